"""Build the PR#20547 port's files for SGLang 0.5.11 from the recipe, outside any deploy: for the
tests, the maintainer's tool, and a GPU run of the real server.

    python -m tests.harness.port_build --site SITE --out OUT [--unfixed] [--mirror M ...]

``SITE`` holds the unpacked 0.5.11 wheel (``SITE/sglang/srt/...``: a venv's site-packages or an
unzipped wheel); ``OUT`` gets the files the port modifies or creates (``OUT/sglang/srt/...``),
ready to copy over ``SITE``. The upstream text comes through the recipe's reader from the mirrors
(default: ``../shared/fixtures/sglang-pr20547/`` and the wheelhouse), each file checked against
its sha256. ``--unfixed`` builds the port as it was before issue #29 (commit ``UNFIXED_COMMIT``:
its ``adaptation.diff`` over the PR diff's hunks, GNU patch), to compare the two on a GPU;
``--before-52`` the port as its recipe was before issue #52; ``--stale-mask`` the fixed port less
its verify-mask fix; ``--rope`` adds the drafter RoPE patch's ``models/dflash.py`` (#52).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from functools import cache
from pathlib import Path

from operations.sglang_sources import UpstreamSources
from specfleet.core.sglang.recipe import RECIPE_FILE, build
from tests.harness.sources import (
    PR20547_DIFF,
    PR20547_DIFF_SHA256,
    PR20547_DIR,
    pr20547_files,
    sglang_wheel,
)
from tests.harness.wheelhouse import WHEELHOUSE_DIR

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "specfleet" / "patchdata" / "pr20547" / "sglang-0.5.11"
# The last commit with the port as it was before issue #29 (stale verify mask under triton,
# penalties dropped, --disable-overlap-schedule overridden, upstream text in adaptation.diff).
UNFIXED_COMMIT = "48fd89f07389c400e2608a2d53a92c551702492a"
UNFIXED_DATA = "specfleet/patchdata/pr20547/sglang-0.5.11"
# The last commit with the port as it was before issue #52 (stop strings inside an accepted block
# missed, EOS at the length cap emitted as "length", the KV reservation from batch.seq_lens).
BEFORE_52_COMMIT = "5a531c740b317d616b2274240872c0167f309ce8"
# The file whose verify-mask policy the fix changes (0.5.14's TritonAttnBackend entry).
MASK_FILE = "sglang/srt/speculative/dflash_utils.py"


def default_mirrors() -> list[str]:
    return [str(PR20547_DIR), str(WHEELHOUSE_DIR)]


def load_recipe() -> dict:
    return json.loads((DATA / RECIPE_FILE).read_text())


def recipe_reader(recipe: dict, mirrors: list[str] | None = None) -> UpstreamSources:
    """The recipe's sources from local mirrors only (never the cache or the network)."""
    return UpstreamSources(recipe["sources"], mirrors or default_mirrors(), use_cache=False)


def port_settings() -> dict:
    """The ``patch`` settings of a test host or the demo: opted in, the upstream text from the
    shared fixtures and the wheelhouse (through the recipe, as a deploy reads it)."""
    return {"sha256": PR20547_DIFF_SHA256, "source": default_mirrors()}


def port_patch():
    """The one diff the deploy applies for the 0.5.11 port (a FilteredPatch)."""
    from operations.pr20547 import load_port

    port = load_port("0.5.11")
    return port.patch(recipe_reader(port.recipe))


def stale_mask_recipe() -> dict:
    """The port's recipe less its verify-mask fix (0.5.11's own dflash_utils.py kept): the tree
    whose DFLASH v2 verify reads a stale mask under triton with CUDA graphs. Made here, at test
    time, from the shipped recipe; it names upstream text, it holds none."""
    recipe = load_recipe()
    recipe["files"].pop(MASK_FILE)
    return recipe


