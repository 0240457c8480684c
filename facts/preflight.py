"""Facts only preflight and the run lock ask: a pip wheel resolution and the lock file."""

from __future__ import annotations

import json
import shlex
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


LOCK_META = "##specfleet-lock-meta"


def parse_run_lock(output: list[str]) -> dict | None:
    """The RunLock value from its command's output: ``None`` when there is no lock, else the
    lock's JSON with ``host_now`` (the host's clock) and ``mtime`` (when it was last written);
    a lock that is not a JSON object reads as ``{"owner": "unknown", "unreadable": ...}``."""
    meta: dict[str, float] = {}
    body = []
    for line in output:
        if line.startswith(LOCK_META):
            words = line[len(LOCK_META) :].split()
            for key, word in zip(("host_now", "mtime"), words, strict=False):
                try:
                    meta[key] = float(word)
                except ValueError:
                    pass
        else:
            body.append(line)
    text = "\n".join(body).strip()
    if not text and not meta:
        return None
    try:
        value = json.loads(text) if text else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        value = {"owner": "unknown", "unreadable": text[:200]}
    value.update(meta)
    return value


class RunLock(FactBase[Any]):
    """
    The per-host run lock (``specfleet.core.runlock``): who holds it, since when and until when,
    or ``None`` when nobody does. ``host_now`` is the host's clock when it was read, ``mtime``
    when the lock was last written (taken or renewed).

    .. code:: python

        {"owner": "ops@laptop", "control_host": "laptop", "machine_id": "9f1c...",
         "boot_id": "2d7a...", "pid": 4242, "pid_start": 81723, "run_id": "5e0b7c1d2a9f4e63",
         "command": "pyinfra inventories/ct200.py deploys/kimi_k26.py",
         "taken_at": 1796050620.0, "expires_at": 1796050860.0, "lease_s": 180.0,
         "host_now": 1796050700.2, "mtime": 1796050680.0}
    """

    @override
    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return (f'! test -f {q} || {{ echo "{LOCK_META} $(date +%s) $(stat -c %Y {q})"; '
                f"cat {q}; }}")

    @override
    def process(self, output: list[str]) -> dict | None:
        return parse_run_lock(output)
