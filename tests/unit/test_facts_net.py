"""facts.net's interface and RDMA parsers on real output.

dev-vm-interfaces.txt is NetworkInterfaces' own command run on this project's development VM
(``ip -j addr`` of iproute2 6.1, then /sys/class/net/*/speed: -1 on its virtio link, unreadable on
the ifb links). No RDMA hardware was reachable for a capture (the lent H200 machine is a container
without /sys/class/infiniband), so the RDMA lines follow the kernel's documented sysfs formats
(Documentation/ABI/stable/sysfs-class-infiniband), as the fact's command prints them.
"""

from __future__ import annotations

from pathlib import Path

from facts.net import parse_interfaces, parse_rdma_ports

FIXTURES = Path(__file__).parents[1] / "fixtures" / "net"


def test_interfaces_from_real_capture():
    lines = (FIXTURES / "dev-vm-interfaces.txt").read_text().splitlines()
    by_name = {i["name"]: i for i in parse_interfaces(lines)}
    assert set(by_name) == {"lo", "ifb0", "ifb1", "eth0"}
    assert by_name["lo"]["loopback"] is True
    assert by_name["lo"]["addresses"] == ["127.0.0.1", "::1"]
    eth0 = by_name["eth0"]
    assert eth0["state"] == "UP" and eth0["mtu"] == 1400
    assert eth0["addresses"][0] == "192.0.2.2"
    # -1 from the kernel is unknown, not a speed.
    assert eth0["speed_mbps"] is None
    assert by_name["ifb0"]["addresses"] == [] and by_name["ifb0"]["state"] == "DOWN"


def test_interfaces_without_ip_or_garbage():
    assert parse_interfaces(["--specfleet-speeds--", "eth0 25000"]) == []
    assert parse_interfaces(["not json"]) == []


def test_interface_speed_read_when_known():
    lines = [
        '[{"ifname": "ens1f0", "operstate": "UP", "flags": ["UP"], "mtu": 9000,',
        '  "addr_info": [{"family": "inet", "local": "10.1.0.5", "prefixlen": 24}]}]',
        "--specfleet-speeds--",
        "ens1f0 100000",
    ]
    (iface,) = parse_interfaces(lines)
    assert iface["speed_mbps"] == 100000 and iface["addresses"] == ["10.1.0.5"]


def test_rdma_ports_kernel_formats():
    lines = [
        "mlx5_0 1|4: ACTIVE|InfiniBand|400 Gb/sec (4X NDR)|ibp12s0 ",
        "mlx5_1 1|1: DOWN|Ethernet|10 Gb/sec (1X QDR)|",
        "garbage line",
    ]
    ports = parse_rdma_ports(lines)
    assert ports == [
        {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand",
         "rate_gbps": 400.0, "netdevs": ["ibp12s0"]},
        {"device": "mlx5_1", "port": 1, "state": "DOWN", "link_layer": "Ethernet",
         "rate_gbps": 10.0, "netdevs": []},
    ]  # fmt: skip
