"""Run the SGLang server under systemd: a unit from the plan, restart only on change, readiness."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paramiko import SSHException
from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.exceptions import ConnectError
from pyinfra.api.util import get_template
from pyinfra.context import ctx_host
from pyinfra.operations import files

from facts.cache import cached_fact
from facts.cache import cached_gather as gather
from facts.serving import STARTED_MARK, ServiceState
from operations.sglang_commands import rejected_port_path, restore_script
from operations.util import check_command, record_failure, say_planned_failure
from specfleet.core.errors import PLAN_ATTR, SpecfleetError
from specfleet.core.plan import GPUS, SGLANG, TOPOLOGY, PlanError, make_plan
from specfleet.core.plan.group import NET, RDMA, GroupMember, make_group_plan
from specfleet.core.resources import hostside_path, template_path
from specfleet.core.settings import (
    ProbeOptions,
    Settings,
    SettingsError,
    api_key_chars_ok,
    probe_from_file,
    settings_for_host,
)
from specfleet.core.sglang.install import patch_state_dir
from specfleet.hostside.specfleet_log_redact import ship_ahead_of

UNIT_TEMPLATE = template_path("sglang.service.j2")
ENV_TEMPLATE = template_path("sglang.env.j2")
GATE_SCRIPT = hostside_path("readiness_gate.py")
# The server's log formatter, which redacts API keys: imported by SGLang's Python from the logging
# config (SGLANG_LOGGING_CONFIG_PATH), with its folder on the server's PYTHONPATH.
LOG_MODULE = hostside_path("specfleet_log_redact.py")
LOG_FORMATTER = "specfleet_log_redact.RedactingFormatter"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# The unit's supervision. A crash loop stops after START_LIMIT_BURST starts in the interval; with
# RESTART_SEC between them, a server that dies at import fails the unit in about 15 s.
START_LIMIT_INTERVAL_S = 300
START_LIMIT_BURST = 3
RESTART_SEC = 5
# SGLang drains in-flight requests on SIGTERM; a 1T model's workers need time to exit.
TIMEOUT_STOP_S = 180
LIMIT_NOFILE = 1048576

# Where each cache goes under <models_root>/.cache, and the variable that moves it there. Each
# default is under $HOME (read in the 0.5.11 wheel: srt/environ.py SGLANG_DG_CACHE_DIR and
# SGLANG_CACHE_DIR, srt/compilation/compiler_interface.py TORCHINDUCTOR_CACHE_DIR/TRITON_CACHE_DIR,
# custom_all_reduce_utils.py ~/.cache/sglang), so a service without them recompiles DeepGEMM
# kernels (10-20 min) after every reinstall of root's home, or never keeps them at all.
CACHE_ENV = (
    ("SGLANG_DG_CACHE_DIR", "deep_gemm"),
    ("SGLANG_CACHE_DIR", "sglang"),
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("CUDA_CACHE_PATH", "nv/ComputeCache"),
    ("XDG_CACHE_HOME", "xdg"),
)

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JINJA = {"trim_blocks": True, "lstrip_blocks": True}


# --------------------------------------------------------------------------------------------------
# Pure helpers: paths, quoting, rendering
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerPaths:
    """Where a specfleet server's files live on the host."""

    unit_name: str
    unit: str
    env: str
    secret: str
    marker: str
    cache_root: str
    # The logging config and its formatter module, root's alone (a 0700 folder of 0600 files).
    log_dir: str
    log_config: str
    log_module: str


def server_paths(settings: Settings) -> ServerPaths:
    name = settings.service_name
    log_dir = f"/etc/specfleet/{name}.logging"
    return ServerPaths(
        unit_name=f"{name}.service",
        unit=f"/etc/systemd/system/{name}.service",
        env=f"/etc/specfleet/{name}.env",
        # SGLang reads `--config FILE.yaml` (0.5.11, 0.5.14, 0.5.23): the API key goes there, so it
        # is in no argv, no unit and no diff. The directory is 0700.
        secret=f"/etc/specfleet/secrets/{name}.yaml",
        marker=posixpath.join(settings.state_dir, f"{name}.restart-pending"),
        cache_root=posixpath.join(settings.models_root, ".cache"),
        log_dir=log_dir,
        log_config=f"{log_dir}/logging.json",
        log_module=f"{log_dir}/{LOG_MODULE.name}",
    )


def systemd_escape(text: str) -> str:
    """Text for a unit setting that expands specifiers (``%``) but is not split into words."""
    if "\n" in text or "\0" in text:
        raise ValueError(f"a unit setting cannot hold a newline or NUL: {text!r}")
    return text.replace("%", "%%")


def systemd_quote(word: str, expand_env: bool = True) -> str:
    """One word of an ``ExecStart=`` (or ``Environment=``) line, quoted so systemd reads it back.

    systemd expands ``%`` specifiers on the whole line, splits words with C-style unquoting and, for
    ``ExecStart=``, expands ``$VAR`` in each word. So ``%`` becomes ``%%``, ``$`` becomes ``$$``
    (``expand_env``), and any word that is not plainly safe is double-quoted with C escapes.
    """
    if "\0" in word:
        raise ValueError(f"an argument cannot hold a NUL byte: {word!r}")
    if word == ";":
        # A lone ; separates commands; \; is the literal.
        return "\\;"
    if _SAFE_WORD.fullmatch(word):
        return word
    out = ['"']
    for ch in word:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "%":
            out.append("%%")
        elif ch == "$" and expand_env:
            out.append("$$")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def exec_start(argv: list[str]) -> str:
    """The value of ``ExecStart=``: the words quoted, one flag (and its value) per line."""
    if not argv:
        raise ValueError("the plan's argv is empty")
    if not argv[0].startswith("/"):
        raise ValueError(f"the plan's argv[0] is not an absolute path: {argv[0]!r}")
    lines: list[list[str]] = [[systemd_quote(argv[0])]]
    for word in argv[1:]:
        if word.startswith("--"):
            lines.append([])
        lines[-1].append(systemd_quote(word))
    return " \\\n    ".join(" ".join(line) for line in lines)


def env_line(key: str, value: str) -> str:
    """One ``KEY="value"`` line of an EnvironmentFile, as systemd's env-file parser reads it."""
    if not _ENV_KEY.fullmatch(key):
        raise ValueError(f"not an environment variable name: {key!r}")
    if "\n" in value or "\0" in value or "\r" in value:
        raise ValueError(f"environment variable {key} holds a newline or NUL")
    escaped = re.sub(r'(["\\`$])', r"\\\1", value)
    return f'{key}="{escaped}"'


