"""Pure decisions behind ``operations.sglang``: what to install, which compressed-tensors, PR#20547.

Every function here is a pure function of fact values (no I/O), so it is tested in milliseconds.
"""

from __future__ import annotations

import fnmatch
import functools
import posixpath
import re
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from specfleet.core.layout import (  # noqa: F401 (the venv's paths, where the callers look)
    CREATED_MARKER,
    PATCH_STATE_DIR,
    created_marker,
    patch_state_dir,
    venv_python,
)
from specfleet.core.tables.sglang_versions import compressed_tensors_row

PACKAGE_PREFIX = "python/sglang/"
# GNU patch options shared by every check and apply: strip a/ b/, never ask, never reverse a patch
# on its own, no .orig files, rejects thrown away.
PATCH_OPTS = (
    "-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-",
)  # fmt: skip

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def site_packages(location: str | None) -> str | None:
    """The directory that holds the ``sglang`` package, from SGLangInstall's ``location`` (the
    package directory itself)."""
    if not location:
        return None
    loc = location.rstrip("/")
    return posixpath.dirname(loc) if posixpath.basename(loc) == "sglang" else loc


def short(sha: str | None) -> str:
    return (sha or "")[:12]


# --------------------------------------------------------------------------------------------------
# Package facts -> versions
# --------------------------------------------------------------------------------------------------


def package_version(packages: dict | None, dist: str) -> str | None:
    """The installed version of ``dist`` in a ``facts.python.Packages`` value (names normalised)."""
    if not packages:
        return None
    want = canonicalize_name(dist)
    for name, value in packages.items():
        if name == "direct_urls" or not isinstance(value, (str, type(None))):
            continue
        if canonicalize_name(name) == want:
            return value
    return None


def direct_url(packages: dict | None, dist: str) -> dict | None:
    """``{"url", "commit"}`` when ``dist`` was installed from a direct reference (git, URL)."""
    if not packages:
        return None
    want = canonicalize_name(dist)
    for name, value in (packages.get("direct_urls") or {}).items():
        if canonicalize_name(name) == want:
            return value or None
    return None


def is_commit(ref: str | None) -> bool:
    return bool(ref) and bool(_COMMIT_RE.match(ref.lower()))


def split_git_url(git_url: str) -> tuple[str, str]:
    """``(repository url for git, pip fragment)``: ``git+https://x/y.git#subdirectory=python`` ->
    ``("https://x/y.git", "#subdirectory=python")``."""
    url = git_url[4:] if git_url.startswith("git+") else git_url
    base, sep, frag = url.partition("#")
    return base, f"#{frag}" if sep else ""


def git_requirement(git_url: str, commit: str) -> str:
    """The pip requirement that installs ``sglang`` from ``git_url`` at ``commit``: a bare VCS URL
    (pip 23.0's PEP 508 parser rejects ``sglang @ git+file:///...``)."""
    base, frag = split_git_url(git_url)
    return f"git+{base}@{commit}{frag}"


def parse_ls_remote(lines: list[str], ref: str) -> str | None:
    """The commit ``git ls-remote URL REF`` resolves ``ref`` to: an exact ref first, then
    ``refs/heads/``, then a peeled tag (``^{}``), then a plain tag."""
    refs: dict[str, str] = {}
    for line in lines:
        parts = line.strip().split()
        if len(parts) == 2 and is_commit(parts[0]):
            refs[parts[1]] = parts[0].lower()
    for candidate in (
        ref,
        f"refs/heads/{ref}",
        f"refs/tags/{ref}^{{}}",
        f"refs/tags/{ref}",
        f"{ref}^{{}}",
    ):
        if candidate in refs:
            return refs[candidate]
    return None


# --------------------------------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What an operation does: ``action`` ("noop" or a verb) and why, in words a person reads."""

    action: str
    reason: str


def _pin_matches(installed: str, version: str) -> bool:
    """``installed`` satisfies ``==version`` the way pip reads a pin (local labels allowed)."""
    try:
        return Version(installed) in SpecifierSet(f"=={version}")
    except (InvalidVersion, InvalidSpecifier):
        return installed == version


