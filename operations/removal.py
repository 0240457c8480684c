"""Take a specfleet deploy off a host: ``removal.removed``, from the one list of what a deploy puts
there (``footprint``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.cache import cached_fact
from facts.removal import VENV_STATE_DIR, Leftovers
from facts.sglang import PatchState, RopePatchState
from operations.fanout import control_dir
from operations.sglang import patch_restore_steps, rope_restore_steps
from operations.util import fails_host, systemctl
from specfleet.core import layout
from specfleet.core.layout import lock_path, model_root, server_paths, watchdog_paths
from specfleet.core.settings import Settings
from specfleet.core.sglang.install import sibling_venv


@dataclass(frozen=True)
class Footprint:
    """Everything a specfleet deploy puts on a host, for one ``Settings``. A pattern may end in
    ``*`` (a prefix glob on the host)."""

    # Stopped, disabled and reset; their unit files are in ``paths``.
    units: tuple[str, ...]
    # Removed (``rm -rf``) once the units are stopped.
    paths: tuple[str, ...]
    # Removed when empty after that, deepest first.
    dirs: tuple[str, ...]
    # The venvs SGLang goes into: specfleet's own (created-by-specfleet) are removed; in another
    # the PR#20547 patch is restored and specfleet's folder removed, the venv kept.
    venvs: tuple[str, ...]
    # Kept unless ``removal.weights``: the models' folders and the server's compile caches.
    weights: tuple[str, ...]
    # Left while the run holds it: the run lock, released (deleted) at the end of the run.
    lock: str


def footprint(s: Settings) -> Footprint:
    """The one list of what specfleet puts on a host. Something new that a deploy writes goes
    here; a unit named ``specfleet-*`` or ``<service_name>-*`` (downloads, the fan-out, a
    watchdog) and a file under ``state_dir`` are already covered."""
    server = server_paths(s)
    name = s.service_name
    units = (server.unit_name, f"{name}-*", "specfleet-*")
    etc, secrets, opt = layout.ETC_DIR, layout.SECRETS_DIR, layout.OPT_DIR
    paths = (
        *(layout.join(layout.SYSTEMD_DIR, u) for u in units),
        server.env, server.secret, server.log_dir, server.marker,
        # the env file, logging config and any other config of this service (a watchdog's)
        layout.join(etc, f"{name}.*"), layout.join(etc, f"{name}-*"),
        layout.join(secrets, f"{name}.*"),
        # the weights tools and every other program folder (a venv found there is left to the
        # venv rules below)
        layout.TOOLS_PATH, layout.join(opt, "*"),
        # the HF token's copy, weights jobs, rollback points, fan-out state
        layout.join(s.state_dir, "*"),
        control_dir("") + "*",  # the fan-out's control folders in /run
        # the watchdog's node-exporter textfile (its unit, config and program are covered above)
        watchdog_paths(s).textfile,
    )  # fmt: skip
    dirs = (secrets, etc, opt)
    venvs = (s.venv.rstrip("/"), sibling_venv(s.venv, "") + "*")
    weights = (model_root(s, "target"), model_root(s, "drafter"), server.cache_root)
    return Footprint(units=units, paths=paths, dirs=dirs, venvs=venvs,
                     weights=weights, lock=lock_path(s))


_RUNNING = ("active", "activating", "reloading", "deactivating")
_ENABLED = ("enabled", "enabled-runtime", "linked", "linked-runtime", "alias")


@operation()
@fails_host
def removed(settings: Settings, weights: bool | None = None,
            venv: bool | None = None):
    """
    Take specfleet's deploy off the host: stop, disable and remove the server and every other
    specfleet unit (downloads, fan-out, watchdog), the env file, the API key and logging
    config, the host's copy of the HF token, the run state (rollback points, weights jobs,
    restart marker), the weights tools; restore PR#20547 in a venv specfleet patched and remove
    a venv specfleet created. What is removed is ``footprint``.

    + settings: the deploy's ``Settings``
    + weights: also remove the target's and drafter's folders and the server's compile caches
      (default: ``settings.removal.weights``, off: they took hours to download)
    + venv: also remove the configured venv when it is the user's own (default:
      ``settings.removal.venv``, off; a venv specfleet created is always removed)

    A second run finds nothing and changes nothing; a deploy afterwards converges again.
    """
    s = settings
    weights = s.removal.weights if weights is None else weights
    venv = s.removal.venv if venv is None else venv
    fp = footprint(s)
    found = cached_fact(host, Leftovers, paths=[*fp.paths, *(fp.weights if weights else ())],
                        units=list(fp.units), dirs=list(fp.dirs), venvs=list(fp.venvs))
    # The lock stays until the run releases it; a venv is never removed as a path, only by the
    # venv rules (nor a folder holding one).
    venvs = found["venvs"]
    paths = [p for p in found["paths"] if p != fp.lock
             and not any(v == p or v.startswith(p.rstrip("/") + "/") for v in venvs)]
    units = found["units"]
    commands: list[Any] = []
    what: list[str] = []
    for unit, st in sorted(units.items()):
        if st["active"] in _RUNNING:
            commands.append(systemctl("stop", unit))
            what.append(f"stops {unit}")
        if st["enabled"] in _ENABLED:
            commands.append(systemctl("disable", unit))
        if st["active"] == "failed":
            commands.append(systemctl("reset-failed", unit))
    kept: list[str] = []
    for path, info in sorted(venvs.items()):
        configured = path == fp.venvs[0]
        if info["created"] or (configured and venv):
            commands.append(StringCommand("rm", "-rf", QuoteString(path)))
            what.append(f"removes the venv {path}")
        elif info["specfleet"]:
            marker = cached_fact(host, PatchState, venv=path)
            restore = list(patch_restore_steps(path, marker))
            rope = cached_fact(host, RopePatchState, venv=path)
            restore += list(rope_restore_steps(path, rope))
            commands += restore
            commands.append(StringCommand(
                "rm", "-rf", QuoteString(f"{path}/{VENV_STATE_DIR}")))
            what.append(f"restores PR#20547 in {path}" if restore
                        else f"removes specfleet's state in {path}")
        elif configured:
            kept.append(f"the venv {path}")
    if paths:
        commands.append(StringCommand("rm", "-rf", *[QuoteString(p) for p in paths]))
        what.append(f"removes {len(paths)} files and folders ({', '.join(paths[:4])}"
                    f"{', ...' if len(paths) > 4 else ''})")
    if not commands and not found["empty_dirs"]:
        if not weights:
            kept.append("the weights")
        host.noop("specfleet's deploy is absent" + (f" ({' and '.join(kept)} kept)" if kept
                                                     else ""))
        return
    if units or any(p.endswith((".service", ".timer")) for p in paths):
        commands.append(systemctl("daemon-reload"))
    commands.append(StringCommand("rmdir", "--ignore-fail-on-non-empty",
                                  *[QuoteString(d) for d in fp.dirs], "2>/dev/null", "||", "true"))
    host.log(f"removal: {'; '.join(what) or 'removes empty folders'}")
    yield from commands
