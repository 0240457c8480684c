"""The drafter RoPE patch (issue #52) on a host's SGLang: 0.5.14's ``get_rope_config`` reading in
0.5.11's ``models/dflash.py`` (``specfleet.core.sglang.dflash_rope`` decides, the recipe makes the
file from the pinned wheels), applied and removed with PR#20547's journaled scripts in its own
state folder."""

from __future__ import annotations

import shlex
from io import StringIO
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS

from facts.cache import cached_fact
from facts.sglang import FileHashes, RopePatchState, SGLangInstall, Venv
from operations.sglang_commands import apply_script, forget_script, restore_script, script_command
from operations.sglang_sources import UpstreamSources, UpstreamUnreachable
from operations.util import fails_host
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import rope_state_dir, venv_python
from specfleet.core.sglang.dflash_rope import (
    TARGET,
    decide_dflash_rope,
    load_rope_patch,
    patch_id,
)
from specfleet.core.sglang.install import short, site_packages
from specfleet.core.sglang.patch import PatchFormatError
from specfleet.core.sglang.recipe import RecipeError
from specfleet.core.tables.sglang_versions import predicted_install


def rope_restore_steps(venv: str, marker: dict | None):
    """Commands that undo an applied (or half-applied) drafter RoPE patch, or forget a marker
    whose file pip has replaced since (its backup is then not put back)."""
    if not marker:
        return
    d = rope_state_dir(venv)
    if marker.get("partial") or marker.get("intact"):
        yield script_command(restore_script(d))
    else:
        yield script_command(forget_script(d))


def _built(patch, source: str | list[str] | None):
    """(diff, sha256 of the file it makes), or None when the pinned wheels cannot be fetched
    from this machine: said with the fix, and the host goes on without the patch (its drafter
    is slower without it, not wrong)."""
    mirrors = [source] if isinstance(source, str) else list(source or ())
    try:
        return patch.build(UpstreamSources(patch.sources, mirrors, host=host.name))
    except UpstreamUnreachable as exc:
        logger.warning(f"{host.print_prefix}{exc.problem}: the drafter RoPE patch is left out, "
                       f"the drafter runs at base 1e6 (fix: {exc.fix})")  # fmt: skip
        return None
    except (RecipeError, PatchFormatError) as exc:
        raise SpecfleetError(
            f"the drafter RoPE patch cannot be built from its pinned sources: {exc}",
            host=host.name,
            fix="point patch.source at the wheels the recipe names (or drop it to fetch them "
            "from PyPI)",
        ) from None


def _without_sglang(venv: str, source: str | list[str] | None, present: bool,
                    sglang_version: str | None):
    """No SGLang in the venv: nothing to remove; while planning (a fresh host under ``--dry``)
    what the run will do once the release is in; else the host fails."""
    if not present:
        host.noop(f"SGLang is not installed in {venv}; there is no RoPE patch to remove")
        return
    if host.state.is_executing or not sglang_version:
        raise SpecfleetError(f"SGLang is not installed in {venv}", host=host.name,
                             fix="run sglang.installed before sglang.dflash_rope")  # fmt: skip
    version = predicted_install(sglang_version)["version"]
    patch = load_rope_patch(version)
    decision = decide_dflash_rope(f"{version} (to be installed)", patch and patch.release_sha256,
                                  None, present=True, patch=patch,
                                  wanted_id=patch and patch_id(patch))  # fmt: skip
    built = None if decision.noop else _built(patch, source)
    if built is None:
        host.noop(decision.reason)
        return
    logger.info(f"{host.print_prefix}{decision.reason}")
    # Never executed: the real run re-reads the facts once SGLang is installed.
    yield StringCommand("patch", "--dry-run", "...", "#", QuoteString(built[0].summary()))