def cache_env(settings: Settings) -> dict[str, str]:
    root = server_paths(settings).cache_root
    return {key: posixpath.join(root, sub) for key, sub in CACHE_ENV}


def server_env(plan_env: dict[str, str], settings: Settings) -> dict[str, str]:
    """The server's environment: the cache directories and the logging config, then the plan's env
    (which wins), with the logging config's folder first on PYTHONPATH (the plan's after it)."""
    paths = server_paths(settings)
    env = cache_env(settings)
    # SGLang's own way to configure its logging (configure_logger, 0.5.11 to 0.5.23): a dictConfig
    # JSON whose formatter redacts the API key SGLang logs with its ServerArgs at start.
    env["SGLANG_LOGGING_CONFIG_PATH"] = paths.log_config
    env.update(plan_env)
    theirs = plan_env.get("PYTHONPATH")
    env["PYTHONPATH"] = paths.log_dir + (f":{theirs}" if theirs else "")
    return env


def logging_config(settings: Settings, argv: list[str]) -> str:
    """The server's logging config (SGLANG_LOGGING_CONFIG_PATH): what SGLang's ``configure_logger``
    sets up without one (a stderr handler at ``--log-level``, SGLang's format, httpx and httpcore
    at WARNING), with the formatter that redacts API keys, the key file's among them.

    SGLang applies it with ``logging.config.dictConfig`` after its modules made their loggers, so
    ``disable_existing_loggers`` is false: true would silence every one of them.
    """
    level = (argv_value(argv, "--log-level") or "info").upper()
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "sglang": {"()": LOG_FORMATTER, "secret_files": [server_paths(settings).secret]},
        },
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                       "formatter": "sglang"},
        },
        "root": {"level": level if level in LOG_LEVELS else "INFO", "handlers": ["stderr"]},
        "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
    }  # fmt: skip
    return json.dumps(config, indent=2) + "\n"


def has_api_key(settings: Settings) -> bool:
    """Whether the server gets an API key (``api_key``, or ``api_key_file`` not read yet)."""
    return settings.api_key is not None or settings.api_key_file is not None


def read_api_key_file(path: str) -> str:
    """The API key in ``path`` (``api_key_file``, on the control machine), read now: at deploy
    time, never when the inventory loads. One line; surrounding whitespace is dropped."""
    try:
        text = Path(os.path.expanduser(path)).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise SpecfleetError(
            f"api_key_file {path} cannot be read on the control machine ({e.strerror})",
            fix="point api_key_file at a file holding the key, or unset it",
        ) from None
    except UnicodeDecodeError:
        raise SpecfleetError(f"api_key_file {path} is not UTF-8 text",
                             fix="write the key into it (one line of printable ASCII)") from None
    if not text:
        raise SpecfleetError(f"api_key_file {path} is empty",
                             fix="write the key into it (one line), or unset api_key_file for a "
                             "server without a key")  # fmt: skip
    if not api_key_chars_ok(text):
        # The key is never quoted back.
        raise SpecfleetError(
            f"api_key_file {path} holds more than one line, a space, or a character that is not "
            "printable ASCII",
            fix="write the key alone on one line of printable ASCII, without spaces",
        )
    return text


def api_key(settings: Settings) -> str | None:
    """The server's API key: ``api_key``, or the content of ``api_key_file`` read now."""
    if settings.api_key is not None:
        return settings.api_key
    if settings.api_key_file is not None:
        return read_api_key_file(settings.api_key_file)
    return None


def secret_yaml(api_key: str) -> str:
    """The ``--config`` YAML holding the API key (a JSON string is a YAML double-quoted scalar)."""
    import json

    if not api_key or any(ord(c) < 32 or ord(c) > 126 for c in api_key):
        raise ValueError("the API key must be printable ASCII")
    return "# Managed by specfleet. The SGLang API key, read through --config.\n" + (
        f"api-key: {json.dumps(api_key)}\n"
    )


def argv_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in argv (``--flag V`` or ``--flag=V``), the last one winning."""
    value = None
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(flag + "="):
            value = word[len(flag) + 1 :]
    return value


def with_secret_config(argv: list[str], secret_path: str | None) -> list[str]:
    """The argv the unit runs: the plan's, plus ``--config SECRET.yaml`` given an API key."""
    if secret_path is None:
        return list(argv)
    if "--config" in argv:
        raise ValueError("the plan already passes --config; the API key cannot be added to it")
    return [*argv, "--config", secret_path]


def build_info(settings: Settings, install: dict[str, Any] | None, weights: dict | None = None):
    """What the running server is built from: SGLang version, patch state, weights revisions.

    It is rendered into the unit, so a new version or revision changes the unit and restarts the
    server. ``weights`` may give the revisions resolved on the host ({"target": sha, ...}).
    """
    weights = weights or {}
    version = (install or {}).get("version") or f"{settings.sglang.version} (not installed yet)"
    features = (install or {}).get("features") or {}
    patch = (install or {}).get("patch")
    if not patch:
        # A PR#20547 build (git install of the PR branch) has it without an applied patch.
        patch = "pr20547 (built in)" if features.get("dflash_pr20547") else "none"
    if settings.sglang.kind == "git":
        version += f" git:{settings.sglang.git_ref}"

    def rev(name: str) -> str:
        src = getattr(settings, name)
        return weights.get(name) or src.revision or "unpinned"

    return {
        "sglang": _one_line(version),
        "patch": _one_line(str(patch)),
        "target": _one_line(f"{settings.target.repo_id}@{rev('target')}"),
        "drafter": _one_line(f"{settings.drafter.repo_id}@{rev('drafter')}"),
    }


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def unit_context(
    argv: list[str],
    env: dict[str, str],
    settings: Settings,
    build: dict[str, str],
    predicted: str | None = None,
) -> dict[str, Any]:
    """Everything the unit and env templates read, already quoted for systemd."""
    paths = server_paths(settings)
    secret = paths.secret if has_api_key(settings) else None
    full_env = server_env(env, settings)
    build_env = "SPECFLEET_BUILD=" + " ".join(f"{k}={v}" for k, v in build.items())
    return {
        "service_name": settings.service_name,
        "predicted": predicted,
        "build": build,
        "build_env": systemd_quote(build_env, expand_env=False),
        "description": systemd_escape(
            f"{settings.target.repo_id} + {settings.drafter.repo_id}"
        ),
        "start_limit_interval_s": START_LIMIT_INTERVAL_S,
        "start_limit_burst": START_LIMIT_BURST,
        "restart_sec": RESTART_SEC,
        "timeout_stop_s": TIMEOUT_STOP_S,
        "limit_nofile": LIMIT_NOFILE,
        "env_path": systemd_escape(paths.env),
        "working_directory": systemd_escape(settings.models_root),
        "exec_start": exec_start(with_secret_config(argv, secret)),
        "cache_root": paths.cache_root,
        "env_lines": [env_line(k, v) for k, v in full_env.items()],
    }