def write_stale_mask_recipe(path: Path) -> Path:
    """``stale_mask_recipe()`` as a recipe.json at ``path``, for the test-only setting
    ``patch.test_recipe`` (the deploy then applies the port without its mask fix)."""
    path.write_text(json.dumps(stale_mask_recipe(), indent=1))
    return path


def build_stale_mask(mirrors: list[str] | None = None) -> dict[str, str]:
    recipe = stale_mask_recipe()
    return build(recipe, recipe_reader(recipe, mirrors)).files


def build_fixed(mirrors: list[str] | None = None) -> dict[str, str]:
    recipe = load_recipe()
    return build(recipe, recipe_reader(recipe, mirrors)).files


def build_before_52(mirrors: list[str] | None = None) -> dict[str, str]:
    """The port's files as its recipe made them before issue #52 (commit ``BEFORE_52_COMMIT``),
    from the same pinned sources: the tree the #52 tests must fail on."""
    recipe = json.loads(subprocess.run(
        ["git", "-C", str(REPO), "show", f"{BEFORE_52_COMMIT}:{UNFIXED_DATA}/{RECIPE_FILE}"],
        check=True, capture_output=True, text=True).stdout)  # fmt: skip
    return build(recipe, recipe_reader(recipe, mirrors)).files


def build_dflash_rope(mirrors: list[str] | None = None) -> dict[str, str]:
    """The drafter RoPE patch's file (issue #52: 0.5.11's ``models/dflash.py`` with 0.5.14's
    ``get_rope_config`` reading), which a deploy applies wherever 0.5.11 runs DFlash, beside the
    port or without it: {path: text}."""
    from specfleet.core.sglang.rope import load_rope_patch

    recipe = load_rope_patch("0.5.11").recipe
    return build(recipe, recipe_reader(recipe, mirrors)).files


def build_unfixed(site: Path) -> dict[str, str]:
    """The pre-#29 port applied to a copy of ``site``'s touched files: {path: text}."""
    def old(name: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), "show", f"{UNFIXED_COMMIT}:{UNFIXED_DATA}/{name}"],
                              check=True, capture_output=True, text=True).stdout  # fmt: skip
    port = json.loads(old("port.json"))
    from specfleet.core.sglang.patch import filter_patch
    from specfleet.core.sglang.pr20547.port import select_pr_hunks
    text = select_pr_hunks(PR20547_DIFF.read_text(), port["pr_hunks"]) + old("adaptation.diff")
    patch = filter_patch(text, site_paths=True).text
    paths = sorted(set(port["targets"]) | set(port.get("requires") or {}) | set(port["creates"]))
    with tempfile.TemporaryDirectory() as tmp:
        for p in paths:
            if (site / p).is_file():
                (Path(tmp) / p).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(site / p, Path(tmp) / p)
        subprocess.run(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch",
                        "--reject-file=-", "-s", "-d", tmp], input=patch, text=True, check=True)  # fmt: skip
        return {p: (Path(tmp) / p).read_text() for p in paths
                if (Path(tmp) / p).is_file() and not (
                    (site / p).is_file() and (site / p).read_text() == (Path(tmp) / p).read_text())}


# --------------------------------------------------------------------------------------------------
# Upstream text in our files: runs of lines shared with SGLang's own sources
# --------------------------------------------------------------------------------------------------

# The upstream packages scanned: every file the recipe reads, and the 0.5.11 wheel's parts a port
# would draw from (the speculative workers, scheduling, sampling, attention, the model runner).
UPSTREAM_PARTS = ("sglang/srt/speculative/", "sglang/srt/managers/", "sglang/srt/sampling/",
                  "sglang/srt/layers/attention/", "sglang/srt/model_executor/",
                  "sglang/srt/server_args.py", "sglang/srt/environ.py")  # fmt: skip
RUN = 3  # this many consecutive substantial lines in common is copied code, not coincidence


