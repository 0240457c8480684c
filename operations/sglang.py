"""Install a pinned SGLang into a venv, pin compressed-tensors, apply PR#20547 where missing."""

from __future__ import annotations

import posixpath
import shlex
import threading
import weakref
from io import StringIO
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta

from facts.cache import cached_fact
from facts.preflight import WritableByOthers, trust_args
from facts.python import Packages, PipInstallPlan
from facts.sglang import (
    FileHashes,
    GitRemoteRefs,
    PatchState,
    RopePatchState,
    SGLangInstall,
    SourceTree,
    SourceTreeKey,
    Venv,
)
from operations import pr20547 as port_op
from operations.pr20547 import patch_restore_steps
from operations.sglang_commands import (
    apply_script,
    forget_script,
    pinned_install_script,
    restore_script,
    restore_steps,
    script_command,
)
from operations.sglang_sources import UpstreamSources, UpstreamUnreachable
from operations.util import check_venv_path, fails_host, say, warn
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import rope_state_dir, source_key_path
from specfleet.core.preflight import untrusted_problem
from specfleet.core.settings import Settings
from specfleet.core.sglang.install import (
    created_marker,
    decide_compressed_tensors,
    decide_install,
    decide_source_install,
    direct_url,
    git_requirement,
    is_commit,
    judge_venv_changes,
    package_version,
    parse_ls_remote,
    planned_changes,
    refused_message,
    rust_extensions,
    short,
    site_packages,
    source_build_problem,
    source_record,
    split_git_url,
    venv_python,
)
from specfleet.core.sglang.patch import (
    PatchFormatError,
)
from specfleet.core.sglang.recipe import RecipeError
from specfleet.core.sglang.rope import (
    ROPE_TARGET,
    decide_dflash_rope,
    load_rope_patch,
    rope_patch_id,
)
from specfleet.core.tables.sglang_versions import predicted_install


def _pip(venv: str) -> list[Any]:
    return [QuoteString(venv_python(venv)), "-m", "pip"]


def _source_argv(
    index_url: str | None,
    find_links: str | None,
    trusted_hosts: list[str] | None,
    no_deps: bool,
) -> list[str]:
    args = ["--no-input", "--disable-pip-version-check"]
    if index_url:
        args += ["--index-url", index_url]
    elif find_links:
        # A find-links wheelhouse alone is the air-gapped case: never fall back to an index.
        args += ["--no-index"]
    if find_links:
        args += ["--find-links", find_links]
    for trusted in trusted_hosts or []:
        args += ["--trusted-host", trusted]
    if no_deps:
        args += ["--no-deps"]
    return args


def _venv_packages(venv: str) -> tuple[dict | None, dict]:
    """The venv fact, and the Packages fact (empty while there is no venv python)."""
    state = cached_fact(host, Venv, path=venv)
    if not state or not state.get("python"):
        return state, {}
    return state, cached_fact(host, Packages, python=venv_python(venv)) or {}


