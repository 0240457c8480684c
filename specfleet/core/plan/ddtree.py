"""Topic ddtree: DDTree on top of DFLASH, where the installed SGLang has a design the table knows.

``plan.ddtree_budget`` asks for it; the design row (specfleet.core.tables.ddtree_designs) that the
installed tree's own declarations matched (facts.sglang ``ddtree``) gives every flag. A host
without DDTree, or with a design no row knows, serves plain DFlash and says so in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specfleet.core.plan.context import GIB, MIB, PlanContext
from specfleet.core.tables import ddtree_designs
from specfleet.core.tables.ddtree_designs import DDTREE_REFUSED, MASK_PREFERRED, DDTreeDesign
from specfleet.core.tables.models import model_row
from specfleet.core.tables.sglang_versions import DFLASH_MAX_RUNNING_REQUESTS, MEMORY_TIERS

# The fork's tree top-k per position is budget - 1 (dflash_worker.py): a budget needs 2 at least.
MIN_BUDGET = 2
# The triton backend's CUDA-graph state holds, per verify token of the largest captured batch,
# one int64 KV index and one uint8 mask byte for every position of the context
# (layers/attention/triton_backend.py:802-816 of the fork: cuda_graph_kv_indices and
# cuda_graph_custom_mask, each max_num_tokens * max_context_len; model_executor/
# cuda_graph_runner.py:541-543: max_num_tokens = max_bs * num_tokens_per_bs, the verify tokens;
# :389-415: max_bs is the largest captured batch, at most the request pool, --max-running-requests).
GRAPH_BYTES_PER_POSITION = 8 + 1


@dataclass(frozen=True)
class DDTreeChoice:
    design: DDTreeDesign
    budget: int
    block: int = 0

    @property
    def verify_tokens(self) -> int:
        """Tokens verified per request per step: what sizes the verify graphs."""
        if self.design.budget_is_draft_tokens:
            return self.budget
        return self.budget + self.design.verify_extra

    @property
    def chain(self) -> bool:
        """At or below block - 1 the design verifies one chain, not a tree."""
        return self.design.chain_below_block and self.budget <= self.block - 1


def verify_graph_bytes(max_bs: int, verify_tokens: int, context_len: int) -> int:
    """The triton backend's verify-graph buffers per GPU (GRAPH_BYTES_PER_POSITION).

    >>> [verify_graph_bytes(48, t, 262144) / 1024**3 for t in (8, 64, 128)]
    [0.84375, 6.75, 13.5]
    """
    return max_bs * verify_tokens * context_len * GRAPH_BYTES_PER_POSITION


def installed_design(c: PlanContext) -> DDTreeDesign | None:
    """The design row the installed tree declares (None: no DDTree, or an unknown design)."""
    return ddtree_designs.design_named((c.install.get("ddtree") or {}).get("design"))


def choose_ddtree(c: PlanContext, block: int) -> DDTreeChoice | None:
    """Whether DDTree is asked for and the tree has a known design (the reasons why not; the
    reasons why are given by ``announce_ddtree`` once the target backend is settled)."""
    b, budget = c.b, c.settings.plan.ddtree_budget
    found = c.install.get("ddtree")
    design = installed_design(c)
    if budget is None:
        if found:
            b.why("ddtree", "off", f"{ddtree_designs.describe(found)} installed; set "
                  "plan.ddtree_budget to turn it on", "info")  # fmt: skip
        return None
    if design is None:
        why = ddtree_designs.describe(found) if found else "no DDTree"
        b.why("ddtree", "off: serving DFlash",
              f"plan.ddtree_budget {budget} asked, but SGLang {c.version} has {why}"
              + (" (no flag is guessed: it would crash-loop the server)" if found else ""),
              "info")  # fmt: skip
        return None
    return DDTreeChoice(design, budget, block)


def _unfit(c: PlanContext, design: DDTreeDesign, backend: str, forced_pages: Mapping[str, int],
           mla: bool) -> str | None:
    """Why ``backend`` cannot verify this design's tree (None: it can)."""
    what = "an MLA target" if mla else "this target"
    table = design.mask_mla if mla else design.mask_mha
    row = table.get(backend)
    if row is None:
        return f"{backend} is not known to honour the tree mask for {what}"
    if not row.honours:
        return f"{backend} drops the tree mask for {what}: {row.source}"
    page = c.overrides.extra_args.get("--page-size", forced_pages.get(backend))
    if design.page_size_rule and page not in (None, 1, "1"):
        return (f"{backend} runs at page size {page}, and {design.name} refuses any page size "
                f"other than 1 ({design.page_size_rule}): the server would crash-loop at start")
    return None


