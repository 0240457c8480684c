"""Pure decisions, patch handling and small host facts behind ``operations.sglang``.

Everything here that decides is a pure function of fact values (no I/O), so it is tested in
milliseconds. The facts at the bottom are the few host questions ``facts/`` does not ask: whether a
venv exists, what commit a git ref names, and the state of an applied PR#20547 patch.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pyinfra.api import FactBase, QuoteString, StringCommand

from deploys.errors import SpecfleetError
from facts.hostpy import PythonJob

# Where an applied PR#20547 keeps its state, relative to the venv: the mapped diff it applied
# (``applied.diff``), a tar of the files it modified (``backup.tar``), the files and directories
# it created (``created``, ``created_dirs``), the site-packages it patched (``site``) and, written
# last, the sha256 of the patch as given (``sha256``): the marker.
PATCH_STATE_DIR = ".specfleet/pr20547"
PACKAGE_PREFIX = "python/sglang/"
V2_BUILTIN_SINCE = "0.5.14"
# GNU patch options shared by every check and apply: strip a/ b/, never ask, never reverse a patch
# on its own, no .orig files, rejects thrown away.
PATCH_OPTS = ("-p1", "--forward", "--batch", "--no-backup-if-mismatch", "--reject-file=-")
REVERSE_OPTS = (
    "-p1",
    "--reverse",
    "--forward",
    "--batch",
    "--no-backup-if-mismatch",
    "--reject-file=-",
)

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def venv_python(venv: str) -> str:
    return f"{venv.rstrip('/')}/bin/python"


def patch_state_dir(venv: str) -> str:
    return f"{venv.rstrip('/')}/{PATCH_STATE_DIR}"


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


def decide_compressed_tensors(
    installed: str | None, sglang_version: str, override: str | None = None
) -> tuple[Decision, SpecifierSet]:
    """Whether compressed-tensors must move. Only a version outside the specifier (or none at all)
    triggers an install. ``override`` is a user-given specifier that replaces the table's."""
    from deploys.versions import compressed_tensors_row

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


@dataclass(frozen=True)
class PatchDecision:
    """``steps`` run in order: "restore" (undo an applied or half-applied patch from its backup),
    "drop-marker" (forget a marker whose patch is no longer on disk), "apply"."""

    steps: tuple[str, ...]
    reason: str
    warning: str | None = None
    # Whether the files are as the facts saw them when "apply" runs, so that a dry run made now
    # (before any step) says whether it applies.
    precheck: bool = True

    @property
    def noop(self) -> bool:
        return not self.steps


def decide_pr20547(
    install: dict | None,
    marker: dict | None,
    *,
    present: bool,
    source: str | None,
    sha256: str | None,
) -> PatchDecision:
    """What to do about PR#20547 given the SGLangInstall fact, the patch-state fact and settings.

    ``marker`` is ``PatchState``'s value: None, or ``{"sha256", "site", "reverse_applies",
    "partial"}``. A marker counts only while the applied diff still reverses cleanly.
    """
    version = (install or {}).get("version") or "?"
    steps: list[str] = []
    warning = None
    applied_sha = None
    if marker:
        if marker.get("partial"):
            steps.append("restore")
            warning = "a PR#20547 apply was interrupted; restores the files it had touched"
        elif marker.get("reverse_applies"):
            applied_sha = marker.get("sha256")
        else:
            steps.append("drop-marker")
            leftovers = marker.get("leftovers") or []
            warning = (
                f"the PR#20547 marker ({short(marker.get('sha256'))}) no longer matches the files "
                "on disk (SGLang was reinstalled?); forgets it"
            )
            if leftovers:
                warning += (
                    f" and removes the {len(leftovers)} files it had added, which pip does not "
                    f"know: {', '.join(leftovers[:4])}"
                )
                # The facts saw those leftovers (a v2 worker file, say): they cannot be trusted
                # until the files are gone, so apply again and let the verify step decide.
                if present and source:
                    return PatchDecision(
                        ("drop-marker", "apply"),
                        f"SGLang {version} keeps leftovers of an earlier PR#20547; removes them "
                        f"and applies PR#20547 ({short(sha256)})",
                        warning,
                        precheck=False,
                    )
                return PatchDecision(("drop-marker",), "PR#20547 patch is not applied", warning)

    if not present:
        if applied_sha:
            return PatchDecision(
                ("restore",), f"removes PR#20547 patch {short(applied_sha)} from SGLang {version}"
            )
        return PatchDecision(tuple(steps), "PR#20547 patch is not applied", warning)

    if applied_sha:
        if sha256 and applied_sha.lower() == sha256.lower():
            return PatchDecision((), f"PR#20547 patch {short(applied_sha)} is applied")
        if not source:
            # The settings no longer name a patch: what is there stays (present=False removes it).
            return PatchDecision((), f"PR#20547 patch {short(applied_sha)} is applied")
        return PatchDecision(
            ("restore", "apply"),
            f"PR#20547 patch {short(applied_sha)} is applied but settings pin {short(sha256)}; "
            "replaces it",
            precheck=False,
        )
    features = (install or {}).get("features") or {}
    if has_v2_worker(features):
        what = "PR#20547 built in" if features.get("dflash_pr20547") else "the DFlash v2 worker"
        return PatchDecision(tuple(steps), f"SGLang {version} has {what}", warning)
    if not source:
        return PatchDecision(
            tuple(steps),
            f"SGLang {version} has no DFlash v2 worker and no patch source is set; "
            f"DFLASH runs v1 with overlap off (SGLang >={V2_BUILTIN_SINCE} has v2 built in)",
            warning,
        )
    return PatchDecision(
        (*steps, "apply"),
        f"SGLang {version} has no DFlash v2 worker; applies PR#20547 ({short(sha256)})",
        warning,
        # A half-applied patch is restored first: the files change before "apply".
        precheck="restore" not in steps,
    )