@operation()
@fails_host(raise_while_planning=True)
def installed(
    venv: str,
    version: str | None = None,
    python: str = "python3",
    index_url: str | None = None,
    find_links: str | None = None,
    trusted_hosts: list[str] | None = None,
    git_url: str | None = None,
    git_ref: str | None = None,
    no_deps: bool = False,
    present: bool = True,
    allow_replacing: bool | list[str] = False,
    source_path: str | None = None,
):
    """
    Install SGLang, pinned, into a venv; reuse the venv if it exists.

    + venv: absolute path of the venv; an existing venv is reused, never recreated
    + version: the SGLang release to pin (index / find-links installs)
    + python: the interpreter that creates a missing venv
    + index_url: a PEP 503 index (an internal mirror) instead of PyPI
    + find_links: a wheelhouse; without ``index_url`` it is the only source (``--no-index``)
    + trusted_hosts: hosts pip may reach over plain http
    + git_url: install from git instead (``#subdirectory=python`` for SGLang's repository)
    + git_ref: branch, tag, ``refs/pull/N/head`` or commit; the commit is the idempotence key
    + no_deps: tests only, install without dependencies
    + present: whether SGLang should be installed
    + allow_replacing: packages (names or globs; ``True``: any) that an install into a venv this
      op did not create may replace besides SGLang and compressed-tensors
    + source_path: install from this source tree on the host instead (an SGLang checkout's
      ``python/`` folder); the key is the folder pip recorded and the tree's content (a changed
      tree is rebuilt), and a tree that needs a toolchain or sources the host lacks (a Rust
      extension without ``cargo``) fails the host before anything changes

    An install into an existing venv first asks pip what it would change there
    (``facts.python.PipInstallPlan``: ``pip install --dry-run --report``; never in a venv or tree
    a user other than root can change), says it (``--dry`` too), and refuses, changing nothing,
    to replace another package (torch, sgl-kernel, ...) in a venv it did not create, unless
    ``allow_replacing`` lets it: the host fails naming the venv, each package (from -> to) and
    the fix. A venv this op creates gets a marker (``.specfleet/created-by-specfleet``).
    ``no_deps`` installs change no dependency and skip the dry run.

    From an index the pin is compared with ``packaging`` (pyinfra's ``pip.packages`` reinstalls
    local versions and direct references every run); from git the key is the commit pip wrote
    into ``direct_url.json``. A PR#20547 patch is removed first (its files are not in RECORD).

    **Example:**

    .. code:: python

        sglang.installed(
            name="Install SGLang 0.5.11",
            venv="/opt/specfleet/sglang",
            version="0.5.11",
            find_links="http://10.0.0.1:8000/",
            trusted_hosts=["10.0.0.1"],
        )
    """
    check_venv_path(venv)
    state, packages = _venv_packages(venv)
    has_python = bool(state and state.get("python"))
    current, direct = package_version(packages, "sglang"), direct_url(packages, "sglang")
    marker = cached_fact(host, PatchState, venv=venv) if has_python else None
    if not present:
        yield from _uninstalled(venv, current, marker)
        return
    decision, requirement, record = _decide(venv, current, direct, version, git_url, git_ref,
                                            source_path)
    if decision.action == "noop" and has_python:
        host.noop(f"{decision.reason} in {venv}")
        return
    if source_path:
        _check_source_tree(source_path)
    source_args = _source_argv(index_url, find_links, trusted_hosts, no_deps)
    changes = (_venv_changes(venv, requirement, source_args, allow_replacing, source_path)
               if has_python and not no_deps else None)
    _say_install(venv, python, state, has_python, decision.reason, index_url, find_links,
                 not (git_url or source_path), no_deps, changes, marker)
    yield from _install_commands(venv, python, has_python, marker, decision.action, source_args,
                                 requirement, record)


def _uninstalled(venv: str, current: str | None, marker: Any):
    if current is None:
        host.noop(f"SGLang is not installed in {venv}")
        return
    say(f"uninstalls SGLang {current} from {venv}")
    yield from patch_restore_steps(venv, marker)
    yield StringCommand(*_pip(venv), "uninstall", "--yes", "sglang")


def _install_commands(venv: str, python: str, has_python: bool, marker: Any, action: str,
                      source_args: list[str], requirement: str, record: str | None = None):
    """A venv where none is (marked as specfleet's), the PR#20547 patch off, then pip; from a
    source tree, then the tree's key (``record``) in the venv, once pip has built it."""
    if not has_python:
        # The marker says this venv is specfleet's: pip may replace packages in it.
        yield StringCommand(
            QuoteString(python), "-m", "venv", QuoteString(venv), "&&", "mkdir", "-p",
            QuoteString(posixpath.dirname(created_marker(venv))), "&&", "touch",
            QuoteString(created_marker(venv)),
        )
    yield from patch_restore_steps(venv, marker)
    if action == "reinstall":
        yield StringCommand(*_pip(venv), "uninstall", "--yes", "sglang")
    yield StringCommand(
        *_pip(venv), "install", *(QuoteString(a) for a in source_args), QuoteString(requirement),
    )
    if record is not None:
        path = source_key_path(venv)
        yield StringCommand(
            "mkdir", "-p", QuoteString(posixpath.dirname(path)), "&&", "printf", "'%s\\n'",
            QuoteString(record), ">", QuoteString(path),
        )


