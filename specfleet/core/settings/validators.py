"""Pure checks of single setting values: paths, names, repo ids, URLs, versions, flags.

Each ``*_problem`` function returns ``None`` for a good value, or what was expected instead (a
phrase that completes "expected ..."); ``schema.py`` runs them as field validators. Nothing here
reads a file or the environment.
"""

import ipaddress
import posixpath
import re
import urllib.parse
from collections.abc import Collection

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# A systemd unit's name (without ".service") that is also a plain file name.
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
# One part of a Hugging Face repo id (huggingface_hub's validate_repo_id: word characters, "-" and
# ".", starting and ending on a word character; no "--" or ".." anywhere; at most 96 characters).
REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")
REPO_PART_MAX = 96
# A folder name under models_root.
DIR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# An environment variable name.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A long command-line flag, without a value.
LONG_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")
# An attention backend name as SGLang registers it.
BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")
# A git ref (branch, tag, "refs/pr/1") or a commit.
GIT_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]{0,254}")
# An executable's bare name (looked up on PATH).
COMMAND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
# A serving group's name.
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A network interface's name (the kernel allows up to 15 characters, no '/' or whitespace).
IFACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,14}")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?")
_SSH_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}")
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# Words that make a flag or an environment variable a secret's (split on "-" and "_"). Whole
# words only: --speculative-num-draft-tokens and TOKENIZERS_PARALLELISM are no secrets.
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "credential",
                          "credentials"})  # fmt: skip

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def api_key_chars_ok(key: str) -> bool:
    """Printable ASCII without whitespace, for ``api_key`` and ``api_key_file``: a log's redaction
    finds an unknown key's value up to whitespace, so a key with a space could leak in part."""
    return all(32 < ord(c) < 127 for c in key)


def has_control_chars(text: str) -> bool:
    return bool(_CONTROL.search(text))


def abs_path_problem(value: str) -> str | None:
    """An absolute, normalized path that is not ``/`` (a single trailing ``/`` is allowed)."""
    if has_control_chars(value):
        return "an absolute path without control characters (newline, tab, NUL ...)"
    if not value.startswith("/"):
        return "an absolute path (starting with /)"
    if '"' in value or "\\" in value:
        return "an absolute path without '\"' or '\\' (they change meaning in a unit file)"
    body = value[:-1] if value.endswith("/") and len(value) > 1 else value
    if body == "/":
        return "an absolute path other than / itself"
    parts = body.split("/")[1:]
    if ".." in parts or "." in parts:
        return "an absolute path without '.' or '..' parts"
    if "" in parts or posixpath.normpath(body) != body:
        return "a normalized absolute path (no '//')"
    return None


# The host's own folders: the top-level ones of the FHS and those directly under /var. A folder
# specfleet owns (state_dir, venv, models_root) is none of them and holds none of them: a removal
# deletes what is in it by exact name, and a folder of the host's is never specfleet's.
SYSTEM_DIRS = (
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
    "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr",
    "/var", "/var/backups", "/var/cache", "/var/lib", "/var/local", "/var/lock", "/var/log",
    "/var/mail", "/var/opt", "/var/run", "/var/spool", "/var/tmp",
    "/usr/bin", "/usr/lib", "/usr/local", "/usr/sbin", "/usr/share", "/etc/systemd",
)
# specfleet's own fixed folders (``specfleet.core.layout``: ETC_DIR, OPT_DIR, its tools and
# watchdog folders; tests/unit/test_settings_paths.py checks that they agree): a configured
# folder holds none of them and lies in none of them but OPT_DIR's free names.
SPECFLEET_DIRS = ("/etc/specfleet", "/opt/specfleet")
SPECFLEET_INNER = ("/etc/specfleet", "/opt/specfleet/tools", "/opt/specfleet/watchdog")


def _holds(folder: str, path: str) -> bool:
    """``folder`` is ``path`` or a parent of it."""
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def owned_dir_problem(value: str) -> str | None:
    """A folder specfleet may own on a host: an absolute path (``abs_path_problem``) that is not
    a system folder nor a parent of one, nor holds or lies in specfleet's fixed folders."""
    problem = abs_path_problem(value)
    if problem:
        return problem
    body = value.rstrip("/")
    for d in (*SYSTEM_DIRS, *SPECFLEET_DIRS):
        if _holds(body, d):
            return (f"a folder of its own, not {d} or a folder holding it (the host's or "
                    "specfleet's own folder)")
    for d in SPECFLEET_INNER:
        if _holds(d, body):
            return f"a folder of its own, not inside specfleet's {d}"
    return None


