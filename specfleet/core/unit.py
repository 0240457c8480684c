"""The SGLang server's systemd unit, as pure functions: quoting for systemd, ``ExecStart``, the
environment and logging config, what the unit's templates read, the start decision, and the plan
from the facts of one probe. ``operations/serving.py`` runs them; nothing here touches a host.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from specfleet.core.layout import join, model_root, server_paths
from specfleet.core.plan import GPUS, SGLANG, TOPOLOGY, PlanError, make_plan
from specfleet.core.plan.group import GroupMember, make_group_plan
from specfleet.core.resources import hostside_path, template_path
from specfleet.core.settings import Settings
from specfleet.hostside.readiness_gate import argv_value

UNIT_TEMPLATE = template_path("sglang.service.j2")


ENV_TEMPLATE = template_path("sglang.env.j2")


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
    return {key: join(root, sub) for key, sub in CACHE_ENV}



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



def secret_yaml(api_key: str) -> str:
    """The ``--config`` YAML holding the API key (a JSON string is a YAML double-quoted scalar)."""
    if not api_key or any(ord(c) < 32 or ord(c) > 126 for c in api_key):
        raise ValueError("the API key must be printable ASCII")
    return "# Managed by specfleet. The SGLang API key, read through --config.\n" + (
        f"api-key: {json.dumps(api_key)}\n"
    )




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



def sha1_text(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()  # noqa: S324 (compared with sha1sum)



def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]



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
    """What ``serving.service`` does for a server that should run.

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



def weights_key(name: str) -> str:
    return f"weights_{name}"



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
        drafter_dir = model_root(settings, "drafter")
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
        current = (facts.get(weights_key(name)) or {}).get("current")
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