def _decide(venv: str, current: str | None, direct: Any, version: str | None,
            git_url: str | None, git_ref: str | None,
            source_path: str | None) -> tuple[Any, str, str | None]:
    """What to do (``decide_install``, or ``decide_source_install`` for a tree on the host), the
    requirement pip is given and, from a tree, the key to record once it is built (its content,
    ``facts.sglang.SourceTreeKey``, read now: a tree changed during the build is rebuilt by the
    next run)."""
    commit = _pinned_commit(version, git_url, git_ref)
    if source_path:
        tree = cached_fact(host, SourceTreeKey, path=source_path, venv=venv) or {}
        record = source_record(tree["sha256"], source_path) if tree.get("sha256") else None
        return (decide_source_install(current, direct, source_path, tree),
                posixpath.normpath(source_path), record)  # fmt: skip
    decision = decide_install(current, direct, version=version, git_url=git_url, commit=commit)
    return decision, (git_requirement(git_url, commit) if git_url and commit
                      else f"sglang=={version}"), None  # fmt: skip


def _pinned_commit(version: str | None, git_url: str | None, git_ref: str | None) -> str | None:
    """The commit a git install pins (``git_ref`` resolved on the host when it is not one);
    None for an index install. Settings that pin nothing fail the host."""
    if git_url and not git_ref:
        raise SpecfleetError(
            "sglang.git_url is set without sglang.git_ref",
            host=host.name,
            fix="set sglang.git_ref to a branch, tag, refs/pull/N/head or commit",
        )
    if not git_url and not version:
        raise SpecfleetError(
            "no SGLang version to pin", host=host.name, fix="set sglang.version, e.g. '0.5.11'"
        )
    if not (git_url and git_ref):
        return None
    if is_commit(git_ref):
        return git_ref.lower()
    repo, _ = split_git_url(git_url)
    commit = parse_ls_remote(host.get_fact(GitRemoteRefs, url=repo, ref=git_ref), git_ref)
    if commit is None:
        raise SpecfleetError(
            f"git ref {git_ref!r} is not in {repo} (git ls-remote on the host found nothing)",
            host=host.name,
            fix="check sglang.git_url and sglang.git_ref, that git is installed on the host and "
            "that the host reaches the repository",
        )
    return commit


def _say_install(venv: str, python: str, state: Any, has_python: bool, reason: str,
                 index_url: str | None, find_links: str | None, from_index: bool,
                 no_deps: bool, changes: str | None, marker: Any) -> None:
    """Every reason of an install, said before its first command: ``--dry`` stops there."""
    if not has_python:
        say(f"creates venv {venv} with {python}" if not state else f"makes {venv} a venv")
    else:
        say(f"reuses venv {venv}")
    where = ""
    if from_index:
        where = f" from {index_url}" if index_url else ""
        where += f" (find-links {find_links})" if find_links else ""
        where = where or " from PyPI"
    say(reason + where + (" without dependencies (tests)" if no_deps else ""))
    if changes:
        say(f"pip also changes {venv}: {changes}")
    if marker:
        say("removes PR#20547 from the current SGLang first (its files are not in pip's RECORD)")


def _check_source_tree(source_path: str) -> None:
    """Fail the host, before any change, where the tree cannot build here."""
    tree = host.get_fact(SourceTree, path=source_path) or {}
    pyproject = tree.get("pyproject")
    missing: list[str] = []
    rust = rust_extensions(pyproject or "")
    if rust and tree.get("cargo"):
        paths = tuple(r["path"] for r in rust if r.get("path"))
        found = host.get_fact(FileHashes, directory=source_path, paths=paths) or {}
        missing = [p for p in paths if found.get(p) is None]
    problem = source_build_problem(source_path, pyproject, cargo=bool(tree.get("cargo")),
                                   missing=missing)  # fmt: skip
    if problem is not None:
        raise SpecfleetError(problem[0], host=host.name, fix=problem[1])


