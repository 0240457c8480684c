"""Topics gpu-memory and mem-fraction-static: do the weights fit, and how much SGLang may take."""

from __future__ import annotations

from specfleet.core.plan.context import GIB, MIB, PlanContext
from specfleet.core.tables.models import known_weights_bytes


def plan_gpu_memory(c: PlanContext) -> None:
    b, s, tp = c.b, c.settings, c.tp
    unknown = [
        str(i if g.get("index") is None else g["index"])
        for i, g in enumerate(c.gpus[:tp])
        if not g.get("memory_mib")
    ]
    if unknown:
        raise b.error(
            f"GPU memory unknown: facts.gpu.Gpus gives no memory_mib (null or 0) for GPU "
            f"{', '.join(unknown)}; no plan is made on unknown memory",
            "check `nvidia-smi --query-gpu=index,memory.total --format=csv` on the host (a "
            "driver or MIG problem shows there), then gather the facts again",
        )
    mib = [int(g["memory_mib"]) for g in c.gpus[:tp]]
    total = sum(mib) * MIB
    if c.group is not None:
        # Tensor parallel shards evenly: the group's smallest GPU bounds every shard.
        total = c.group.group_gpu_bytes
    size = c.weights_bytes
    if size is None:
        size = known_weights_bytes(s.target.repo_id)
    if size is None:
        b.why("gpu-memory", f"{total / GIB:.0f} GiB", "weights size unknown: not checked", "info")
    elif total and total < size:
        raise b.error(
            f"{tp} GPUs hold {total / GIB:.0f} GiB in all, far below the {size / GIB:.0f} GiB of "
            f"weights ({s.target.repo_id} + {s.drafter.repo_id})",
            "use a host with more GPU memory (Kimi K2.6 needs 8x H200, 8x B200 or 8x RTX PRO "
            "6000), serve it from several hosts as one (settings 'group'), or a smaller target"
            if c.group is None
            else "add members to the serving group, or use hosts with more GPU memory",
        )
    else:
        b.why(
            "gpu-memory",
            f"{total / GIB:.0f} GiB",
            f"{size / GIB:.0f} GiB of weights fit, {(total - size) / GIB / max(tp, 1):.0f} GiB "
            "per GPU left for KV cache and activations",
        )
    c.total_bytes, c.size = total, size


def plan_mem_fraction(c: PlanContext) -> None:
    b, ov, rule = c.b, c.overrides, c.rule
    if ov.mem_fraction_static is not None:
        mfs: float | None = ov.mem_fraction_static
        rule_txt = "SGLang default" if rule.mem_fraction is None else str(rule.mem_fraction)
        note = ""
        ceiling = rule.mem_fraction_ceiling
        if ceiling is not None and ov.mem_fraction_static > ceiling:
            note = f"; above {ceiling} has been seen to OOM on {rule.family}"
        b.why(
            "mem-fraction-static",
            mfs,
            f"plan.mem_fraction_static (rule: {rule_txt}){note}",
            "override",
        )
    else:
        mfs = rule.mem_fraction
        b.why(
            "mem-fraction-static", "SGLang default" if mfs is None else mfs, rule.mem_fraction_why
        )
    if mfs is not None:
        b.flag("--mem-fraction-static", str(mfs))
        size, total = c.size, c.total_bytes
        if size is not None and total and size > mfs * total:
            b.why(
                "kv-cache-room",
                "none",
                f"the weights ({size / GIB:.0f} GiB) exceed mem-fraction-static x GPU memory "
                f"({mfs * total / GIB:.0f} GiB): SGLang will find no room for the KV cache",
                "info",
            )
