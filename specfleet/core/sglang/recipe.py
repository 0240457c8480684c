"""A port kept as a recipe: which upstream text to take, from sources pinned by sha256, and the
lines this project wrote. No upstream text is stored in this project; the deploy fetches the
sources the recipe names (``operations.sglang_sources``) and this module puts the files together.

``recipe.json`` of a port::

    {"sources": {NAME: {"kind": "wheel" | "git", ..., "files": {PATH: SHA256-HEX}}},
     "base": NAME,                       # the release the port applies to (a wheel source)
     "files": {PATH: [PIECE, ...]}}      # each file the port modifies or creates, whole

A piece is one of:

- ``{"take": NAME, "lines": [A, B]}``: lines A..B (from 1, inclusive) of the same path in source
  NAME, or of ``"path"`` when given; ``"indent": N`` adds N spaces (or removes -N) to each
  non-blank line;
- ``{"own": [LINE, ...], "why": TEXT}``: lines this project wrote, each run with its reason.

Every source file read is checked against its pinned sha256 before a line of it is used. Pure:
the caller passes a reader of the source files' text.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

RECIPE_FILE = "recipe.json"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SOURCE_KINDS = ("wheel", "git")

# (source name, path) -> the file's text, or None when the source does not have it.
SourceReader = Callable[[str, str], "str | None"]


class RecipeError(ValueError):
    """A recipe that does not hold, or a source that does not give what it names."""


@dataclass(frozen=True)
class Built:
    """The files a recipe makes, and the release's files they replace (None: created)."""

    files: dict[str, str]
    originals: dict[str, str | None]

    def diff(self) -> str:
        """One unified diff (``a/``/``b/`` paths, for ``patch -p1`` in site-packages), files in
        sorted order."""
        out: list[str] = []
        for path in sorted(self.files):
            old = self.originals.get(path)
            new = self.files[path]
            old_lines = [] if old is None else old.splitlines(keepends=True)
            body = list(
                difflib.unified_diff(
                    old_lines,
                    new.splitlines(keepends=True),
                    "/dev/null" if old is None else f"a/{path}",
                    f"b/{path}",
                    n=3,
                )
            )
            if not body:
                continue
            # difflib writes "--- a\n+++ b\n" with no tab or date; GNU patch reads them as is.
            for line in body:
                out.append(line)
                if not line.endswith("\n"):
                    out.append("\n\\ No newline at end of file\n")
        return "".join(out)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_recipe(recipe: Mapping) -> list[str]:
    """What is wrong with a loaded ``recipe.json`` (empty when nothing)."""
    problems: list[str] = []
    sources = recipe.get("sources")
    if not isinstance(sources, Mapping) or not sources:
        return ["no sources"]
    for name, src in sources.items():
        if not isinstance(src, Mapping) or src.get("kind") not in SOURCE_KINDS:
            problems.append(f"source {name}: kind is not one of {SOURCE_KINDS}")
            continue
        if src["kind"] == "wheel" and not _SHA256_RE.match(str(src.get("sha256", ""))):
            problems.append(f"source {name}: a wheel needs the sha256 of the wheel file")
        if src["kind"] == "git" and not re.match(r"^[0-9a-f]{40}$", str(src.get("commit", ""))):
            problems.append(f"source {name}: a git source needs a 40-hex commit")
        for path, digest in (src.get("files") or {}).items():
            if not _SHA256_RE.match(str(digest)):
                problems.append(f"source {name}: files[{path}] is not a lowercase hex sha256")
    base = recipe.get("base")
    if base not in sources or (sources.get(base) or {}).get("kind") != "wheel":
        problems.append(f"base {base!r} is not a wheel source")
    files = recipe.get("files")
    if not isinstance(files, Mapping) or not files:
        problems.append("no files")
        return problems
    for path, pieces in files.items():
        for i, piece in enumerate(pieces or ()):
            where = f"{path} piece {i}"
            if "own" in piece:
                lines = piece.get("own")
                if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
                    problems.append(f"{where}: own is not a list of lines")
                if not str(piece.get("why") or "").strip():
                    problems.append(f"{where}: own lines without a why")
                continue
            name = piece.get("take")
            if name not in sources:
                problems.append(f"{where}: takes from unknown source {name!r}")
                continue
            src_path = piece.get("path", path)
            if src_path not in (sources[name].get("files") or {}):
                problems.append(f"{where}: {name} does not pin {src_path}")
            span = piece.get("lines")
            ints = isinstance(span, list) and len(span) == 2 and all(type(x) is int for x in span)
            if not ints or not 1 <= span[0] <= span[1]:
                problems.append(f"{where}: lines is not [first, last] from 1: {span!r}")
    return problems


