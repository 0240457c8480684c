"""Topic overrides: settings.plan extra_args and extra_env, applied last."""

from __future__ import annotations

from specfleet.core.plan.context import PlanContext


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
    for key, value in ov.extra_env.items():
        b.env[key] = str(value)
        b.why(f"env {key}", value, "plan.extra_env", "override")
    return flags
