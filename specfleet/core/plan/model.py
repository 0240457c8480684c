"""What a launch plan is: the argv, the environment, and a reason for every choice."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from specfleet.core.errors import SpecfleetError

ReasonKind = Literal["rule", "override", "predicted", "assumed", "info", "warning"]


class PlanError(SpecfleetError):
    """A launch plan that cannot be made for this host, with the reason and the fix."""


@dataclass(frozen=True)
class Reason:
    """One decision of the plan: what it is about, what was chosen, and why."""

    topic: str
    choice: str
    why: str
    # "rule": issue 4's rules; "override": settings.plan overrode a rule; "predicted": from the
    # version table, SGLang not (yet) installed; "assumed": a default stood in for a missing input;
    # "info": reported, nothing added.
    kind: ReasonKind = "rule"

    def to_dict(self) -> dict[str, str]:
        return {"topic": self.topic, "choice": self.choice, "why": self.why, "kind": self.kind}

    def render(self, width: int = 24) -> str:
        tag = "" if self.kind == "rule" else f" [{self.kind}]"
        return f"{self.topic:<{width}} {self.choice}: {self.why}{tag}"


@dataclass(frozen=True)
class Plan:
    argv: list[str]
    env: dict[str, str]
    reasons: list[Reason]
    # True when SGLang's features came from the version table, not from the installed files.
    predicted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "env": dict(self.env),
            "reasons": [r.to_dict() for r in self.reasons],
            "predicted": self.predicted,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def render(self) -> str:
        """One line per decision, then the environment and the command."""
        width = max((len(r.topic) for r in self.reasons), default=0)
        head = "plan (predicted: SGLang not installed yet)" if self.predicted else "plan"
        lines = [head + ":"]
        lines += ["  " + r.render(width) for r in self.reasons]
        lines.append("  env: " + " ".join(f"{k}={v}" for k, v in self.env.items()))
        lines.append("  argv: " + " ".join(shell_quote(a) for a in self.argv))
        return "\n".join(lines)

    def reason(self, topic: str) -> Reason | None:
        return next((r for r in self.reasons if r.topic == topic), None)


def shell_quote(arg: str) -> str:
    if arg and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", arg):
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"


@dataclass
class PlanBuilder:
    """The plan being made: flags in order, the environment, the reasons, and the host (for
    errors). Each topic module adds to it."""

    host: str | None = None
    flags: list[tuple[str, str | None]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    reasons: list[Reason] = field(default_factory=list)

    def flag(self, name: str, value: str | int | float | None = None) -> None:
        self.flags.append((name, None if value is None else str(value)))

    def why(self, topic: str, choice: Any, why: str, kind: ReasonKind = "rule") -> None:
        self.reasons.append(Reason(topic, str(choice), why, kind))

    def error(self, problem: str, fix: str) -> PlanError:
        return PlanError(problem, host=self.host, fix=fix)
