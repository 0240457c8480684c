"""Keep a rollback point on the host before a change, and return to it: unit, pins, patches
(PR#20547's port and the drafter RoPE patch)."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS

from facts.rollback import FILE_KEYS, PATCH_KEYS, RollbackState
from facts.sglang import PatchState, RopePatchState
from operations import preflight
from operations import sglang as sglang_ops
from operations.sglang_commands import restore_files_script, restore_steps, script_command
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import (
    RollbackPaths,
    ServerPaths,
    rollback_paths,
    rope_state_dir,
    server_paths,
    venv_python,
)
from specfleet.core.settings import Settings
from specfleet.core.sglang.install import PATCH_OPTS, patch_state_dir

# The distributions specfleet's software step changes; their wheels are kept in the cache so that
# a rollback reinstalls the old pins even where the index no longer serves them.
MANAGED = ("sglang", "compressed-tensors")
SECRET_KEY = "secret"


# --------------------------------------------------------------------------------------------------
# Pure decisions
# --------------------------------------------------------------------------------------------------


def live_files(paths: ServerPaths) -> dict[str, str]:
    """The server's files a rollback point keeps: all of them (the one list)."""
    return paths.files()


# Files a point taken by an older specfleet does not hold: copied back when it holds them, never
# removed (the unit always names them: their absence in a point means the point predates them).
_KEPT_WHEN_ABSENT = ("log_config", "log_module")
# Files in root's own 0700 folder.
_PRIVATE_KEYS = ("secret", "log_config", "log_module")


def pin_name(line: str) -> str | None:
    """The canonical distribution name of one ``pip freeze`` line (None for comments, ``-e``)."""
    line = line.strip()
    if not line or line.startswith(("#", "-")):
        return None
    for sep in (" @ ", "==", "==="):
        if sep in line:
            return canonicalize_name(line.split(sep, 1)[0].strip())
    return None


def parse_pins(lines: list[str]) -> dict[str, str]:
    """``pip freeze`` lines -> {canonical name: line}."""
    out = {}
    for line in lines:
        name = pin_name(line)
        if name:
            out[name] = line.strip()
    return out


@dataclass(frozen=True)
class PinChanges:
    install: list[str]
    uninstall: list[str]

    @property
    def empty(self) -> bool:
        return not self.install and not self.uninstall

    def names(self) -> set[str]:
        return {pin_name(p) or p for p in self.install} | set(self.uninstall)


def _pin_key(line: str) -> str:
    """What a pin asks for, without the spelling of its name: ``==0.5.11`` or ``@ URL``."""
    for sep in (" @ ", "==="):
        if sep in line:
            return sep.strip() + line.split(sep, 1)[1].strip()
    if "==" in line:
        from packaging.version import InvalidVersion, Version

        version = line.split("==", 1)[1].strip()
        try:
            return "==" + str(Version(version))
        except InvalidVersion:
            return "==" + version
    return line


def pin_changes(saved: list[str], current: list[str]) -> PinChanges:
    """What returns the venv from ``current`` to ``saved`` (both ``pip freeze`` output): the saved
    pins that differ or are missing, and the distributions that were not there."""
    s, c = parse_pins(saved), parse_pins(current)
    install = [
        line for name, line in sorted(s.items())
        if name not in c or _pin_key(c[name]) != _pin_key(line)
    ]  # fmt: skip
    uninstall = sorted(name for name in c if name not in s)
    return PinChanges(install, uninstall)


def missing_wheels(freeze: list[str], wheels: list[str], managed=MANAGED) -> list[str]:
    """The ``name==version`` pins of the managed distributions with no wheel in the cache."""
    have = set()
    for filename in wheels:
        try:
            name, version, _, _ = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue
        have.add((canonicalize_name(name), str(version)))
    out = []
    for name, line in sorted(parse_pins(freeze).items()):
        if name not in {canonicalize_name(m) for m in managed} or "==" not in line:
            continue
        version = line.split("==", 1)[1].strip()
        from packaging.version import InvalidVersion, Version

        try:
            version = str(Version(version))
        except InvalidVersion:
            continue
        if (name, version) not in have:
            out.append(line)
    return out


