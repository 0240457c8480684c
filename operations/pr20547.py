"""The PR#20547 port's operation (``sglang.pr20547``): its steps and its private helpers, gathered
so that removing the port is one step (``docs/port.md``, "Removing the port").

``operations.sglang.pr20547`` is the pyinfra operation (its name, arguments and docstring stay
those of the SGLang operations); it yields :func:`commands`. :func:`patch_restore_steps` is what
``sglang.installed`` and ``removal`` run to take an applied port off before pip touches the tree.
The pure side is ``specfleet.core.sglang.pr20547``; the journaled scripts that apply and restore
(``operations.sglang_commands``) and the upstream reader (``operations.sglang_sources``) are shared
with the drafter RoPE patch and stay.
"""

from __future__ import annotations

import json
import shlex
from io import StringIO
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS

from facts.cache import cached_fact
from facts.sglang import FileHashes, PatchState, SGLangInstall, Venv
from operations.sglang_commands import (
    apply_script,
    forget_script,
    restore_script,
    restore_steps,
    script_command,
)
from operations.sglang_sources import UpstreamSources, UpstreamUnreachable
from operations.util import check_venv_path, say, warn
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import join
from specfleet.core.settings import TEST_SETTINGS_ENV, allow_test_settings
from specfleet.core.sglang.install import (
    has_v2_worker,
    patch_state_dir,
    short,
    site_packages,
    venv_python,
)
from specfleet.core.sglang.patch import PatchFormatError, parse_patch_failures
from specfleet.core.sglang.pr20547.decision import (
    CONFLICT_FIX,
    KEEP_V1,
    PortVerdict,
    conflict_message,
    decide_pr20547,
)
from specfleet.core.sglang.pr20547.port import load_ports, read_port_file
from specfleet.core.sglang.pr20547.portdata import (
    PORTED_RELEASES,
    Port,
    no_port_verdict,
    port_verdict,
    predicted_hashes,
)
from specfleet.core.sglang.recipe import RECIPE_FILE, RecipeError, check_recipe
from specfleet.core.tables.sglang_versions import predicted_install

ON_CONFLICT = ("keep-v1", "fail")


def load_port(version: str, test_recipe: str | None = None) -> Port | None:
    """This project's port of PR#20547 onto SGLang ``version`` (package data under
    ``specfleet/patchdata/pr20547/sglang-<version>/``), or None. ``test_recipe`` (the test-only
    setting ``patch.test_recipe``, refused unless ``SPECFLEET_ALLOW_TEST_SETTINGS=1``): a
    recipe.json on the control machine used in place of the port's own."""
    if version not in PORTED_RELEASES:
        return None
    if test_recipe is not None and not allow_test_settings():
        raise SpecfleetError(
            "patch.test_recipe is a test-only setting",
            fix=f"remove it (specfleet's own tests set {TEST_SETTINGS_ENV}=1)",
        )
    for name, data in load_ports().items():
        if data.get("sglang_version") == version:
            fix = "reinstall specfleet (its package data is damaged)"
            if test_recipe is None:
                text = read_port_file(name, data.get("recipe", RECIPE_FILE))
            else:
                path = Path(test_recipe).expanduser()
                fix = f"rebuild the test's recipe {path}"
                try:
                    text = path.read_text()
                except OSError as exc:
                    raise SpecfleetError(f"patch.test_recipe {path} cannot be read: {exc}",
                                         fix=fix) from None  # fmt: skip
            try:
                recipe = json.loads(text)
            except ValueError as exc:
                raise SpecfleetError(f"the PR#20547 port {name} has a {RECIPE_FILE} that is not "
                                     f"JSON: {exc}", fix=fix) from None  # fmt: skip
            problems = check_recipe(recipe)
            if problems:
                raise SpecfleetError(
                    f"the PR#20547 port {name} has a bad {RECIPE_FILE}: {'; '.join(problems)}",
                    fix=fix,
                )
            return Port(name, data, recipe)
    return None


def patch_restore_steps(venv: str, marker: dict | None):
    """Commands that undo an applied (or half-applied) PR#20547, or forget a stale marker."""
    yield from restore_steps(patch_state_dir(venv), marker)


def commands(
    venv: str,
    source: str | list[str] | None,
    sha256: str | None,
    on_conflict: str,
    present: bool,
    sglang_version: str | None,
    test_recipe: str | None,
):
    """The steps of ``sglang.pr20547`` (its docstring says what they are)."""
    check_venv_path(venv)
    if on_conflict not in ON_CONFLICT:
        raise SpecfleetError(
            f"patch.on_conflict is {on_conflict!r}",
            host=host.name,
            fix="set patch.on_conflict to 'keep-v1' or 'fail'",
        )
    py = venv_python(venv)
    state = cached_fact(host, Venv, path=venv)
    has_python = bool(state and state.get("python"))
    install = cached_fact(host, SGLangInstall, python=py) if has_python else None
    marker = cached_fact(host, PatchState, venv=venv) if has_python else None

    if install is None:
        yield from _without_sglang(venv, source, sha256, on_conflict, present, sglang_version,
                                   test_recipe)
        return

    decision, port, patch = _pr20547_decision(venv, install, marker, source, sha256, present,
                                              on_conflict, test_recipe)
    if decision.noop:
        host.noop(decision.reason)
        return
    if decision.row != KEEP_V1:
        say(decision.reason)
    d = patch_state_dir(venv)
    # Commands are gathered first so that every reason is said before the first yield (--dry).
    out: list[Any] = []
    for step in decision.steps:
        if step == "restore":
            out.append(script_command(restore_script(d)))
        elif step == "drop-marker":
            out.append(script_command(forget_script(d)))
        elif step == "apply":
            out += _apply_commands(venv, install, port, patch, on_conflict)
    yield from out


