"""The DFlash drafter's RoPE settings on SGLang 0.5.11: a patch of ``models/dflash.py``, kept as a
recipe (issue #52).

0.5.11's drafter builds its rotary embedding from ``getattr(config, "rope_theta", 1000000)`` and
``getattr(config, "rope_scaling", None)``. Under transformers 5.x (0.5.11 pins 5.6) a config keeps
the base only inside ``rope_parameters``, so every DFlash drafter runs at base 1e6 whatever its
config says (``z-lab/Kimi-K2.6-DFlash``: 50000 with yarn): slower (lost acceptance), not wrong.
0.5.14's ``models/dflash.py`` reads them with ``get_rope_config``, which 0.5.11 already ships. The
patch is 0.5.11's file with 0.5.14's two lines, from the pinned wheels
(``specfleet/patchdata/dflash_rope/sglang-0.5.11/recipe.json``), applied wherever 0.5.11 runs
DFlash (v1, and beside the PR#20547 port, which does not touch this file), with the port's
guarantees: the tree's file must hash as the wheel's, the apply is journaled and reversible, its
marker is written only after the file on disk is the one built, and ``--dry`` shows it.

Pure: the recipe comes from the caller (``load_rope_patch`` reads the package data), the upstream
text from a reader the caller passes, the host's state from the facts. Not part of the PR#20547
port (``specfleet.core.sglang.pr20547``): it stays when the port is removed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from specfleet.core.sglang.install import short
from specfleet.core.sglang.patch import FilteredPatch, filter_patch
from specfleet.core.sglang.recipe import RECIPE_FILE, SourceReader, build, check_recipe

ROPE_PACKAGE = "specfleet.patchdata"
ROPE_DIR = "dflash_rope"
# The one file the patch modifies.
ROPE_TARGET = "sglang/srt/models/dflash.py"
# Releases with a RoPE patch (specfleet/patchdata/dflash_rope/sglang-<version>/).
ROPE_PATCHED_RELEASES = ("0.5.11",)

ROPE_APPLY, ROPE_APPLIED, ROPE_RESTORE, ROPE_NOOP = "apply", "applied", "restore", "none"


@dataclass(frozen=True)
class RopePatch:
    version: str
    recipe: Mapping

    @property
    def sources(self) -> Mapping:
        return self.recipe["sources"]

    @property
    def release_sha256(self) -> str:
        """The sha256 of the release's own file: the only tree the patch applies to."""
        return self.recipe["sources"][self.recipe["base"]]["files"][ROPE_TARGET]

    def build(self, read: SourceReader) -> tuple[FilteredPatch, str]:
        """(the diff it applies, the sha256 of the file it makes)."""
        built = build(self.recipe, read)
        patch = filter_patch(built.diff(), site_paths=True)
        return patch, hashlib.sha256(built.files[ROPE_TARGET].encode("utf-8")).hexdigest()


def rope_patch_id(patch: RopePatch) -> str:
    """The patch's identity, written as its marker: the sha256 of its recipe (canonical JSON).
    The recipe pins every line it takes by the sha256 of its source file, so the same id is the
    same file, and an applied patch is recognised without fetching its sources."""
    canonical = json.dumps(patch.recipe, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def load_rope_patch(version: str, package: str = ROPE_PACKAGE) -> RopePatch | None:
    """The RoPE patch for SGLang ``version`` shipped in ``package``, or None (no patch for it)."""
    if version not in ROPE_PATCHED_RELEASES:
        return None
    spec = resources.files(package) / ROPE_DIR / f"sglang-{version}" / RECIPE_FILE
    recipe = json.loads(spec.read_text(encoding="utf-8"))
    problems = check_recipe(recipe)
    if problems:
        raise ValueError(f"{ROPE_DIR}/sglang-{version}/{RECIPE_FILE}: {'; '.join(problems)}")
    return RopePatch(version, recipe)


@dataclass(frozen=True)
class RopeDecision:
    """``steps`` in order: "restore" (undo an applied or interrupted patch from its journal),
    "forget" (a marker whose file pip has replaced since), "apply"; ``reason``: one line."""

    steps: tuple[str, ...]
    row: str
    reason: str
    warning: str | None = None

    @property
    def noop(self) -> bool:
        return not self.steps


def decide_dflash_rope(
    version: str,
    file_sha256: str | None,
    marker: Mapping | None,
    *,
    present: bool,
    patch: RopePatch | None,
    wanted_id: str | None,
) -> RopeDecision:
    """What to do with the drafter RoPE patch on one tree. ``file_sha256``: the tree's
    ``models/dflash.py`` now; ``marker``: the PatchState fact of the patch's state folder;
    ``patch``: the patch for this release (None: none); ``wanted_id``: its ``patch_id``."""
    steps: list[str] = []
    warning = None
    marker = marker or {}
    if marker.get("partial"):
        steps.append("restore")
        warning = "a drafter RoPE patch apply was interrupted; restores models/dflash.py first"
        file_sha256 = patch.release_sha256 if patch else file_sha256
    elif marker.get("sha256"):
        applied = marker["sha256"]
        if marker.get("intact"):
            if not present:
                return RopeDecision(("restore",), ROPE_RESTORE,
                                    f"removes the drafter RoPE patch {short(applied)} from "
                                    f"SGLang {version}")  # fmt: skip
            if applied == wanted_id:
                return RopeDecision((), ROPE_APPLIED, f"the drafter RoPE patch {short(applied)} is "
                                    f"applied to SGLang {version}")  # fmt: skip
            return RopeDecision(("restore", "apply"), ROPE_APPLY,
                                f"the drafter RoPE patch {short(applied)} is applied, this "
                                f"project's is {short(wanted_id)}; replaces it")  # fmt: skip
        steps.append("forget")
        warning = (f"the drafter RoPE patch marker ({short(applied)}) no longer matches "
                   "models/dflash.py (SGLang was reinstalled?); forgets it")  # fmt: skip
    if not present:
        return RopeDecision(tuple(steps), ROPE_NOOP, f"SGLang {version}: no drafter RoPE patch to "
                            "remove", warning)  # fmt: skip
    if patch is None:
        return RopeDecision(tuple(steps), ROPE_NOOP,
                            f"SGLang {version} needs no drafter RoPE patch (the patch is for "
                            f"{', '.join(ROPE_PATCHED_RELEASES)}; 0.5.14 and later read "
                            "rope_parameters themselves)", warning)  # fmt: skip
    if file_sha256 != patch.release_sha256:
        return RopeDecision(
            tuple(steps), ROPE_NOOP,
            f"SGLang {version}: models/dflash.py is not the {patch.version} wheel's "
            f"(sha256 {short(file_sha256)}), so the drafter RoPE patch is not applied; the "
            "drafter keeps base 1e6 unless that file reads rope_parameters", warning)  # fmt: skip
    return RopeDecision(
        (*steps, "apply"), ROPE_APPLY,
        f"SGLang {version}: applies the drafter RoPE patch (0.5.14's get_rope_config in "
        "models/dflash.py: the drafter's rope_theta and scaling from its config, not base 1e6)",
        warning,
    )