# --------------------------------------------------------------------------------------------------
# The patch: filter to the package, map onto site-packages, read GNU patch's complaints
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to site-packages, e.g. sglang/srt/environ.py
    kind: str  # "create", "modify", "delete", "rename"
    old_path: str | None = None
    hunks: int = 0


@dataclass(frozen=True)
class FilteredPatch:
    text: str
    files: tuple[FileChange, ...]
    dropped: tuple[str, ...]

    @property
    def created(self) -> list[str]:
        return [f.path for f in self.files if f.kind in ("create", "rename")]

    @property
    def existing(self) -> list[str]:
        """Files that must exist before applying: the ones to back up."""
        out = []
        for f in self.files:
            if f.kind in ("modify", "delete"):
                out.append(f.path)
            elif f.kind == "rename" and f.old_path:
                out.append(f.old_path)
        return out

    @property
    def hunks(self) -> int:
        return sum(f.hunks for f in self.files)

    def summary(self) -> str:
        text = f"{len(self.files)} files under {PACKAGE_PREFIX} ({self.hunks} hunks)"
        if self.dropped:
            text += f"; leaves out {len(self.dropped)}: {', '.join(self.dropped[:6])}"
            if len(self.dropped) > 6:
                text += ", ..."
        return text


class PatchFormatError(ValueError):
    pass


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _header_path(line: str) -> str | None:
    """The path of a ``--- ``/``+++ `` line with the first component stripped; None for
    /dev/null."""
    raw = line[4:].rstrip("\n")
    raw = raw.split("\t", 1)[0]
    if raw.startswith('"') and raw.endswith('"'):
        raw = raw[1:-1]
    raw = raw.rstrip()
    if raw == "/dev/null":
        return None
    return raw.split("/", 1)[1] if "/" in raw else raw


@dataclass
class _Section:
    lines: list[str] = field(default_factory=list)
    git_old: str | None = None
    git_new: str | None = None
    old: str | None = None
    new: str | None = None
    has_headers: bool = False
    created: bool = False
    deleted: bool = False
    rename_from: str | None = None
    rename_to: str | None = None
    binary: bool = False
    hunks: int = 0