def _without_sglang(venv: str, source: str | list[str] | None, sha256: str | None,
                    on_conflict: str, present: bool, sglang_version: str | None,
                    test_recipe: str | None = None):
    """No SGLang in the venv: nothing to remove; while planning (a fresh host under ``--dry``)
    the decision predicted for the release about to be installed; else the host fails."""
    if not present:
        host.noop(f"SGLang is not installed in {venv}; there is no patch to remove")
        return
    if host.state.is_executing or not sglang_version:
        raise SpecfleetError(
            f"SGLang is not installed in {venv}",
            host=host.name,
            fix="run sglang.installed before sglang.pr20547",
        )
    yield from _predict_patch(source, sha256, bool(sha256), on_conflict, sglang_version,
                              test_recipe)


def _pr20547_decision(venv: str, install: dict, marker: dict | None,
                      source: str | list[str] | None, sha256: str | None, present: bool,
                      on_conflict: str, test_recipe: str | None = None):
    """``decide_pr20547`` for the installed SGLang, with the port that fits its tree (read only
    when opted in and v2 is missing); a kept v1 is said at normal verbosity, or fails the host
    under ``on_conflict="fail"``. Returns (decision, port, patch)."""
    opted_in = bool(sha256)
    features = install.get("features") or {}
    release = None
    if marker and marker.get("partial") and load_port(install.get("version") or "?"):
        # An apply killed after it patched leaves the v2 worker wired in: the decision reads the
        # release's features, which the restore step gives back.
        release = features = predicted_install(install["version"])["features"]
    port = patch = None
    if opted_in and present and features.get("dflash") != "v2":
        port, patch = _port_for_install(venv, install, source or "", sha256 or "", marker,
                                        test_recipe)
    decision = decide_pr20547(install, marker, present=present, opted_in=opted_in, port=port,
                              release_features=release)
    if decision.warning:
        warn(decision.warning)
    if decision.row == KEEP_V1:
        if opted_in and on_conflict == "fail":
            raise SpecfleetError(decision.reason, host=host.name, fix=decision.fix)
        # Said at normal verbosity: the plan's "dflash-worker v1" has this reason.
        logger.info(f"{host.print_prefix}{decision.reason} (fix: {decision.fix})")
    return decision, port, patch


def _upstream(port: Port, source: str | list[str] | None) -> UpstreamSources:
    """The reader of the upstream text the port's recipe names: ``patch.source`` (mirrors) first,
    then the recipe's pinned URLs; every file checked against its sha256."""
    mirrors = [source] if isinstance(source, str) else list(source or ())
    return UpstreamSources(port.sources, mirrors, host=host.name)


def _port_for_install(venv: str, install: dict, source: str, sha256: str, marker: dict | None,
                      test_recipe: str | None = None):
    """The port verdict for the installed tree, and the patch it would apply (or None). Files an
    earlier apply of ours left (``marker``) are judged as the restore or forget step before the
    apply leaves them: the apply's trial (no fuzz) and its verify guard that assumption."""
    version = install.get("version") or "?"
    port = load_port(version, test_recipe)
    if port is None:
        return no_port_verdict(version), None
    site = site_packages(install.get("location"))
    if not site:
        raise SpecfleetError(
            f"the SGLang facts give no install location in {venv}",
            host=host.name,
            fix="check that sglang imports from the venv (facts.sglang.SGLangInstall)",
        )
    hashes = dict(host.get_fact(FileHashes, directory=site, paths=tuple(port.hashed_paths)) or {})
    marker = marker or {}
    if marker.get("partial") or marker.get("intact"):
        hashes.update(predicted_hashes(port))  # the restore puts the release's files back
    for leftover in marker.get("leftovers") or ():
        hashes[leftover] = None  # the forget step removes what we added
    # Judged first: a tree the port does not fit fetches nothing.
    verdict = port_verdict(port, version, sha256, hashes, "")
    if not verdict.available:
        return verdict, None
    patch, missing = _port_patch_or_missing(port, source)
    if missing is not None:
        return missing, None
    return port_verdict(port, version, sha256, hashes, patch.text), patch


