"""The port of PR#20547's DFlash v2 worker onto released SGLang wheels, kept as data.

A port is a folder under ``specfleet/patchdata/pr20547/sglang-<version>/``:

- ``port.json``: the key (the PR revision's sha256, the SGLang version, the sha256 of every file
  the port modifies and of the files it relies on unchanged, the files it creates);
- ``recipe.json``: which upstream text makes each file, from sources pinned by sha256, and the
  lines this project wrote (``specfleet.core.sglang.recipe``); no upstream text is stored;
- ``provenance.json``: why each file of the recipe is what it is;
- ``NOTICE``: the Apache-2.0 notice of the upstream code the deploy fetches.

Everything here is pure text handling except :func:`load_ports`, the one function that reads (the
data folder, found with ``importlib.resources``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources

from specfleet.core.sglang.patch import PatchFormatError, filter_patch, hunk_line_counts

PATCHDATA_PACKAGE = "specfleet.patchdata"
PR20547_DIR = "pr20547"
PORT_FILE = "port.json"
PROVENANCE_FILE = "provenance.json"
# How port.json writes the sha256 of a file: lowercase hex, what ``sha256sum`` prints. (A wheel's
# RECORD has the same digest as urlsafe base64 without padding.)
HASH_FORMAT = "sha256-hex"

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class PortError(ValueError):
    """A port's data that does not fit what this module expects."""


# --------------------------------------------------------------------------------------------------
# Hunks of a unified diff
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hunk:
    """One hunk of a (git-style or plain) unified diff, with the header of its file."""

    index: int  # over the whole diff, counting from 0
    path: str  # the new path (the old one for a deletion), e.g. sglang/srt/environ.py
    file_header: tuple[str, ...]  # diff --git / index / new file mode / --- / +++
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str  # what follows the second @@ (a function name)
    lines: tuple[str, ...]  # the body, each with its newline and its leading " ", "-", "+", "\"

    @property
    def added(self) -> list[str]:
        """The added lines' text, without the ``+`` and the line end."""
        return [ln[1:].rstrip("\r\n") for ln in self.lines if ln.startswith("+")]

    @property
    def removed(self) -> list[str]:
        return [ln[1:].rstrip("\r\n") for ln in self.lines if ln.startswith("-")]

    @property
    def creates(self) -> bool:
        return any(ln.startswith("--- /dev/null") for ln in self.file_header)

    def header(self, new_start: int | None = None) -> str:
        start = self.new_start if new_start is None else new_start
        return f"@@ -{self.old_start},{self.old_len} +{start},{self.new_len} @@{self.section}\n"


def split_hunks(text: str) -> list[Hunk]:
    """Every hunk of a unified diff whose paths carry ``a/`` and ``b/`` (``-p1``), in order."""
    lines = text.splitlines(keepends=True)
    hunks: list[Hunk] = []
    header: list[str] = []
    had_hunk = False  # whether the current header already has hunks (the next line starts a file)
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _HUNK_RE.match(line)
        if m is None:
            if had_hunk or line.startswith("diff --git "):
                header, had_hunk = [], False
            header.append(line)
            i += 1
            continue
        path = _header_path(header)
        if not header:
            raise PatchFormatError(f"line {i + 1}: a hunk before any file header")
        had_hunk = True
        old_len = int(m.group(2)) if m.group(2) is not None else 1
        new_len = int(m.group(4)) if m.group(4) is not None else 1
        body: list[str] = []
        old_left, new_left = old_len, new_len
        i += 1
        while old_left > 0 or new_left > 0:
            if i >= len(lines):
                raise PatchFormatError(f"{path}: the diff ends inside a hunk")
            x = lines[i]
            counts = hunk_line_counts(x)
            if counts is None:
                raise PatchFormatError(f"{path}: line {i + 1} inside a hunk: {x!r}")
            old_left -= counts[0]
            new_left -= counts[1]
            body.append(x)
            i += 1
        while i < len(lines) and lines[i].startswith("\\"):
            body.append(lines[i])
            i += 1
        hunks.append(
            Hunk(
                index=len(hunks),
                path=path,
                file_header=tuple(header),
                old_start=int(m.group(1)),
                old_len=old_len,
                new_start=int(m.group(3)),
                new_len=new_len,
                section=m.group(5),
                lines=tuple(body),
            )
        )
    return hunks


def _header_path(header: list[str]) -> str:
    """The file a header names: its ``+++`` path, or its ``---`` path for a deletion."""
    new = old = ""
    for line in header:
        if line.startswith("+++ "):
            new = _strip_ab(line[4:])
        elif line.startswith("--- "):
            old = _strip_ab(line[4:])
    return new or old