def render(template: Path, context: dict[str, Any]) -> str:
    """Render a template exactly as ``files.template`` does."""
    return get_template(str(template), dict(_JINJA)).render(context)


def sha1_text(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()  # noqa: S324 (compared with sha1sum)


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------------------
# Restart or wait: what server.service does with the restart-pending marker (pure)
# --------------------------------------------------------------------------------------------------


def files_fingerprint(files: dict[str, dict[str, Any]]) -> str:
    """One word for the unit's files as ``ServiceState`` reports them (path, content, mode,
    owner), recorded with a restart to tell later whether they changed since."""
    text = "\n".join(
        f"{path} {info.get('sha1')} {info.get('mode')} {info.get('user')}:{info.get('group')}"
        for path, info in sorted(files.items())
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StartDecision:
    """What ``server.service`` does for a server that should run.

    ``none``: it runs and nothing is pending. ``start``: it is stopped. ``restart``: for the
    restart-pending marker (``why`` starts with the marker's reason). ``wait``: the restart for
    the marker was done and the server it started is still up with its unit unchanged: gate it
    with what is left of the budget since ``started_at`` (host time), do not restart it.
    """

    action: str
    why: str = ""
    started_at: int | None = None


def start_decision(st: dict[str, Any], fingerprint: str) -> StartDecision:
    """Restart, wait, start or nothing, from the unit's state (``ServiceState``: active state,
    invocation, the marker and the restart recorded in it) and the fingerprint of the unit's files
    now (``files_fingerprint``).

    A marker is cleared only when the gate passes, so a gate that failed (or a run that died)
    leaves it. Restarting on every marker restarts a server that is still loading, or healthy by
    now, on every run: a server needing longer than the budget never comes up. So a restart
    records, in the marker, the invocation it started and the files it started from; a marker
    with that record is waited on while that same invocation is up and the files are the same,
    and restarts the server only when the unit, env, key or logging config changed since, or the
    server died (failed, stopped, restarting after a crash, or another invocation).
    """
    pending = st.get("restart_pending")
    active_state = st.get("active_state") or "inactive"
    sub_state = st.get("sub_state") or "dead"
    up = active_state in ("active", "activating", "reloading")
    if pending is None:
        if sub_state == "auto-restart":
            # "activating" here is a dead server that systemd starts again after RestartSec (or
            # never, once its start limit is hit): nothing serves, so start it now and gate it.
            return StartDecision("start", "the server died; systemd waits to start it again "
                                 "(auto-restart)")
        return StartDecision("none" if up else "start")
    started = st.get("restart_started")
    if not started:
        return StartDecision("restart", pending)
    if st.get("need_daemon_reload") or started.get("files") != fingerprint:
        return StartDecision(
            "restart", f"{pending}; the unit's files changed since the restart for it"
        )
    if not up or sub_state == "auto-restart" or st.get("result") == "start-limit-hit":
        return StartDecision(
            "restart", f"{pending}; the server restarted for it is {active_state}/{sub_state}"
        )
    if st.get("invocation_id") != started.get("invocation"):
        return StartDecision(
            "restart", f"{pending}; the server restarted for it is gone: the unit runs another "
            "invocation",
        )  # fmt: skip
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started["at"]))
    return StartDecision(
        "wait",
        f"it was restarted for {pending} at {when} (invocation {started['invocation'][:12]}) and "
        f"is {active_state}/{sub_state} since, its unit unchanged: not restarting it, waiting "
        "until it serves",
        started["at"],
    )


# --------------------------------------------------------------------------------------------------
# Execute-time inputs: the plan from the facts as they are now
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurrentPlan:
    argv: list[str]
    env: dict[str, str]
    build: dict[str, str]
    # Why the plan is predicted (SGLang or the drafter not on the host yet), or None.
    predicted_because: str | None
    rendered: str


SERVICE = "facts.serving.ServiceState"
DRAFTER_CONFIG = "drafter_config"
PATCH_SHA = "patch_sha256"


def _weights_key(name: str) -> str:
    return f"weights_{name}"


def unit_files(paths: ServerPaths) -> list[str]:
    """The files whose state ``ServiceState`` reports with the unit's: one set for every step
    (preflight, server.unit, server.service), so that a probe asks systemctl once."""
    return [paths.unit, paths.env, paths.secret, paths.log_config, paths.log_module]


def service_state_args(settings: Settings) -> dict[str, Any]:
    paths = server_paths(settings)
    return {"service": paths.unit_name, "paths": unit_files(paths), "marker": paths.marker}


def host_specs(settings: Settings, files_: list[str]) -> dict[str, Any]:
    """The facts the unit needs, for one ``facts.probe.Probe`` command (one SSH round trip)."""
    paths = server_paths(settings)
    drafter_dir = posixpath.join(settings.models_root, settings.drafter.dir_name)
    specs: dict[str, Any] = {
        SERVICE: (ServiceState, {"service": paths.unit_name, "paths": files_,
                                 "marker": paths.marker}),
        GPUS: ("facts.gpu.Gpus", {}),
        TOPOLOGY: ("facts.gpu.GpuTopology", {}),
        SGLANG: (
            "facts.sglang.SGLangInstall",
            {"python": posixpath.join(settings.venv, "bin", "python")},
        ),
        DRAFTER_CONFIG: (
            "facts.serving.FirstJson",
            {"paths": [posixpath.join(drafter_dir, "config.json"),
                       posixpath.join(drafter_dir, "current", "config.json")]},
        ),
    }
    if settings.group is not None:
        # A serving group's plan needs the interfaces the peers reach this member on.
        specs[NET] = ("facts.net.NetworkInterfaces", {})
        specs[RDMA] = ("facts.net.RdmaPorts", {})
    # The applied PR#20547 patch's sha256 (written by operations.sglang), for the build info.
    specs[PATCH_SHA] = (
        "facts.serving.FileText",
        {"path": posixpath.join(patch_state_dir(settings.venv), "sha256")},
    )
    for name in ("target", "drafter"):
        src = getattr(settings, name)
        if src.revision is None or src.follow_branch:
            # Not pinned in the settings: the revision the weights step left on the host.
            specs[_weights_key(name)] = (
                "facts.weights.WeightsState",
                {"path": posixpath.join(settings.models_root, src.dir_name)},
            )
    return specs


@dataclass(frozen=True)
class Peer:
    """Another member of this host's serving group, as this run read it."""

    settings: Settings
    facts: dict[str, Any]
    address: str


