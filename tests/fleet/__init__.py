"""Tests on real hosts (marked ``fleet``: they need root), and ``python -m tests.fleet``, the
fleet CLI. The harness itself is ``tests.harness``."""

from tests.harness import (  # noqa: F401 (re-exported for `from tests.harness import Fleet`)
    FLEET_NETWORK,
    NO_GPU,
    Fleet,
    FleetError,
    HostSpec,
    check_target,
    list_fleets,
    parse_hosts,
)
