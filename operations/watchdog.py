"""Day two on the host: the health watchdog's unit (with its ``/metrics`` relay), and the deploy's
record of what it set up, which the watchdog exports as a node-exporter textfile.

Every path is ``specfleet.core.layout.watchdog_paths``.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.cache import cached_fact
from facts.serving import ServiceState
from facts.weights import WeightsState
from operations.server_facts import group_peers, host_address, service_state_args, unit_facts
from operations.util import fails_host, render, systemctl, unit_removal
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import WatchdogPaths, model_root, server_paths, watchdog_paths
from specfleet.core.monitoring import deploy_state, watchdog_config
from specfleet.core.resources import hostside_path, template_path
from specfleet.core.settings import Settings
from specfleet.core.unit import plan_from_facts, sha1_text

UNIT_TEMPLATE = template_path("specfleet-watchdog.service.j2")
PROGRAM = hostside_path("watchdog.py")
RUN_LOCK = hostside_path("run_lock.py")


def managed_files(paths: WatchdogPaths) -> list[str]:
    """The files this operation writes (the state and textfile are the program's own)."""
    return [paths.unit, paths.program, paths.run_lock, paths.config]


def state_args(settings: Settings) -> dict[str, Any]:
    """``ServiceState``'s arguments for the watchdog's unit (``operations.probe`` asks them too)."""
    paths = watchdog_paths(settings)
    return {"service": paths.unit_name, "paths": [*managed_files(paths), paths.deploy_state]}


def desired_files(settings: Settings) -> dict[str, tuple[str, int]]:
    """``{path: (text, mode)}`` of every file the watchdog needs."""
    paths = watchdog_paths(settings)
    unit = render(UNIT_TEMPLATE, {
        "service_name": settings.service_name, "server_unit": f"{settings.service_name}.service",
        "program": paths.program, "config": paths.config, "unit_name": paths.unit_name,
    })  # fmt: skip
    config = json.dumps(watchdog_config(settings), indent=2, sort_keys=True) + "\n"
    return {
        paths.unit: (unit, 644),
        paths.program: (PROGRAM.read_text(), 644),
        paths.run_lock: (RUN_LOCK.read_text(), 644),
        paths.config: (config, 644),
    }


def _state(settings: Settings) -> dict[str, Any]:
    st = cached_fact(host, ServiceState, **state_args(settings))
    if st is None:
        raise SpecfleetError(
            "systemctl is not on this host: the watchdog runs as a systemd unit",
            host=host.name,
            fix="run specfleet on a host booted with systemd, or set watchdog.enable to False",
        )
    return st


def _matches(st: dict[str, Any], path: str, text: str, mode: int) -> bool:
    info = st["files"].get(path)
    return info is not None and info["sha1"] == sha1_text(text) and info["mode"] == mode


def _write(path: str, text: str, mode: int) -> StringCommand:
    """Write ``path`` through stdin, then rename it into place."""
    script = ('mkdir -p "$(dirname "$1")" && cat > "$1.tmp" && chmod "$2" "$1.tmp" '
              '&& mv -f "$1.tmp" "$1"')  # fmt: skip
    return StringCommand("sh", "-c", QuoteString(script), "specfleet", QuoteString(path),
                         str(mode), _stdin=text)  # fmt: skip


@operation()
@fails_host(all_or_nothing=True)
def service(settings: Settings, present: bool = True):
    """
    The health watchdog of the SGLang server, as a systemd unit of its own.

    + settings: the deploy's ``Settings``
    + present: ``False`` (or ``watchdog.enable`` False) stops, disables and removes it

    It installs ``specfleet/hostside/watchdog.py`` (and ``run_lock.py`` beside it) and its JSON
    config, and (re)starts the unit when any of them changed. A restart of the watchdog never
    restarts the server.
    """
    yield from _service(settings, present)


def _service(settings: Settings, present: bool):
    s = settings
    paths = watchdog_paths(s)
    st = _state(s)
    if not present or not s.watchdog.enable:
        yield from _absent(paths, st)
        return
    stale = {p: (t, m) for p, (t, m) in desired_files(s).items() if not _matches(st, p, t, m)}
    commands = [_write(p, t, m) for p, (t, m) in stale.items()]
    if paths.unit in stale or st["need_daemon_reload"] or st["load_state"] != "loaded":
        commands.append(systemctl("daemon-reload"))
    if st["unit_file_state"] != "enabled":
        commands.append(systemctl("enable", paths.unit_name))
    if stale:
        names = ", ".join(posixpath.basename(p) for p in stale)
        # --dry prepares the same commands: it must not say it restarts anything.
        verb = "restarting it" if host.state.is_executing else "will restart it"
        host.log(f"watchdog {paths.unit_name}: {names} changed, {verb}")
        commands.append(systemctl("restart", paths.unit_name))
    elif st["active_state"] not in ("active", "activating", "reloading"):
        commands.append(systemctl("reset-failed", paths.unit_name))
        commands.append(systemctl("start", paths.unit_name))
    if not commands:
        host.noop(f"watchdog {paths.unit_name} is running and up to date")
        return
    yield from commands


def _absent(paths: WatchdogPaths, st: dict[str, Any]):
    present = [p for p in managed_files(paths) if p in st["files"]]
    if not present and st["load_state"] in ("not-found", ""):
        host.noop(f"watchdog {paths.unit_name} is absent")
        return
    yield from unit_removal(paths.unit_name, st, paths.files(), [paths.folder])


@operation()
@fails_host(all_or_nothing=True)
def deploy_record(settings: Settings):
    """
    Record what this deploy set up (SGLang version, PR#20547 state, revisions, the unit's hash,
    each model's manifest check) for the watchdog's textfile. The record holds no time: a
    converged run leaves it as it is, and its mtime is when the setup last changed.

    + settings: the deploy's ``Settings``
    """
    yield from _deploy_record(settings)


def _weights_ok(s: Settings) -> dict[str, bool]:
    out = {}
    for which in ("target", "drafter"):
        src = getattr(s, which)
        facts = cached_fact(host, WeightsState, path=model_root(s, which))
        revisions = (facts or {}).get("revisions") or {}
        rev = src.revision if src.revision and not src.follow_branch else (facts or {}).get(
            "current")
        info = revisions.get(rev) or {}
        out[which] = bool(info.get("complete")) and not info.get("changed") and not info.get(
            "missing")
    return out


def _deploy_record(settings: Settings):
    s = settings
    paths = watchdog_paths(s)
    if not s.watchdog.enable:
        host.noop("no deploy record: watchdog.enable is False (the watchdog exports it)")
        return
    server = server_paths(s)
    unit_st = cached_fact(host, ServiceState, **service_state_args(s))
    unit_sha = ((unit_st or {}).get("files", {}).get(server.unit) or {}).get("sha1", "")
    # The facts the unit step read (the probe's, on a converged host: no command more).
    build = plan_from_facts(
        s, unit_facts(s, server.unit_files()), host.name, group_peers(s), host_address(host)
    ).build
    record = deploy_state(build, unit_sha[:16], _weights_ok(s))
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    if _matches(_state(s), paths.deploy_state, text, 644):
        host.noop(f"deploy record {paths.deploy_state} is up to date")
        return
    yield _write(paths.deploy_state, text, 644)