def _refuse_untrusted(venv: str, source_path: str | None) -> None:
    """Fail the host before pip's dry run (``PipInstallPlan``, at ``--dry`` too) where a user
    other than root can change the venv (its pip, its ``.pth`` files) or the source tree (its
    build backend): that run is their code as root. Preflight refuses the same (its fact, from
    the deploy's probe)."""
    found = cached_fact(host, WritableByOthers, **trust_args(venv, source_path)) or {}
    for what, path in (("venv", venv), ("sglang.source_path", source_path)):
        if path and path in found:
            problem, fix = untrusted_problem(what, path, found[path])
            raise SpecfleetError(f"{problem}; pip was not run", host=host.name, fix=fix)


def _venv_changes(venv: str, requirement: str, source_args: list[str],
                  allow_replacing: bool | list[str], source_path: str | None = None) -> str | None:
    """What installing ``requirement`` into the existing ``venv`` changes besides SGLang and
    compressed-tensors, in words (None: nothing), from pip's dry run on the host. Raises when it
    would replace a package in a venv specfleet did not create and ``allow_replacing`` does not
    let it, or when pip cannot tell in such a venv; and, before pip, where a user other than
    root can change the venv or the source tree (``_refuse_untrusted``)."""
    _refuse_untrusted(venv, source_path)
    plan = host.get_fact(PipInstallPlan, venv=venv, requirement=requirement,
                         pip_args=source_args) or {}
    created = bool(plan.get("created_by_specfleet"))
    if plan.get("rc") != 0:
        problem = (f"pip cannot tell what installing {requirement} would change in {venv}: "
                   f"{plan.get('error') or 'no answer'}")
        if created or allow_replacing is True:
            warn(problem)
            return None
        raise SpecfleetError(
            f"{problem}; nothing was changed (a venv specfleet did not create)",
            host=host.name,
            fix="check that pip in the venv is 22.2 or later (--report) and reaches the SGLang "
            "source; or install beside it (sglang.side_by_side: True), or set "
            "sglang.allow_replacing: True",
        )
    verdict = judge_venv_changes(
        planned_changes({"install": plan.get("install")}, plan.get("installed")),
        created_by_specfleet=created, allow=allow_replacing,
    )
    if verdict.refused:
        problem, fix = refused_message(venv, requirement, verdict)
        raise SpecfleetError(problem, host=host.name, fix=fix)
    return verdict.summary()


