"""THE one table of known DDTree designs: one row per design, keyed by what an SGLang tree's own
``server_args`` / ``arg_groups`` / ``spec_info`` declare.

No SGLang release up to 0.5.23 has DDTree; the designs differ in their flags, so a flag is only
ever rendered from a row whose keys the installed tree declares (facts.sglang reads them from its
files, never importing it). A tree that mentions DDTree in a way no row knows is "DDTree present,
unknown design" and is served with plain DFlash: a guessed flag would crash-loop the server.

Sources: the fork's tree in ../shared/fixtures/sglang-ddtree-fork/ (read: server_args.py,
arg_groups/speculative_hook.py, speculative/dflash_worker.py) and the PR#29907 description in
../shared/reference/sglang.md / that fixture's README (its code is not available here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DesignKnob:
    """One tunable of a design other than the budget: where SGLang reads it, and the setting."""

    setting: str  # the key under specfleet.plan (plan.<setting>)
    env: str | None = None  # an environment variable the tree reads
    flag: str | None = None  # or a command-line flag


@dataclass(frozen=True)
class TreeMask:
    """Whether a target attention backend verifies the tree with its mask, and where the tree's
    code shows it (file:line of the fork at 514ea1f3e, under python/sglang/srt/)."""

    honours: bool
    source: str


# A DDTree step verifies a tree: each node may see only its ancestors, which only the custom mask
# says. A backend that drops the mask verifies the tree as one causal chain, so siblings see each
# other and the output is wrong. Keyed by SGLang's --attention-backend name; a backend with no row
# is not known to honour the mask and is never planned under DDTree.
FORK_MASK_MLA: Mapping[str, TreeMask] = {
    "triton": TreeMask(
        True,
        "layers/attention/triton_backend.py:402-409 copies spec_info.custom_mask into its "
        "CUDA-graph mask buffer (:811-816) and :875-890 passes it in target-verify; "
        "model_executor/cuda_graph_runner.py:1279-1280 forces the mask into the verify graphs "
        "under --speculative-dflash-enable-ddtree",
    ),
    "fa3": TreeMask(
        False,
        "arg_groups/speculative_hook.py:163-170 forces speculative_eagle_topk to 1 for DFLASH; "
        "layers/attention/flashattention_backend.py:490 then takes the topk <= 1 target-verify "
        "path, which never reads custom_mask (read only at :571, under topk > 1): the tree is "
        "verified causally",
    ),
    "flashinfer": TreeMask(
        False,
        "layers/attention/attention_registry.py:32-36 serves an MLA target with "
        "flashinfer_mla_backend.py, which builds custom_mask (:849) but plans its prefill with "
        "causal=True (:868 ragged, :882 paged) and never passes the mask",
    ),
    "trtllm_mla": TreeMask(
        False,
        "layers/attention/trtllm_mla_backend.py:456-467 only allocates a tree-mask scratch for "
        "build_tree; no kernel call of its target-verify (:1020-1091) reads a mask",
    ),
}
FORK_MASK_MHA: Mapping[str, TreeMask] = {
    "triton": FORK_MASK_MLA["triton"],
    "flashinfer": TreeMask(
        True,
        "layers/attention/flashinfer_backend.py:718-728 plans target-verify with use_custom_mask "
        "(its CUDA-graph mask buffer :653); the fork's own DDTree test is an MHA model on "
        "flashinfer",
    ),
}
# The backend planned instead where the arch's rule picks one that drops the mask.
MASK_PREFERRED = "triton"


@dataclass(frozen=True)
class DDTreeDesign:
    name: str
    source: str
    # All must be declared by the tree: the ServerArgs fields / CLI flags / enum members / env
    # variables (``field:``, ``flag:``, ``algorithm:``, ``env:`` prefixed) that identify it.
    keys: tuple[str, ...]
    # The --speculative-algorithm value with DDTree on.
    algorithm: str
    # A boolean switch that turns DDTree on (None: the algorithm alone does).
    switch_flag: str | None
    # The flag that carries the tree budget (nodes verified per step).
    budget_flag: str
    # The budget is --speculative-num-draft-tokens: the drafter runs over the whole budget (the
    # fork's worker sets block_size = num_draft_tokens), and the flag then replaces the block size.
    budget_is_draft_tokens: bool
    # Where the design checks the budget against the drafter's block size, and what it does.
    block_rule: str
    knobs: tuple[DesignKnob, ...] = ()
    notes: tuple[str, ...] = ()
    # Which target backends verify the tree with its mask, for an MLA target and for the others.
    mask_mla: Mapping[str, TreeMask] = field(default_factory=lambda: FORK_MASK_MLA)
    mask_mha: Mapping[str, TreeMask] = field(default_factory=lambda: FORK_MASK_MHA)
    # Only --page-size 1 is accepted (None: any).
    page_size_rule: str | None = None
    # The worker runs without the overlap scheduler, and where that is said.
    overlap_rule: str = ""
    # Budgets at or below block - 1 are verified as one chain (no branching), not a tree.
    chain_below_block: bool = False
    # Verify tokens per request per step beyond the budget (the root): sizes the verify graphs.
    verify_extra: int = 0

    def declared_by(self, declared: Iterable[str]) -> bool:
        return set(self.keys) <= set(declared)


FORK_DFLASH_SWITCH = DDTreeDesign(
    name="dflash-switch (DB-Guo/sglang-ddtree-dev)",
    source="server_args.py field speculative_dflash_enable_ddtree and its add_argument "
    "--speculative-dflash-enable-ddtree; arg_groups/speculative_hook.py; "
    "speculative/dflash_worker.py (block_size = num_draft_tokens, top-k budget - 1)",
    keys=("field:speculative_dflash_enable_ddtree", "flag:--speculative-dflash-enable-ddtree"),
    algorithm="DFLASH",
    switch_flag="--speculative-dflash-enable-ddtree",
    budget_flag="--speculative-num-draft-tokens",
    budget_is_draft_tokens=True,
    block_rule="arg_groups/speculative_hook.py: with --speculative-dflash-enable-ddtree a "
    "--speculative-num-draft-tokens that differs from the drafter's block size only warns "
    "(without it they must match)",
    overlap_rule="DFLASH is the non-overlap worker in this tree (speculative/spec_info.py: "
    "\"DFLASH does not support overlap scheduling (spec v2)\")",
)

PR29907_ALGORITHM = DDTreeDesign(
    name="algorithm DDTREE (sgl-project/sglang#29907)",
    source="the PR description (code not available here): SpeculativeAlgorithm.DDTREE on "
    "DFlashWorkerV2, --speculative-ddtree-budget, verify graphs sized budget + 1",
    keys=("algorithm:DDTREE", "flag:--speculative-ddtree-budget"),
    algorithm="DDTREE",
    switch_flag=None,
    budget_flag="--speculative-ddtree-budget",
    budget_is_draft_tokens=False,
    block_rule="the drafter keeps its block size; the verify step takes budget + 1 tokens",
    # Its code is not available: its target backends are upstream's, read from the fork's copies
    # of them (the fork's base is upstream main of mid-June 2026), so the same mask rows apply.
    page_size_rule="the PR's review thread: any --page-size other than 1 is refused at start",
    overlap_rule="the PR's review thread: DDTREE turns the overlap scheduler off",
    chain_below_block=True,
    verify_extra=1,
    knobs=(
        DesignKnob("ddtree_max_topk", env="SGLANG_DDTREE_MAX_TOPK"),
        DesignKnob("ddtree_depth_bonus", env="SGLANG_DDTREE_DEPTH_BONUS"),
        DesignKnob("ddtree_rank_probe", env="SGLANG_DDTREE_RANK_PROBE"),
    ),
)

DESIGNS: tuple[DDTreeDesign, ...] = (FORK_DFLASH_SWITCH, PR29907_ALGORITHM)
# Every setting some design reads (plan.<name>), for the settings' checks.
KNOB_SETTINGS = tuple(sorted({k.setting for d in DESIGNS for k in d.knobs}))

UNKNOWN = "unknown"
# Begins the plan's error for a DDTree budget that cannot run on the host (the sweep drops such a
# point from its grid, saying so, instead of counting it failed).
DDTREE_REFUSED = "DDTree budget refused"


def design_named(name: str | None) -> DDTreeDesign | None:
    return next((d for d in DESIGNS if d.name == name), None)


def match_design(declared: Iterable[str]) -> DDTreeDesign | None:
    """The row whose keys the tree declares (the most specific one), or None."""
    declared = set(declared)
    found = [d for d in DESIGNS if d.declared_by(declared)]
    return max(found, key=lambda d: len(d.keys)) if found else None


def describe(ddtree: Mapping | None) -> str:
    """One line for a fact value ``SGLangInstall["ddtree"]``."""
    if not ddtree:
        return "no DDTree"
    if ddtree.get("design") in (None, UNKNOWN):
        return f"DDTree present, unknown design ({', '.join(ddtree.get('declared') or []) or '?'})"
    return f"DDTree, design {ddtree['design']}"