def plan_from_facts(
    settings: Settings,
    facts: dict[str, Any],
    host_name: str = "",
    peers: dict[str, Peer] | None = None,
    address: str = "",
) -> CurrentPlan:
    """The plan and build info from the facts of ``host_specs`` (pure: no I/O).

    Before the software and weights steps have run (a fresh host under ``--dry``), the plan is
    predicted from the settings and ``specfleet.core.tables.sglang_versions``, and says why.
    A member of a serving group gets its part of the group's plan: ``peers`` are the other
    members (their settings, facts and address), ``address`` the one its peers reach it on.
    """
    install = facts.get(SGLANG)
    drafter_config = facts.get(DRAFTER_CONFIG)
    missing = []
    if install is None:
        missing.append(f"SGLang is not installed in {settings.venv} yet")
    if drafter_config is None:
        drafter_dir = posixpath.join(settings.models_root, settings.drafter.dir_name)
        missing.append(f"the drafter's config.json is not in {drafter_dir} yet")
    try:
        if settings.group is None:
            plan = make_plan(
                {k: facts.get(k) for k in (GPUS, TOPOLOGY, SGLANG)},
                settings,
                drafter_config,
                predicted=install is None,
                host=host_name or None,
            )
        else:
            group = make_group_plan(
                [GroupMember(host_name, facts, settings, address or host_name)]
                + [GroupMember(name, p.facts, p.settings, p.address)
                   for name, p in (peers or {}).items()],
                drafter_config,
                predicted=install is None,
            )  # fmt: skip
            plan = group.plans[host_name]
    except PlanError as exc:
        raise exc.for_host(host_name) if host_name else exc from None
    weights = {}
    for name in ("target", "drafter"):
        current = (facts.get(_weights_key(name)) or {}).get("current")
        if current:
            weights[name] = current
    if install is not None and facts.get(PATCH_SHA):
        install = dict(install, patch=f"pr20547 sha256:{facts[PATCH_SHA][:16]}")
    return CurrentPlan(
        argv=list(plan.argv),
        env=dict(plan.env),
        build=build_info(settings, install, weights),
        predicted_because="; ".join(missing) or None,
        rendered=plan.render(),
    )


def current_plan(settings: Settings) -> CurrentPlan:
    """The plan for this host from its facts as they are now (call it inside an operation)."""
    return plan_from_facts(
        settings, _gather(settings, []), host.name, group_peers(settings), host_address(host)
    )


def host_address(h: Any) -> str:
    """The address the inventory reaches ``h`` on (its peers reach it there too, by default)."""
    return str(h.data.get("ssh_hostname") or h.name)


def group_peers(settings: Settings) -> dict[str, Peer] | None:
    """The other members of this host's serving group, their facts read now (one probe each).

    Every member must be in this run: a group's plan is made from all of its members' facts.
    """
    g = settings.group
    if g is None:
        return None
    peers: dict[str, Peer] = {}
    for name in g.members:
        if name == host.name:
            continue
        peer = state.inventory.get_host(name, default=None)
        if peer is None or peer not in state.activated_hosts:
            raise SpecfleetError(
                f"serving group {g.name}: member {name} is "
                + ("not in the inventory" if peer is None else "not in this run (--limit?)"),
                host=host.name,
                fix=f"deploy the whole group together: add {name} to the inventory and to "
                "--limit (a group's plan needs every member's facts)",
            )
        if peer not in state.active_hosts:
            raise SpecfleetError(
                f"serving group {g.name}: member {name} failed earlier in this run",
                host=host.name,
                fix=f"fix {name} (its error is above) and run again; the group starts as one",
            )
        peer_settings = settings_for_host(peer)
        peers[name] = Peer(
            peer_settings, gather(peer, host_specs(peer_settings, [])), host_address(peer)
        )
    return peers


def _gather(settings: Settings, files_: list[str]) -> dict[str, Any]:
    facts = gather(host, host_specs(settings, files_))
    if facts.get(SERVICE) is None:
        if not state.is_executing:  # the plan needs no systemd: show it, then why it fails
            _show_plan(settings, facts)
        raise SpecfleetError(
            "systemctl is not on this host: the SGLang server runs as a systemd unit",
            host=host.name,
            fix="run specfleet on a host booted with systemd",
        )
    return facts


def _show_plan(settings: Settings, facts: dict[str, Any]) -> None:
    """Planning on a host that cannot run the unit: the launch plan all the same (kept for a
    controller's dry report, and printed), so ``--dry`` always shows it."""
    try:
        current = plan_from_facts(settings, facts, host.name, group_peers(settings),
                                  host_address(host))
    except SpecfleetError as exc:  # the plan itself fails: said as the planned failure
        say_planned_failure(exc, "would fail")
        return
    _say_plan(current)


def _say_plan(current: CurrentPlan) -> None:
    """While planning: the host's launch plan, printed once (several operations read it) and
    kept on the Host (``PLAN_ATTR``) for a controller's dry report."""
    where = ctx_host.get() or host
    if getattr(where, PLAN_ATTR, None) == current.rendered:
        return
    setattr(where, PLAN_ATTR, current.rendered)
    note = f"\n  (predicted: {current.predicted_because})" if current.predicted_because else ""
    host.log(f"{current.rendered}{note}", logger.info)


def _settings(settings: Settings | None) -> Settings:
    # A deploy resolves the venv once (operations.venvs) and passes its settings in.
    return settings if settings is not None else settings_for_host(host)


def _state(paths: ServerPaths, files_: list[str]) -> dict[str, Any]:
    st = cached_fact(host, ServiceState, service=paths.unit_name, paths=files_, marker=paths.marker)
    if st is None:
        raise SpecfleetError(
            "systemctl is not on this host: the SGLang server runs as a systemd unit",
            host=host.name,
            fix="run specfleet on a host booted with systemd",
        )
    return st


def _marker_command(paths: ServerPaths, reason: str) -> StringCommand:
    script = 'mkdir -p "$(dirname "$1")" && printf "%s\\n" "$2" > "$1"'
    return StringCommand(
        "sh", "-c", QuoteString(script), "specfleet", QuoteString(paths.marker), QuoteString(reason)
    )


def _systemctl(*args: str) -> StringCommand:
    return StringCommand("systemctl", *[QuoteString(a) for a in args])


def _file_matches(st: dict[str, Any], path: str, text: str, mode: int) -> bool:
    info = st["files"].get(path)
    return (
        info is not None
        and info["sha1"] == sha1_text(text)
        and info["mode"] == mode
        and (info["user"], info["group"]) == ("root", "root")
    )