def _split_sections(text: str) -> list[_Section]:
    lines = text.splitlines(keepends=True)
    sections: list[_Section] = []
    cur: _Section | None = None
    old_left = new_left = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if old_left > 0 or new_left > 0:
            # Inside a hunk: count, so that a removed "-- x" line is never taken for a header.
            if cur is None:
                raise PatchFormatError("hunk outside any file")
            cur.lines.append(line)
            tag = line[:1]
            if tag == " " or line in ("\n", "\r\n"):
                old_left -= 1
                new_left -= 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            elif tag == "\\":
                pass
            else:
                raise PatchFormatError(f"line {i + 1}: unexpected line inside a hunk: {line!r}")
            i += 1
            continue
        if line.startswith("diff --git "):
            cur = _Section()
            sections.append(cur)
            m = re.match(r"^diff --git (\"?a/.+?\"?) (\"?b/.+\"?)$", line.rstrip("\n"))
            if m:
                cur.git_old = m.group(1).strip('"').split("/", 1)[1]
                cur.git_new = m.group(2).strip('"').split("/", 1)[1]
            cur.lines.append(line)
        elif (
            line.startswith("--- ")
            and i + 1 < len(lines)
            and lines[i + 1].startswith("+++ ")
            and (cur is None or cur.has_headers or cur.hunks)
        ):
            # A plain unified diff (no "diff --git" line) starts a new file here.
            cur = _Section()
            sections.append(cur)
            continue
        elif cur is None:
            pass  # preamble (a mail header, a diffstat): not part of any file
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            cur.old = _header_path(line)
            cur.new = _header_path(lines[i + 1])
            cur.created = cur.created or cur.old is None
            cur.deleted = cur.deleted or cur.new is None
            cur.has_headers = True
            cur.lines.extend([line, lines[i + 1]])
            i += 2
            continue
        elif (m := _HUNK_RE.match(line)) and cur.has_headers:
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            cur.hunks += 1
            cur.lines.append(line)
        elif cur.hunks == 0 and not cur.has_headers and cur.git_old is not None:
            # git extended header lines
            if line.startswith("new file mode"):
                cur.created = True
            elif line.startswith("deleted file mode"):
                cur.deleted = True
            elif line.startswith(("rename from ", "copy from ")):
                cur.rename_from = line.split(" ", 2)[2].rstrip("\n")
            elif line.startswith(("rename to ", "copy to ")):
                cur.rename_to = line.split(" ", 2)[2].rstrip("\n")
            elif line.startswith(("GIT binary patch", "Binary files ")):
                cur.binary = True
            cur.lines.append(line)
        elif line.startswith(("GIT binary patch", "Binary files ")):
            cur.binary = True
            cur.lines.append(line)
        else:
            pass  # trailing text after a file's hunks (a mail signature): dropped
        i += 1
    if old_left > 0 or new_left > 0:
        raise PatchFormatError("the patch ends inside a hunk (truncated?)")
    return sections


def _map(path: str | None) -> str | None:
    if path is None:
        return None
    if path.startswith(PACKAGE_PREFIX):
        return path[len("python/") :]
    return None


def filter_patch(text: str) -> FilteredPatch:
    """Keep only the files under ``python/sglang/`` and rewrite their paths onto site-packages
    (``python/sglang/srt/x.py`` -> ``sglang/srt/x.py``, still with ``a/``/``b/`` for ``-p1``).
    Everything else (``benchmark/``, ``pyproject.toml``, tests) is dropped and listed."""
    kept: list[str] = []
    files: list[FileChange] = []
    dropped: list[str] = []
    for sec in _split_sections(text):
        old = sec.rename_from or (sec.old if sec.has_headers else sec.git_old)
        new = sec.rename_to or (sec.new if sec.has_headers else sec.git_new)
        if sec.created:
            old = None
        if sec.deleted:
            new = None
        label = new or old or sec.git_new or "?"
        m_old, m_new = _map(old), _map(new)
        inside = [p for p in (old, new) if p is not None]
        if not inside or not all(_map(p) for p in inside):
            dropped.append(label)
            continue
        if sec.binary:
            raise PatchFormatError(f"{label}: binary diffs cannot be applied with GNU patch")
        if sec.hunks == 0 and not (sec.rename_from or sec.created or sec.deleted):
            dropped.append(f"{label} (mode-only)")
            continue
        out = []
        for line in sec.lines:
            if line.startswith("diff --git "):
                a = m_old or m_new
                b = m_new or m_old
                line = f"diff --git a/{a} b/{b}\n"
            elif line.startswith("--- ") and sec.has_headers and not out_has_hunk(out):
                line = "--- /dev/null\n" if m_old is None else f"--- a/{m_old}\n"
            elif line.startswith("+++ ") and sec.has_headers and not out_has_hunk(out):
                line = "+++ /dev/null\n" if m_new is None else f"+++ b/{m_new}\n"
            elif line.startswith(("rename from ", "copy from ")) and not out_has_hunk(out):
                line = f"{line.split(' ', 2)[0]} from {m_old}\n"
            elif line.startswith(("rename to ", "copy to ")) and not out_has_hunk(out):
                line = f"{line.split(' ', 2)[0]} to {m_new}\n"
            out.append(line)
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        kept.extend(out)
        if m_old is None:
            kind = "create"
        elif m_new is None:
            kind = "delete"
        elif m_old != m_new:
            kind = "rename"
        else:
            kind = "modify"
        files.append(
            FileChange(
                path=m_new or m_old or "",
                kind=kind,
                old_path=m_old if kind == "rename" else None,
                hunks=sec.hunks,
            )
        )
    if not files:
        raise PatchFormatError(
            f"no file under {PACKAGE_PREFIX} in the patch"
            + (f" (it touches only: {', '.join(dropped[:8])})" if dropped else "")
        )
    return FilteredPatch(text="".join(kept), files=tuple(files), dropped=tuple(dropped))