def _strip_ab(raw: str) -> str:
    raw = raw.rstrip("\r\n").split("\t", 1)[0].strip()
    if raw == "/dev/null":
        return ""
    return raw.split("/", 1)[1] if raw.startswith(("a/", "b/")) else raw


def join_hunks(hunks: Iterable[Hunk]) -> str:
    """A patch of the given hunks (of one diff, in its order): each file's header once, and the
    new-side start lines recomputed so that they agree with the hunks left out."""
    out: list[str] = []
    last_path: str | None = None
    delta = 0
    for h in hunks:
        if h.path != last_path:
            out.extend(h.file_header)
            last_path, delta = h.path, 0
        start = h.old_start + delta if h.old_len else h.old_start + delta + 1
        if h.old_start == 0 and h.old_len == 0:
            start = 1 if h.new_len else 0
        out.append(h.header(start))
        out.extend(h.lines)
        delta += h.new_len - h.old_len
    return "".join(out)


def select_pr_hunks(pr_diff: str, indexes: Iterable[int]) -> str:
    """The PR diff mapped onto site-packages (``python/sglang/`` -> ``sglang/``, as
    :func:`filter_patch` does), cut down to the hunks at ``indexes`` (over the whole diff, from 0,
    strictly increasing)."""
    wanted = list(indexes)
    if wanted != sorted(set(wanted)):
        raise PortError(f"PR hunk indexes must be strictly increasing: {wanted}")
    hunks = split_hunks(filter_patch(pr_diff).text)
    if wanted and (wanted[0] < 0 or wanted[-1] >= len(hunks)):
        raise PortError(f"PR hunk indexes out of range 0..{len(hunks) - 1}: {wanted}")
    return join_hunks(hunks[i] for i in wanted)


# --------------------------------------------------------------------------------------------------
# The key: which port fits a tree
# --------------------------------------------------------------------------------------------------


def check_port(port: Mapping) -> list[str]:
    """What is wrong with a loaded ``port.json`` (empty when nothing)."""
    problems = []
    for field in ("pr_diff_sha256", "sglang_version", "targets", "recipe"):
        if field not in port:
            problems.append(f"missing {field}")
    if port.get("hash") != HASH_FORMAT:
        problems.append(f"hash is {port.get('hash')!r}, not {HASH_FORMAT!r}")
    for field in ("targets", "requires"):
        for path, digest in (port.get(field) or {}).items():
            if not isinstance(digest, str) or not _SHA256_RE.match(digest):
                problems.append(f"{field}[{path}] is not a lowercase hex sha256: {digest!r}")
    if not _SHA256_RE.match(str(port.get("pr_diff_sha256", ""))):
        problems.append("pr_diff_sha256 is not a lowercase hex sha256")
    return problems


def port_matches(
    port: Mapping, version: str, pr_diff_sha256: str, file_hashes: Mapping[str, str | None]
) -> bool:
    """Whether ``port`` (a loaded ``port.json``) fits a tree: the same SGLang version and PR diff,
    every file it modifies or relies on with the recorded sha256, and none of the files it creates
    already there. ``file_hashes``: ``{path under site-packages: sha256 hex, or None: absent}``."""
    if port.get("sglang_version") != version or port.get("pr_diff_sha256") != pr_diff_sha256:
        return False
    for field in ("targets", "requires"):
        for path, digest in (port.get(field) or {}).items():
            if file_hashes.get(path) != digest:
                return False
    return all(file_hashes.get(path) is None for path in port.get("creates") or ())


def port_for(
    version: str,
    pr_diff_sha256: str,
    file_hashes: Mapping[str, str | None],
    ports: Mapping[str, Mapping],
) -> str | None:
    """The port (its key in ``ports``, a data folder such as ``pr20547/sglang-0.5.11``) that fits
    the tree, or None: no port for this tree. ``ports`` is what :func:`load_ports` returns; this
    function reads nothing itself."""
    for name in sorted(ports):
        if port_matches(ports[name], version, pr_diff_sha256, file_hashes):
            return name
    return None


def hashed_paths(port: Mapping) -> list[str]:
    """The files whose sha256 a caller needs for :func:`port_for`: those the port modifies, relies
    on, or creates."""
    names = set(port.get("targets") or {}) | set(port.get("requires") or {})
    return sorted(names | set(port.get("creates") or ()))


# --------------------------------------------------------------------------------------------------
# Provenance: every added line of the adaptation comes from its named source, or says why not
# --------------------------------------------------------------------------------------------------

SourceReader = Callable[[str, str, str], "str | None"]  # (repo, commit, path) -> text or None


def _norm(line: str) -> str:
    # Indentation is not compared: re-indenting a derived line adds no code.
    return line.strip()


@dataclass(frozen=True)
class LineCount:
    derived: int  # added lines found in the named source (or moved within the hunk)
    new: int  # added lines listed in adapted_lines, or in a hunk without a source
    blank: int