def _secret_commands(paths: ServerPaths, text: str) -> list[StringCommand]:
    """Write the API key file through stdin: it never sits in a temp file, an argv or a diff."""
    script = (
        'umask 077 && mkdir -p "$(dirname "$1")" && chmod 700 "$(dirname "$1")" '
        '&& cat > "$1.tmp" && chown root:root "$1.tmp" && mv -f "$1.tmp" "$1"'
    )
    return [
        StringCommand(
            "sh", "-c", QuoteString(script), "specfleet", QuoteString(paths.secret), _stdin=text
        )
    ]


def _private_file_commands(folder: str, path: str, text: str) -> list[StringCommand]:
    """Write ``path`` (mode 0600) in ``folder`` (mode 0700), both root's, through stdin."""
    script = (
        'umask 077 && mkdir -p "$1" && chown root:root "$1" && chmod 700 "$1" '
        '&& cat > "$2.tmp" && chown root:root "$2.tmp" && chmod 600 "$2.tmp" '
        '&& mv -f "$2.tmp" "$2"'
    )
    return [
        StringCommand(
            "sh", "-c", QuoteString(script), "specfleet", QuoteString(folder), QuoteString(path),
            _stdin=text,
        )
    ]  # fmt: skip


def _per_host(body: Iterator[Any]) -> Iterator[Any]:
    """An op body whose ``SpecfleetError`` fails this one host, not the whole run.

    pyinfra 3.10 turns an ``OperationError`` raised in an op (at prepare or execute time) into
    "Operation error" and stops every host. Here the error becomes a command that logs it and
    fails, so the other hosts go on and ``--fail-percent`` decides; ``--dry`` shows it too.
    """
    try:
        commands = list(body)
    except SpecfleetError as exc:
        error = exc.for_host(host.name)
        if not state.is_executing:
            say_planned_failure(error, "will fail")
        yield FunctionCommand(_report_error, (error.render(),), {})
        return
    yield from commands


def _report_error(state, host, text: str) -> bool:
    logger.error(f"{host.print_prefix}{text}" if not text.startswith(f"[{host.name}]") else text)
    return False


# --------------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------------


@operation()
def unit(settings: Settings | None = None, present: bool = True):
    """
    Render the SGLang server's systemd unit and environment file from the plan, computed now.

    + settings: the deploy's ``Settings``; default: the host's ``specfleet`` data
    + present: whether the unit should exist; ``False`` stops, disables and removes it

    The plan is made here, at execution time, from the host's facts as they are then (after the
    software and weights steps of the same run). Under ``--dry`` on a fresh host it is predicted
    from the settings and the version table, and the unit says so.

    ``ExecStart`` is the plan's argv, quoted for systemd. The environment file (mode 0600) holds the
    plan's env and the JIT/DeepGEMM cache directories under ``<models_root>/.cache``. The unit
    carries the SGLang version, its patch state and the weights revisions, so a change of any of
    them changes the unit. An API key (``settings.api_key``, or ``settings.api_key_file`` read
    on the control machine now) goes to a 0600 YAML file that SGLang reads with ``--config``; it
    never appears in an argv, the unit or a diff. SGLang logs it with its ServerArgs at start, so
    the server's logging is configured by a file of its own (``SGLANG_LOGGING_CONFIG_PATH``, with
    its formatter module on ``PYTHONPATH``, in a 0700 folder beside the env file) whose formatter
    redacts API keys: the journal never holds it either (the settings refuse
    ``SGLANG_LOGGING_CONFIG_PATH`` and ``PYTHONPATH`` in ``plan.extra_env``).

    When any of these files changes, a restart-pending marker is written on the host *before* the
    files, so a run that fails between here and the restart still restarts on the next run.

    **Example:**

    .. code:: python

        unit = server.unit(name="Render the SGLang unit")
        server.restart_pending(name="Restart for new software or weights",
                               _if=any_changed(software, weights))
        server.service(name="Run the SGLang server", running=True, enabled=True)
    """
    yield from _per_host(_unit(settings, present))


def _unit(settings: Settings | None, present: bool):
    s = _settings(settings)
    paths = server_paths(s)
    files_ = unit_files(paths)

    if not present:
        yield from _absent(paths, _state(paths, files_))
        return

    # One command reads the unit's state and everything the plan needs, as they are now.
    facts = _gather(s, files_)
    st = facts[SERVICE]
    current = plan_from_facts(s, facts, host.name, group_peers(s), host_address(host))
    if not state.is_executing:  # planning (--dry): every host's plan, shown and kept
        _say_plan(current)
    elif current.predicted_because:
        raise SpecfleetError(
            f"cannot write the unit from a predicted plan: {current.predicted_because}",
            host=host.name,
            fix="run the SGLang install and the weights steps before server.unit "
            "(deploys/kimi_k26.py does it in that order)",
        )

    try:
        ctx = unit_context(current.argv, current.env, s, current.build, current.predicted_because)
        key = api_key(s)
        secret = secret_yaml(key) if key is not None else None
    except ValueError as exc:
        raise SpecfleetError(
            f"the plan cannot be written as a systemd unit: {exc}",
            host=host.name,
            fix="change the offending value in the settings (plan.extra_args / extra_env)",
        ) from None

    changes: list[Any] = []
    changed: list[str] = []
    for template, dest, mode, what in (
        (UNIT_TEMPLATE, paths.unit, 644, "the unit"),
        (ENV_TEMPLATE, paths.env, 600, "the environment file"),
    ):
        if not _file_matches(st, dest, render(template, ctx), mode):
            changed.append(what)
            changes += list(
                files.template._inner(
                    src=str(template),
                    dest=dest,
                    user="root",
                    group="root",
                    mode=mode,
                    jinja_env_kwargs=dict(_JINJA),
                    **ctx,
                )
            )
    if secret is not None and not _file_matches(st, paths.secret, secret, 600):
        changed.append("the API key")
        host.log(f"API key file {paths.secret} will change (sha256 {short_hash(secret)}...)")
        changes += _secret_commands(paths, secret)
    elif secret is None and paths.secret in st["files"]:
        changed.append("the API key (removed)")
        changes.append(StringCommand("rm", "-f", QuoteString(paths.secret)))
    stale_logging = [
        (dest, text)
        for dest, text in ((paths.log_config, logging_config(s, current.argv)),
                           (paths.log_module, LOG_MODULE.read_text()))
        if not _file_matches(st, dest, text, 600)
    ]  # fmt: skip
    if stale_logging:
        changed.append("the logging config")
        for dest, text in stale_logging:
            changes += _private_file_commands(paths.log_dir, dest, text)

    if not changes:
        host.noop(f"unit {paths.unit_name} is up to date")
        return
    what = changed[0] if len(changed) == 1 else ", ".join(changed[:-1]) + " and " + changed[-1]
    yield _marker_command(paths, f"{what} changed")
    yield StringCommand("mkdir", "-p", QuoteString(paths.cache_root))
    yield from changes