def out_has_hunk(out: list[str]) -> bool:
    return any(line.startswith("@@ ") for line in out)


def parse_patch_failures(lines: list[str]) -> dict[str, list[str]]:
    """GNU patch's output (dry run or real) -> ``{file: [problem, ...]}`` for the files that fail.
    Problems not tied to a file are under ``""``."""
    failures: dict[str, list[str]] = {}
    current = ""
    pending_missing = False

    def add(path: str, problem: str) -> None:
        failures.setdefault(path, []).append(problem)

    for raw in lines:
        line = raw.rstrip("\n")
        if m := re.match(r"^(?:checking|patching) file (.+)$", line):
            current = m.group(1).strip("'\"")
        elif m := re.match(r"^The next patch would (create|delete) the file (.+?),?$", line):
            current = m.group(2).strip("'\"")
            add(current, "already exists" if m.group(1) == "create" else "would be deleted")
        elif m := re.match(r"^Hunk #(\d+) FAILED at (\d+)", line):
            add(current, f"hunk #{m.group(1)} FAILED at line {m.group(2)}")
        elif line.startswith("Reversed (or previously applied) patch detected"):
            add(current, "already applied (reversed patch detected)")
        elif line.startswith("can't find file to patch"):
            pending_missing = True
        elif pending_missing and (m := re.match(r"^\|(?:\+\+\+|---) (.+)$", line)):
            path = _header_path(f"--- {m.group(1)}")
            if path:
                current = path
        elif pending_missing and line.startswith("No file to patch"):
            add(current, "file not found")
            pending_missing = False
        elif line.startswith("patch: **** "):
            add("", line[len("patch: **** ") :])
    return failures


def describe_failures(failures: dict[str, list[str]]) -> str:
    parts = []
    for path, problems in failures.items():
        parts.append(f"{path or 'patch'}: {', '.join(problems)}")
    return "; ".join(parts) if parts else "GNU patch refused it (no detail)"


def conflict_message(
    version: str, site: str, sha256: str | None, failures: dict[str, list[str]], on_conflict: str
) -> str:
    head = (
        f"PR#20547 patch {short(sha256)} does not apply to SGLang {version} in {site}: "
        f"{describe_failures(failures)}. The install is unchanged."
    )
    if on_conflict == "keep-v1":
        head += " DFLASH runs v1 with overlap scheduling off."
    return head + f" SGLang >={V2_BUILTIN_SINCE} has the DFlash v2 worker built in."


CONFLICT_FIX = (
    f"pin sglang.version to {V2_BUILTIN_SINCE} or later (the v2 worker is built in), or give a "
    "patch.source/patch.sha256 that applies to this SGLang, or set patch.on_conflict = 'keep-v1' "
    "to run DFLASH v1 with overlap off"
)


# --------------------------------------------------------------------------------------------------
# Reading the patch on the control machine
# --------------------------------------------------------------------------------------------------

_PATCH_CACHE: dict[tuple[str, str], str] = {}