# Units of the host's own a specfleet server may never be named as (its unit file would shadow
# theirs in /etc/systemd/system): exact names, and prefixes of families.
SYSTEM_UNITS = frozenset({
    "ssh", "sshd", "systemd", "init", "dbus", "dbus-broker", "cron", "crond", "anacron", "atd",
    "user", "getty", "serial-getty", "container-getty", "console-getty", "networkmanager",
    "networking", "network",
    "rsyslog", "syslog", "polkit", "udev", "ufw", "firewalld", "apparmor", "auditd", "chrony",
    "chronyd", "ntp", "ntpd", "docker", "containerd", "kubelet", "snapd", "unattended-upgrades",
    "apt-daily", "apt-daily-upgrade", "emergency", "rescue", "multi-user", "default", "basic",
    "sysinit", "shutdown", "reboot", "poweroff", "halt", "display-manager", "rc-local",
    "dm-event", "lvm2-monitor", "irqbalance", "kmod", "cloud-init", "cloud-config",
    "cloud-final", "rpcbind", "autofs", "postfix", "exim4", "fwupd", "multipathd",
    "prometheus-node-exporter", "node-exporter",
})
SYSTEM_UNIT_PREFIXES = ("systemd-", "nvidia", "getty@", "serial-getty@", "user@",
                        "user-runtime-dir@", "dbus-")


def system_unit_problem(value: str) -> str | None:
    """A unit name that is not one of the host's own (``SYSTEM_UNITS``)."""
    low = value.lower()
    if low in SYSTEM_UNITS or low.startswith(SYSTEM_UNIT_PREFIXES):
        return "a name of specfleet's own, not one of the host's system units"
    return None


def control_path_problem(value: str) -> str | None:
    """A path on the control machine: absolute or under ``~/``, normalized, no ``..``."""
    if value.startswith("~/"):
        problem = abs_path_problem(value[1:])
        if problem is None:
            return None
        return problem.replace("an absolute path", "a path under ~/").replace("absolute path",
                                                                            "path under ~/")
    problem = abs_path_problem(value)
    if problem == "an absolute path (starting with /)":
        return "an absolute path or one under ~/"
    return problem


def unit_name_problem(value: str) -> str | None:
    if not UNIT_NAME.fullmatch(value):
        return ("a systemd unit name: 1-64 letters, digits and _ . @ -, starting with a letter or "
                "digit (no '/', spaces or shell characters)")  # fmt: skip
    if value.endswith(".service"):
        return "the name without the '.service' suffix (specfleet adds it)"
    if value.endswith(("@", ".")):
        return "a name that does not end with '@' or '.'"
    return system_unit_problem(value)


def listen_address_problem(value: str) -> str | None:
    """An address the server listens on: an IP address, or a loopback name (``localhost``). A
    DNS name is refused: the readiness gate and the status fact send the API key to it, and a
    name may resolve anywhere."""
    problem = host_problem(value)
    if problem:
        return problem
    if not (is_ip(value.strip("[]")) or value.lower() in LOOPBACK_NAMES):
        return "an IP address of the host (or localhost), not a DNS name"
    return None


def repo_id_problem(value: str) -> str | None:
    parts = value.split("/")
    if (len(parts) != 2 or "--" in value or ".." in value or value.endswith(".git")
            or any(len(p) > REPO_PART_MAX or not REPO_PART.fullmatch(p) for p in parts)):
        return ("a Hugging Face repo id 'namespace/name': two parts of letters, digits, '.', '_' "
                "and '-', each starting with a letter or digit, ending with a letter, digit or "
                f"'_', at most {REPO_PART_MAX} characters, with no '--' or '..'")
    return None


def dir_name_problem(value: str) -> str | None:
    if not DIR_NAME.fullmatch(value) or ".." in value or value.endswith("."):
        return ("a folder name under models_root: letters, digits, '.', '_' and '-', starting "
                "with a letter or digit, no '/' or '..'")  # fmt: skip
    return None


def git_ref_problem(value: str) -> str | None:
    bad = not GIT_REF.fullmatch(value) or ".." in value or "//" in value
    if bad or value.endswith(("/", ".", ".lock")):
        return ("a branch, tag or commit: letters, digits, '.', '_', '-' and '/', no '..', no "
                "spaces, not starting with '-'")  # fmt: skip
    return None


def version_problem(value: str) -> str | None:
    if value != value.strip() or has_control_chars(value):
        # Stripped for the check, the raw value would still name venvs and pins.
        return "a version without spaces or newlines, such as '0.5.23'"
    try:
        Version(value)
    except InvalidVersion:
        return "a version that packaging parses (PEP 440), such as '0.5.23'"
    return None


def specifier_problem(value: str) -> str | None:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        return "a version specifier such as '>=0.15.0.1,<0.19' or '==0.18.0'"
    return None


def sha256_problem(value: str) -> str | None:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        return "a sha256: 64 hex digits (sha256sum FILE)"
    return None