@operation()
@fails_host(raise_while_planning=True)
def compressed_tensors(
    venv: str,
    specifier: str | None = None,
    sglang_version: str | None = None,
    index_url: str | None = None,
    find_links: str | None = None,
    trusted_hosts: list[str] | None = None,
    no_deps: bool = False,
):
    """
    Make the venv's compressed-tensors satisfy what its SGLang needs.

    + venv: the venv SGLang is installed in
    + specifier: a user-given specifier that overrides the version table
    + sglang_version: the SGLang about to be installed (``--dry`` on a fresh host predicts with it)
    + test_recipe: tests only (refused unless ``SPECFLEET_ALLOW_TEST_SETTINGS=1``): a recipe.json
      used in place of the port's own (a variant without one of its fixes, built by the tests)
    + index_url: as for ``sglang.installed``
    + find_links: as for ``sglang.installed``
    + trusted_hosts: as for ``sglang.installed``
    + no_deps: tests only; also skips ``pip check``, which would report every absent dependency

    The specifier comes from
    ``specfleet.core.tables.sglang_versions.compressed_tensors_specifier`` (one table keyed by
    SGLang version). Only a version outside it triggers an install, made with a constraints file
    of the venv's current pins so that torch and transformers cannot move, then ``pip check``.

    **Example:**

    .. code:: python

        sglang.compressed_tensors(
            name="Pin compressed-tensors for SGLang",
            venv="/opt/specfleet/sglang",
        )
    """
    check_venv_path(venv)
    _, packages = _venv_packages(venv)
    sglang = package_version(packages, "sglang")
    if sglang is None:
        if host.state.is_executing or not sglang_version:
            raise SpecfleetError(
                f"SGLang is not installed in {venv}",
                host=host.name,
                fix="run sglang.installed before sglang.compressed_tensors",
            )
        sglang = sglang_version
    try:
        decision, spec = decide_compressed_tensors(
            package_version(packages, "compressed-tensors"), sglang, specifier
        )
    except ValueError as exc:
        raise SpecfleetError(
            str(exc), host=host.name, fix="set sglang.compressed_tensors to e.g. '>=0.15,<0.19'"
        ) from None
    if decision.action == "noop":
        host.noop(decision.reason)
        return
    say(decision.reason)
    if no_deps:
        say("skips pip check: no_deps (tests) leaves the dependencies out")
    script = pinned_install_script(
        venv_python(venv),
        _source_argv(index_url, find_links, trusted_hosts, no_deps),
        "compressed-tensors",
        str(spec),
        check=not no_deps,
    )
    yield script_command(script)


@operation()
@fails_host(raise_while_planning=True)
def pr20547(
    venv: str,
    source: str | list[str] | None = None,
    sha256: str | None = None,
    on_conflict: str = "keep-v1",
    present: bool = True,
    sglang_version: str | None = None,
    test_recipe: str | None = None,
):
    """
    Wire PR#20547's DFlash v2 (overlap) worker into an SGLang that lacks it, where this project
    has a port of the PR for that exact tree (``specfleet/patchdata/pr20547/``).

    + venv: the venv SGLang is installed in
    + sha256: the PR revision to port (the sha256 of its diff against its merge base, as in
      the port's ``port.json``); giving it opts in. No default: the library keeps DFLASH v1
      unless asked.
    + source: where the upstream text the port's recipe names comes from: folders on the control
      machine or URL bases (mirrors), tried before the recipe's own pinned URLs (GitHub, PyPI);
      every file is checked against its sha256 pin
    + on_conflict: ``"keep-v1"`` (say so in one line, DFLASH v1 with overlap off) or ``"fail"``
      (fail the host when it opted in and no port fits)
    + present: ``False`` removes an applied port, restoring every file byte for byte
    + sglang_version: the SGLang about to be installed (``--dry`` on a fresh host predicts with it)

    The decision is ``specfleet.core.sglang.pr20547.decision``'s table: built in (the PR branch, or
    SGLang >= 0.5.14), apply the port (opted in, and the tree's files hash as the port's release
    wheel), or keep v1, said in one line with the fix at normal verbosity. The apply commits a
    journal of the tree's own state before it writes anything, so an apply or a restore killed at
    any point is finished or rolled back by the next run; it is verified by re-reading the SGLang
    facts (the v2 worker wired in) before its marker is written.

    **Example:**

    .. code:: python

        sglang.pr20547(
            name="PR#20547 (DFlash v2 worker) where missing",
            venv="/root/venv_sglang211",
            sha256="1c844c0f...",
        )
    """
    # The port's steps and helpers are gathered in operations/pr20547.py (docs/port.md, "Removing
    # the port"); the operation stays here so that its name and output are unchanged.
    yield from port_op.commands(venv, source, sha256, on_conflict, present, sglang_version,
                                test_recipe)


