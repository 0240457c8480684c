"""Topics gpu-memory and mem-fraction-static: do the weights fit, and how much SGLang may take."""

from __future__ import annotations

from specfleet.core.plan.context import GIB, MIB, PlanContext
from specfleet.core.tables.models import known_weights_bytes, model_row
from specfleet.core.tables.sglang_versions import (
    DFLASH_MAX_RUNNING_REQUESTS,
    DRAFT_KV_BY_LAYERS,
    kv_cell_bytes,
    sglang_mem_fraction,
)


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
            "per GPU left for KV cache and activations (SGLang reserves part: kv-cache-room)",
        )
    c.total_bytes, c.size = total, size


def plan_mem_fraction(c: PlanContext) -> None:
    """The memory fraction (the rule's, an override's, or the one SGLang will choose), the KV cache
    room it leaves per GPU in GiB and tokens, and no plan where that room is below
    plan.min_request_tokens (see ``_kv_room``)."""
    b, ov, rule, row = c.b, c.overrides, c.rule, c.row
    model = model_row(c.settings.target.repo_id)
    gpu_mib = _smallest_gpu_mib(c)
    sglang_mfs = None
    if model is not None and model.architecture and gpu_mib and row is not None:
        sglang_mfs, reserved = sglang_mem_fraction(
            row.memory, gpu_mib, c.tp, speculative=True, mla=model.mla,
            architecture=model.architecture, vision=model.vision,
            attn_dp_size=attention_dp_size(ov.extra_args),
        )  # fmt: skip
    if ov.mem_fraction_static is not None:
        mfs: float | None = ov.mem_fraction_static
        rule_txt = "SGLang default" if rule.mem_fraction is None else str(rule.mem_fraction)
        note = ""
        ceiling = rule.mem_fraction_ceiling
        if ceiling is not None and ov.mem_fraction_static > ceiling:
            note = f"; above {ceiling} has been seen to OOM on {rule.family}"
        if sglang_mfs is not None and mfs > sglang_mfs:
            note += (
                f"; above the {sglang_mfs:.3f} SGLang {c.version} would choose, it leaves less "
                "than SGLang's estimate for activations and CUDA graphs: out of memory under load "
                "is possible"
            )
        b.why(
            "mem-fraction-static",
            mfs,
            f"plan.mem_fraction_static (rule: {rule_txt}){note}",
            "override",
        )
    elif rule.mem_fraction is not None:
        mfs = rule.mem_fraction
        over = (
            f"; it overrides the {sglang_mfs:.3f} SGLang {c.version} would choose on "
            f"{gpu_mib} MiB GPUs at TP {c.tp} ({row.memory.source})"
            if sglang_mfs is not None else "; it overrides SGLang's own choice"
        )
        b.why("mem-fraction-static", mfs, rule.mem_fraction_why + over)
    elif sglang_mfs is not None:
        mfs = None
        b.why(
            "mem-fraction-static",
            "SGLang default",
            f"{rule.mem_fraction_why}: SGLang {c.version} will choose {sglang_mfs:.3f} on "
            f"{gpu_mib} MiB GPUs at TP {c.tp} ({reserved / 1024:.1f} GiB reserved for "
            "activations, CUDA graphs and the draft model"
            + (", then lowered for the vision tower" if model.vision else "")
            + f"; {row.memory.source})",
        )
    else:
        mfs = None
        b.why("mem-fraction-static", "SGLang default", rule.mem_fraction_why)
    if mfs is not None:
        b.flag("--mem-fraction-static", str(mfs))
    effective = mfs if mfs is not None else sglang_mfs
    c.mem_fraction = effective
    _kv_room(c, effective, gpu_mib, model, explicit=mfs is not None)
    _max_running_requests(c)


def attention_dp_size(extra_args) -> int:
    """The attention data-parallel width plan.extra_args asks for: ``--attn-dp-size N`` (0.5.23),
    or the older ``--enable-dp-attention`` with ``--dp-size N``; 1 without dp attention."""
    def width(flag: str) -> int:
        try:
            return int(extra_args.get(flag) or 1)
        except (TypeError, ValueError):
            return 1  # not a number: SGLang's own parser refuses it

    if width("--attn-dp-size") > 1:
        return width("--attn-dp-size")
    if extra_args.get("--enable-dp-attention") not in (None, False):
        return width("--dp-size")
    return 1


def _smallest_gpu_mib(c: PlanContext) -> int:
    if c.group is not None and c.tp:
        return c.group.group_gpu_bytes // c.tp // MIB
    mib = [int(g["memory_mib"]) for g in c.gpus[: c.tp] if g.get("memory_mib")]
    return min(mib) if mib else 0