def drift(state: dict[str, Any]) -> list[str]:
    """How the host differs from its rollback point (empty: the point is current)."""
    saved, cur = state.get("saved"), state["current"]
    if saved is None:
        return ["there is no rollback point yet"]
    out = []
    for key in (*FILE_KEYS, *PATCH_KEYS):
        if saved.get(key) != cur.get(key):
            if key in _KEPT_WHEN_ABSENT and saved.get(key) is None:
                continue
            out.append({"unit": "the unit", "env": "the environment file",
                        "secret": "the API key file", "log_config": "the logging config",
                        "log_module": "the log redaction module",
                        "patch": "the PR#20547 patch state",
                        "rope": "the drafter RoPE patch state"}[key])
    if not pin_changes(saved["freeze"], cur["freeze"]).empty:
        out.append("the package pins")
    return out


def file_restores(state: dict[str, Any]) -> list[tuple[str, str]]:
    """``[(key, "copy" | "remove"), ...]``: what puts the server's files back as saved."""
    saved, cur = state["saved"], state["current"]
    out = []
    for key in FILE_KEYS:
        if saved.get(key) == cur.get(key) or (key in _KEPT_WHEN_ABSENT and saved.get(key) is None):
            continue
        out.append((key, "remove" if saved[key] is None else "copy"))
    return out


def pip_source_args(settings: Settings, wheels: str) -> list[str]:
    """pip's source arguments: the wheel cache first, then the settings' index or find-links."""
    sg = settings.sglang
    args = ["--no-input", "--disable-pip-version-check", "--find-links", wheels]
    if sg.index_url:
        args += ["--index-url", sg.index_url]
    elif sg.find_links:
        args += ["--no-index"]
    if sg.find_links:
        args += ["--find-links", sg.find_links]
    for trusted in sg.trusted_hosts:
        args += ["--trusted-host", trusted]
    return args


# --------------------------------------------------------------------------------------------------
# Shell scripts
# --------------------------------------------------------------------------------------------------


def checkpoint_script(rp: RollbackPaths, live: dict[str, str], venv: str,
                      run_id: str = "") -> str:
    """Take a rollback point in a new folder, then swap it in: a failed copy keeps the old one.
    The state folder of each applied patch (PR#20547's port in ``patch``, the drafter RoPE
    patch in ``rope``: its diff, backup, journal and marker) is copied whole; an absent one
    means the patch was not applied. ``run_id`` (the run that took it: a rollout's id) is kept
    beside it, in ``run_id``."""
    q = shlex.quote
    d = q(rp.directory)
    py = q(venv_python(venv))
    state_dirs = {"patch": patch_state_dir(venv), "rope": rope_state_dir(venv)}
    lines = [
        "set -e",
        "umask 077",
        f"d={d}",
        'mkdir -p "$(dirname "$d")"',
        'rm -rf "$d.new" && mkdir -p "$d.new"',
    ]
    for key in FILE_KEYS:
        lines.append(f'if test -e {q(live[key])}; then cp -p {q(live[key])} "$d.new/{key}"; fi')
    lines += [
        f"if test -x {py}; then {py} -m pip freeze --disable-pip-version-check "
        '> "$d.new/freeze.txt"; fi',
        *(f"if test -e {q(state_dirs[key] + '/sha256')}; then cp -a {q(state_dirs[key])} "
          f'"$d.new/{key}"; fi' for key in PATCH_KEYS),
        'date -u +%Y-%m-%dT%H:%M:%S+00:00 > "$d.new/taken"',
        f'printf "%s\\n" {q(run_id)} > "$d.new/run_id"',
        'rm -rf "$d.old"',
        'if test -e "$d"; then mv "$d" "$d.old"; fi',
        'mv "$d.new" "$d"',
        'rm -rf "$d.old"',
    ]
    return "\n".join(lines)