@deploy("SGLang software")
def ensure_software(settings: Settings) -> dict[str, OperationMeta]:
    """The software operations from ``settings``: SGLang installed, compressed-tensors
    pinned, PR#20547 applied where missing, the drafter RoPE patch where needed. Returns their
    ``OperationMeta`` by name (a ``restart_pending`` runs ``_if`` any of them changed).
    ``settings.venv`` is the venv this run uses, as ``operations.venvs.effective_settings`` picks
    it (a new release goes beside the configured venv): the deploy resolves it once and passes
    it in."""
    sg = settings.sglang
    git = sg.kind == "git"
    from_tree = sg.kind == "source"
    source = dict(
        index_url=sg.index_url,
        find_links=sg.find_links,
        trusted_hosts=list(sg.trusted_hosts) or None,
        no_deps=sg.no_deps,
    )
    metas = {}
    # The label is one row of pyinfra's Results for every host: the venv is each host's own
    # (CT200 reuses its venv), so the host's lines name it, not the label.
    metas["installed"] = installed(
        name=f"SGLang {sg.git_ref if git else sg.source_path if from_tree else sg.version} "
        "installed",
        venv=settings.venv,
        version=sg.version,
        python=settings.python,
        git_url=sg.git_url if git else None,
        git_ref=sg.git_ref if git else None,
        source_path=sg.source_path if from_tree else None,
        allow_replacing=sg.allow_replacing,
        **source,
    )
    metas["compressed_tensors"] = compressed_tensors(
        name="compressed-tensors pinned for SGLang",
        venv=settings.venv,
        specifier=sg.compressed_tensors,
        sglang_version=sg.version,
        **source,
    )
    metas["pr20547"] = pr20547(
        name="PR#20547 (DFlash v2 worker) where missing",
        venv=settings.venv,
        source=settings.patch.source,
        sha256=settings.patch.sha256,
        on_conflict=settings.patch.on_conflict,
        sglang_version=sg.version,
        test_recipe=settings.patch.test_recipe,
    )
    # Issue #52: 0.5.11's drafter reads its RoPE from the config (v1 and the port alike).
    metas["dflash_rope"] = dflash_rope(
        name="DFlash drafter RoPE from its config where SGLang lacks it",
        venv=settings.venv,
        source=settings.patch.source,
        sglang_version=sg.version,
    )
    return metas

# --------------------------------------------------------------------------------------------------
# The drafter RoPE patch (issue #52): 0.5.14's get_rope_config reading in 0.5.11's models/dflash.py
# (specfleet.core.sglang.rope decides, the recipe makes the file from the pinned wheels),
# applied and removed with PR#20547's journaled scripts in its own state folder.
# --------------------------------------------------------------------------------------------------


def rope_restore_steps(venv: str, marker: dict | None):
    """Commands that undo an applied (or half-applied) drafter RoPE patch, or forget a marker
    whose file pip has replaced since (its backup is then not put back)."""
    yield from restore_steps(rope_state_dir(venv), marker)


# The patch built once per process for each recipe and mirrors: its wheels are pinned by sha256,
# so every host gets the same file. A source that cannot be reached is tried once per run (per
# pyinfra State), not once per host: a 32-host converged run with no route to PyPI spent 21 ms
# of control CPU per host on it (an SSL context, then the failed lookup); the next run tries again.
_ROPE_BUILDS: dict[tuple[str, tuple[str, ...]], tuple] = {}
_ROPE_UNREACHABLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ROPE_LOCK = threading.Lock()


def _rope_built(patch, source: str | list[str] | None):
    """(diff, sha256 of the file it makes), or None when the pinned wheels cannot be fetched
    from this machine: said with the fix, and the host goes on without the patch (its drafter
    is slower without it, not wrong)."""
    mirrors = [source] if isinstance(source, str) else list(source or ())
    key = (rope_patch_id(patch), tuple(mirrors))
    unreachable = _ROPE_UNREACHABLE.setdefault(host.state, {})
    try:
        # The hosts' greenlets reach this together: the first fetches, the others wait for it
        # (pyinfra's gevent patches threading) instead of all fetching at once.
        with _ROPE_LOCK:
            if key not in _ROPE_BUILDS and key not in unreachable:
                _ROPE_BUILDS[key] = patch.build(UpstreamSources(patch.sources, mirrors,
                                                                host=host.name))
    except UpstreamUnreachable as exc:
        unreachable[key] = exc
    except (RecipeError, PatchFormatError) as exc:
        raise SpecfleetError(
            f"the drafter RoPE patch cannot be built from its pinned sources: {exc}",
            host=host.name,
            fix="point patch.source at the wheels the recipe names (or drop it to fetch them "
            "from PyPI)",
        ) from None
    if key in unreachable:
        exc = unreachable[key]
        logger.warning(f"{host.print_prefix}{exc.problem}: the drafter RoPE patch is left out, "
                       f"the drafter runs at base 1e6 (fix: {exc.fix})")  # fmt: skip
        return None
    return _ROPE_BUILDS[key]


