"""A compromised fan-out source cannot exhaust a receiver (issue 55, finding 3): a flood of status
lines keeps only the newest, a flood of stderr keeps only its last lines, and a source that sends
one genuine file a round then stalls is given up after one stall. The sources are stand-ins (no
sshd here): real processes that behave as a hostile source's ssh client would, through the
receiver's real ``SourceChannel`` and ``Pull``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc

import pytest

from specfleet.hostside import fanout_agent, weights_agent
from tests.unit.test_fanout import REV, SOURCE, receiver_pull


def _channel(script: str) -> fanout_agent.SourceChannel:
    return fanout_agent.SourceChannel([sys.executable, "-c", script],
                                      lambda stream, head, asked: None)


@pytest.mark.local
def test_a_status_flood_keeps_only_the_newest():
    """20,000 statuses of 1 KiB each (20 MiB): the receiver holds the newest alone (before: every
    one, in a queue that grew with the flood)."""
    flood = ("import json, sys\nw = sys.stdout.write\npad = 'x' * 1000\n"
             "for n in range(20000):\n    w(json.dumps({'n': n, 'pad': pad}) + '\\n')\n"
             "sys.stdout.flush()\n")
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        channel = _channel(flood)
        try:
            # The source has written it all once it exits; the reader is at most a pipe's worth
            # (64 KiB) behind then.
            channel.proc.wait(timeout=120)
            time.sleep(1.0)
            held = tracemalloc.get_traced_memory()[0] - base
            assert held < 4 << 20, f"{held} bytes held after the flood"
            newest = channel.latest(10)
            assert newest is not None and newest["n"] == 19999
        finally:
            channel.close()
    finally:
        tracemalloc.stop()


@pytest.mark.local
def test_a_stderr_flood_keeps_its_last_lines(tmp_path, monkeypatch):
    """20 MiB of stderr, then the line that says why: the receiver keeps the last lines only (in
    memory, each cut short; before: all of it, in a temporary file), and tells the last one."""
    monkeypatch.setattr(fanout_agent.tempfile, "tempdir", str(tmp_path))
    noise = ("import sys\nw = sys.stderr.write\nfor n in range(2000):\n    w('e' * 10000 + '\\n')\n"
             "w('Connection closed by 10.0.0.1 port 22\\x1b[2J\\n')\nsys.exit(255)\n")
    channel = _channel(noise)
    try:
        assert channel.latest(60) is None
        channel.proc.wait(timeout=60)
        time.sleep(0.5)
        assert channel.error() == "Connection closed by 10.0.0.1 port 22\\x1b[2J"
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
                size = os.fstat(int(fd)).st_size
            except OSError:
                continue
            assert not (target.startswith(str(tmp_path)) and size > 1 << 20), (target, size)
    finally:
        channel.close()


@pytest.mark.local
def test_a_source_that_stalls_after_one_file_is_given_up_after_one_stall(tmp_path, monkeypatch):
    """The source has three files; each round it sends the first asked for, then goes silent.
    Before, each round took one file and a stall (files x stall_seconds: about 11 h for K2.6);
    now the stall clock of the first unanswered request ends the source: the other files are
    left for the next source or upstream, and the run says why."""
    _, rev_dir, pull = receiver_pull(tmp_path)
    pull.job["stall_seconds"] = 2
    pull.job["poll_seconds"] = 0.1
    body = {p: f"content of {p}\n".encode() for p in ("a.py", "b.py", "c.py")}
    wanted = {p: {"path": p, "size": len(b), "blob_id": weights_agent.git_blob_id(b)}
              for p, b in body.items()}
    status = {"verified": {p: {"size": f["size"], "hash": weights_agent.expected_hash(f)[1]}
                           for p, f in wanted.items()}}
    script = ("import json, sys, time\n"
              "sys.stdout.write(sys.argv[1] + '\\n'); sys.stdout.flush()\n"
              "ask = json.loads(sys.stdin.readline())['send']\n"
              "files = json.loads(sys.argv[2])\n"
              "head = json.dumps({'file': ask[0], 'size': len(files[ask[0]])}) + '\\n'\n"
              "sys.stdout.buffer.write(head.encode() + files[ask[0]].encode())\n"
              "sys.stdout.flush(); time.sleep(30)\n")
    real_popen = subprocess.Popen
    files = json.dumps({p: b.decode() for p, b in body.items()})
    monkeypatch.setattr(fanout_agent.subprocess, "Popen", lambda argv, **kw: real_popen(
        [sys.executable, "-c", script, json.dumps(status), files], **kw))
    began = time.monotonic()
    pull.from_source(SOURCE, "o--m", REV, str(rev_dir), wanted)
    took = time.monotonic() - began
    assert sorted(wanted) == ["b.py", "c.py"], wanted
    assert (rev_dir / "a.py").read_bytes() == body["a.py"]
    assert took < 2 * 2 + 5, took  # one stall, not one per file
    events = [e["text"] for e in pull.data["events"]]
    assert any("left a file asked for unanswered for 2 s (1 came); trying the next source" in e
               for e in events), events


def test_the_pulls_unit_has_a_memory_cap():
    """Whatever a source sends, the pull's unit cannot take the host's memory: systemd-run gets
    MemoryMax= (and no swap to spill into)."""
    from pyinfra_testing.util import get_command_string

    from operations.fanout import PULL_MEMORY_MAX, pull_start_command

    cmd = get_command_string(pull_start_command(
        "specfleet-fanout-pull-o--m-r1", {"progress_path": "/p.json", "control_dir": "/run/x"},
        "o/m", "/opt/specfleet/tools/bin/python", "/opt/specfleet/tools/fanout_agent.py",
        "/var/lib/specfleet/fanout/o--m.pull-job.json"))
    words = cmd.split()
    assert f"--property=MemoryMax={PULL_MEMORY_MAX}" in words and PULL_MEMORY_MAX == "1G"
    assert "--property=MemorySwapMax=0" in words
    assert words.index("--property=MemoryMax=1G") < words.index("--")


@pytest.mark.local
def test_the_private_key_goes_through_stdin_never_an_upload(tmp_path):
    """Issue 55: with --sudo, pyinfra's upload of the fan-out's private key went through a file in
    /tmp with default permissions before its copy. Now one root shell writes it from stdin,
    0600 in a 0700 folder; run here as the host runs it."""
    from pyinfra.api import StringCommand

    from operations.fanout import _secret_upload

    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
    dest = tmp_path / "fanout" / "r1.key"
    commands = list(_secret_upload(str(dest), key))
    assert [type(c) for c in commands] == [StringCommand]
    command = commands[0]
    assert key not in command.get_raw_value()  # not in the argv
    stdin = command.connector_arguments["_stdin"]
    subprocess.run(["sh", "-c", command.get_raw_value()], input=stdin, text=True, check=True)
    assert dest.read_text() == key
    assert oct(dest.stat().st_mode & 0o777) == "0o600"
    assert oct(dest.parent.stat().st_mode & 0o777) == "0o700"


class _WatchedHost:
    """Stand-in for pyinfra's host in ``_wait`` (no pyinfra run here): each look at the pull
    answers as the host's ``watch_command`` does for a pull that goes on for ever, its progress
    file updated each time, with a source's words holding an escape."""

    name = "h1"

    def __init__(self):
        self.commands: list[str] = []
        self.said: list[str] = []
        self.n = 0

    def run_shell_command(self, command, **kwargs):
        from pyinfra.api.command import StringCommand

        text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        self.commands.append(text)
        self.n += 1
        progress = {"rollout_id": "r1", "state": "copying", "updated_at": float(self.n),
                    "files_total": 3, "files_done": 0, "events": [
                        {"at": 0, "text": "h2: \x1b[2Jstill sending"}]}
        lines = ["unit specfleet-fanout-pull-o--m-r1.service", "progress", json.dumps(progress)]
        return True, [type("L", (), {"line": ln, "buffer_name": "stdout"})() for ln in lines]

    def log(self, text, *a, **k):
        self.said.append(text)

    def log_styled(self, text, *a, **k):
        self.said.append(text)


def test_the_controllers_wait_on_a_pull_has_a_deadline():
    """Issue 55: a pull whose progress goes on for ever held the fan-out controller for ever; now
    it is stopped at its deadline, and what the host said is shown printable."""
    from operations.fanout import _wait

    host = _WatchedHost()
    began = time.monotonic()
    assert _wait(None, host, "specfleet-fanout-pull-o--m-r1", "/p.json", "r1", 0.05,
                 deadline_s=0.5) is True
    assert time.monotonic() - began < 5
    assert "systemctl stop specfleet-fanout-pull-o--m-r1" in host.commands[-1]
    assert any("ran past its deadline" in s for s in host.said)
    assert not any("\x1b" in s for s in host.said) and any("still sending" in s for s in host.said)