def _substantial(line: str) -> str | None:
    text = line.strip().lstrip("+-")  # a diff's lines too
    # Short lines (")", "else:", "return None") are everywhere, and so are import lines.
    if len(text.strip()) < 12 or text.startswith(("import ", "from ")):
        return None
    return text.strip()


def _windows(text: str) -> set[tuple[str, ...]]:
    lines = [x for x in (_substantial(ln) for ln in text.splitlines()) if x is not None]
    return {tuple(lines[i : i + RUN]) for i in range(len(lines) - RUN + 1)}


@cache
def upstream_windows() -> frozenset[tuple[str, ...]]:
    """Every run of RUN substantial lines (indentation aside) of the upstream text the port
    draws on: the PR head's files and the 0.5.11 and 0.5.14 wheels' parts above."""
    recipe = load_recipe()
    read = recipe_reader(recipe)
    out: set[tuple[str, ...]] = set()
    for name, src in recipe["sources"].items():
        paths = set(src["files"])
        if src["kind"] == "wheel":
            with zipfile.ZipFile(sglang_wheel(src["version"])) as zf:
                paths |= {n for n in zf.namelist() if n.endswith(".py") and n.startswith(UPSTREAM_PARTS)}
        else:
            paths |= {p for p in pr20547_files() if p.endswith(".py") and p.startswith(UPSTREAM_PARTS)}
        for path in paths:
            text = read(name, path) if path in src["files"] else _raw(name, src, path)
            if text:
                out |= _windows(text)
    return frozenset(out)


def _raw(name: str, src: dict, path: str) -> str | None:
    if src["kind"] == "wheel":
        with zipfile.ZipFile(sglang_wheel(src["version"])) as zf:
            return zf.read(path).decode("utf-8", "replace")
    data = pr20547_files().get(path)
    return None if data is None else data.decode("utf-8", "replace")


def upstream_runs(text: str) -> list[tuple[str, ...]]:
    """The runs of ``text`` found in upstream SGLang (empty: none)."""
    return sorted(_windows(text) & upstream_windows())


def check_site(site: Path, recipe: dict) -> list[str]:
    """The base files under ``site`` that do not hash as the 0.5.11 wheel's (empty: all do)."""
    pins = recipe["sources"][recipe["base"]]["files"]
    bad = []
    for path, want in pins.items():
        f = site / path
        if not f.is_file() or hashlib.sha256(f.read_bytes()).hexdigest() != want:
            bad.append(path)
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", required=True, type=Path, help="holds the 0.5.11 sglang/ package")
    ap.add_argument("--out", required=True, type=Path, help="gets the port's files")
    ap.add_argument("--unfixed", action="store_true", help="the port as it was before #29")
    ap.add_argument("--stale-mask", action="store_true", help="the fixed port less its verify-mask "
                    "fix (0.5.11's dflash_utils.py kept): isolates the mask on a GPU")
    ap.add_argument("--rope", action="store_true", help="also the drafter RoPE patch's "
                    "models/dflash.py (#52), which a deploy applies on every 0.5.11 host")
    ap.add_argument("--before-52", action="store_true", help="the port as it was before #52 "
                    "(commit BEFORE_52_COMMIT), to compare on a GPU")
    ap.add_argument("--mirror", action="append", help="a folder or URL base with the sources "
                    "(repeatable; default: shared fixtures and the wheelhouse)")
    args = ap.parse_args(argv)
    bad = check_site(args.site, load_recipe())
    if bad:
        print(f"{args.site} is not the SGLang 0.5.11 wheel's tree: {', '.join(bad)} differ",
              file=sys.stderr)
        return 2
    if args.unfixed:
        files = build_unfixed(args.site)
    elif args.before_52:
        files = build_before_52(args.mirror)
    else:
        files = build_stale_mask(args.mirror) if args.stale_mask else build_fixed(args.mirror)
    if args.stale_mask:
        files.pop(MASK_FILE, None)
    if args.rope:
        files.update(build_dflash_rope(args.mirror))
    for path, text in sorted(files.items()):
        dest = args.out / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