def ddtree_backend(c: PlanContext, att: str, explicit: bool,
                   forced_pages: Mapping[str, int]) -> str:
    """The target backend under DDTree: ``att`` where it verifies the tree with its mask, else
    triton where it does (unless plan.attention_backend chose ``att``), else DFlash without
    DDTree (``c.ddtree`` cleared), each with its reason. ``forced_pages``: the page size SGLang
    sets itself for a backend."""
    choice = c.ddtree
    if choice is None:
        return att
    b, design = c.b, choice.design
    model = model_row(c.settings.target.repo_id)
    mla = model.mla if model is not None else True  # unknown target: the stricter MLA rows
    table = design.mask_mla if mla else design.mask_mha
    why_not = _unfit(c, design, att, forced_pages, mla)
    if why_not is None:
        b.why("ddtree-mask", f"{att} honours it", f"the tree is verified with its mask: "
              f"{table[att].source}")  # fmt: skip
        return att
    alt = MASK_PREFERRED
    alt_why = _unfit(c, design, alt, forced_pages, mla)
    if alt_why is None and alt not in c.registry:
        alt_why = f"{alt} is not in SGLang {c.version}'s attention registry"
    if alt_why is None and alt in c.rule.target_broken:
        alt_why = f"{alt} fails at runtime on {c.sm}"
    if not explicit and alt_why is None:
        b.why("ddtree-mask", f"{alt} instead of {att}",
              f"{why_not}; DDTree is only planned on a target backend that verifies the tree with "
              f"its mask, and {alt} does: {table[alt].source} (unset plan.ddtree_budget to keep "
              f"{att} with plain DFlash)", "override")  # fmt: skip
        return alt
    c.ddtree = None
    if explicit:
        fix = (f"set plan.attention_backend to {alt} (or unset it) to serve DDTree, or unset "
               "plan.ddtree_budget")
        why = f"plan.attention_backend {att} is kept: {why_not}; {fix}"
    else:
        why = f"{why_not}; and {alt_why}"
    b.why("ddtree", "off: serving DFlash", f"plan.ddtree_budget {choice.budget} asked, but "
          f"{why} (a tree verified without its mask gives wrong output)", "warning")  # fmt: skip
    return att


def check_rendered_ddtree(c: PlanContext, flags: list[tuple[str, str | None]]) -> None:
    """No plan renders a DDTree flag (any design's switch or algorithm, plan.extra_args
    included) with a target backend that drops the tree mask: the tree would be verified wrongly
    and the output would differ from the target's."""
    values = dict(flags)
    att = values.get("--attention-backend") or c.attention
    model = model_row(c.settings.target.repo_id)
    mla = model.mla if model is not None else True
    for design in ddtree_designs.DESIGNS:
        on = (design.switch_flag in values if design.switch_flag
              else values.get("--speculative-algorithm") == design.algorithm)
        row = (design.mask_mla if mla else design.mask_mha).get(att or "")
        if on and not (row and row.honours):
            why = row.source if row else "no row of the table says it honours the mask"
            raise c.b.error(
                f"plan.extra_args turns DDTree on ({design.switch_flag or design.algorithm}) with "
                f"--attention-backend {att}, which drops the tree mask: {why}",
                f"remove the DDTree flags from plan.extra_args and set plan.ddtree_budget (the "
                f"plan then picks {MASK_PREFERRED}), or set plan.attention_backend "
                f"{MASK_PREFERRED}",
            )


def announce_ddtree(c: PlanContext, choice: DDTreeChoice) -> None:
    """The reasons DDTree is on: the design, the budget (a chain where the design makes one),
    the overlap rule."""
    b, design, budget, block = c.b, choice.design, choice.budget, choice.block
    found = c.install.get("ddtree") or {}
    b.why("ddtree", design.name, f"plan.ddtree_budget {budget}; the installed tree declares "
          f"{', '.join(found.get('declared') or [])} ({design.source})", "override")  # fmt: skip
    if design.budget_is_draft_tokens:
        b.why("ddtree-budget", f"{design.budget_flag} {budget}",
              f"the budget is the number of draft tokens: the drafter runs over all {budget} "
              f"positions (the drafter's block size is {block}), tree top-k {budget - 1} (a "
              "tree at any budget); " + design.block_rule, "override")  # fmt: skip
    elif choice.chain:
        b.why("ddtree-budget", f"{design.budget_flag} {budget} (a chain)",
              f"plan.ddtree_budget {budget} is at or below the drafter's block size - 1 "
              f"({block - 1}): {design.name} verifies it as one chain, not a tree (DFlash's own "
              f"verify at a shorter block); {design.block_rule}", "override")  # fmt: skip
    else:
        b.why("ddtree-budget", f"{design.budget_flag} {budget}",
              f"plan.ddtree_budget; {design.block_rule}", "override")


