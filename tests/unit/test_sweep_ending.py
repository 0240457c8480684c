"""The sweep's last word (issue 56): a failed restore is said as such, never followed by "the
inventory plan is back"; the exit codes are specfleet --help's (no 2, a usage error, for a sweep
that could measure nothing)."""

from __future__ import annotations

from specfleet.core import bench as core


def test_a_failed_restore_is_said_as_such_and_nothing_says_the_plan_is_back():
    line, rc = core.sweep_ending(None, False, "the inventory plan", 0, 0)
    assert "FAILED" in line and "is back" not in line and rc == 1
    line, rc = core.sweep_ending("num_draft_tokens=4", False, "best point num_draft_tokens=4",
                                 0, 0)
    assert "FAILED" in line and rc == 1


def test_no_point_measured_is_exit_1_not_a_usage_error():
    line, rc = core.sweep_ending(None, True, "the inventory plan", 5, 0)
    assert line == "no point could be measured; the inventory plan is back" and rc == 1


def test_the_other_endings():
    assert core.sweep_ending("a=1", True, "best point a=1", 0, 0) == ("best a=1 restored", 0)
    line, rc = core.sweep_ending("a=1", True, "best point a=1", 2, 3)
    assert rc == 1 and "2 point(s) failed" in line and "3 point(s) left" in line