def host_problem(value: str, allow_port: bool = False) -> str | None:
    """A host name or an IP address (``host:port`` where ``allow_port``)."""
    host = value
    if allow_port and not value.startswith("["):
        name, sep, port = value.rpartition(":")
        if sep and port.isdigit() and ":" not in name:
            if not 1 <= int(port) <= 65535:
                return "a host name or IP address, with an optional :port in 1..65535"
            host = name
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if is_ip(host):
        return None
    labels = host.rstrip(".").split(".")
    # An all-digit last label is no name: clients read "127.1" or "0x7f.1" as an IP address.
    if (host and len(host) <= 253 and all(_HOST_LABEL.fullmatch(lb) for lb in labels)
            and not labels[-1].isdigit() and not re.fullmatch(r"0x[0-9a-f]+", labels[-1], re.I)):
        return None
    what = "a host name or IP address"
    return what + (" (optionally host:port)" if allow_port else "")


def is_ip(text: str) -> bool:
    try:
        return bool(ipaddress.ip_address(text))
    except ValueError:
        return False


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower().rstrip(".")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_problem(value: str, schemes: Collection[str] = ("https", "http")) -> str | None:
    """A URL with one of ``schemes`` that every HTTP client reads as the same host: no userinfo
    (a plain user name only for ssh), no backslash, no percent-encoding in the authority, and a
    host that is a host name or an IP address (not ``-oProxyCommand=...``)."""
    if has_control_chars(value) or any(c.isspace() for c in value):
        return "a URL without spaces or control characters"
    if "\\" in value:
        # urllib3 and browsers read "http://evil\@127.0.0.1/" as host evil, urlsplit as 127.0.0.1.
        return "a URL without backslashes"
    try:
        parts = urllib.parse.urlsplit(value)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "a well-formed URL"
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        return "a URL with scheme " + " or ".join(f"{s}://" for s in schemes)
    if scheme.endswith("file"):
        if parts.netloc or abs_path_problem(parts.path) is not None:
            return "a file:// URL of an absolute path (file:///PATH)"
        return None
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and not (scheme.endswith("ssh") and _SSH_USER.fullmatch(userinfo)):
        return ("a URL without user or password before '@' (credentials go in the client's own "
                "config, e.g. pip's netrc or keyring, never in the inventory)")
    if "%" in parts.netloc:
        return "a URL without percent-encoding in its host part"
    if not host:
        return f"a URL with a host, such as {scheme}://HOST/"
    if host_problem(host) is not None:
        return "a URL whose host is a host name or IP address"
    if not _HOST_PORT.fullmatch(parts.netloc.rpartition("@")[2]):
        return "a URL whose authority is HOST or HOST:PORT"
    if port is not None and not 1 <= port <= 65535:
        return "a URL whose port is in 1..65535"
    return None


def hide_userinfo(value: object) -> str | None:
    """A URL quoted with its user and password hidden (a secret); None if it has none."""
    userinfo = re.match(r"[^:/]+://([^/?#]*)@", value) if isinstance(value, str) else None
    return repr(value[:userinfo.start(1)] + "***" + value[userinfo.end(1):]) if userinfo else None


def http_host_problem(value: str, http_hosts: Collection[str], http_setting: str) -> str | None:
    """Plain ``http`` (also ``git+http``) only to a loopback address or to one of ``http_hosts``
    (named by the setting ``http_setting``); ``value`` passed ``url_problem``."""
    parts = urllib.parse.urlsplit(value)
    if parts.scheme.lower().removeprefix("git+") != "http":
        return None
    host = (parts.hostname or "").lower()
    if is_loopback(host) or host in {h.lower().strip("[]") for h in http_hosts}:
        return None
    return (f"an https:// URL (plain http:// only to a loopback address or to a host listed in "
            f"{http_setting})")


def secret_flag(flag: str) -> bool:
    """Whether a command-line flag's name says it carries a secret (--api-key, --hf-token ...)."""
    return any(w in SECRET_WORDS for w in re.split(r"[-_]+", flag.lstrip("-").lower()))


def secret_env_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret (HF_TOKEN, API_KEY ...)."""
    return any(w in SECRET_WORDS for w in name.lower().split("_"))


# Variables that change what code the server runs or how it logs, and so turn off what specfleet
# set up (the redacting logging config, the pinned venv): the dynamic loader's, Python's module
# search and start-up hooks, SGLang's logging config.
UNSAFE_ENV = frozenset({"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
                        "PYTHONINSPECT", "PYTHONBREAKPOINT", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR",
                        "BASH_ENV", "ENV", "GCONV_PATH", "SGLANG_LOGGING_CONFIG_PATH"})


# Where the server (root) loads compiled code from: specfleet points each at a root-owned folder
# under <models_root>/.cache (``specfleet.core.unit.CACHE_ENV``, checked to agree by
# tests/unit/test_settings_paths.py); one a user may write would run their code as root.
CODE_CACHE_ENV = frozenset({"PYTHONPYCACHEPREFIX", "SGLANG_DG_CACHE_DIR", "SGLANG_CACHE_DIR",
                            "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                            "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH", "XDG_CACHE_HOME"})


def unsafe_env_name(name: str) -> bool:
    """Whether setting ``name`` in the server's environment would undo specfleet's safety."""
    upper = name.upper()
    return upper in UNSAFE_ENV or upper in CODE_CACHE_ENV or upper.startswith("LD_")