def reapply_script(saved: str, state_dir: str, what: str) -> str:
    """Put an applied patch (``what``: "PR#20547", "the drafter RoPE patch") back from the copy of
    its state folder a rollback point keeps (``saved``) into ``state_dir``, beside the (restored)
    venv. Only onto the tree it was applied to: every file it modified must be as its backup holds
    it and none it created may be there, else nothing changes and the host fails. Then its diff,
    with the journal in place (a run killed half-way is finished by a restore; one found
    interrupted is restored first), and the files it wrote must hash as they did after the
    first apply (``applied.sha256``, what the PatchState fact calls intact), else the tree is
    restored from the journal and the host fails; the marker last."""
    q = shlex.quote
    opts = " ".join(PATCH_OPTS)
    fix = "run the deploy again: it applies the patch its settings ask for, or none"
    return "\n".join(
        [
            "set -e",
            f"s={q(saved)}",
            f"d={q(state_dir)}",
            'cd "$(cat "$s/site")"',
            # An apply of it interrupted since (its journal, no marker): finished by a restore.
            'if [ -f "$d/journal" ] && [ ! -f "$d/sha256" ] && [ -f "$d/site" ]; then',
            f'  (cd "$(cat "$d/site")" && {restore_files_script()})',
            'fi',
            't=$(mktemp -d); trap \'rm -rf "$t"\' EXIT',
            'tar -xf "$s/backup.tar" -C "$t"',
            'bad=""',
            'while IFS= read -r f; do [ -n "$f" ] || continue; '
            'cmp -s -- "$f" "$t/$f" || bad="$bad $f"; done < "$s/existing"',
            'while IFS= read -r f; do [ -n "$f" ] || continue; '
            'if [ -e "$f" ] || [ -L "$f" ]; then bad="$bad $f"; fi; done < "$s/created"',
            'if [ -n "$bad" ]; then',
            f'  echo "{what} kept in $s was applied to another tree: in $PWD,$bad '
            f'differ from it; nothing changed. fix: {fix}" >&2',
            "  exit 1",
            "fi",
            'rm -rf -- "$d" "$d.tmp" && mkdir -p "$(dirname "$d")"',
            'cp -a "$s" "$d.tmp" && rm -f "$d.tmp/sha256" "$d.tmp/unproven" && mv "$d.tmp" "$d"',
            f'if ! patch {opts} -i "$d/applied.diff" > "$t/out" 2>&1 '
            '|| ! sha256sum --status -c "$d/applied.sha256"; then',
            f"  {restore_files_script()}",
            '  rm -rf -- "$d"',
            f'  echo "{what} kept in $s does not give the files it gave before; restored, '
            f'nothing changed. fix: {fix}" >&2',
            '  cat "$t/out" >&2',
            "  exit 1",
            "fi",
            'cp "$s/sha256" "$d/sha256"',
        ]
    )


# --------------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------------


# Settings default to the host's with the configured venv, not operations.venvs' pick: a release
# installed beside it never changes it, so the rollback point of what runs before a change is kept
# there (and the unit it restores names the venv that ran).


def _current_pins(s: Settings, state: dict[str, Any]) -> dict[str, Any]:
    """The venv's pins now (``RollbackState``'s ``current``); a failed ``pip freeze`` fails the
    host: no rollback point is kept, or restored, from pins it could not read."""
    cur = state["current"]
    if cur["freeze_error"]:
        raise SpecfleetError(
            f"pip freeze failed in {s.venv}: {cur['freeze_error'].splitlines()[-1]}",
            host=host.name,
            fix=f"check that {venv_python(s.venv)} -m pip works",
        )
    return cur


def rollback_state(settings: Settings) -> dict[str, Any]:
    """The host's ``RollbackState`` for these settings (call it in an op or a deploy file)."""
    return _state(settings)


def _state(s: Settings) -> dict[str, Any]:
    rp = rollback_paths(s)
    live = live_files(server_paths(s))
    return host.get_fact(
        RollbackState,
        directory=rp.directory,
        unit=live["unit"],
        env=live["env"],
        secret=live["secret"],
        log_config=live["log_config"],
        log_module=live["log_module"],
        venv=s.venv,
        wheels=rp.wheels,
    )


def _need_point(s: Settings, state: dict[str, Any]) -> dict[str, Any]:
    if state["saved"] is None:
        raise SpecfleetError(
            f"there is no rollback point in {rollback_paths(s).directory}",
            host=host.name,
            fix="take one with rollback.checkpoint before changing the host "
            "(specfleet rollout does it for every host it changes)",
        )
    return state["saved"]