def load_patch(source: str, sha256: str | None, host: str | None = None) -> str:
    """The patch text from a local file or an http(s) URL, checked against ``sha256``."""
    if not sha256:
        raise SpecfleetError(
            f"patch source {source} has no sha256 pin",
            host=host,
            fix="set patch.sha256 to the sha256 of the diff (sha256sum FILE)",
        )
    key = (source, sha256.lower())
    if key in _PATCH_CACHE:
        return _PATCH_CACHE[key]
    scheme = urllib.parse.urlparse(source).scheme
    try:
        if scheme in ("http", "https"):
            with urllib.request.urlopen(source, timeout=120) as resp:  # noqa: S310 (http/https only)
                data = resp.read()
        elif scheme in ("", "file"):
            path = urllib.parse.urlparse(source).path if scheme == "file" else source
            data = Path(path).expanduser().read_bytes()
        else:
            raise SpecfleetError(
                f"patch source {source} has an unsupported scheme {scheme!r}",
                host=host,
                fix="give a local path on the control machine or an http(s) URL",
            )
    except OSError as exc:
        raise SpecfleetError(
            f"cannot read the PR#20547 patch from {source}: {exc}",
            host=host,
            fix="check patch.source (a path on the control machine or a reachable URL)",
        ) from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha256.lower():
        raise SpecfleetError(
            f"the patch from {source} has sha256 {got}, settings pin {sha256}",
            host=host,
            fix="check that patch.source is the intended diff, then set patch.sha256 to its hash",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecfleetError(
            f"the patch from {source} is not UTF-8 text", host=host, fix="give a unified diff"
        ) from None
    _PATCH_CACHE[key] = text
    return text


# --------------------------------------------------------------------------------------------------
# Shell scripts (paths are quoted with shlex; nothing here runs on its own)
# --------------------------------------------------------------------------------------------------


def _q(value: str) -> str:
    return shlex.quote(value)


def apply_script(state_dir: str, site: str, patch: FilteredPatch) -> str:
    """Back up, dry-run, apply. A dry-run that fails leaves every file as it was and writes GNU
    patch's words to ``conflict``; a real apply that fails restores the backup and exits 1."""
    d, s = _q(state_dir), _q(site)
    existing = " ".join(_q(p) for p in patch.existing)
    created = " ".join(_q(p) for p in patch.created)
    opts = " ".join(PATCH_OPTS)
    return "\n".join(
        [
            "set -e",
            f"d={d}",
            f"cd {s}",
            'printf "%s\\n" "$PWD" > "$d/site"',
            f'printf "%s\\n" {created} > "$d/created"' if created else ': > "$d/created"',
            # Directories the patch will create, deepest first, so that a revert can remove them.
            f'for f in {created}; do p=$(dirname "$f"); '
            'while [ "$p" != . ] && [ ! -e "$p" ]; do echo "$p"; p=$(dirname "$p"); done; '
            'done | sort -u -r > "$d/created_dirs"'
            if created
            else ': > "$d/created_dirs"',
            f'tar -cf "$d/backup.tar" -- {existing}'
            if existing
            else 'tar -cf "$d/backup.tar" -T /dev/null',
            f'if ! patch --dry-run {opts} -i "$d/applied.diff" > "$d/dryrun.out" 2>&1; then',
            '  cp "$d/dryrun.out" "$d/conflict"; cat "$d/conflict"; exit 0',
            "fi",
            f'if ! patch {opts} -i "$d/applied.diff"; then',
            '  echo "patch failed after a clean dry run; restoring" >&2',
            f"  {restore_files_script()}",
            "  exit 1",
            "fi",
            # What it added, by content: after an out-of-band reinstall these are the leftovers.
            f'sha256sum -- {created} > "$d/created.sha256"'
            if created
            else ': > "$d/created.sha256"',
        ]
    )


def restore_files_script() -> str:
    """Undo an apply from ``$d`` (cwd = the site it patched): remove what it created, untar what
    it modified. Needs ``d`` set."""
    return (
        'while IFS= read -r f; do [ -n "$f" ] || continue; rm -f -- "$f"; '
        'b=$(basename "$f" .py); rm -f -- "$(dirname "$f")/__pycache__/$b".*.pyc; '
        'done < "$d/created"; '
        'tar -xf "$d/backup.tar"; '
        'while IFS= read -r p; do [ -n "$p" ] || continue; '
        'rm -rf -- "$p/__pycache__"; rmdir --ignore-fail-on-non-empty -- "$p"; '
        'done < "$d/created_dirs"'
    )


def restore_script(state_dir: str) -> str:
    """Restore the files an apply (complete or interrupted) touched, then forget it."""
    d = _q(state_dir)
    return "\n".join(
        [
            "set -e",
            f"d={d}",
            'if [ -f "$d/backup.tar" ] && [ -f "$d/site" ]; then',
            '  cd "$(cat "$d/site")"',
            f"  {restore_files_script()}",
            "fi",
            'rm -rf -- "$d"',
        ]
    )


def forget_script(state_dir: str) -> str:
    """Forget a marker whose patch is no longer on disk (SGLang reinstalled under it): remove the
    files it added that are still exactly as it added them (pip does not know them), then the
    state directory. Files pip has replaced since are left alone."""
    d = _q(state_dir)
    return "\n".join(
        [
            "set -e",
            f"d={d}",
            'if [ -f "$d/created.sha256" ] && [ -f "$d/site" ]; then',
            '  cd "$(cat "$d/site")"',
            '  sha256sum -c "$d/created.sha256" 2>/dev/null | sed -n "s/: OK$//p" | '
            'while IFS= read -r f; do rm -f -- "$f"; '
            'b=$(basename "$f" .py); rm -f -- "$(dirname "$f")/__pycache__/$b".*.pyc; done',
            '  if [ -f "$d/created_dirs" ]; then while IFS= read -r p; do [ -n "$p" ] || continue; '
            '[ -d "$p" ] || continue; rmdir --ignore-fail-on-non-empty -- "$p/__pycache__" "$p" '
            '2>/dev/null || true; done < "$d/created_dirs"; fi',
            "fi",
            'rm -rf -- "$d"',
        ]
    )


def pinned_install_script(
    python: str, pip_args: list[str], dist: str, specifier: str, check: bool = True
) -> str:
    """Install ``dist`` within ``specifier`` while every other distribution in the environment
    stays where it is: a constraints file of the current pins (``pip list --format=freeze``
    minus ``dist``). Then ``pip check``, failing only on problems the install brought: problems
    that were there before (a venv with extras missing, say) are printed, not fatal."""
    py = _q(python)
    name_re = "[-_.]".join(re.escape(part) for part in re.split(r"[-_.]+", dist))
    lines = [
        "set -e",
        "c=$(mktemp)",
        'trap \'rm -f "$c" "$c.all" "$c.before" "$c.after"\' EXIT',
        f'{py} -m pip list --format=freeze --disable-pip-version-check > "$c.all"',
        f'grep -viE {_q(f"^{name_re}==")} "$c.all" > "$c" || true',
    ]
    if check:
        lines.append(f'{py} -m pip check > "$c.before" 2>&1 || true')
    lines.append(
        f'{py} -m pip install {shlex.join(pip_args)} --constraint "$c" {_q(dist + specifier)}'
    )
    if check:
        lines += [
            f'if ! {py} -m pip check > "$c.after" 2>&1; then',
            '  new=$(grep -vxF -f "$c.before" "$c.after" || true)',
            '  if [ -n "$new" ]; then',
            f'    echo "pip check: installing {dist} broke:" >&2; echo "$new" >&2; exit 1',
            "  fi",
            '  echo "pip check: only problems that were there before:"; cat "$c.after"',
            "fi",
        ]
    return "\n".join(lines)


def script_command(script: str) -> StringCommand:
    return StringCommand("sh", "-c", QuoteString(script))


# --------------------------------------------------------------------------------------------------
# Host facts that facts/ does not provide
# --------------------------------------------------------------------------------------------------


class Venv(FactBase[dict | None]):
    """Whether ``path`` is a venv: None if nothing is there, ``{"python": None}`` for a path that is
    not a venv, else the interpreter's version.

    .. code:: python

        {"path": "/opt/specfleet/sglang", "python": "3.11.2"}
    """

    def python_job(self, path: str) -> PythonJob:
        # -I as the SGLang facts of the same interpreter: a probe runs them in one process.
        return PythonJob(venv_python(path), ("-I",),
                         "import sys; print('python=%d.%d.%d' % sys.version_info[:3])")

    def command(self, path: str) -> StringCommand:
        py = venv_python(path)
        return StringCommand(
            "if", "test", "-x", QuoteString(py), ";", "then", *self.python_job(path).words(), ";",
            "elif", "test", "-e", QuoteString(path), ";", "then", "echo", "python=", ";", "fi",
        )  # fmt: skip

    def process(self, output: list[str]) -> dict | None:
        for line in output:
            if line.startswith("python="):
                return {"python": line[len("python=") :].strip() or None}
        return None


class GitRemoteRefs(FactBase[list[str]]):
    """The raw ``git ls-remote URL REF`` lines, for ``parse_ls_remote``.

    .. code:: python

        ["e67a0d4880f1d6a1c4e0b9a3f1b2c3d4e5f60718\trefs/heads/dflash_v2"]
    """

    default = list

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "git"

    def command(self, url: str, ref: str) -> StringCommand:
        # No prompt for credentials: a private URL fails instead of hanging the deploy.
        return StringCommand(
            "GIT_TERMINAL_PROMPT=0", "git", "ls-remote", "--", QuoteString(url), QuoteString(ref),
            QuoteString(f"{ref}^{{}}"),
        )  # fmt: skip

    def process(self, output: list[str]) -> list[str]:
        return list(output)


class PatchState(FactBase[dict | None]):
    """An applied PR#20547 in a venv: the marker's sha256, the site it patched, and whether the
    applied diff still reverses cleanly there (``patch -R --dry-run``). None if no patch was
    applied; ``partial`` for an apply that never reached its marker; ``leftovers``, for a marker
    that no longer reverses, the files it added that are still exactly as it added them.

    .. code:: python

        {"sha256": "9f2c...", "site": "/opt/v/lib/python3.11/site-packages",
         "reverse_applies": True, "partial": False}
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "patch"

    def command(self, venv: str) -> str:
        d = _q(patch_state_dir(venv))
        rev = " ".join(REVERSE_OPTS)
        return (
            f"d={d}; "
            'if [ -f "$d/sha256" ]; then '
            'echo "sha256=$(cat "$d/sha256")"; echo "site=$(cat "$d/site")"; '
            f'if (cd "$(cat "$d/site")" && patch --dry-run {rev} -i "$d/applied.diff") '
            ">/dev/null 2>&1; then echo reverse=ok; else echo reverse=fail; "
            'if [ -f "$d/created.sha256" ]; then (cd "$(cat "$d/site")" && '
            'sha256sum -c "$d/created.sha256" 2>/dev/null '
            '| sed -n "s/^\\(.*\\): OK$/leftover=\\1/p"); '
            "fi; fi; "
            'elif [ -d "$d" ]; then echo partial=1; '
            'if [ -f "$d/conflict" ]; then sed "s/^/conflict:/" "$d/conflict"; fi; fi'
        )

    def process(self, output: list[str]) -> dict | None:
        if not any(line.strip() for line in output):
            return None
        out: dict[str, Any] = {
            "sha256": None, "site": None, "reverse_applies": False, "partial": False,
            "conflict": [], "leftovers": [],
        }  # fmt: skip
        for line in output:
            if line.startswith("sha256="):
                out["sha256"] = line[len("sha256=") :].strip() or None
            elif line.startswith("site="):
                out["site"] = line[len("site=") :].strip() or None
            elif line.startswith("reverse="):
                out["reverse_applies"] = line.strip() == "reverse=ok"
            elif line.startswith("partial="):
                out["partial"] = True
            elif line.startswith("leftover="):
                out["leftovers"].append(line[len("leftover=") :])
            elif line.startswith("conflict:"):
                out["conflict"].append(line[len("conflict:") :])
        return out


class PatchCheck(FactBase[dict]):
    """A dry run of the diff given on stdin (``_stdin=``) in ``directory``: nothing is written.

    .. code:: python

        {"applies": False, "output": ["checking file sglang/srt/environ.py",
                                      "Hunk #1 FAILED at 57."]}
    """

    default = dict

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "patch"

    def command(self, directory: str) -> str:
        opts = " ".join(PATCH_OPTS)
        return (
            f"if cd {_q(directory)}; then "
            f"if patch --dry-run {opts} 2>&1; then echo '##applies=1'; "
            "else echo '##applies=0'; fi; else echo '##applies=0'; fi"
        )

    def process(self, output: list[str]) -> dict:
        applies = "##applies=1" in output
        return {"applies": applies, "output": [x for x in output if not x.startswith("##applies")]}
