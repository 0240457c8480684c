"""Topic custom-all-reduce: off where the GPUs are not all on NVLink."""

from __future__ import annotations

from collections.abc import Mapping

from specfleet.core.plan.context import TOPOLOGY, PlanContext


def plan_all_reduce(c: PlanContext) -> None:
    b, tp = c.b, c.tp
    topo = c.facts.get(TOPOLOGY)
    nvlink = None
    if isinstance(topo, Mapping) and not topo.get("error") and topo.get("gpus"):
        nvlink = bool(topo.get("nvlink_all_pairs"))
    if tp > 2 and nvlink is not True:
        b.flag("--disable-custom-all-reduce")
        if nvlink is None:
            why = (
                f"GPU topology unknown with {tp} GPUs: the custom all-reduce kernel needs "
                "NVLink/P2P, so it is off to be safe"
            )
            b.why("custom-all-reduce", "disabled", why, "assumed")
        else:
            b.why(
                "custom-all-reduce",
                "disabled",
                f"PCIe-only ({tp} GPUs, not every pair on NVLink): the custom all-reduce kernel "
                "needs NVLink/P2P there",
            )
    else:
        link = "NVLink between all pairs" if nvlink else f"{tp} GPU(s)"
        b.why("custom-all-reduce", "SGLang default", f"{link}: custom all-reduce stays on")