def _port_patch_or_missing(port: Port, source: str | list[str] | None) -> tuple[Any, Any]:
    """``(the port's patch, None)``, or, while planning (``--dry``) when its upstream text cannot
    be fetched on this machine, ``(None, verdict)``: the plan goes on without the port and says
    what that changes (a real run stops at it, with the fix)."""
    try:
        return _port_patch(port, source), None
    except UpstreamUnreachable as exc:
        if host.state.is_executing:
            raise
        logger.warning(f"{host.print_prefix}{exc.problem}: this plan keeps DFLASH v1; a real "
                       f"run stops here (fix: {exc.fix})")
        return None, PortVerdict(
            False, text="the PR#20547 port's upstream text cannot be fetched on this machine, so "
            "this plan keeps DFLASH v1", fix=exc.fix or "")


def _port_patch(port: Port, source: str | list[str] | None):
    try:
        return port.patch(_upstream(port, source))
    except (RecipeError, PatchFormatError) as exc:
        raise SpecfleetError(
            f"the PR#20547 port cannot be built from its pinned sources: {exc}",
            host=host.name,
            fix="point patch.source at the files the recipe names (or drop it to fetch them "
            "from GitHub and PyPI)",
        ) from None


def _predict_patch(
    source: str | None, sha256: str | None, opted_in: bool, on_conflict: str, sglang_version: str,
    test_recipe: str | None = None,
):
    """``--dry`` on a host without SGLang: say exactly what the run will do once it is in."""
    predicted = predicted_install(sglang_version)
    version = predicted["version"]
    if has_v2_worker(predicted["features"]):
        host.noop(f"SGLang {version} (to be installed) has the DFlash v2 worker")
        return
    port = load_port(version, test_recipe) if opted_in else None
    install = {"version": f"{version} (to be installed)", "features": predicted["features"]}
    verdict = None
    patch, missing = _port_patch_or_missing(port, source) if port else (None, None)
    if missing is not None:
        verdict = missing
    elif port is not None:
        # The wheel about to be installed is the one the port was made from: its files match.
        verdict = port_verdict(port, version, sha256 or "", predicted_hashes(port), patch.text)
    elif opted_in:
        verdict = no_port_verdict(version)
    decision = decide_pr20547(install, None, present=True, opted_in=opted_in, port=verdict)
    if decision.row == KEEP_V1:
        if opted_in and on_conflict == "fail":
            raise SpecfleetError(decision.reason, host=host.name, fix=decision.fix)
        logger.info(f"{host.print_prefix}{decision.reason} (fix: {decision.fix})")
        host.noop(decision.reason)
        return
    say(decision.reason)
    # Never executed: the real run re-reads the facts once SGLang is installed.
    yield StringCommand("patch", "--dry-run", "...", "#", QuoteString(patch.summary()))


def _apply_commands(
    venv: str, install: dict, verdict: Any, patch: Any, on_conflict: str
) -> list[Any]:
    version = install.get("version") or "?"
    site = site_packages(install.get("location")) or ""
    d = patch_state_dir(venv)
    connector_args = {
        k: v
        for k, v in (host.current_op_global_arguments or {}).items()
        if k in CONNECTOR_ARGUMENT_KEYS
    }
    return [
        StringCommand("rm", "-rf", "--", QuoteString(d), "&&", "mkdir", "-p", QuoteString(d)),
        FileUploadCommand(StringIO(patch.text), join(d, "applied.diff")),
        script_command(apply_script(d, site, patch)),
        FunctionCommand(
            _verify_or_roll_back,
            (venv, version, site, verdict.port_id or "", on_conflict, connector_args),
            {},
        ),
    ]


def _verify_or_roll_back(
    state: Any,
    host: Any,
    venv: str,
    version: str,
    site: str,
    port_id: str,
    on_conflict: str,
    connector_args: dict,
) -> bool:
    """After the apply script: a conflict, or a port that left the v2 worker not wired in, is
    rolled back and handled by ``on_conflict``; a good one gets its marker, and ``unproven``
    until the server passes its readiness gate with it (a failed gate rolls it back)."""
    d = patch_state_dir(venv)

    def run(script: str) -> bool:
        ok, _ = host.run_shell_command(script_command(script), **connector_args)
        return ok

    marker = host.get_fact(PatchState, venv=venv) or {}
    if marker.get("conflict"):
        failures = parse_patch_failures(marker["conflict"])
        problem = conflict_message(version, site, port_id, failures, on_conflict)
        run(restore_script(d))
    else:
        facts = host.get_fact(SGLangInstall, python=venv_python(venv)) or {}
        features = facts.get("features") or {}
        if features.get("dflash_pr20547"):
            q = shlex.quote(d)
            return run(f"touch {q}/unproven && printf '%s\\n' {shlex.quote(port_id)} > {q}/sha256")
        run(restore_script(d))
        missing = "; ".join(features.get("dflash_v2_missing") or ["no v2 worker found"])
        problem = (
            f"PR#20547 port {short(port_id)} applied to SGLang {version} in {site} but the v2 "
            f"worker is not wired in ({missing}); rolled back, the install is unchanged."
        )
    if on_conflict == "fail":
        host.log(f"{problem}\n  fix: {CONFLICT_FIX}", logger.error)
        return False
    host.log(problem, logger.warning)
    return True