def _absent(paths: ServerPaths, st: dict[str, Any]):
    present = [p for p in unit_files(paths) if p in st["files"]]
    loaded = st["load_state"] not in ("not-found", "")
    if not present and not loaded and st["restart_pending"] is None:
        host.noop(f"unit {paths.unit_name} is absent")
        return
    if st["active_state"] in ("active", "activating", "reloading", "deactivating"):
        yield _systemctl("stop", paths.unit_name)
    if st["unit_file_state"] in ("enabled", "enabled-runtime", "linked"):
        yield _systemctl("disable", paths.unit_name)
    if st["active_state"] == "failed":
        yield _systemctl("reset-failed", paths.unit_name)
    yield StringCommand(
        "rm", "-f", *[QuoteString(p) for p in (paths.unit, paths.env, paths.secret, paths.marker)]
    )
    yield StringCommand("rm", "-rf", QuoteString(paths.log_dir))
    yield _systemctl("daemon-reload")


@operation()
def restart_pending(settings: Settings | None = None, reason: str = "the software or weights"):
    """
    Mark the SGLang server for a restart by the next ``server.service``, even across failed runs.

    + settings: the deploy's ``Settings``; default: the host's ``specfleet`` data
    + reason: what changed, kept in the marker and shown when the restart happens

    Gate it on the steps whose change needs a restart, with ``_if=any_changed(...)``: it always
    writes the marker when it runs.

    **Example:**

    .. code:: python

        server.restart_pending(
            name="Restart for new software or weights",
            reason="the software or weights",
            _if=any_changed(software, weights),
        )
    """
    yield from _per_host(_restart_pending(settings, reason))


def _restart_pending(settings: Settings | None, reason: str):
    paths = server_paths(_settings(settings))
    yield _marker_command(paths, f"{reason} changed")


@operation()
def group_restart(settings: Settings | None = None):
    """
    Restart a serving group as one: when any member is marked for a restart, mark and stop every
    member, so that the next ``server.service`` starts them all together.

    + settings: the deploy's ``Settings``; default: the host's ``specfleet`` data

    Run it after every step that may mark a restart (``server.unit``, ``server.restart_pending``)
    and before ``server.service``: pyinfra runs an operation on every host before the next one, so
    each member sees the others' markers here. Restarting members one at a time would let a
    surviving rank meet a new one half-way (SGLang's ranks end on a lost peer, and systemd would
    restart them into the middle of the new start); stopping all first starts the group clean.
    A host that serves alone is left as it is.
    """
    yield from _per_host(_group_restart(settings))


def _group_restart(settings: Settings | None):
    s = _settings(settings)
    g = s.group
    if g is None:
        host.noop("serves alone: no serving group to restart together")
        return
    paths = server_paths(s)
    own = _state(paths, unit_files(paths))
    marked: dict[str, str] = {}
    if own["restart_pending"]:
        marked[host.name] = own["restart_pending"]
    for name in g.members:
        peer = state.inventory.get_host(name, default=None)
        if name == host.name or peer is None:
            continue
        peer_settings = settings_for_host(peer)
        peer_state = peer.get_fact(ServiceState, **service_state_args(peer_settings))
        if peer_state and peer_state.get("restart_pending"):
            marked[name] = peer_state["restart_pending"]
    if not marked:
        host.noop(f"no member of serving group {g.name} is marked for a restart")
        return
    others = [n for n in g.members if n in marked and n != host.name]
    if host.name not in marked:
        yield _marker_command(
            paths, f"serving group {g.name} restarts: {others[0]}: {marked[others[0]]}"
        )
    if own["active_state"] in ("active", "activating", "reloading"):
        host.log(f"stopping {paths.unit_name}: serving group {g.name} restarts as one "
                 f"({', '.join(sorted(marked))} marked)", logger.info)  # fmt: skip
        yield _systemctl("stop", paths.unit_name)
    elif host.name in marked:
        host.noop(f"{paths.unit_name} is stopped and marked: serving group {g.name} starts as one")


@operation()
def service(
    settings: Settings | None = None,
    running: bool = True,
    enabled: bool | None = True,
    ready: bool = True,
):
    """
    Run the SGLang server unit: reload, enable, (re)start only when something changed, then gate.

    + settings: the deploy's ``Settings``; default: the host's ``specfleet`` data
    + running: whether the server should be running
    + enabled: whether the unit should start at boot (``None`` leaves it as it is)
    + ready: after a (re)start, wait for readiness (``server.ready``) before clearing the marker

    It restarts only when the restart-pending marker is there (written by ``server.unit`` when the
    unit, env or key changed, or by ``server.restart_pending``), and starts a stopped server. The
    marker is removed only after the server passed the readiness gate, so a run that fails before
    then restarts on the next run instead of reporting "no change" over a stale server.

    A restart is recorded in the marker (the invocation it started, when, and the unit's files it
    started from). A later run that finds the marker with that record, the same server up and
    its files unchanged (a gate that ran out of budget while the model loaded, a dropped SSH
    session) waits on that server with what is left of the budget since its start, and says so,
    instead of restarting it again; it restarts it only when its files changed since or it died
    (``start_decision``).
    """
    yield from _per_host(_service(settings, running, enabled, ready))