@operation()
def checkpoint(settings: Settings, replace: bool = True):
    """
    Keep a rollback point on the host: the server's unit, env and secret files, the venv's
    ``pip freeze``, the PR#20547 and drafter RoPE patch states, and wheels of the managed pins.

    + settings: the deploy's ``Settings``
    + replace: replace a point that is there (only for a state that passed its readiness gate);
      ``False`` keeps an existing point as it is, so that no interrupted run can swap the last
      known-good state for one never checked

    The point lives in ``<state_dir>/rollback/<service_name>/`` (mode 0700: it may hold the API
    key file) and is replaced only when the host differs from it, so a second run changes nothing.
    Wheels of the installed ``sglang`` and ``compressed-tensors`` go to
    ``<state_dir>/rollback/wheels`` (``pip download`` from the configured index or find-links),
    so that ``rollback.pins`` can reinstall them later.

    **Example:**

    .. code:: python

        rollback.checkpoint(name="Keep a rollback point", settings=settings)
    """
    s = settings
    rp = rollback_paths(s)
    state = _state(s)
    cur = _current_pins(s, state)
    if not replace and state["saved"] is not None:
        host.noop(f"rollback point {rp.directory} is kept: only a state that passed its gate "
                  "replaces it")
        return
    reasons = drift(state)
    missing = missing_wheels(cur["freeze"], state["wheels"])
    if not reasons and not missing:
        host.noop(f"rollback point {rp.directory} is current")
        return
    if reasons:
        host.log(f"rollback point: keeps {', '.join(reasons)}", logger.info)
        live = live_files(server_paths(s))
        yield script_command(checkpoint_script(rp, live, s.venv, preflight.run_id()))
    if missing:
        argv = [
            venv_python(s.venv), "-m", "pip", "download", "--no-deps",
            "--dest", rp.wheels, *pip_source_args(s, rp.wheels), *missing,
        ]  # fmt: skip
        yield FunctionCommand(_cache_wheels, (rp.wheels, argv), {})


def _cache_wheels(state: Any, host: Any, wheels: str, argv: list[str]) -> bool:
    """Fill the wheel cache; a failure is a warning (a rollback then needs the index)."""
    connector_args: dict[str, Any] = {}
    if host.executing_op_hash:
        global_args = state.get_op_data_for_host(host, host.executing_op_hash).global_arguments
        connector_args = {k: v for k, v in global_args.items() if k in CONNECTOR_ARGUMENT_KEYS}
    ok, output = host.run_shell_command(
        StringCommand("mkdir", "-p", QuoteString(wheels), "&&", *[QuoteString(a) for a in argv]),
        print_output=False,
        **connector_args,
    )
    if not ok:
        last = (output.output_lines if output else ["no output"]) or ["no output"]
        host.log(
            f"wheel cache: pip download failed ({last[-1]}); a rollback will need the index",
            logger.warning,
        )
    return True


@operation()
def pins(settings: Settings):
    """
    Reinstall the venv's package pins as kept in the rollback point, where they differ.

    + settings: the deploy's ``Settings``

    Pins that differ are reinstalled with ``--no-deps`` from the wheel cache first, then the
    configured index or find-links; distributions that were not there are uninstalled. When
    SGLang itself changes, an applied PR#20547 (its files are not in pip's RECORD) and drafter
    RoPE patch are removed first (the RoPE patch's marker is forgotten where pip has replaced its
    file since), so neither is left as a marker of files pip has replaced.
    """
    s = settings
    state = _state(s)
    saved = _need_point(s, state)
    cur = _current_pins(s, state)
    changes = pin_changes(saved["freeze"], cur["freeze"])
    if changes.empty:
        host.noop(f"the pins in {s.venv} are as kept")
        return
    rp = rollback_paths(s)
    py = QuoteString(venv_python(s.venv))
    host.log(
        "rollback: reinstalls "
        + (", ".join(changes.install) or "nothing")
        + (f"; uninstalls {', '.join(changes.uninstall)}" if changes.uninstall else ""),
        logger.info,
    )
    if "sglang" in changes.names():  # pip is about to replace the files both patches wrote
        yield from restore_steps(patch_state_dir(s.venv), host.get_fact(PatchState, venv=s.venv))
        yield from restore_steps(rope_state_dir(s.venv),
                                 host.get_fact(RopePatchState, venv=s.venv))
    if changes.uninstall:
        yield StringCommand(
            py, "-m", "pip", "uninstall", "--yes", *[QuoteString(n) for n in changes.uninstall]
        )
    if changes.install:
        yield StringCommand(
            py, "-m", "pip", "install", "--no-deps",
            *[QuoteString(a) for a in pip_source_args(s, rp.wheels)],
            *[QuoteString(p) for p in changes.install],
        )  # fmt: skip


