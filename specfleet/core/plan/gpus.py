"""Topic gpus: what the host has, and the architecture rule that applies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specfleet.core.plan.context import GPUS, PlanContext
from specfleet.core.tables.gpu_archs import (
    SUPPORTED_GPUS,
    ArchRule,
    arch_rule,
    capability,
    covered_archs,
)


def plan_gpus(c: PlanContext) -> None:
    b, ov = c.b, c.overrides
    gpus_fact = c.facts.get(GPUS)
    gpus: list[Mapping[str, Any]] = list((gpus_fact or {}).get("gpus") or [])
    if not gpus:
        detail = (gpus_fact or {}).get("error") if isinstance(gpus_fact, Mapping) else None
        if gpus_fact is None:
            problem = "no GPUs: the facts carry no facts.gpu.Gpus (GPU inventory unknown)"
        elif detail:
            problem = f"no GPUs: nvidia-smi failed: {detail.strip()}"
        else:
            problem = "no GPUs: no nvidia-smi on the host, or it lists none"
        raise b.error(
            problem,
            "run on a host with NVIDIA GPUs and a working driver (nvidia-smi must list them), "
            "or remove this host from the SGLang group",
        )
    caps = [capability(g) for g in gpus]
    if any(cap is None for cap in caps):
        detail = (gpus_fact or {}).get("error")
        raise b.error(
            "GPU compute capability unknown (facts.gpu.Gpus has no compute_capability)"
            + (f": nvidia-smi said: {detail.strip()}" if detail else ""),
            "update the NVIDIA driver: nvidia-smi --query-gpu=compute_cap needs driver >= 510",
        )
    archs = sorted({cap for cap in caps if cap is not None})
    if len({arch_rule(*cap) for cap in archs}) > 1:
        raise b.error(
            "mixed GPU architectures on one host: " + ", ".join(f"SM{ma}{mi}" for ma, mi in archs),
            "serve from GPUs of one architecture: set plan.extra_env CUDA_VISIBLE_DEVICES and "
            "plan.tp_size to one kind",
        )
    major, minor = archs[0]
    sm = f"SM{major}{minor}"
    rule = arch_rule(major, minor)
    names = sorted({str(g.get("name", "?")) for g in gpus})
    b.why("gpus", f"{len(gpus)}x {', '.join(names)} ({sm})", "from facts.gpu.Gpus")
    if rule is None and ov.attention_backend and ov.draft_attention_backend:
        # No rule for this arch, but both backends are given: the plan follows them.
        rule = ArchRule(
            family=sm,
            target=(ov.attention_backend,),
            target_why="",
            draft=(ov.draft_attention_backend,),
            draft_why="",
            mem_fraction_why=f"{sm}: no rule, left to SGLang's own default",
        )
    if rule is None:
        raise b.error(
            f"no usable attention backend for {sm} ({', '.join(names)}): specfleet's rules cover "
            f"{covered_archs()}",
            f"run on {SUPPORTED_GPUS} GPUs, or set plan.attention_backend "
            "and plan.draft_attention_backend to backends known to work on this GPU",
        )
    c.gpus, c.sm, c.names, c.rule = gpus, sm, names, rule