def _service(settings: Settings | None, running: bool, enabled: bool | None, ready: bool):
    s = _settings(settings)
    paths = server_paths(s)
    st = _state(paths, unit_files(paths))
    pending = st["restart_pending"]
    fingerprint = files_fingerprint(st["files"])
    if paths.unit not in st["files"]:
        if state.is_executing and running:
            raise SpecfleetError(
                f"there is no unit file {paths.unit}",
                host=host.name,
                fix="run server.unit before server.service",
            )
        # --dry on a fresh host: server.unit will have written it by the time this executes.
        pending = pending or "the unit is new"
        decision = StartDecision("restart", pending)
    else:
        decision = start_decision(st, fingerprint)
    waiting = running and decision.action == "wait"

    commands: list[Any] = []
    if (pending and not waiting) or st["need_daemon_reload"] or st["load_state"] != "loaded":
        commands.append(_systemctl("daemon-reload"))
    if enabled is True and st["unit_file_state"] != "enabled":
        commands.append(_systemctl("enable", paths.unit_name))
    elif enabled is False and st["unit_file_state"] == "enabled":
        commands.append(_systemctl("disable", paths.unit_name))

    active = st["active_state"] in ("active", "activating", "reloading")
    if running:
        if waiting:
            verb = "waiting on" if state.is_executing else "will wait on"
            host.log(f"{verb} {paths.unit_name}: {decision.why}", logger.info)
            if ready:
                commands += list(_ready(settings=s, started_at=decision.started_at))
            commands.append(StringCommand("rm", "-f", QuoteString(paths.marker)))
        elif decision.action in ("restart", "start"):
            start = decision.action
            if start == "restart":
                verb = "restarting" if state.is_executing else "will restart"
                host.log(f"{verb} {paths.unit_name}: {decision.why}", logger.info)
            elif decision.why:
                verb = "starting" if state.is_executing else "will start"
                host.log(f"{verb} {paths.unit_name}: {decision.why}", logger.info)
            if st["active_state"] == "failed" or st["result"] == "start-limit-hit":
                commands.append(_systemctl("reset-failed", paths.unit_name))
            commands.append(_systemctl(start, paths.unit_name))
            if start == "restart":
                commands.append(_record_restart_command(paths, pending, fingerprint))
            if ready:
                commands += list(_ready(settings=s))
            commands.append(StringCommand("rm", "-f", QuoteString(paths.marker)))
    elif active or st["active_state"] == "deactivating":
        commands.append(_systemctl("stop", paths.unit_name))

    if not commands:
        host.noop(
            f"service {paths.unit_name} is {'running' if running else 'stopped'}"
            + (f" and {'enabled' if enabled else 'disabled'}" if enabled is not None else "")
        )
        return
    yield from commands


def _record_restart_command(paths: ServerPaths, reason: str, fingerprint: str) -> StringCommand:
    """Record in the marker, right after ``systemctl restart``, the invocation that restart
    started, the host time and the fingerprint of the files it started from
    (``facts.serving.STARTED_MARK``), so that a later run waits on that server instead of
    restarting it again. Best effort: without a record the next run restarts, as it always did."""
    script = (
        'inv=$(systemctl show -p InvocationID --value "$2" 2>/dev/null); '
        'if [ -n "$inv" ]; then printf "%s\\n%sinvocation=%s at=%s files=%s\\n" "$3" "$4" "$inv" '
        '"$(date +%s)" "$5" > "$1.tmp" && mv -f "$1.tmp" "$1"; fi; true'
    )
    return StringCommand(
        "sh", "-c", QuoteString(script), "specfleet", QuoteString(paths.marker),
        QuoteString(paths.unit_name), QuoteString(reason), QuoteString(STARTED_MARK),
        QuoteString(fingerprint),
    )  # fmt: skip


@operation(is_idempotent=False, idempotent_notice="A check: it always polls the server.")
def ready(
    settings: Settings | None = None,
    timeout_s: float | None = None,
    model_path: str | None = None,
):
    """
    Wait until the SGLang server serves: poll from the host, fail fast, quote the journal.

    + settings: the deploy's ``Settings``; default: the host's ``specfleet`` data
    + timeout_s: the budget in seconds; default ``settings.readiness_timeout_s`` (3600)
    + model_path: the ``model_path`` ``/get_model_info`` must report; default: the running
      server's own ``--model-path``

    A small script run on the host (its source sent on stdin) polls ``/health_generate`` then
    ``/get_model_info`` on the address the unit's process was started with, printing progress.
    It fails at once when systemd reports the unit failed (``start-limit-hit`` included) or
    stopped, or when the port is served by a process outside the unit, and the error quotes the
    unit's last journal lines (with any API key redacted).
    """
    yield from _per_host(_ready(settings=settings, timeout_s=timeout_s, model_path=model_path))


def _ready(settings: Settings | None = None, timeout_s=None, model_path=None,
           started_at: int | None = None):  # fmt: skip
    """The gate's command; ``started_at`` (host time): the budget counts from then, the start of
    a server restarted by an earlier run and waited on now, instead of from the gate's start."""
    s = _settings(settings)
    paths = server_paths(s)
    budget = float(timeout_s if timeout_s is not None else s.readiness_timeout_s)
    # The gate runs as `python3 - ARGS` with its source on stdin: nothing to upload or diff.
    argv = [
        "python3", "-", "--unit", paths.unit_name, "--host", s.listen_host,
        "--port", str(s.port), "--timeout", str(int(budget)),
    ]
    if has_api_key(s):
        argv += ["--secret-file", paths.secret]
    if model_path:
        argv += ["--model-path", model_path]
    if started_at is not None:
        argv += ["--started-at", str(int(started_at))]
    if s.probe.enable:
        argv += ["--probe", json.dumps(probe_spec(s.probe, host.name))]
    group = None
    if s.group is not None:
        # Rank 0's gate proves the group; when it fails, say which members never joined.
        group = (s.group.name, [
            (name, server_paths(settings_for_host(peer)).unit_name)
            for name in s.group.members[1:]
            if (peer := state.inventory.get_host(name, default=None)) is not None
        ])  # fmt: skip
    yield check_command(
        _run_gate, (argv, paths.unit_name, budget, patch_state_dir(s.venv)), {"group": group}
    )


def gate_source() -> str:
    """The readiness gate as the host runs it (from stdin): the redaction module's source ahead
    of the gate's, so that its journal excerpt is redacted by the one set of rules."""
    return ship_ahead_of(GATE_SCRIPT.read_text())


def probe_spec(probe: ProbeOptions, host_name: str = "") -> dict[str, Any]:
    """The gate's correctness probe (``--probe``): the settings' questions and thresholds, or a
    probe file's (``probe.file`` on the control machine, read now, at deploy time)."""
    if probe.file is not None:
        path = os.path.expanduser(probe.file)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(
                f"probe.file {probe.file} cannot be read on the control machine "
                f"({getattr(exc, 'strerror', None) or exc})", host=host_name,
                fix="point probe.file at a JSON probe file, or unset it for the default probe",
            ) from None
        probe = probe_from_file(probe, text, probe.file, host_name)
    return {
        "questions": [{"prompt": q.prompt, "answer": q.answer} for q in probe.questions],
        "min_correct": probe.min_correct, "max_tokens": probe.max_tokens,
        "concurrency": probe.concurrency, "min_accept_length": probe.min_accept_length,
        "timeout_s": probe.timeout_s,
    }


JOURNAL_LINES = 30
# What a dropped SSH session raises from a command (paramiko, sockets, pyinfra's reconnect).
CONNECTION_ERRORS = (SSHException, EOFError, OSError, ConnectError)


