"""Take a specfleet deploy off a host: ``removal.removed``, from the one list of what a deploy puts
there (``footprint``)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.cache import cached_fact
from facts.removal import VENV_STATE_DIR, Leftovers
from facts.sglang import PatchState, RopePatchState
from operations.fanout import control_dir, pull_unit
from operations.fanout import serve_unit as fanout_serve_unit
from operations.pr20547 import patch_restore_steps
from operations.sglang import rope_restore_steps
from operations.util import fails_host, systemctl
from operations.weights import unit_name as weights_unit_name
from specfleet.core import layout
from specfleet.core.layout import (
    bench_dir,
    control_token_path,
    fanout_dir,
    lock_path,
    model_root,
    rollback_paths,
    server_paths,
    watchdog_paths,
    weights_job_paths,
)
from specfleet.core.settings import Settings
from specfleet.core.sglang.install import sibling_venv


@dataclass(frozen=True)
class Footprint:
    """Everything a specfleet deploy puts on a host, for one ``Settings``: exact names, never a
    glob over a folder or a name prefix (a unit or path of the host's, or of another service,
    is never in it)."""

    # Stopped, disabled and reset: the server's and its watchdog's, by exact name; their unit
    # files are in ``paths``.
    units: tuple[str, ...]
    # The transient units specfleet names per run (a download's, a fan-out's), each a full
    # regular expression of the names specfleet gives them, and the systemctl pattern that
    # lists their candidates (a loaded unit is acted on only when its name matches exactly).
    unit_families: tuple[tuple[str, str], ...]
    # Removed (``rm -rf``) once the units are stopped: each a file or folder specfleet made.
    paths: tuple[str, ...]
    # Removed when empty after that, deepest first.
    dirs: tuple[str, ...]
    # The venvs SGLang goes into: specfleet's own (created-by-specfleet) are removed; in another
    # the PR#20547 patch is restored and specfleet's folder removed, the venv kept. The
    # configured one exactly; the ones beside it (``<venv>-sglang-*``) are acted on only by their
    # markers.
    venvs: tuple[str, ...]
    # Kept unless ``removal.weights``: the models' folders and the server's compile caches.
    weights: tuple[str, ...]
    # Left while the run holds it: the run lock, released (deleted) at the end of the run.
    lock: str


def _unit_family(prefix: str, tail: str) -> tuple[str, str]:
    return (re.escape(prefix) + tail + r"\.service", prefix + "*")


def footprint(s: Settings) -> Footprint:
    """The one list of what specfleet puts on a host. Something new that a deploy writes goes
    here, by its exact path (``tests/unit/test_removal_property.py`` checks that removal touches
    nothing else)."""
    server = server_paths(s)
    wd = watchdog_paths(s)
    roots = (model_root(s, "target"), model_root(s, "drafter"))
    dir_names = sorted({posixpath.basename(r) for r in roots})
    families = [_unit_family(weights_unit_name(r), r"(-run-[0-9a-f]{8})?") for r in roots]
    families.append(_unit_family(fanout_serve_unit(""), r"[A-Za-z0-9_.-]+"))
    families += [_unit_family(pull_unit(d, ""), r"[A-Za-z0-9_.-]+") for d in dir_names]
    state = s.state_dir
    jobs = [weights_job_paths(state, r) for r in roots]
    rollback = rollback_paths(s)
    paths = (
        # the server's own files (the one list), its log folder and restart marker
        *server.unit_files(), server.log_dir, server.marker,
        # its watchdog: unit, program folder, config, counters, node-exporter's textfile
        *wd.files(), wd.folder,
        # the weights tools (the agents and huggingface_hub) shared by the host's services
        layout.TOOLS_PATH,
        # under state_dir: the HF token's copy, the weights jobs' folder (specfleet's download
        # jobs and progress alone), the rollback point and the wheels kept for it, the
        # benchmark's results, the fan-out's state
        posixpath.dirname(control_token_path(s)), jobs[0].work,
        rollback.directory, rollback.wheels, bench_dir(s), fanout_dir(state),
        # the fan-out's control folders in /run
        *(control_dir(d) for d in dir_names),
    )  # fmt: skip
    dirs = (layout.SECRETS_DIR, layout.ETC_DIR, posixpath.dirname(wd.folder), layout.OPT_DIR,
            posixpath.dirname(rollback.directory), state.rstrip("/") or "/")
    venvs = (s.venv.rstrip("/"), sibling_venv(s.venv, "") + "*")
    weights = (*roots, server.cache_root)
    return Footprint(units=(server.unit_name, wd.unit_name), unit_families=tuple(families),
                     paths=tuple(dict.fromkeys(paths)), dirs=dirs, venvs=venvs,
                     weights=weights, lock=lock_path(s))


def own_units(fp: Footprint, units: dict[str, Any]) -> dict[str, Any]:
    """The units of ``units`` (a ``Leftovers`` value's) that are specfleet's, by exact name."""
    return {u: st for u, st in units.items()
            if u in fp.units or any(re.fullmatch(rx, u) for rx, _ in fp.unit_families)}


def _inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or inside it."""
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder.rstrip("/") + "/")


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
    + venv: also remove the configured venv when it is the user's own and specfleet installed
      SGLang into it (a venv, with specfleet's folder in it; default: ``settings.removal.venv``,
      off; a venv specfleet created is always removed, a folder that is no such venv never)

    A second run finds nothing and changes nothing; a deploy afterwards converges again.
    """
    s = settings
    weights = s.removal.weights if weights is None else weights
    venv = s.removal.venv if venv is None else venv
    fp = footprint(s)
    found = cached_fact(host, Leftovers, paths=[*fp.paths, *(fp.weights if weights else ())],
                        units=[*fp.units, *(pattern for _, pattern in fp.unit_families)],
                        dirs=list(fp.dirs), venvs=list(fp.venvs))
    # The lock stays until the run releases it; a venv is never removed as a path, only by the
    # venv rules (nor a folder holding one), and the weights not unless asked (nor a folder
    # holding them).
    venvs = found["venvs"]
    keep = [*venvs, fp.lock, *(() if weights else fp.weights)]
    paths = [p for p in found["paths"] if not any(_inside(k, p) for k in keep)]
    units = own_units(fp, found["units"])
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
        if info["created"] or (configured and venv and info["specfleet"] and info["venv"]):
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
            kept.append(f"the venv {path}" + ("" if info["venv"] else " (not a venv)"))
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