def decide_install(
    installed: str | None,
    direct: dict | None,
    *,
    version: str | None,
    git_url: str | None = None,
    commit: str | None = None,
) -> Decision:
    """Install, reinstall (uninstall first) or leave SGLang.

    From an index the key is the version (``packaging``); a direct-reference build of the same
    version is not the release, so it is replaced. From git the key is the commit pip recorded in
    ``direct_url.json``: a git build's version is not stable.
    """
    if git_url:
        where = f"{split_git_url(git_url)[0]} at {short(commit)}"
        if installed is None:
            return Decision("install", f"SGLang is not installed; installs it from {where}")
        have = (direct or {}).get("commit")
        if have and commit and have.lower() == commit.lower():
            return Decision("noop", f"SGLang {installed} is installed from {where}")
        if have:
            return Decision(
                "reinstall",
                f"SGLang {installed} is built from commit {short(have)}; installs {where}",
            )
        return Decision(
            "reinstall", f"SGLang {installed} is a release install; installs it from {where}"
        )
    if not version:
        raise ValueError("an index install needs a version to pin")
    if installed is None:
        return Decision("install", f"SGLang is not installed; installs SGLang {version}")
    if direct and direct.get("commit"):
        return Decision(
            "reinstall",
            f"SGLang {installed} is built from git ({short(direct.get('commit'))}); "
            f"installs release {version}",
        )
    if _pin_matches(installed, version):
        return Decision("noop", f"SGLang {installed} is installed")
    return Decision(
        "install", f"SGLang {installed} is installed; settings pin {version}, installs it"
    )


@functools.lru_cache(maxsize=256)
def decide_compressed_tensors(
    installed: str | None, sglang_version: str, override: str | None = None
) -> tuple[Decision, SpecifierSet]:
    """Whether compressed-tensors must move. Only a version outside the specifier (or none at all)
    triggers an install. ``override`` is a user-given specifier that replaces the table's."""

    if override:
        try:
            spec = SpecifierSet(override)
        except InvalidSpecifier as exc:
            raise ValueError(f"not a version specifier: {override!r}") from exc
        why = f"settings ask for compressed-tensors{spec}"
    else:
        row = compressed_tensors_row(sglang_version)
        spec = row.compressed_tensors
        why = f"SGLang {sglang_version} needs compressed-tensors{spec} ({row.why})"
    if installed is None:
        return Decision("install", f"compressed-tensors is not installed; {why}"), spec
    try:
        ok = spec.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        ok = False
    if ok:
        return Decision("noop", f"compressed-tensors {installed} satisfies {spec}"), spec
    return Decision("install", f"compressed-tensors {installed} is outside {spec}; {why}"), spec


def has_v2_worker(features: dict | None) -> bool:
    features = features or {}
    return features.get("dflash") == "v2" or bool(features.get("dflash_pr20547"))


def source_label(source_path: str) -> str:
    """A source tree's name for its venv beside the base: the checkout's folder
    (``/opt/src/sglang-ddtree-fork/python`` -> ``src-sglang-ddtree-fork``)."""
    parts = [p for p in posixpath.normpath(source_path).split("/") if p]
    if len(parts) > 1 and parts[-1] == "python":
        parts = parts[:-1]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", parts[-1] if parts else "tree")
    return f"src-{name}"


def sibling_venv(base: str, version: str) -> str:
    """Where SGLang ``version`` goes beside the venv ``base``: ``/root/venv-sglang-0.5.14``."""
    return f"{base.rstrip('/')}-sglang-{version}"


@dataclass(frozen=True)
class VenvChoice:
    venv: str
    # Why it is not ``base`` (one line), or None.
    reason: str | None = None


def choose_venv(
    base: str,
    base_packages: dict | None,
    *,
    version: str | None,
    git: bool,
    side_by_side: bool,
    source_path: str | None = None,
) -> VenvChoice:
    """The venv this run installs into and the unit runs from. ``base`` (settings ``venv``) while
    it has no SGLang or holds the wanted release; else, with ``side_by_side``, a venv beside it
    for that release, so that the user's venv is never changed under them (pip would replace
    torch in it) and stays there to roll back to. Git installs stay in ``base``."""
    current = package_version(base_packages, "sglang")
    if source_path and side_by_side and current is not None:
        if (direct_url(base_packages, "sglang") or {}).get("url") == source_url(source_path):
            return VenvChoice(base)
        sibling = sibling_venv(base, source_label(source_path))
        return VenvChoice(
            sibling,
            f"{base} holds SGLang {current}: the tree {source_path} goes into {sibling} beside "
            f"it and the unit switches to it; {base} is kept as it is, for rollback",
        )
    if not side_by_side or git or source_path or not version or current is None:
        return VenvChoice(base)
    if _pin_matches(current, version) and direct_url(base_packages, "sglang") is None:
        return VenvChoice(base)
    sibling = sibling_venv(base, version)
    return VenvChoice(
        sibling,
        f"{base} holds SGLang {current}: SGLang {version} goes into {sibling} beside it and the "
        f"unit switches to it; {base} is kept as it is, for rollback",
    )


