"""operations.status for serving groups: one line per group from its members' rows (pure)."""

from __future__ import annotations

from operations.status import HostStatus, format_table, group_lines


def row(host: str, group: str, healthy: bool, drift: list[str] | None = None) -> HostStatus:
    return HostStatus(host=host, group=group, healthy=healthy, health="h", drift=drift or [])


def test_group_serving_when_every_member_runs():
    rows = [row("g0", "pair rank 0/2", True), row("g1", "pair rank 1/2", True),
            row("solo", "-", True)]  # fmt: skip
    assert group_lines(rows) == ["group pair (g0, g1): serving, 2/2 members running"]
    table = format_table(rows)
    assert table.splitlines()[0].split()[-1] == "GROUP"
    assert table.endswith("group pair (g0, g1): serving, 2/2 members running")


def test_group_not_serving_names_the_member_down_and_drift():
    rows = [row("g1", "pair rank 1/2", False, ["unit differs"]), row("g0", "pair rank 0/2", True)]
    assert group_lines(rows) == [
        "group pair (g0, g1): not serving: g1 not running, 1/2 members running; drift on g1"
    ]


def test_single_hosts_have_no_group_column():
    table = format_table([row("solo", "-", True)])
    assert "GROUP" not in table and "group " not in table