def provenance_problems(
    adaptation: str, records: list[Mapping], read_source: SourceReader
) -> list[str]:
    """What does not hold in ``records`` (a loaded ``provenance.json``) for ``adaptation``: one
    record per hunk, in order, naming the hunk's file; a hunk with a source has every added line
    in that source file (indentation aside) or among the hunk's own removed lines (a line of the
    target moved or re-indented), except the lines listed in ``adapted_lines``, each with a
    reason; a line listed there is an added line of the hunk and is not in the source; a hunk
    without a source says ``why_new``."""
    hunks = split_hunks(adaptation)
    problems: list[str] = []
    by_hunk = {r.get("hunk"): r for r in records}
    ids = [r.get("hunk") for r in records]
    if ids != list(range(len(hunks))):
        problems.append(
            f"provenance has records for hunks {ids}; the adaptation has {len(hunks)} hunks "
            "(one record per hunk, in order)"
        )
    for h in hunks:
        rec = by_hunk.get(h.index)
        if rec is None:
            continue
        where = f"hunk {h.index} ({h.path})"
        if rec.get("file") != h.path:
            problems.append(f"{where}: provenance names file {rec.get('file')!r}")
        adapted = {}
        for item in rec.get("adapted_lines") or ():
            line = item.get("line") if isinstance(item, Mapping) else None
            if not isinstance(line, str) or not str(item.get("why") or "").strip():
                problems.append(f"{where}: adapted_lines entry without line and why: {item!r}")
                continue
            adapted[line] = item
        source = rec.get("source")
        if source is None:
            if not str(rec.get("why_new") or "").strip():
                problems.append(f"{where}: no source and no why_new")
            continue
        repo, commit, path = source.get("repo"), source.get("commit"), source.get("path")
        if not (repo and path and isinstance(commit, str) and _COMMIT_RE.match(commit)):
            problems.append(f"{where}: source needs repo, a 40-hex commit and path: {source!r}")
            continue
        text = read_source(repo, commit, path)
        if text is None:
            problems.append(f"{where}: cannot read the source {repo}@{commit[:12]}:{path}")
            continue
        known = {_norm(x) for x in text.splitlines()} | {_norm(x) for x in h.removed}
        added = h.added
        for line in added:
            if not _norm(line) or line in adapted:
                continue
            if _norm(line) not in known:
                problems.append(
                    f"{where}: added line not in {repo}@{commit[:12]}:{path} and not listed in "
                    f"adapted_lines: {line!r}"
                )
        for line in adapted:
            if line not in added:
                problems.append(
                    f"{where}: adapted_lines names a line the hunk does not add: {line!r}"
                )
            elif _norm(line) in known:
                problems.append(f"{where}: adapted_lines names a line the source has: {line!r}")
    return problems


def count_lines(adaptation: str, records: list[Mapping]) -> LineCount:
    """How many added lines of the adaptation are derived, new (adapted or without a source), or
    blank."""
    by_hunk = {r.get("hunk"): r for r in records}
    derived = new = blank = 0
    for h in split_hunks(adaptation):
        rec = by_hunk.get(h.index) or {}
        adapted = {item.get("line") for item in rec.get("adapted_lines") or ()}
        for line in h.added:
            if not _norm(line):
                blank += 1
            elif rec.get("source") is None or line in adapted:
                new += 1
            else:
                derived += 1
    return LineCount(derived=derived, new=new, blank=blank)


# --------------------------------------------------------------------------------------------------
# The data (the one reader here)
# --------------------------------------------------------------------------------------------------


def load_ports(package: str = PATCHDATA_PACKAGE) -> dict[str, dict]:
    """``{"pr20547/sglang-0.5.11": port.json's contents, ...}`` for every port shipped in
    ``package`` (found with ``importlib.resources``: a wheel's package data or a checkout)."""
    root = resources.files(package) / PR20547_DIR
    out: dict[str, dict] = {}
    if not root.is_dir():
        return out
    for folder in sorted(root.iterdir(), key=lambda p: p.name):
        spec = folder / PORT_FILE
        if folder.is_dir() and spec.is_file():
            port = json.loads(spec.read_text(encoding="utf-8"))
            problems = check_port(port)
            if problems:
                raise PortError(f"{PR20547_DIR}/{folder.name}/{PORT_FILE}: {'; '.join(problems)}")
            out[f"{PR20547_DIR}/{folder.name}"] = port
    return out


def read_port_file(name: str, file: str, package: str = PATCHDATA_PACKAGE) -> str:
    """The text of ``file`` (``adaptation.diff``, ``NOTICE``...) in the port ``name``."""
    return (resources.files(package).joinpath(*name.split("/"), file)).read_text(encoding="utf-8")
