"""Run the SGLang server under systemd: a unit from the plan, restart only on change, readiness.

The unit's decisions are pure and live in ``specfleet.core.unit`` (re-exported here, where the
README's examples and the tests read them); this module holds the operations.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.operations import files

from facts.serving import STARTED_MARK, ServiceState
from operations.readiness import GATE_SCRIPT, gate_source, probe_spec, run_gate  # noqa: F401
from operations.server_facts import (  # noqa: F401 (callers read them here)
    current_plan,
    group_peers,
    host_address,
    host_specs,
    say_plan,
    service_state,
    service_state_args,
    unit_facts,
)
from operations.util import (  # noqa: F401 (render: callers read it here)
    JINJA,
    check_command,
    fails_host,
    read_secret_file,
    render,
    systemctl,
    unit_removal,
)
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import (
    ServerPaths,
    patch_state_dir,
    server_paths,
)
from specfleet.core.settings import Settings, api_key_chars_ok, settings_for_host
from specfleet.core.unit import (  # noqa: F401 (the unit's pure half, read here by callers)
    DRAFTER_CONFIG,
    ENV_TEMPLATE,
    LOG_MODULE,
    PATCH_SHA,
    SERVICE,
    UNIT_TEMPLATE,
    CurrentPlan,
    Peer,
    StartDecision,
    argv_value,
    build_info,
    exec_start,
    files_fingerprint,
    has_api_key,
    logging_config,
    plan_from_facts,
    secret_yaml,
    server_env,
    sha1_text,
    short_hash,
    start_decision,
    systemd_quote,
    unit_context,
    weights_key,
)


def read_api_key_file(path: str) -> str:
    """The API key in ``path`` (``api_key_file``, on the control machine), read now: one line of
    printable ASCII without spaces."""
    text = read_secret_file(path, "api_key_file", "the key",
                            ", or unset api_key_file for a server without a key")
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


def _marker_command(paths: ServerPaths, reason: str) -> StringCommand:
    script = 'mkdir -p "$(dirname "$1")" && printf "%s\\n" "$2" > "$1"'
    return StringCommand(
        "sh", "-c", QuoteString(script), "specfleet", QuoteString(paths.marker), QuoteString(reason)
    )


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


# --------------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------------


@operation()
@fails_host(all_or_nothing=True)
def unit(settings: Settings, present: bool = True):
    """
    Render the SGLang server's systemd unit and environment file from the plan, computed now.

    + settings: the deploy's ``Settings``
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

        unit = serving.unit(name="Render the SGLang unit")
        serving.restart_pending(name="Restart for new software or weights",
                               _if=any_changed(software, weights))
        serving.service(name="Run the SGLang server", running=True, enabled=True)
    """
    yield from _unit(settings, present)


def _unit(settings: Settings, present: bool):
    s = settings
    paths = server_paths(s)
    files_ = paths.unit_files()

    if not present:
        yield from _absent(paths, service_state(paths))
        return

    # One command reads the unit's state and everything the plan needs, as they are now.
    facts = unit_facts(s, files_)
    st = facts[SERVICE]
    current = plan_from_facts(s, facts, host.name, group_peers(s), host_address(host))
    if not state.is_executing:  # planning (--dry): every host's plan, shown and kept
        say_plan(current)
    elif current.predicted_because:
        raise SpecfleetError(
            f"cannot write the unit from a predicted plan: {current.predicted_because}",
            host=host.name,
            fix="run the SGLang install and the weights steps before serving.unit "
            "(deploys/kimi_k26.py does it in that order)",
        )

    try:
        texts = server_texts(s, current)
    except ValueError as exc:
        raise SpecfleetError(
            f"the plan cannot be written as a systemd unit: {exc}",
            host=host.name,
            fix="change the offending value in the settings (plan.extra_args / extra_env)",
        ) from None

    ctx = unit_context(current.argv, current.env, s, current.build, current.predicted_because)
    secret = texts["secret"]
    changes: list[Any] = []
    changed: list[str] = []
    for template, key, mode, what in (
        (UNIT_TEMPLATE, "unit", 644, "the unit"),
        (ENV_TEMPLATE, "env", 600, "the environment file"),
    ):
        dest = paths.files()[key]
        if not _file_matches(st, dest, texts[key], mode):
            changed.append(what)
            changes += list(
                files.template._inner(
                    src=str(template),
                    dest=dest,
                    user="root",
                    group="root",
                    mode=mode,
                    jinja_env_kwargs=dict(JINJA),
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
        for dest, text in ((paths.log_config, texts["log_config"]),
                           (paths.log_module, texts["log_module"]))
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


def server_texts(s: Settings, current: Any) -> dict[str, str | None]:
    """What a deploy writes into each of the server's files (``ServerPaths.files``, by key) for
    the plan ``current``: None where it writes nothing (no API key). The deploy writes these and
    ``specfleet status`` compares them, so the two agree on every file. ValueError: the plan
    cannot be written as a unit."""
    ctx = unit_context(current.argv, current.env, s, current.build, current.predicted_because)
    key = api_key(s)
    return {
        "unit": render(UNIT_TEMPLATE, ctx),
        "env": render(ENV_TEMPLATE, ctx),
        "secret": secret_yaml(key) if key is not None else None,
        "log_config": logging_config(s, current.argv),
        "log_module": LOG_MODULE.read_text(),
    }


def _absent(paths: ServerPaths, st: dict[str, Any]):
    present = [p for p in paths.unit_files() if p in st["files"]]
    loaded = st["load_state"] not in ("not-found", "")
    if not present and not loaded and st["restart_pending"] is None:
        host.noop(f"unit {paths.unit_name} is absent")
        return
    yield from unit_removal(paths.unit_name, st, [*paths.unit_files(), paths.marker],
                            [paths.log_dir])


@operation()
@fails_host(all_or_nothing=True)
def restart_pending(settings: Settings, reason: str = "the software or weights"):
    """
    Mark the SGLang server for a restart by the next ``serving.service``, even across failed runs.

    + settings: the deploy's ``Settings``
    + reason: what changed, kept in the marker and shown when the restart happens

    Gate it on the steps whose change needs a restart, with ``_if=any_changed(...)``: it always
    writes the marker when it runs.

    **Example:**

    .. code:: python

        serving.restart_pending(
            name="Restart for new software or weights",
            reason="the software or weights",
            _if=any_changed(software, weights),
        )
    """
    yield from _restart_pending(settings, reason)


def _restart_pending(settings: Settings, reason: str):
    paths = server_paths(settings)
    yield _marker_command(paths, f"{reason} changed")


@operation()
@fails_host(all_or_nothing=True)
def group_restart(settings: Settings):
    """
    Restart a serving group as one: when any member is marked for a restart, mark and stop every
    member, so that the next ``serving.service`` starts them all together.

    + settings: the deploy's ``Settings``

    Run it after every step that may mark a restart (``serving.unit``, ``serving.restart_pending``)
    and before ``serving.service``: pyinfra runs an operation on every host before the next one, so
    each member sees the others' markers here. Restarting members one at a time would let a
    surviving rank meet a new one half-way (SGLang's ranks end on a lost peer, and systemd would
    restart them into the middle of the new start); stopping all first starts the group clean.
    A host that serves alone is left as it is.
    """
    yield from _group_restart(settings)


def _group_restart(settings: Settings):
    s = settings
    g = s.group
    if g is None:
        host.noop("serves alone: no serving group to restart together")
        return
    paths = server_paths(s)
    own = service_state(paths)
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
        yield systemctl("stop", paths.unit_name)
    elif host.name in marked:
        host.noop(f"{paths.unit_name} is stopped and marked: serving group {g.name} starts as one")


@operation()
@fails_host(all_or_nothing=True)
def service(
    settings: Settings,
    running: bool = True,
    enabled: bool | None = True,
    ready: bool = True,
):
    """
    Run the SGLang server unit: reload, enable, (re)start only when something changed, then gate.

    + settings: the deploy's ``Settings``
    + running: whether the server should be running
    + enabled: whether the unit should start at boot (``None`` leaves it as it is)
    + ready: after a (re)start, wait for readiness (``serving.ready``) before clearing the marker

    It restarts only when the restart-pending marker is there (written by ``serving.unit`` when the
    unit, env or key changed, or by ``serving.restart_pending``), and starts a stopped server. The
    marker is removed only after the server passed the readiness gate, so a run that fails before
    then restarts on the next run instead of reporting "no change" over a stale server.

    A restart is recorded in the marker (the invocation it started, when, and the unit's files it
    started from). A later run that finds the marker with that record, the same server up and
    its files unchanged (a gate that ran out of budget while the model loaded, a dropped SSH
    session) waits on that server with what is left of the budget since its start, and says so,
    instead of restarting it again; it restarts it only when its files changed since or it died
    (``start_decision``).
    """
    yield from _service(settings, running, enabled, ready)


def _service(settings: Settings, running: bool, enabled: bool | None, ready: bool):
    s = settings
    paths = server_paths(s)
    st = service_state(paths)
    pending = st["restart_pending"]
    fingerprint = files_fingerprint(st["files"])
    if paths.unit not in st["files"]:
        if state.is_executing and running:
            raise SpecfleetError(
                f"there is no unit file {paths.unit}",
                host=host.name,
                fix="run serving.unit before serving.service",
            )
        # --dry on a fresh host: serving.unit will have written it by the time this executes.
        pending = pending or "the unit is new"
        decision = StartDecision("restart", pending)
    else:
        decision = start_decision(st, fingerprint)
    waiting = running and decision.action == "wait"

    commands: list[Any] = []
    if (pending and not waiting) or st["need_daemon_reload"] or st["load_state"] != "loaded":
        commands.append(systemctl("daemon-reload"))
    if enabled is True and st["unit_file_state"] != "enabled":
        commands.append(systemctl("enable", paths.unit_name))
    elif enabled is False and st["unit_file_state"] == "enabled":
        commands.append(systemctl("disable", paths.unit_name))

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
                commands.append(systemctl("reset-failed", paths.unit_name))
            commands.append(systemctl(start, paths.unit_name))
            if start == "restart":
                commands.append(_record_restart_command(paths, pending, fingerprint))
            if ready:
                commands += list(_ready(settings=s))
            commands.append(StringCommand("rm", "-f", QuoteString(paths.marker)))
    elif active or st["active_state"] == "deactivating":
        commands.append(systemctl("stop", paths.unit_name))

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
@fails_host(all_or_nothing=True)
def ready(
    settings: Settings,
    timeout_s: float | None = None,
    model_path: str | None = None,
):
    """
    Wait until the SGLang server serves: poll from the host, fail fast, quote the journal.

    + settings: the deploy's ``Settings``
    + timeout_s: the budget in seconds; default ``settings.readiness_timeout_s`` (3600)
    + model_path: the ``model_path`` ``/get_model_info`` must report; default: the running
      server's own ``--model-path``

    A small script run on the host (its source sent on stdin) polls ``/health_generate`` then
    ``/get_model_info`` on the address the unit's process was started with, printing progress.
    It fails at once when systemd reports the unit failed (``start-limit-hit`` included) or
    stopped, or when the port is served by a process outside the unit, and the error quotes the
    unit's last journal lines (with any API key redacted).
    """
    yield from _ready(settings=settings, timeout_s=timeout_s, model_path=model_path)


def gate_command(settings: Settings, host_name: str, budget: float, model_path=None,
                 started_at: int | None = None) -> tuple[list[str], dict[str, Any] | None]:
    """The gate's argv and its correctness probe (None: off). The gate runs as `python3 - ARGS`
    with its source on stdin: nothing to upload or diff; the probe goes on stdin with it
    (``--probe-on-stdin``), never as an argv word (one is capped at 128 KiB: E2BIG)."""
    s = settings
    paths = server_paths(s)
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
    probe = probe_spec(s.probe, host_name) if s.probe.enable else None
    if probe is not None:
        argv.append("--probe-on-stdin")
    return argv, probe


def _ready(settings: Settings, timeout_s=None, model_path=None,
           started_at: int | None = None):  # fmt: skip
    """The gate's command; ``started_at`` (host time): the budget counts from then, the start of
    a server restarted by an earlier run and waited on now, instead of from the gate's start."""
    s = settings
    paths = server_paths(s)
    budget = float(timeout_s if timeout_s is not None else s.readiness_timeout_s)
    argv, probe = gate_command(s, host.name, budget, model_path, started_at)
    group = None
    if s.group is not None:
        # Rank 0's gate proves the group; when it fails, say which members never joined.
        group = (s.group.name, [
            (name, server_paths(settings_for_host(peer)).unit_name)
            for name in s.group.members[1:]
            if (peer := state.inventory.get_host(name, default=None)) is not None
        ])  # fmt: skip
    yield check_command(
        run_gate, (argv, paths.unit_name, budget, patch_state_dir(s.venv)),
        {"group": group, "probe": probe},
    )