def _kv_room(c: PlanContext, mfs: float | None, gpu_mib: int, model, explicit: bool) -> None:
    """The KV pool per GPU in GiB and, by the release's own accounting, in tokens: what one
    request may hold (SGLang caps each request at the pool) and how many full-context requests
    fit. Below plan.min_request_tokens (or no room at all) there is no plan; a pool that holds
    no full-context request is a warning with the cap."""
    b, size, tp = c.b, c.size, c.tp
    if mfs is None or size is None or not gpu_mib or not tp:
        b.why("kv-cache-room", "unknown", "weights size or memory fraction unknown", "info")
        return
    budget = mfs * gpu_mib * MIB
    per_gpu = size / tp
    room = budget - per_gpu
    cell, how = _kv_cell(c, model)
    tokens = int(max(room, 0) // cell) if cell else None
    minimum = c.overrides.min_request_tokens
    if room <= 0 or (tokens is not None and tokens < minimum):
        need = (per_gpu + max(minimum * cell, 1)) / (gpu_mib * MIB)
        where = (
            f"serving group {c.group.name} ({c.group.nnodes} hosts, TP {tp})"
            if c.group is not None
            else f"{tp} GPUs of {gpu_mib / 1024:.1f} GiB"
        )
        whose = "set by the plan" if explicit else f"what SGLang {c.version} chooses"
        fixes = [
            "serve it from more hosts as one (settings 'group': twice the GPUs halve the "
            "weights per GPU)"
            if c.group is None
            else "add members to the serving group",
            "use hosts with more GPU memory",
        ]
        if need < 1:
            fixes.append(
                f"or set plan.mem_fraction_static to at least {need:.3f} (risk: SGLang then "
                "keeps less than its own estimate for activations and CUDA graphs, and may run "
                "out of memory under load)"
            )
        if room > 0:
            fixes.append(f"or lower plan.min_request_tokens (now {minimum:,}) knowing no request "
                         f"may then hold more than {tokens:,} tokens")
        below = (
            f": a KV pool of {tokens:,} tokens by SGLang {c.version}'s accounting ({how}), so no "
            f"request may hold more; below plan.min_request_tokens {minimum:,}"
            if tokens is not None and room > 0
            else f": no KV pool at all, below plan.min_request_tokens {minimum:,} (SGLang stops "
            "at model load with \"Not enough memory\")"
        )
        raise b.error(
            f"{where}: mem_fraction_static {mfs:.3f} ({whose}) gives "
            f"{budget / GIB:.1f} GiB per GPU for weights and KV cache; the weights need "
            f"{per_gpu / GIB:.1f} GiB per GPU, leaving {room / GIB:.1f} GiB for the KV cache"
            + below,
            "; ".join(fixes),
        )
    b.why(
        "kv-cache-room",
        f"{room / GIB:.1f} GiB/GPU",
        f"mem_fraction_static {mfs:.3f} x {gpu_mib / 1024:.1f} GiB = {budget / GIB:.1f} GiB per "
        f"GPU, minus {per_gpu / GIB:.1f} GiB of weights per GPU"
        + (f": about {tokens:,} tokens of KV cache by SGLang {c.version}'s accounting ({how})"
           if tokens is not None else ": tokens unknown (no KV cell size for this model)"),
        "info",
    )
    context = model.context_length if model is not None else 0
    if tokens is None or not context:
        return
    running = c.overrides.extra_args.get("--max-running-requests") or DFLASH_MAX_RUNNING_REQUESTS
    full = tokens // context
    if full >= 1:
        b.why(
            "request-tokens",
            f"{context:,} of {context:,}",
            f"one request may hold its full context; {full} full-context request"
            f"{'s fit' if full > 1 else ' fits'} in the KV pool at once, shared by up to "
            f"{running} running requests",
            "info",
        )
        return
    b.why(
        "request-tokens",
        f"about {tokens // 1000 * 1000:,} of {context:,}",
        f"requests capped at about {tokens // 1000 * 1000:,} of {context:,} tokens: SGLang caps "
        f"each request at its KV pool (managers/tp_worker.py max_req_len), which holds "
        f"{tokens:,} tokens, shared by up to {running} running requests; not one full-context "
        "request fits (more GPU memory, more hosts in a serving group, or a higher "
        "plan.mem_fraction_static raise it)",
        "warning",
    )


def _kv_cell(c: PlanContext, model) -> tuple[int, str]:
    """SGLang's KV bytes per token on each GPU, drafter included, by the release's accounting
    (``sglang_versions.kv_cell_bytes``), and how it is made up; (0, "") when unknown."""
    if model is None or not model.kv_bytes_per_token:
        return 0, ""
    raw = (c.drafter_config or {}).get("num_hidden_layers")
    draft_layers = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 \
        else model.draft_num_layers
    heads = max(1, model.draft_kv_heads // max(c.tp, 1)) if model.draft_kv_heads else 0
    draft_cell = heads * model.draft_kv_bytes_per_token_per_head
    scheme = c.row.dflash_draft_kv if c.row is not None else DRAFT_KV_BY_LAYERS
    target = model.kv_bytes_per_token
    cell = kv_cell_bytes(scheme, target, model.num_layers, draft_layers, draft_cell)
    if scheme == DRAFT_KV_BY_LAYERS and model.num_layers and draft_layers:
        how = (f"{cell:,} bytes per token: the target's cell of {target:,} scaled by "
               f"{model.num_layers + draft_layers}/{model.num_layers} for the drafter's "
               f"{draft_layers} layers")
    else:
        how = (f"{cell:,} bytes per token: the target's cell of {target:,} plus the drafter's "
               f"{cell - target:,}")
    return cell, how


def _max_running_requests(c: PlanContext) -> None:
    extra = c.overrides.extra_args.get("--max-running-requests")
    if extra is not None:
        c.b.why("max-running-requests", extra, "plan.extra_args", "override")
        return
    c.b.why(
        "max-running-requests",
        DFLASH_MAX_RUNNING_REQUESTS,
        f"left to SGLang {c.version}: with DFLASH it resets an unset --max-running-requests to "
        f"{DFLASH_MAX_RUNNING_REQUESTS} (set plan.extra_args '--max-running-requests' to change)",
    )
