"""Topic overrides: settings.plan extra_args and extra_env, applied last."""

from __future__ import annotations

from specfleet.core.plan.context import PlanContext
from specfleet.core.plan.ddtree import check_rendered_ddtree
from specfleet.core.plan.memory import attention_dp_size


def apply_overrides(c: PlanContext) -> list[tuple[str, str | None]]:
    """The flags with ``plan.extra_args`` applied (a flag set, replaced or removed), and
    ``plan.extra_env`` added to the environment."""
    b, ov, row = c.b, c.overrides, c.row
    flags = list(b.flags)
    for name, value in ov.extra_args.items():
        if not name.startswith("--"):
            raise b.error(
                f"plan.extra_args key {name!r} is not a long flag",
                f"write it as '--{name.lstrip('-')}'",
            )
        if name in row.dflash_forbidden_flags and value not in (None, False):
            raise b.error(
                f"{name} must not be passed with DFLASH on SGLang {c.version}",
                f"remove {name} from plan.extra_args",
            )
        if value is None or value is False:
            flags = [(n, v) for n, v in flags if n != name]
            b.why(name, "removed", "plan.extra_args", "override")
            continue
        rendered = None if value is True else str(value)
        if any(n == name for n, _ in flags):
            flags = [(n, rendered if n == name else v) for n, v in flags]
        else:
            flags.append((name, rendered))
        b.why(name, "set" if rendered is None else rendered, "plan.extra_args", "override")
    refuses_dp = "--enable-dp-attention" in row.dflash_forbidden_flags
    if refuses_dp and attention_dp_size(ov.extra_args) > 1:
        # Where DFLASH refuses dp attention, every spelling of it (--attn-dp-size N from 0.5.22).
        raise b.error(
            f"plan.extra_args turns on dp attention, which DFLASH on SGLang {c.version} refuses "
            "(it stops with \"Currently DFLASH speculative decoding does not support dp "
            "attention\")",
            "remove the dp attention flags from plan.extra_args, or use a release whose DFLASH "
            "runs with dp attention (0.5.23 and later, with --enable-dp-lm-head)",
        )
    needs = row.dflash_dp_attention_needs
    missing = [f for f in needs if not any(n == f for n, _ in flags)]
    if missing and attention_dp_size(ov.extra_args) > 1:
        raise b.error(
            f"plan.extra_args turns on dp attention, which DFLASH on SGLang {c.version} runs only "
            f"with {' '.join(missing)} (it stops with \"DFLASH with dp attention requires "
            f"{missing[0]}.\")",
            f"add {', '.join(repr(f) for f in missing)}: true to plan.extra_args, or remove the "
            "dp attention flags",
        )
    for key, value in ov.extra_env.items():
        b.env[key] = str(value)
        b.why(f"env {key}", value, "plan.extra_env", "override")
    check_rendered_ddtree(c, flags)
    return flags