@operation()
@fails_host(raise_while_planning=True)
def dflash_rope(
    venv: str,
    source: str | list[str] | None = None,
    present: bool = True,
    sglang_version: str | None = None,
):
    """
    Make SGLang 0.5.11's DFlash drafter use the RoPE its config gives (issue #52): 0.5.14's
    ``get_rope_config`` reading in ``models/dflash.py``, from the pinned 0.5.11 and 0.5.14
    wheels. Applied only where the file hashes as the 0.5.11 wheel's (v1, or beside the PR#20547
    port, which leaves this file alone); other releases need nothing.

    + venv: the venv SGLang is installed in
    + source: mirrors of the pinned wheels (``patch.source``), tried before PyPI
    + present: ``False`` restores the file byte for byte
    + sglang_version: the SGLang about to be installed (``--dry`` on a fresh host predicts)

    The apply commits a journal before it writes (PR#20547's scripts, in
    ``<venv>/.specfleet/dflash-rope``); its marker is written only once the file on disk hashes
    as the file built, else it is rolled back and the host fails.
    """
    py = venv_python(venv)
    state = cached_fact(host, Venv, path=venv)
    install = cached_fact(host, SGLangInstall, python=py) if state and state.get("python") else None
    if install is None:
        yield from _without_sglang(venv, source, present, sglang_version)
        return
    version = install.get("version") or "?"
    site = site_packages(install.get("location")) or ""
    d = rope_state_dir(venv)
    marker = cached_fact(host, RopePatchState, venv=venv)
    patch = load_rope_patch(version)
    hashes = dict(host.get_fact(FileHashes, directory=site, paths=(TARGET,)) or {}) if site else {}
    decision = decide_dflash_rope(version, hashes.get(TARGET), marker, present=present,
                                  patch=patch, wanted_id=patch and patch_id(patch))  # fmt: skip
    built = _built(patch, source) if "apply" in decision.steps else None
    if decision.warning:
        logger.warning(f"{host.print_prefix}{decision.warning}")
    if decision.noop:
        host.noop(decision.reason)
        return
    if "apply" in decision.steps and built is None:
        host.noop(f"{decision.reason}: left out (its pinned wheels cannot be fetched here)")
        return
    logger.info(f"{host.print_prefix}{decision.reason}")
    commands: list[Any] = []
    for step in decision.steps:
        if step == "restore":
            commands.append(script_command(restore_script(d)))
        elif step == "forget":
            commands.append(script_command(forget_script(d)))
        elif step == "apply":
            diff, want = built
            connector_args = {k: v for k, v in (host.current_op_global_arguments or {}).items()
                              if k in CONNECTOR_ARGUMENT_KEYS}  # fmt: skip
            commands += [
                StringCommand("rm", "-rf", "--", QuoteString(d), "&&", "mkdir", "-p",
                              QuoteString(d)),  # fmt: skip
                FileUploadCommand(StringIO(diff.text), f"{d}/applied.diff"),
                script_command(apply_script(d, site, diff)),
                FunctionCommand(_verify_or_roll_back,
                                (venv, version, site, patch_id(patch), want, connector_args), {}),
            ]  # fmt: skip
    yield from commands


def _verify_or_roll_back(state: Any, host: Any, venv: str, version: str, site: str, pid: str,
                         want: str, connector_args: dict) -> bool:  # fmt: skip
    """After the apply script: the file on disk must be the one built; then the marker. A
    conflict or any other file is rolled back and fails the host (nothing half-changed)."""
    d = rope_state_dir(venv)

    def run(script: str) -> bool:
        ok, _ = host.run_shell_command(script_command(script), **connector_args)
        return ok

    marker = host.get_fact(RopePatchState, venv=venv) or {}
    got = (host.get_fact(FileHashes, directory=site, paths=(TARGET,)) or {}).get(TARGET)
    if not marker.get("conflict") and got == want:
        return run(f"printf '%s\\n' {shlex.quote(pid)} > {shlex.quote(d)}/sha256")
    run(restore_script(d))
    why = ("GNU patch refused it" if marker.get("conflict")
           else f"{TARGET} hashes {short(got)}, the patch makes {short(want)}")  # fmt: skip
    host.log(f"the drafter RoPE patch did not apply to SGLang {version} in {site} ({why}); "
             "rolled back, the install is unchanged\n  fix: reinstall SGLang "
             f"{version} from its wheel (pip install --force-reinstall --no-deps)", logger.error)
    return False
