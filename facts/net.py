"""Facts about a host's network listeners."""

from __future__ import annotations

import re

from pyinfra.api import FactBase
from typing_extensions import override

_USER = re.compile(r'\("([^"]*)",pid=(\d+)')


def parse_listeners(output: list[str]) -> list[dict]:
    """Parse ``ss -Hltnp``: one entry per listening socket and process."""
    listeners = []
    for line in output:
        fields = line.split()
        if len(fields) < 5 or fields[0] != "LISTEN":
            continue
        address, _, port = fields[3].rpartition(":")
        if not port.isdigit():
            continue
        address = address.strip("[]")
        users = _USER.findall(" ".join(fields[5:])) or [(None, None)]
        for process, pid in users:
            listeners.append(
                {
                    "address": address,
                    "port": int(port),
                    "process": process,
                    "pid": int(pid) if pid else None,
                }
            )
    return listeners


class ListeningPorts(FactBase[list]):
    """
    Returns the TCP sockets listening on the host and, where ``ss`` may see it (as root), the
    process behind each. Empty where ``ss`` is missing.

    .. code:: python

        [
            {"address": "0.0.0.0", "port": 22, "process": "sshd", "pid": 412},
            {"address": "127.0.0.1", "port": 30000, "process": "python3", "pid": 5120},
        ]
    """

    default = list

    @override
    def command(self) -> str:
        return "if command -v ss >/dev/null 2>&1; then ss -Hltnp 2>/dev/null || true; fi"

    @override
    def process(self, output: list[str]) -> list:
        return parse_listeners(output)


def port_users(listeners: list[dict], port: int) -> list[dict]:
    """The listeners on ``port`` (any address)."""
    return [entry for entry in listeners if entry["port"] == port]
