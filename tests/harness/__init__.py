"""A fleet of real Debian bookworm hosts (systemd-nspawn) for specfleet's tests and demo.

    from tests.harness import Fleet, HostSpec
    fleet = Fleet.up("mine", [HostSpec("h1", gpu="h200x2", disk="64G"), HostSpec("h2")])
    fleet.run("h1", "nvidia-smi topo -m").stdout
    fleet.down()

CLI: ``python -m tests.fleet up|down|status|list|wheelhouse`` (see ``--help``).
"""

from tests.harness.core import (
    FLEET_NETWORK,
    NO_GPU,
    Fleet,
    FleetError,
    HostSpec,
    check_target,
    list_fleets,
    parse_hosts,
)

__all__ = [
    "FLEET_NETWORK", "NO_GPU", "Fleet", "FleetError", "HostSpec", "check_target", "list_fleets",
    "parse_hosts",
]
