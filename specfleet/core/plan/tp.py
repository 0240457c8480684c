"""Topic tensor-parallel: one shard per GPU unless settings say otherwise."""

from __future__ import annotations

from specfleet.core.plan.context import PlanContext


def plan_tp(c: PlanContext) -> None:
    b, ov, n = c.b, c.overrides, len(c.gpus)
    g = c.group
    if g is not None:
        # SGLang places tp_size / nnodes ranks on each node, so every member gives all its GPUs.
        c.tp = g.nnodes * n
        b.why("tensor-parallel", c.tp, f"{g.nnodes} hosts x {n} GPUs of serving group {g.name}: "
              "DFLASH is tensor parallel only across hosts (pp_size must be 1)")  # fmt: skip
        return
    if ov.tp_size is not None:
        tp = ov.tp_size
        b.why("tensor-parallel", tp, f"plan.tp_size (rule: all {n} GPUs)", "override")
    else:
        tp = n
        b.why("tensor-parallel", tp, "one shard per GPU")
    if tp > n:
        raise b.error(
            f"--tp-size {tp} needs {tp} GPUs, the host has {n}",
            f"set plan.tp_size to at most {n} or leave it unset to use every GPU",
        )
    c.tp = tp