def _run_gate(
    state, host, argv: list[str], unit_name: str, budget: float, patch_dir: str | None = None,
    group: tuple[str, list[tuple[str, str]]] | None = None,
) -> bool:  # fmt: skip
    """Run the gate on the host, its progress printed live; on failure, quote the journal. A
    PR#20547 port applied in this run (``unproven``) is proven by a passing gate and rolled back by
    a failing one (remembered as rejected, so the next run keeps v1 instead of applying it
    again). A dropped SSH session fails the host with what happened and what the next run does,
    not a traceback; a timeout of the op stays pyinfra's to report."""
    script = gate_source()
    try:
        return _gate(state, host, argv, unit_name, budget, patch_dir, script, group)
    except TimeoutError:
        raise
    except CONNECTION_ERRORS as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        error = SpecfleetError(
            f"the SSH connection to the host was lost during the readiness gate of {unit_name} "
            f"({detail}); whether the server is ready is not known",
            host=host.name,
            fix="check that the host is reachable (network, sshd) and run again: the restart stays "
            "pending, and the next run waits on the server if it is still starting (it restarts "
            "it only if its unit changed or it died, and its gate proves or rolls back a "
            "PR#20547 port applied in this run)",
        )  # fmt: skip
        return record_failure(state, host, error.render())


def _gate(
    state, host, argv: list[str], unit_name: str, budget: float, patch_dir: str | None,
    script: str, group: tuple[str, list[tuple[str, str]]] | None = None,
) -> bool:  # fmt: skip
    # The op's connector arguments (_sudo, _su_user, ...) apply to the gate's commands too.
    connector_args: dict[str, Any] = {}
    if host.executing_op_hash:
        global_args = state.get_op_data_for_host(host, host.executing_op_hash).global_arguments
        connector_args = {k: v for k, v in global_args.items() if k in CONNECTOR_ARGUMENT_KEYS}
    connector_args["_timeout"] = int(budget) + 120
    connector_args["_stdin"] = script
    ok, output = host.run_shell_command(
        StringCommand(*[QuoteString(a) for a in argv]),
        print_output=True,
        print_input=False,
        **connector_args,
    )
    if ok:
        if patch_dir:
            connector_args.pop("_stdin", None)
            host.run_shell_command(
                StringCommand("rm", "-f", QuoteString(f"{patch_dir}/unproven")),
                print_output=False, print_input=False, **connector_args,
            )  # fmt: skip
        return True
    rolled_back = _reject_unproven_port(host, patch_dir, connector_args)
    lines = output.output_lines if output else []
    since = next((m.group(1) for ln in lines if (m := re.search(r"since @(\d+)", ln))), None)
    failed = next((ln.split("FAILED ", 1)[1] for ln in lines if "gate: FAILED " in ln), None)
    last = lines[-1] if lines else "no output"
    problem = f"not ready {failed}" if failed else f"the gate failed: {last}"
    journal: list[str] = []
    if since is not None:
        connector_args["_timeout"] = 60
        _, out = host.run_shell_command(
            StringCommand(
                *[QuoteString(a) for a in argv],
                "--journal-since", since, "--journal-lines", str(JOURNAL_LINES),
            ),
            print_output=False,
            print_input=False,
            **connector_args,
        )
        journal = [ln[2:] for ln in (out.output_lines if out else []) if ln.startswith("| ")]
    excerpt = "\n".join(f"    | {ln}" for ln in journal)
    if group is not None:
        problem += _group_diagnosis(state, group)
    error = SpecfleetError(
        f"{unit_name} {problem}"
        + (f"\n  last {len(journal)} journal lines of {unit_name}:\n{excerpt}" if journal else ""),
        host=host.name,
        fix=f"read `journalctl -u {unit_name}` on the host, fix the cause (settings, software, "
        "weights) and run again: the restart stays pending until the server is ready (a server "
        "still starting is waited on, not restarted, unless its unit changes or it dies)",
    )
    record_failure(state, host, error.render())
    if rolled_back:
        logger.error(
            f"{host.print_prefix}rolled back the PR#20547 port applied in this run (the server did "
            "not pass readiness with it): the next run restarts the server on DFLASH v1; delete "
            f"{rolled_back} on the host to try the port again"
        )
    return False


def _group_diagnosis(state, group: tuple[str, list[tuple[str, str]]]) -> str:
    """What each other member of a serving group was doing when rank 0's gate failed: its unit's
    state and its last journal line (a rank that cannot reach the rendezvous says so there)."""
    name, members = group
    down, up = [], []
    for rank, (member, unit_name) in enumerate(members, start=1):
        peer = state.inventory.get_host(member, default=None)
        script = (
            'printf "%s|" "$(systemctl is-active "$1" 2>/dev/null)"; '
            # The server's own lines (_SYSTEMD_UNIT), not systemd's about it; no access log.
            'journalctl _SYSTEMD_UNIT="$1" -n 40 --no-pager -o cat 2>/dev/null | '
            'grep -v "\\"GET /" | tail -n 1'
        )
        try:
            _, out = peer.run_shell_command(
                StringCommand("sh", "-c", QuoteString(script), "specfleet", QuoteString(unit_name)),
                print_output=False, print_input=False, _timeout=30,
            )  # fmt: skip
        except CONNECTION_ERRORS as exc:
            down.append(f"{member} (rank {rank}): not reachable over SSH ({exc})")
            continue
        active, _, last = " ".join(out.output_lines if out else []).strip().partition("|")
        state_text = active or "unknown"
        note = f"{member} (rank {rank}): server {state_text}, last log: {last.strip() or '-'}"
        (up if active == "active" else down).append(note)
    if down:
        return f"; serving group {name}: members not running: " + "; ".join(down)
    return f"; serving group {name}: every member's server runs: " + "; ".join(up)


def _reject_unproven_port(host, patch_dir: str | None, connector_args: dict) -> str | None:
    """Restore a port that has not passed a gate yet; returns the rejection file, or None."""
    if not patch_dir:
        return None
    d = shlex.quote(patch_dir)
    rejected = rejected_port_path(patch_dir)
    script = (
        f'if [ -f {d}/unproven ] && [ -f {d}/sha256 ]; then '
        f'cp {d}/sha256 {shlex.quote(rejected)}; {restore_script(patch_dir)}\n'
        "echo rolled-back; fi"
    )
    args = {k: v for k, v in connector_args.items() if k != "_stdin"}
    args["_timeout"] = 300
    ok, out = host.run_shell_command(
        StringCommand("sh", "-c", QuoteString(script)), print_output=False, print_input=False,
        **args,
    )  # fmt: skip
    lines = out.output_lines if out else []
    return rejected if ok and "rolled-back" in lines else None