def apply_ddtree(c: PlanContext, choice: DDTreeChoice) -> None:
    """The design's switch, its budget flag (where the budget is not the draft tokens) and the
    knobs set in plan (each with its reason)."""
    b, ov, design = c.b, c.settings.plan, choice.design
    if design.switch_flag:
        b.flag(design.switch_flag)
        b.why("ddtree-switch", design.switch_flag, "the design's own switch (a DFLASH flag)",
              "override")
    if not design.budget_is_draft_tokens:
        b.flag(design.budget_flag, choice.budget)
    for knob in design.knobs:
        value = getattr(ov, knob.setting, None)
        if value is None:
            continue
        if knob.env:
            b.env[knob.env] = str(value)
        elif knob.flag:
            b.flag(knob.flag, value)
        b.why(f"ddtree-{knob.setting}", f"{knob.env or knob.flag}={value}",
              f"plan.{knob.setting}", "override")


def graph_reserve_mib(c: PlanContext, gpu_mib: int) -> float:
    """What SGLang keeps for itself beside the verify buffers: the base and CUDA-graph terms of
    its own reserve (``sglang_mem_fraction``: 512 MiB + 2 MiB per decode-graph batch + 1 GiB per
    8 TP ranks). Its chunked-prefill term is left out: the arch rules' fractions already override
    SGLang's own and run with less than that."""
    tiers = (c.row.memory.tiers if c.row is not None else ()) or MEMORY_TIERS
    _, _, bs_small, bs_large = next(t for t in tiers if gpu_mib < t[0])
    return 512 + (bs_small if c.tp < 4 else bs_large) * 2 + c.tp / 8 * 1024


def plan_ddtree_memory(c: PlanContext) -> None:
    """The verify graphs' buffers under DDTree, counted against what the memory fraction leaves
    beside SGLang's own reserve; a budget whose buffers cannot fit is refused (no plan, so
    nothing changes on the host)."""
    choice = c.ddtree
    if choice is None:
        return
    b, extra = c.b, c.overrides.extra_args
    if c.attention != "triton":
        b.why("ddtree-verify-memory", "not counted", f"the verify buffers are counted for triton; "
              f"{c.attention}'s are not", "info")  # fmt: skip
        return
    if extra.get("--disable-cuda-graph") not in (None, False):
        b.why("ddtree-verify-memory", "no verify graphs", "plan.extra_args --disable-cuda-graph",
              "info")
        return
    model = model_row(c.settings.target.repo_id)
    context = extra.get("--context-length") or (model.context_length if model else 0)
    gpu_mib = min((int(g["memory_mib"]) for g in c.gpus[: c.tp] if g.get("memory_mib")),
                  default=0)  # fmt: skip
    if c.group is not None and c.tp:
        gpu_mib = c.group.group_gpu_bytes // c.tp // MIB
    if not context or c.mem_fraction is None or not gpu_mib:
        b.why("ddtree-verify-memory", "not counted", "context length, memory fraction or GPU "
              "memory unknown", "info")  # fmt: skip
        return
    try:
        running = int(extra.get("--max-running-requests") or DFLASH_MAX_RUNNING_REQUESTS)
        max_bs = min(running, int(extra.get("--cuda-graph-max-bs") or running))
        context = int(context)
    except (TypeError, ValueError):
        return  # not a number: SGLang's own parser refuses it
    need = verify_graph_bytes(max_bs, choice.verify_tokens, context)
    left = (1 - c.mem_fraction) * gpu_mib * MIB
    reserve = graph_reserve_mib(c, gpu_mib) * MIB
    room = left - reserve
    how = (f"{max_bs} requests (the largest captured batch) x {choice.verify_tokens} verify "
           f"tokens x {context:,} context positions x {GRAPH_BYTES_PER_POSITION} bytes (triton's "
           f"int64 KV index + uint8 tree mask) = {need / GIB:.2f} GiB per GPU, against "
           f"{left / GIB:.1f} GiB outside mem_fraction_static {c.mem_fraction:.3f}"
           + f" less {reserve / GIB:.1f} GiB SGLang keeps for itself (its reserve's base and "
           "graph terms)"
           + f" = {room / GIB:.1f} GiB")
    if need <= room:
        b.why("ddtree-verify-memory", f"{need / GIB:.2f} GiB fits", how, "info")
        return
    per_token = max_bs * context * GRAPH_BYTES_PER_POSITION
    top = int(room // per_token) - (choice.verify_tokens - choice.budget) if room > 0 else 0
    fixes = []
    if top >= MIN_BUDGET:
        fixes.append(f"use plan.ddtree_budget {top} or lower")
    fixes.append(f"lower the largest verify batch (plan.extra_args --cuda-graph-max-bs or "
                 f"--max-running-requests, now {max_bs})")
    fixes.append("or unset plan.ddtree_budget for plain DFlash")
    raise b.error(
        f"{DDTREE_REFUSED}: plan.ddtree_budget {choice.budget} needs verify CUDA-graph buffers "
        f"that do not fit: {how}",
        "; ".join(fixes),
    )