def _rope_without_sglang(venv: str, source: str | list[str] | None, present: bool,
                    sglang_version: str | None):
    """The drafter RoPE patch with no SGLang in the venv: nothing to remove; while planning (a
    fresh host under ``--dry``) what the run will do once the release is in; else the host
    fails."""
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
                                  wanted_id=patch and rope_patch_id(patch))  # fmt: skip
    built = None if decision.noop else _rope_built(patch, source)
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
        yield from _rope_without_sglang(venv, source, present, sglang_version)
        return
    version = install.get("version") or "?"
    site = site_packages(install.get("location")) or ""
    d = rope_state_dir(venv)
    marker = cached_fact(host, RopePatchState, venv=venv)
    patch = load_rope_patch(version)
    hashes = {}
    built = None
    # The file is read only when the decision needs it: a converged host (its marker intact), a
    # release without a patch and a patch whose wheels cannot be fetched here (left out, said)
    # ask nothing beyond the probe's facts.
    if present and patch is not None and not (marker or {}).get("intact"):
        built = _rope_built(patch, source)
        if built is None and not marker:
            host.noop(f"SGLang {version}: the drafter RoPE patch is left out (its pinned wheels "
                      "cannot be fetched here); the drafter runs at base 1e6")  # fmt: skip
            return
        if site:
            hashes = dict(host.get_fact(FileHashes, directory=site, paths=(ROPE_TARGET,)) or {})
    decision = decide_dflash_rope(version, hashes.get(ROPE_TARGET), marker, present=present,
                                  patch=patch,
                                  wanted_id=patch and rope_patch_id(patch))  # fmt: skip
    if "apply" in decision.steps and built is None:
        built = _rope_built(patch, source)
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
                FunctionCommand(_rope_verify_or_roll_back,
                                (venv, version, site, rope_patch_id(patch), want,
                                 connector_args), {}),
            ]  # fmt: skip
    yield from commands


def _rope_verify_or_roll_back(state: Any, host: Any, venv: str, version: str, site: str, pid: str,
                         want: str, connector_args: dict) -> bool:  # fmt: skip
    """After the apply script: the file on disk must be the one built; then the marker. A
    conflict or any other file is rolled back and fails the host (nothing half-changed)."""
    d = rope_state_dir(venv)

    def run(script: str) -> bool:
        ok, _ = host.run_shell_command(script_command(script), **connector_args)
        return ok

    marker = host.get_fact(RopePatchState, venv=venv) or {}
    got = (host.get_fact(FileHashes, directory=site, paths=(ROPE_TARGET,)) or {}).get(ROPE_TARGET)
    if not marker.get("conflict") and got == want:
        return run(f"printf '%s\\n' {shlex.quote(pid)} > {shlex.quote(d)}/sha256")
    run(restore_script(d))
    why = ("GNU patch refused it" if marker.get("conflict")
           else f"{ROPE_TARGET} hashes {short(got)}, the patch makes {short(want)}")  # fmt: skip
    host.log(f"the drafter RoPE patch did not apply to SGLang {version} in {site} ({why}); "
             "rolled back, the install is unchanged\n  fix: reinstall SGLang "
             f"{version} from its wheel (pip install --force-reinstall --no-deps)", logger.error)
    return False
