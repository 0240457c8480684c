"""Facts only preflight and the run lock ask: a pip wheel resolution and the lock file."""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

WHEEL_OK = "specfleet-wheel-ok"


def parse_wheel_check(output: list[str]) -> str | None:
    """None when pip resolved a wheel, else pip's error (its last lines)."""
    if any(line.strip() == WHEEL_OK for line in output):
        return None
    tail = [line for line in output if line.strip()][-6:]
    return "\n".join(tail) or "pip found no matching distribution"


class SGLangWheel(FactBase[Any]):
    """
    Whether pip on the host resolves ``requirement`` for the host's interpreter and glibc, with
    the given pip source arguments, without installing anything. ``None`` when it does, else pip's
    error text.

    .. code:: python

        "ERROR: Could not find a version that satisfies the requirement sglang==0.5.13 ..."
    """

    @override
    def command(self, python: str, requirement: str, pip_args: list[str] | None = None):
        # --target keeps Debian's externally-managed guard out of a dry resolution.
        return StringCommand(
            QuoteString(python), "-m", "pip", "install", "--dry-run", "--no-deps",
            "--ignore-installed", "--disable-pip-version-check", "--quiet",
            "--target", "/tmp/specfleet-wheel-check",
            *[QuoteString(a) for a in pip_args or []], QuoteString(requirement),
            "2>&1", "&&", "echo", WHEEL_OK, "||", "true",
        )

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_wheel_check(output)


class RunLock(FactBase[Any]):
    """
    The per-host run lock: who holds it and since when, or ``None`` when nobody does.

    .. code:: python

        {"owner": "ops@laptop", "control_host": "laptop", "pid": 4242, "started": 1796050619.1,
         "command": "pyinfra inventories/ct200.py deploys/kimi_k26.py"}
    """

    @override
    def command(self, path: str) -> StringCommand:
        return StringCommand("!", "test", "-f", QuoteString(path), "||", "cat", QuoteString(path))

    @override
    def process(self, output: list[str]) -> dict | None:
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return {"owner": "unknown", "unreadable": text[:200]}
        return value if isinstance(value, dict) else {"owner": "unknown", "unreadable": text[:200]}
