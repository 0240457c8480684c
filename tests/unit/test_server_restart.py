"""Restart or wait: what ``server.service`` does with a restart-pending marker (pure), and a readiness
gate whose SSH session drops (a fake host).

A failed gate leaves the marker, so the next run must finish the restart. But the server that
restart started may be loading still, or healthy by now: restarting it again is a restart loop
(observed: a server needing 60 s to load under a 10 s budget restarted on every run). The marker
records the invocation the restart started and the unit files it started from; the decision is
made from that record and the unit's state (``facts.serving.ServiceState``).
"""

from __future__ import annotations

import logging

import pytest
from paramiko import SSHException

from facts.serving import parse_service_state
from operations import readiness, serving

UNIT = "/etc/systemd/system/sf.service"
ENV = "/etc/specfleet/sf.env"
FILES = {
    UNIT: {"mode": 644, "user": "root", "group": "root", "sha1": "a" * 40},
    ENV: {"mode": 600, "user": "root", "group": "root", "sha1": "b" * 40},
}
AT = 1700000000


def state(**over):
    st = {
        "load_state": "loaded", "active_state": "active", "sub_state": "running",
        "result": "success", "unit_file_state": "enabled", "need_daemon_reload": False,
        "n_restarts": 0, "main_pid": 4242, "invocation_id": "1f" * 16, "files": FILES,
        "restart_pending": "the unit changed",
        "restart_started": {"invocation": "1f" * 16, "at": AT,
                            "files": serving.files_fingerprint(FILES)},
    }  # fmt: skip
    st.update(over)
    return st


def decide(**over):
    st = state(**over)
    return serving.start_decision(st, serving.files_fingerprint(st["files"]))


def test_the_fact_reads_the_invocation_and_the_markers_restart_record():
    out = [
        "LoadState=loaded", "ActiveState=active", "SubState=running", "Result=success",
        "InvocationID=" + "1f" * 16,
        "##restart-pending", "the unit changed",
        f"##started invocation={'1f' * 16} at={AT} files=0123456789abcdef", "",
    ]  # fmt: skip
    st = parse_service_state(out)
    assert st["invocation_id"] == "1f" * 16
    assert st["restart_pending"] == "the unit changed"
    assert st["restart_started"] == {"invocation": "1f" * 16, "at": AT, "files": "0123456789abcdef"}
    # A marker as server.unit writes it: a reason, no restart yet.
    fresh = parse_service_state(["ActiveState=active", "##restart-pending", "the unit changed", ""])
    assert fresh["restart_pending"] == "the unit changed" and fresh["restart_started"] is None
    assert parse_service_state(["ActiveState=inactive"])["invocation_id"] == ""


def test_no_marker_starts_a_stopped_server_and_leaves_a_running_one():
    assert decide(restart_pending=None, restart_started=None).action == "none"
    for active in ("inactive", "failed"):
        d = decide(restart_pending=None, restart_started=None, active_state=active)
        assert d.action == "start"


def test_no_marker_starts_a_server_that_died_and_waits_for_systemds_restart():
    # A SIGKILLed server under Restart=on-failure is "activating/auto-restart" for RestartSec:
    # nothing serves; a run must start it and gate it, not report it running (the drill
    # sglang-killed in bench/drills found this).
    d = decide(restart_pending=None, restart_started=None, active_state="activating",
               sub_state="auto-restart", main_pid=0)
    assert d.action == "start" and "auto-restart" in d.why


def test_a_marker_without_a_restart_record_restarts():
    d = decide(restart_started=None)
    assert d.action == "restart" and d.why == "the unit changed"


@pytest.mark.parametrize("sub", ["running", "start"])
def test_the_server_restarted_for_the_marker_and_still_up_is_waited_on(sub):
    d = decide(sub_state=sub)
    assert d.action == "wait" and d.started_at == AT
    assert "restarted for the unit changed" in d.why and "not restarting it" in d.why


@pytest.mark.parametrize(
    "over, why",
    [
        ({"active_state": "failed", "sub_state": "failed", "result": "exit-code"}, "failed"),
        ({"active_state": "inactive", "sub_state": "dead"}, "inactive"),
        ({"active_state": "activating", "sub_state": "auto-restart"}, "auto-restart"),
        ({"invocation_id": "2e" * 16}, "another invocation"),
        ({"invocation_id": ""}, "another invocation"),
        ({"files": {**FILES, ENV: {**FILES[ENV], "sha1": "c" * 40}}}, "changed since"),
        ({"need_daemon_reload": True}, "changed since"),
    ],
)
def test_a_dead_server_or_a_changed_unit_restarts(over, why):
    st = state(**over)
    d = serving.start_decision(st, serving.files_fingerprint(st["files"]))
    assert d.action == "restart", d
    assert d.why.startswith("the unit changed") and why in d.why, d.why


def test_the_fingerprint_covers_content_mode_and_owner_not_order():
    fp = serving.files_fingerprint(FILES)
    assert fp == serving.files_fingerprint(dict(reversed(FILES.items())))
    assert fp != serving.files_fingerprint({**FILES, ENV: {**FILES[ENV], "mode": 644}})
    assert fp != serving.files_fingerprint({**FILES, ENV: {**FILES[ENV], "user": "nobody"}})
    assert fp != serving.files_fingerprint({UNIT: FILES[UNIT]})


# --------------------------------------------------------------------------------------------------
# A dropped SSH session during the gate: a clear host failure, no traceback
# --------------------------------------------------------------------------------------------------


class DroppingHost:
    """A host whose SSH session drops at its ``drop_at``-th command (0: the gate itself)."""

    name = "h9"
    print_prefix = "[h9] "
    executing_op_hash = None

    def __init__(self, error: Exception, drop_at: int = 0):
        self.error = error
        self.drop_at = drop_at
        self.commands = 0

    def run_shell_command(self, command, **kwargs):
        self.commands += 1
        if self.commands > self.drop_at:
            raise self.error

        class Out:
            output_lines = ["gate: waiting for sf.service to serve; budget 10 s; since @1700000000",
                            "gate: FAILED after 10 s: not ready within the budget of 10 s"]

        return False, Out()


@pytest.mark.parametrize(
    "error, drop_at",
    [
        (SSHException("SSH session not active"), 0),
        (EOFError(), 0),
        (OSError("Socket is closed"), 0),
        (SSHException("SSH session not active"), 1),  # while quoting the journal after a failure
    ],
)
def test_a_dropped_ssh_session_during_the_gate_fails_the_host_clearly(caplog, error, drop_at):
    host = DroppingHost(error, drop_at)
    argv = ["python3", "-", "--unit", "sf.service", "--timeout", "10"]
    with caplog.at_level(logging.ERROR, logger="pyinfra"):
        ok = readiness.run_gate(None, host, argv, "sf.service", 10.0)
    assert ok is False
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "[h9]" in text and "the SSH connection to the host was lost" in text, text
    assert "readiness gate of sf.service" in text and type(error).__name__ in text, text
    assert "fix: " in text and "Traceback" not in text, text


def test_a_timeout_of_the_gate_is_still_pyinfras_own():
    # pyinfra reports an op's timeout itself (no traceback); the gate leaves it to it.
    with pytest.raises(TimeoutError):
        readiness.run_gate(None, DroppingHost(TimeoutError()), ["python3", "-"], "sf.service", 1.0)
