"""Topic ddtree: DDTree on top of DFLASH, where the installed SGLang has a design the table knows.

``plan.ddtree_budget`` asks for it; the design row (specfleet.core.tables.ddtree_designs) that the
installed tree's own declarations matched (facts.sglang ``ddtree``) gives every flag. A host
without DDTree, or with a design no row knows, serves plain DFlash and says so in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from specfleet.core.plan.context import PlanContext
from specfleet.core.tables import ddtree_designs
from specfleet.core.tables.ddtree_designs import DDTreeDesign

# The fork's tree top-k per position is budget - 1 (dflash_worker.py): a budget needs 2 at least.
MIN_BUDGET = 2


@dataclass(frozen=True)
class DDTreeChoice:
    design: DDTreeDesign
    budget: int


def installed_design(c: PlanContext) -> DDTreeDesign | None:
    """The design row the installed tree declares (None: no DDTree, or an unknown design)."""
    return ddtree_designs.design_named((c.install.get("ddtree") or {}).get("design"))


def choose_ddtree(c: PlanContext, block: int) -> DDTreeChoice | None:
    """Whether DDTree is on, and why or why not (one reason either way when it is asked for, or
    when the tree has it)."""
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
    b.why("ddtree", design.name, f"plan.ddtree_budget {budget}; the installed tree declares "
          f"{', '.join(found.get('declared') or [])} ({design.source})", "override")  # fmt: skip
    if design.budget_is_draft_tokens:
        b.why("ddtree-budget", f"{design.budget_flag} {budget}",
              f"the budget is the number of draft tokens: the drafter runs over all {budget} "
              f"positions (the drafter's block size is {block}), tree top-k {budget - 1}; "
              + design.block_rule, "override")  # fmt: skip
    else:
        b.why("ddtree-budget", f"{design.budget_flag} {budget}",
              f"plan.ddtree_budget; {design.block_rule}", "override")
    return DDTreeChoice(design, budget)


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