# --------------------------------------------------------------------------------------------------
# What an install into an existing venv would change besides SGLang (pip's own dry run)
# --------------------------------------------------------------------------------------------------

# What ``sglang.installed`` and ``sglang.compressed_tensors`` are there to move.
OWN_PACKAGES = ("sglang", "compressed-tensors")


@dataclass(frozen=True)
class PackageChange:
    """One distribution pip would install: ``old`` is the version there now (None: added)."""

    name: str
    old: str | None
    new: str

    def words(self) -> str:
        return f"{self.name} {self.old} -> {self.new}" if self.old else f"{self.name} {self.new}"


def planned_changes(report: dict | None, installed: dict[str, str] | None) -> list[PackageChange]:
    """What ``pip install --dry-run --report`` says it would install (its ``install`` list, pip's
    report format version 1), against the versions ``installed`` now (canonical names)."""
    have = {canonicalize_name(k): v for k, v in (installed or {}).items()}
    out = []
    for item in (report or {}).get("install") or []:
        meta = item.get("metadata") or {}
        name, version = meta.get("name"), meta.get("version")
        if not name or not version:
            continue
        key = canonicalize_name(name)
        out.append(PackageChange(key, have.get(key), str(version)))
    return sorted(out, key=lambda c: c.name)


def _allowed(name: str, allow: bool | list[str] | tuple[str, ...]) -> bool:
    if allow is True:
        return True
    if not allow:
        return False
    return any(fnmatch.fnmatchcase(name, canonicalize_name(p) if "*" not in p and "?" not in p
                                   and "[" not in p else p.lower()) for p in allow)


@dataclass(frozen=True)
class VenvChanges:
    """What an install into an existing venv does besides SGLang and compressed-tensors:
    ``replaced`` (installed now, another version after), ``added``, and ``refused``: the replaced
    ones this run will not let pip touch (a venv specfleet did not create, not allowed)."""

    replaced: tuple[PackageChange, ...] = ()
    added: tuple[PackageChange, ...] = ()
    refused: tuple[PackageChange, ...] = ()

    def summary(self, limit: int = 12) -> str | None:
        """``replaces torch 2.8.0 -> 2.9.1, ...; adds nvidia-nccl-cu12 2.27.3, ...`` or None."""
        parts = []
        for verb, items in (("replaces", self.replaced), ("adds", self.added)):
            if items:
                shown = ", ".join(c.words() for c in items[:limit])
                more = f" and {len(items) - limit} more" if len(items) > limit else ""
                parts.append(f"{verb} {shown}{more}")
        return "; ".join(parts) or None


def judge_venv_changes(
    changes: list[PackageChange], *, created_by_specfleet: bool,
    allow: bool | list[str] | tuple[str, ...] = False,
) -> VenvChanges:
    """Sort pip's planned changes: SGLang and compressed-tensors are this install's own; any
    other installed distribution it would replace is refused in a venv specfleet did not create,
    unless ``allow`` (``sglang.allow_replacing``: True, or names / globs) lets it."""
    others = [c for c in changes if c.name not in OWN_PACKAGES]
    replaced = tuple(c for c in others if c.old is not None and c.old != c.new)
    added = tuple(c for c in others if c.old is None)
    refused = () if created_by_specfleet else tuple(
        c for c in replaced if not _allowed(c.name, allow))
    return VenvChanges(replaced, added, refused)


def refused_message(venv: str, requirement: str, verdict: VenvChanges) -> tuple[str, str]:
    """``(problem, fix)`` when an install would replace packages it may not."""
    names = [c.name for c in verdict.refused]
    problem = (
        f"installing {requirement} into {venv}, a venv specfleet did not create, would replace "
        f"{', '.join(c.words() for c in verdict.refused)} (pip's dry run on the host); "
        "nothing was changed"
    )
    fix = (
        "keep this venv as it is and install beside it: set sglang.side_by_side: True (the "
        f"default); or let pip replace them there: sglang.allow_replacing: {names!r} (True for "
        "any package)"
    )
    return problem, fix


# --------------------------------------------------------------------------------------------------
# A source tree on the host (a DDTree fork's checkout, a git ref checked out by hand)
# --------------------------------------------------------------------------------------------------

