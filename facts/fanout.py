"""Facts about a fan-out on a host: its ephemeral sshd and what a fan-out left behind."""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override


def parse_serve(output: list[str]) -> dict[str, Any]:
    """Lines ``unit NAME`` (active units), then ``digest HEX`` if the digest file exists."""
    out: dict[str, Any] = {"active": [], "digest": None}
    for line in output:
        kind, _, value = line.strip().partition(" ")
        if kind == "unit" and value:
            out["active"].append(value)
        elif kind == "digest" and value:
            out["digest"] = value
    return out


class FanoutServe(FactBase[dict[str, Any]]):
    """
    The active units whose names match ``pattern`` (a fan-out's sshd or pulls), and the content
    of ``digest_path`` (the digest of the config and keys an sshd was started with).

    .. code:: python

        {"active": ["specfleet-fanout-sshd-1a2b3c4d5e6f.service"], "digest": "3f1c...64 hex"}
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return {"active": [], "digest": None}

    @override
    def command(self, pattern: str, digest_path: str) -> StringCommand:
        return StringCommand(
            "(", "systemctl", "list-units", "--plain", "--no-legend", "--state=active",
            QuoteString(pattern), "|", "awk", QuoteString('{print "unit " $1}'), ";",
            "!", "test", "-f", QuoteString(digest_path), "||",
            "awk", QuoteString('{print "digest " $1}'), QuoteString(digest_path), ")",
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
