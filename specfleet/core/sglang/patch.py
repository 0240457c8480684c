"""The PR#20547 diff: filtered to the package, mapped onto site-packages, GNU patch's words read.

Pure text handling, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from specfleet.core.sglang.install import PACKAGE_PREFIX

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
    def touched(self) -> list[str]:
        """Every path the patch may write, create or delete. Which of them exist is read from the
        tree at apply time, never from the diff's "new file" headers: a file the PR creates may
        already ship in the installed release (0.5.11 ships DFlash v1)."""
        out: list[str] = []
        for f in self.files:
            for path in (f.old_path, f.path):
                if path and path not in out:
                    out.append(path)
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


# A hunk's header; group 5: what follows the second @@ (a function name).
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


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
    # Where each hunk's @@ line is in ``lines``.
    hunk_at: list[int] = field(default_factory=list)


def hunk_line_counts(line: str) -> tuple[int, int] | None:
    """How a line inside a hunk counts against the hunk's old and new lengths: context (and a
    bare line end) 1 and 1, removed 1 and 0, added 0 and 1, "\\ No newline" 0 and 0; None for a
    line that cannot be inside a hunk."""
    tag = line[:1]
    if tag == " " or line in ("\n", "\r\n"):
        return 1, 1
    return {"-": (1, 0), "+": (0, 1), "\\": (0, 0)}.get(tag)


def split_sections(text: str) -> list[_Section]:
    """A unified diff (git-style or plain, in a mail or not) cut into its files: each file's
    lines (headers, hunks), what its headers say, and where its hunks start. The one reader of
    a diff's structure (``specfleet.core.sglang.pr20547.port.split_hunks`` reads hunks through
    it)."""
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
            counts = hunk_line_counts(line)
            if counts is None:
                raise PatchFormatError(f"line {i + 1}: unexpected line inside a hunk: {line!r}")
            old_left -= counts[0]
            new_left -= counts[1]
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
        elif (m := HUNK_RE.match(line)) and cur.has_headers:
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            cur.hunks += 1
            cur.hunk_at.append(len(cur.lines))
            cur.lines.append(line)
        elif line.startswith("\\") and cur.hunks:
            cur.lines.append(line)  # "\ No newline at end of file" after a hunk's last line
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


def _map(path: str | None, site_paths: bool = False) -> str | None:
    if path is None:
        return None
    if site_paths:
        return path if path.startswith("sglang/") else None
    if path.startswith(PACKAGE_PREFIX):
        return path[len("python/") :]
    return None


def filter_patch(text: str, site_paths: bool = False) -> FilteredPatch:
    """Keep only the files under ``python/sglang/`` and rewrite their paths onto site-packages
    (``python/sglang/srt/x.py`` -> ``sglang/srt/x.py``, still with ``a/``/``b/`` for ``-p1``).
    Everything else (``benchmark/``, ``pyproject.toml``, tests) is dropped and listed.
    ``site_paths``: the diff is already in site-packages paths (``sglang/...``), as a port's."""
    kept: list[str] = []
    files: list[FileChange] = []
    dropped: list[str] = []
    for sec in split_sections(text):
        old = sec.rename_from or (sec.old if sec.has_headers else sec.git_old)
        new = sec.rename_to or (sec.new if sec.has_headers else sec.git_new)
        if sec.created:
            old = None
        if sec.deleted:
            new = None
        label = new or old or sec.git_new or "?"
        m_old, m_new = _map(old, site_paths), _map(new, site_paths)
        inside = [p for p in (old, new) if p is not None]
        if not inside or not all(_map(p, site_paths) for p in inside):
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