_RUST_TABLE = re.compile(r"^\[\[tool\.setuptools-rust\.ext-modules\]\]\s*$")
_TOML_STRING = re.compile(r"""^(\w+)\s*=\s*["']([^"']*)["']\s*$""")


def source_url(source_path: str) -> str:
    """The ``direct_url.json`` url pip records for an install of the folder ``source_path``."""
    return "file://" + posixpath.normpath(source_path)


def rust_extensions(pyproject: str) -> list[dict[str, str]]:
    """The ``[[tool.setuptools-rust.ext-modules]]`` tables of a pyproject.toml (``target``,
    ``path`` of its Cargo.toml relative to the pyproject's folder): a build of such a tree needs
    a Rust toolchain and those sources. Read line by line (no TOML parser on Python 3.10)."""
    found: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for raw in pyproject.splitlines():
        line = raw.strip()
        if _RUST_TABLE.match(line):
            current = {}
            found.append(current)
        elif line.startswith("["):
            current = None
        elif current is not None:
            m = _TOML_STRING.match(line)
            if m:
                current[m.group(1)] = m.group(2)
    return found


def source_build_problem(
    source_path: str, pyproject: str | None, *, cargo: bool, missing: list[str]
) -> tuple[str, str] | None:
    """Why ``pip install SOURCE_PATH`` cannot build on this host (problem, fix), or None: no
    pyproject.toml there, or a Rust extension without ``cargo`` on the host or without its
    sources (``missing``: the Cargo.toml paths the host does not have). Said before anything
    changes."""
    if pyproject is None:
        return (
            f"{source_path} has no pyproject.toml: not an SGLang source tree (its python/ folder)",
            "set sglang.source_path to the python/ folder of an SGLang checkout on the host",
        )
    rust = rust_extensions(pyproject)
    if not rust:
        return None
    targets = ", ".join(r.get("target", "?") for r in rust)
    if not cargo:
        return (
            f"the SGLang tree at {source_path} builds a Rust extension ({targets}, "
            "setuptools-rust) and the host has no Rust toolchain (cargo not found); nothing "
            "was changed",
            "install a Rust toolchain on the host (rustup, or the distribution's cargo), or use "
            "a build of that tree made elsewhere (a wheel via sglang.find_links)",
        )
    if missing:
        return (
            f"the SGLang tree at {source_path} builds {targets} from {', '.join(missing)}, "
            "which is not on the host (a python/ folder alone, without the rest of the "
            "repository); nothing was changed",
            "check out the whole repository on the host and point sglang.source_path at its "
            "python/ folder",
        )
    return None


def source_record(sha256: str, source_path: str) -> str:
    """The line ``sglang.installed`` records in the venv after it built SGLang from a tree
    (``layout.source_key_path``): the tree's content sha256 and its folder."""
    return f"{sha256} {posixpath.normpath(source_path)}"


def decide_source_install(installed: str | None, direct: dict | None, source_path: str,
                          tree: dict | None = None) -> Decision:
    """From a source tree the key is the folder pip recorded (``direct_url.json``) and the tree's
    content (``tree``: ``facts.sglang.SourceTreeKey``, its sha256 and the one recorded at the
    last build): a source build's version is a placeholder (``0.0.0.dev0``) and says nothing
    about the tree, and the folder stays the same when what is in it changes (a pull, an edit,
    another branch). A changed tree is rebuilt, an unchanged one is not."""
    url = source_url(source_path)
    if installed is None:
        return Decision("install", f"SGLang is not installed; installs it from {source_path}")
    if (direct or {}).get("url") != url:
        return Decision("reinstall",
                        f"SGLang {installed} is not the tree {source_path}; installs it from there")
    tree = tree or {}
    key, recorded = tree.get("sha256"), (tree.get("recorded") or "").strip()
    if key is None:
        return Decision("noop", f"SGLang {installed} is installed from the tree {source_path}, "
                                "which is not on the host now: kept as it is")
    if recorded == source_record(key, source_path):
        return Decision("noop", f"SGLang {installed} is installed from the tree {source_path} "
                                f"as it is now (content {short(key)})")
    if not recorded:
        return Decision("reinstall", f"SGLang {installed} is installed from the tree "
                        f"{source_path}, but from which content of it is not recorded: rebuilds "
                        f"it from the tree as it is now (content {short(key)})")
    before = recorded.split(" ", 1)[0]
    return Decision("reinstall", f"the tree {source_path} changed since SGLang {installed} was "
                    f"built from it (content {short(before)} -> {short(key)}): rebuilds it")
