"""Maintainer's tool: write a port's ``recipe.json`` from a patched tree (never used by a deploy).

Edit the patched files in a scratch tree (built with ``python -m tests.harness.port_build``), then

    python -m tests.harness.port_recipe_tool --tree SCRATCH [--write]

matches every line of every file the port modifies or creates, longest runs first, against the
pinned upstream sources (the 0.5.11 and 0.5.14 wheels from the wheelhouse, the PR head from
``../shared/fixtures/sglang-pr20547/``) and writes the pieces; lines found nowhere become ``own``
pieces, whose ``why`` is kept from the current recipe when the same lines were there, else
``TODO`` (the provenance test fails on it until a reason is written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specfleet.core.sglang.recipe import RECIPE_FILE, check_recipe, sha256_text
from tests.harness.port_build import DATA, recipe_reader

# Where a file's lines come from upstream besides the same path (in this order).
HINTS = {
    "sglang/srt/speculative/dflash_utils_pr20547.py": (
        "sglang/srt/speculative/dflash_utils.py",
        # #52: the rank-0 broadcast after sampled verification, as 0.5.11's EAGLE v2 does it.
        "sglang/srt/speculative/eagle_info_v2.py",
    ),
    "sglang/srt/speculative/dflash_worker_pr20547_base.py": (
        "sglang/srt/speculative/dflash_worker.py",
    ),
}
MIN_TRIVIAL = 4  # a lone line this short (")", "else:") is not worth a piece of its own


def _candidates(path: str, recipe: dict, read) -> list[tuple[str, str, list[str]]]:
    out = []
    for name in recipe["match_order"]:
        for p in (path, *HINTS.get(path, ())):
            text = read(name, p)
            if text is not None:
                out.append((name, p, text.splitlines(keepends=True)))
    return out


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _best_run(final: list[str], i: int, src: list[str], index: dict) -> tuple[int, int, int]:
    """(length, start in src, indent delta) of the longest run at final[i]."""
    best = (0, 0, 0)
    for j in index.get(final[i].strip(), ()):
        delta = _indent(final[i]) - _indent(src[j])
        k = 0
        while i + k < len(final) and j + k < len(src):
            a, b = final[i + k], src[j + k]
            if a.strip() != b.strip():
                break
            if a.strip() and _indent(a) - _indent(b) != delta:
                break
            if not a.strip() and a != b:
                break
            k += 1
        if (k, -abs(delta)) > (best[0], -abs(best[2])):
            best = (k, j, delta)
    return best


def pieces_for(path: str, final_text: str, cands, old_whys: dict, fallbacks=()) -> list[dict]:
    final = final_text.splitlines(keepends=True)
    indexes = []
    for _, _, src in cands:
        idx: dict[str, list[int]] = {}
        for j, line in enumerate(src):
            idx.setdefault(line.strip(), []).append(j)
        indexes.append(idx)
    pieces: list[dict] = []
    own: list[str] = []

    def flush_own():
        if own:
            why = old_whys.get((path, own[0]), "TODO")
            pieces.append({"own": list(own), "why": why})
            own.clear()

    i = 0
    while i < len(final):
        best = None
        # A fallback source (a later release) gives only lines no primary source has.
        for fallback in (False, True):
            for c, (name, p, src) in enumerate(cands):
                if (name in fallbacks) != fallback:
                    continue
                k, j, delta = _best_run(final, i, src, indexes[c])
                if best is None or k > best[0]:
                    best = (k, j, delta, name, p)
            if best is not None and best[0] > 0:
                break
        k, j, delta, name, p = best
        line = final[i]
        if k == 0 or (k == 1 and len(line.strip()) < MIN_TRIVIAL and line.strip()):
            own.append(line.rstrip("\n"))
            i += 1
            continue
        flush_own()
        piece: dict = {"take": name}
        if p != path:
            piece["path"] = p
        piece["lines"] = [j + 1, j + k]
        if delta:
            piece["indent"] = delta
        pieces.append(piece)
        i += k
    flush_own()
    return pieces


def dump(recipe: dict) -> str:
    """recipe.json as people read it: one piece a line."""
    head = {k: v for k, v in recipe.items() if k != "files"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "files": {\n'
    files = []
    for path, pieces in recipe["files"].items():
        body = ",\n".join("  " + json.dumps(piece) for piece in pieces)
        files.append(f"  {json.dumps(path)}: [\n{body}\n  ]")
    return text + ",\n".join(files) + "\n }\n}\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", required=True, type=Path, help="the patched tree (holds sglang/)")
    ap.add_argument("--write", action="store_true", help=f"write {RECIPE_FILE}")
    args = ap.parse_args(argv)
    recipe = json.loads((DATA / RECIPE_FILE).read_text())
    read = recipe_reader(recipe)
    old_whys = {}
    for path, pieces in recipe["files"].items():
        for piece in pieces:
            if "own" in piece and piece["own"]:
                old_whys[(path, piece["own"][0])] = piece["why"]
    files = {}
    for path in recipe["files"]:
        text = (args.tree / path).read_text()
        files[path] = pieces_for(path, text, _candidates(path, recipe, read), old_whys,
                                 recipe.get("match_fallback", ()))
    used: dict[str, set[str]] = {}
    for path, pieces in files.items():
        if read(recipe["base"], path) is not None:
            used.setdefault(recipe["base"], set()).add(path)
        for piece in pieces:
            if "take" in piece:
                used.setdefault(piece["take"], set()).add(piece.get("path", path))
    for name, src in recipe["sources"].items():
        src["files"] = {p: sha256_text(read(name, p)) for p in sorted(used.get(name, ()))}
    recipe["files"] = files
    problems = check_recipe(recipe)
    todo = sum(1 for ps in files.values() for x in ps if x.get("why") == "TODO")
    for path, pieces in files.items():
        own = sum(len(x["own"]) for x in pieces if "own" in x)
        print(f"{path}: {len(pieces)} pieces, {own} own lines", file=sys.stderr)
    print(f"problems: {problems}; own runs without a reason: {todo}", file=sys.stderr)
    if args.write:
        (DATA / RECIPE_FILE).write_text(dump(recipe))
    return 0


if __name__ == "__main__":
    sys.exit(main())
