"""Facts about a fan-out on a host: its ephemeral sshd and what a fan-out left behind."""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override


def parse_serve(output: list[str]) -> dict[str, Any]:
    """``systemctl is-active`` on the first line, then the digest file's content, if any."""
    lines = [line.strip() for line in output if line.strip()]
    return {
        "active": bool(lines) and lines[0] in ("active", "activating", "reloading"),
        "digest": lines[1] if len(lines) > 1 else None,
    }


class FanoutServe(FactBase[dict[str, Any]]):
    """
    The ephemeral sshd of a fan-out: whether its unit runs, and the digest of the config and
    keys it was started with (written beside them).

    .. code:: python

        {"active": True, "digest": "3f1c...64 hex"}
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return {"active": False, "digest": None}

    @override
    def command(self, unit: str, digest_path: str) -> StringCommand:
        return StringCommand(
            "(", "systemctl", "is-active", QuoteString(unit), "||", "true", ";",
            "cat", QuoteString(digest_path), "2>/dev/null", "||", "true", ")",
        )

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_serve(output)


def parse_leftovers(output: list[str]) -> dict[str, list[str]]:
    """Lines ``unit NAME`` and ``file NAME`` -> {"units": [...], "files": [...]}."""
    out: dict[str, list[str]] = {"units": [], "files": []}
    for line in output:
        kind, _, name = line.strip().partition(" ")
        if kind == "unit" and name:
            out["units"].append(name)
        elif kind == "file" and name:
            out["files"].append(name)
    return out


class FanoutLeftovers(FactBase[dict[str, list[str]]]):
    """
    Running fan-out units, and what is under the fan-out folder besides the pull records
    (``*.pull.json``): keys, known_hosts, jobs, the sshd folder.

    .. code:: python

        {"units": ["specfleet-fanout-sshd.service"], "files": ["sshd", "x.key"]}
    """

    @staticmethod
    def default() -> dict[str, list[str]]:
        return {"units": [], "files": []}

    @override
    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "(", "systemctl", "list-units", "--plain", "--no-legend", "--state=active",
            QuoteString("specfleet-fanout-*"), "|", "awk", QuoteString('{print "unit " $1}'),
            ";", "!", "test", "-d", QuoteString(path), "||", "find", QuoteString(path),
            "-mindepth", "1", "-maxdepth", "1", "!", "-name", QuoteString("*.pull.json"),
            "-printf", QuoteString("file %f\\n"), ")",
        )

    @override
    def process(self, output: list[str]) -> dict[str, list[str]]:
        return parse_leftovers(output)