def used_source_files(recipe: Mapping) -> dict[str, set[str]]:
    """{source name: the paths of its files the recipe reads} (the base's files the port
    modifies included: the diff needs them)."""
    out: dict[str, set[str]] = {}
    base = recipe["base"]
    base_files = recipe["sources"][base].get("files") or {}
    for path, pieces in recipe["files"].items():
        if path in base_files:
            out.setdefault(base, set()).add(path)
        for piece in pieces:
            if "take" in piece:
                out.setdefault(piece["take"], set()).add(piece.get("path", path))
    return out


def _reindent(line: str, indent: int) -> str:
    if not line.strip() or not indent:
        return line
    if indent > 0:
        return " " * indent + line
    if line[: -indent].strip():
        raise RecipeError(f"cannot remove {-indent} spaces from {line!r}")
    return line[-indent:]


def build(recipe: Mapping, read: SourceReader) -> Built:
    """The port's files, put together from the sources ``read`` gives. Raises RecipeError when a
    source file is missing or does not hash as pinned, or a piece runs past its file."""
    problems = check_recipe(recipe)
    if problems:
        raise RecipeError("; ".join(problems))
    sources = recipe["sources"]
    texts: dict[tuple[str, str], list[str]] = {}

    def lines_of(name: str, path: str) -> list[str]:
        key = (name, path)
        if key not in texts:
            text = read(name, path)
            if text is None:
                raise RecipeError(f"source {name} has no file {path}")
            want = sources[name]["files"][path]
            got = sha256_text(text)
            if got != want:
                raise RecipeError(f"{name}:{path} has sha256 {got}, the recipe pins {want}")
            texts[key] = text.splitlines(keepends=True)
        return texts[key]

    base = recipe["base"]
    base_files = sources[base].get("files") or {}
    files: dict[str, str] = {}
    originals: dict[str, str | None] = {}
    for path, pieces in recipe["files"].items():
        out: list[str] = []
        for i, piece in enumerate(pieces):
            if "own" in piece:
                out.extend(line + "\n" for line in piece["own"])
                continue
            src = lines_of(piece["take"], piece.get("path", path))
            first, last = piece["lines"]
            if last > len(src):
                raise RecipeError(
                    f"{path} piece {i}: lines {first}..{last} of {piece['take']}:"
                    f"{piece.get('path', path)}, which has {len(src)}"
                )
            indent = int(piece.get("indent", 0))
            out.extend(_reindent(line, indent) for line in src[first - 1 : last])
        files[path] = "".join(out)
        originals[path] = "".join(lines_of(base, path)) if path in base_files else None
    return Built(files=files, originals=originals)


def own_lines(recipe: Mapping) -> list[tuple[str, str, str]]:
    """(file, line, why) for every line this project wrote."""
    return [
        (path, line, piece["why"])
        for path, pieces in recipe["files"].items()
        for piece in pieces
        if "own" in piece
        for line in piece["own"]
    ]


def count_taken(recipe: Mapping) -> dict[str, int]:
    """How many lines the recipe takes from each source, and how many it wrote (``own``)."""
    out: dict[str, int] = {}
    for pieces in recipe["files"].values():
        for piece in pieces:
            if "own" in piece:
                out["own"] = out.get("own", 0) + len(piece["own"])
            else:
                first, last = piece["lines"]
                out[piece["take"]] = out.get(piece["take"], 0) + last - first + 1
    return out