@operation()
def patch(settings: Settings):
    """
    Put the PR#20547 patch state back as kept in the rollback point.

    + settings: the deploy's ``Settings``

    A patch applied since is removed (``sglang.pr20547(present=False)``); a patch that was applied
    then is applied again from the rollback point's own copy (its mapped diff and backup), so the
    control machine needs no copy of an old patch.
    """
    yield from _put_patch_back(settings, "patch", "PR#20547", sglang_ops.pr20547,
                               patch_state_dir(settings.venv), PatchState)


@operation()
def rope(settings: Settings):
    """
    Put the drafter RoPE patch state (issue #52) back as kept in the rollback point.

    + settings: the deploy's ``Settings``

    A RoPE patch applied since is removed (``sglang.dflash_rope(present=False)``: restored byte
    for byte, or its marker forgotten where pip has replaced the file); a patch that was applied
    then is applied again from the rollback point's own copy (its diff and backup), only onto the
    file it was applied to, so the control machine fetches nothing. A point taken before it kept
    the RoPE state says it was not applied.
    """
    yield from _put_patch_back(settings, "rope", "the drafter RoPE patch", sglang_ops.dflash_rope,
                               rope_state_dir(settings.venv), RopePatchState)


def _put_patch_back(s: Settings, key: str, what: str, remove_op, state_dir: str, state_fact):
    """One patch's state (``key`` of the point: its marker's sha256, or None) as kept: removed by
    its own operation where it was not applied then; else the one applied now undone (restored,
    or its marker forgotten where pip has replaced its files) and the kept one applied again."""
    state = _state(s)
    saved = _need_point(s, state)
    cur = state["current"]
    if saved[key] == cur[key]:
        host.noop(f"{what} is not applied, as kept" if not cur[key]
                  else f"{what} {cur[key][:12]} is applied, as kept")
        return
    if saved[key] is None:
        yield from remove_op._inner(venv=s.venv, present=False)
        return
    host.log(f"rollback: applies {what} {saved[key][:12]} again", logger.info)
    if cur[key]:
        yield from restore_steps(state_dir, host.get_fact(state_fact, venv=s.venv))
    yield script_command(reapply_script(rollback_paths(s).file(key), state_dir, what))


@operation()
def files(settings: Settings):
    """
    Put the server's unit, env and secret files back as kept in the rollback point.

    + settings: the deploy's ``Settings``

    A file that did not exist then is removed. When anything changes, the server's
    restart-pending marker is written first, so ``serving.service`` restarts onto the old unit.
    """
    s = settings
    state = _state(s)
    _need_point(s, state)
    steps = file_restores(state)
    if not steps:
        host.noop("the unit, env and secret files are as kept")
        return
    paths = server_paths(s)
    rp = rollback_paths(s)
    live = live_files(paths)
    host.log(
        "rollback: " + ", ".join(f"{'restores' if a == 'copy' else 'removes'} {live[k]}"
                                 for k, a in steps),
        logger.info,
    )
    # The restart-pending marker first, as serving.unit does: serving.service restarts onto it.
    yield StringCommand(
        "sh", "-c", QuoteString('mkdir -p "$(dirname "$1")" && printf "%s\\n" "$2" > "$1"'),
        "specfleet", QuoteString(paths.marker), QuoteString("the rollback"),
    )  # fmt: skip
    for key, action in steps:
        dest = live[key]
        if action == "remove":
            yield StringCommand("rm", "-f", QuoteString(dest))
            continue
        mode = "700" if key in _PRIVATE_KEYS else "755"
        yield StringCommand(
            "mkdir", "-p", "-m", mode, QuoteString(posixpath.dirname(dest)), "&&",
            "cp", "-p", QuoteString(rp.file(key)), QuoteString(dest + ".specfleet-tmp"), "&&",
            "mv", "-f", QuoteString(dest + ".specfleet-tmp"), QuoteString(dest),
        )  # fmt: skip
    yield StringCommand("systemctl", "daemon-reload")
