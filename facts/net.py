"""Facts about a host's network listeners."""

from __future__ import annotations

import json
import re
import shlex

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


# `ip -j addr` first, then one "name speed" line per /sys/class/net entry after this marker.
_SPEED_MARK = "--specfleet-speeds--"


def parse_interfaces(output: list[str]) -> list[dict]:
    """Parse ``ip -j addr`` followed by ``_SPEED_MARK`` and ``NAME SPEED`` lines.

    SPEED is /sys/class/net/NAME/speed in Mbit/s; the kernel gives -1 (or an error, here "-") for
    virtual links and links without a carrier, which is unknown (None), not slow.
    """
    if _SPEED_MARK in output:
        at = output.index(_SPEED_MARK)
        json_lines, speed_lines = output[:at], output[at + 1 :]
    else:
        json_lines, speed_lines = output, []
    try:
        links = json.loads("\n".join(json_lines) or "[]")
    except json.JSONDecodeError:
        return []
    speeds: dict[str, int | None] = {}
    for line in speed_lines:
        name, _, speed = line.strip().partition(" ")
        speeds[name] = int(speed) if speed.lstrip("-").isdigit() and int(speed) > 0 else None
    interfaces = []
    for link in links if isinstance(links, list) else []:
        if not isinstance(link, dict) or not isinstance(link.get("ifname"), str):
            continue
        name = link["ifname"]
        interfaces.append(
            {
                "name": name,
                "state": str(link.get("operstate", "UNKNOWN")),
                "loopback": "LOOPBACK" in (link.get("flags") or []),
                "mtu": link.get("mtu"),
                "speed_mbps": speeds.get(name),
                "addresses": [
                    a["local"]
                    for a in link.get("addr_info") or []
                    if isinstance(a, dict) and isinstance(a.get("local"), str)
                ],
            }
        )
    return interfaces


class NetworkInterfaces(FactBase[list]):
    """
    Returns the host's network interfaces: state, MTU, link speed (Mbit/s, None where the kernel
    does not know it) and addresses. Empty where ``ip`` is missing.

    .. code:: python

        [
            {"name": "lo", "state": "UNKNOWN", "loopback": True, "mtu": 65536,
             "speed_mbps": None, "addresses": ["127.0.0.1", "::1"]},
            {"name": "eth0", "state": "UP", "loopback": False, "mtu": 9000,
             "speed_mbps": 100000, "addresses": ["10.0.0.11", "fe80::1"]},
        ]
    """

    default = list

    @override
    def command(self) -> str:
        return (
            "command -v ip >/dev/null 2>&1 && ip -j addr 2>/dev/null; "
            f"echo {_SPEED_MARK}; "
            "for d in /sys/class/net/*; do "
            '[ -e "$d" ] && echo "${d##*/} $(cat "$d/speed" 2>/dev/null || echo -)"; done; true'
        )

    @override
    def process(self, output: list[str]) -> list:
        return parse_interfaces(output)


def parse_rdma_ports(output: list[str]) -> list[dict]:
    """Parse ``DEVICE PORT|state|link_layer|rate|netdevs`` lines (one per RDMA port).

    The files are the kernel's (Documentation/ABI/stable/sysfs-class-infiniband): ``state`` reads
    "4: ACTIVE", ``link_layer`` "InfiniBand" or "Ethernet" (RoCE), ``rate`` "400 Gb/sec (4X NDR)";
    ``netdevs`` are the device's network interfaces (device/net/), space-separated.
    """
    ports = []
    for line in output:
        head, sep, rest = line.partition("|")
        fields = rest.split("|")
        if not sep or len(fields) != 4:
            continue
        device, _, port = head.strip().partition(" ")
        if not device or not port.isdigit():
            continue
        state, link_layer, rate, netdevs = (f.strip() for f in fields)
        gbps = rate.split(" ", 1)[0]
        ports.append(
            {
                "device": device,
                "port": int(port),
                "state": state.partition(":")[2].strip() or state or "UNKNOWN",
                "link_layer": link_layer or None,
                "rate_gbps": float(gbps) if gbps.replace(".", "", 1).isdigit() else None,
                "netdevs": netdevs.split(),
            }
        )
    return ports


class RdmaPorts(FactBase[list]):
    """
    Returns the host's RDMA ports (InfiniBand or RoCE), read from /sys/class/infiniband. Empty on
    a host without RDMA devices.

    .. code:: python

        [
            {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand",
             "rate_gbps": 400.0, "netdevs": ["ibp12s0"]},
        ]
    """

    default = list

    @override
    def command(self) -> str:
        return (
            "for p in /sys/class/infiniband/*/ports/*; do [ -d \"$p\" ] || continue; "
            'dev=${p%/ports/*}; dev=${dev##*/}; '
            'echo "$dev ${p##*/}|$(cat "$p/state" 2>/dev/null)|$(cat "$p/link_layer" 2>/dev/null)'
            '|$(cat "$p/rate" 2>/dev/null)|$(ls "/sys/class/infiniband/$dev/device/net" '
            '2>/dev/null | tr "\\n" " ")"; done; true'
        )

    @override
    def process(self, output: list[str]) -> list:
        return parse_rdma_ports(output)


class TcpReach(FactBase[dict]):
    """
    Returns whether this host reaches ``address:port`` over TCP: ``open`` (something listens),
    ``refused`` (the host answered, nothing listens yet: reachable), ``timeout`` (filtered or
    down), or the error (no route, unknown name).

    .. code:: python

        {"result": "refused"}
    """

    @override
    def command(self, address: str, port: int, timeout_s: float = 3.0) -> str:
        script = (
            "import socket,sys\n"
            "try:\n"
            f"    socket.create_connection(({address!r}, {int(port)}), {float(timeout_s)}).close()"
            "; print('open')\n"
            "except ConnectionRefusedError: print('refused')\n"
            "except (TimeoutError, socket.timeout): print('timeout')\n"
            "except OSError as e: print(str(e).replace(chr(10), ' ') or type(e).__name__)\n"
        )
        return f"python3 -c {shlex.quote(script)}"

    @override
    def process(self, output: list[str]) -> dict:
        return {"result": (output[-1].strip() if output else "") or "unknown"}
