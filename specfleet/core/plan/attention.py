"""Topic attention-backend: the target's (MLA) attention backend for this arch and SGLang."""

from __future__ import annotations

from specfleet.core.plan.context import PlanContext
from specfleet.core.plan.ddtree import ddtree_backend

# Target backends whose page size SGLang sets itself when --page-size is unset: 0.5.11 and 0.5.14
# server_args.py _handle_attention_backend_compatibility ("TensorRT-LLM MLA only supports
# page_size of 32 or 64, changing page_size from None to 64"), run by tests/harness/sglang_rules.py.
PAGE_SIZE_SET_BY_SGLANG = {"trtllm_mla": 64}
PAGE_SIZE_WHY = "supports page sizes 32 or 64 only, SGLang sets 64"


def plan_attention(c: PlanContext) -> None:
    b, ov, rule, registry, sm = c.b, c.overrides, c.rule, c.registry, c.sm
    if ov.attention_backend:
        att = ov.attention_backend
        if att in rule.target_broken:
            raise b.error(
                f"plan.attention_backend {att!r} fails at runtime on {sm}",
                f"unset plan.attention_backend (the rule picks {rule.target[0]}) or choose one of "
                f"{', '.join(rule.target)}",
            )
        if att not in registry:
            raise b.error(
                f"plan.attention_backend {att!r} is not in SGLang {c.version}'s attention registry",
                f"choose one of: {', '.join(sorted(registry))}",
            )
        b.why(
            "attention-backend", att, f"plan.attention_backend (rule: {rule.target[0]})", "override"
        )
    else:
        prefs = rule.target
        chosen = ov.sm120_target_backend if rule.target_choice_setting else None
        if chosen in prefs:
            prefs = (chosen,) + tuple(p for p in prefs if p != chosen)
        att = next((p for p in prefs if p in registry), None)
        if att is None:
            raise b.error(
                f"no usable attention backend for {sm}: SGLang {c.version}'s registry has none of "
                f"{', '.join(prefs)}",
                f"install an SGLang whose attention registry has {prefs[0]}, or set "
                "plan.attention_backend",
            )
        if chosen is not None and att == chosen and att != rule.target[0]:
            b.why(
                "attention-backend",
                att,
                f"plan.sm120_target_backend chose {att} (rule: {rule.target[0]})",
                "override",
            )
        else:
            b.why("attention-backend", att, rule.target_why, c.src)
    att = ddtree_backend(c, att, bool(ov.attention_backend), PAGE_SIZE_SET_BY_SGLANG)
    c.attention = att
    b.flag("--attention-backend", att)
    if "--page-size" in c.overrides.extra_args:
        return
    forced = PAGE_SIZE_SET_BY_SGLANG.get(att)
    if forced is not None:
        b.why("page-size", forced, f"left to SGLang {c.version}: {att} {PAGE_SIZE_WHY}")
    else:
        # server_args.py: page_size None becomes 1 when no backend rule sets it (seen on a real
        # GPU with 0.5.11, tests/fixtures/real_gpu/).
        b.why("page-size", 1, f"left to SGLang {c.version}: its default; {att} sets none")
