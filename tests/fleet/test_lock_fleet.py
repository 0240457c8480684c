"""The per-host run lock on real hosts, through the pyinfra CLI (tests/deploys/lock_deploy.py).

One lock model for every run that changes a host (operations.preflight.lock): the owner is the
control machine's machine id and boot id, the pid and the run id; the lock is a lease the run
renews while it lives (``SPECFLEET_LOCK_LEASE_S`` shortens it here); taking it is a
compare-and-swap on the host; a run releases it on every exit path.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import HostSpec

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
DEPLOY = str(REPO / "tests" / "deploys" / "lock_deploy.py")
STATUS = str(REPO / "deploys" / "status.py")
LOCK = "/var/lib/specfleet/run.lock"
BUSY = "another specfleet run holds this host: "


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


MACHINE_ID = _read("/etc/machine-id")
BOOT_ID = _read("/proc/sys/kernel/random/boot_id")


@pytest.fixture(scope="module")
def lk(make_fleet):
    return make_fleet("lock", [HostSpec("l1"), HostSpec("l2")])


def inventory(fleet, tmp_path: Path, host: str, test: dict | None = None) -> Path:
    return fleet.write_inventory(
        tmp_path / f"inventory_{time.monotonic_ns()}.py",
        host_data={host: {"specfleet": {}, **({"lock_test": test} if test else {})}},
    )


def pyinfra_argv(fleet, tmp_path, host: str, test: dict | None = None,
                 deploy: str = DEPLOY) -> list[str]:
    return [PYINFRA, "-y", "--limit", host, str(inventory(fleet, tmp_path, host, test)), deploy]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("SPECFLEET_RUN_ID")}
    out.update(extra)
    return out


def run(fleet, tmp_path, host: str, test: dict | None = None, deploy: str = DEPLOY,
        prefix: tuple[str, ...] = (), **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, *pyinfra_argv(fleet, tmp_path, host, test, deploy)],
                          cwd=REPO, env=env(**extra), capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def start(fleet, tmp_path, host: str, test: dict | None = None, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(pyinfra_argv(fleet, tmp_path, host, test), cwd=REPO, env=env(**extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def lock_of(fleet, host: str) -> dict | None:
    out = fleet.run(host, f"cat {LOCK} 2>/dev/null").stdout.strip()
    return json.loads(out) if out else None


def host_time(fleet, host: str) -> float:
    return float(fleet.run(host, "date +%s.%N", check=True).stdout)


def put_lock(fleet, host: str, lock: dict) -> None:
    fleet.run(host, f"mkdir -p {os.path.dirname(LOCK)} && cat > {LOCK}", input=json.dumps(lock),
              check=True)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_run_failing_after_preflight_leaves_no_lock(lk, tmp_path):
    """pyinfra skips every later operation of a failed host, "Release the run lock" too: the
    lock is released by the run's exit path, so the next run from any machine goes at once."""
    res = run(lk, tmp_path, "l1", {"fail": True})
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "failing on purpose" in out
    assert lock_of(lk, "l1") is None, out[-3000:]
    assert "Traceback" not in out
    again = run(lk, tmp_path, "l1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert lock_of(lk, "l1") is None


def pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def test_a_second_control_machine_in_another_pid_namespace_finds_the_host_busy(lk, tmp_path):
    """Containers on one kernel share the boot id and often the machine id: a control machine
    in another pid namespace (``unshare --pid --fork --mount-proc``, this machine's machine id)
    sees the first run's pid as dead. It must report the host busy and change nothing; the
    first run's lock stays its own."""
    mark = "/var/tmp/pidns-second-run-changed"
    lk.run("l1", f"rm -f {mark}")
    holder = start(lk, tmp_path, "l1", {"sleep": 25})
    try:
        deadline = time.monotonic() + 120
        while lock_of(lk, "l1") is None:
            assert holder.poll() is None and time.monotonic() < deadline, holder.stdout.read()
            time.sleep(0.5)
        held = lock_of(lk, "l1")
        assert held["pid"] == holder.pid
        unshare = ("unshare", "--pid", "--fork", "--mount-proc")
        # The holder's pid is not a process in that namespace (the takeover's mistake).
        probe = subprocess.run([*unshare, "sh", "-c", f"test -e /proc/{holder.pid} || echo gone"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert probe.stdout.strip() == "gone", probe
        second = run(lk, tmp_path, "l1", {"touch": mark}, prefix=unshare)
        out = second.stdout + second.stderr
        assert second.returncode != 0, out[-3000:]
        assert BUSY in out and f"pid {holder.pid} on machine {MACHINE_ID[:8]}" in out, out[-3000:]
        assert "Traceback" not in out
        assert lk.run("l1", f"test -e {mark}").returncode != 0, "the second run changed the host"
        assert lock_of(lk, "l1")["token"] == held["token"]
        assert holder.poll() is None  # the first run goes on, its lock untouched
        assert held["pid_ns"] == pid_namespace()  # what told the second run it cannot judge
    finally:
        out = holder.communicate(timeout=300)[0]
    assert holder.returncode == 0, out[-3000:]
    assert "lost the run lock" not in out
    assert lock_of(lk, "l1") is None


def test_two_concurrent_takers_of_a_stale_lock_exactly_one_wins(lk, tmp_path):
    """A lock left by a dead run of this control machine is taken over; two runs that find it at
    once both see it stale, and the takeover is a compare-and-swap on the host: one wins, the
    other fails the host naming the winner."""
    me = socket.gethostname()
    stale = {"owner": f"bob@{me}", "control_host": me, "machine_id": MACHINE_ID,
             "boot_id": BOOT_ID, "pid_ns": pid_namespace(), "pid": dead_pid(), "run_id": "a-dead-run",
             "started": time.time() - 3600, "command": "pyinfra x.py deploy.py"}
    put_lock(lk, "l2", stale)
    procs = [start(lk, tmp_path, "l2", {"sleep": 8}) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    rcs = [p.returncode for p in procs]
    assert sorted(rcs)[0] == 0 and sorted(rcs)[1] != 0, "\n\n".join(o[-3000:] for o in outs)
    winner, loser = (outs[0], outs[1]) if rcs[0] == 0 else (outs[1], outs[0])
    assert "a lock left by a dead run of bob@" in winner
    assert BUSY in loser, loser[-3000:]
    assert lock_of(lk, "l2") is None


def test_a_lock_of_a_dead_run_of_another_machine_expires_by_itself(lk, tmp_path):
    """A lock from another control machine (another machine id, even with this machine's host
    name) holds the host while its lease runs; once that run stopped renewing it, the lease
    expires and the next run takes it over without anyone removing a file."""
    now = host_time(lk, "l1")
    foreign = {"owner": "alice@laptop", "control_host": socket.gethostname(),
               "machine_id": "0" * 32, "boot_id": "1" * 32, "pid": dead_pid(),
               "run_id": "alices-run", "started": time.time() - 60,
               "command": "pyinfra inventories/fleet.py deploys/kimi_k26.py",
               "taken_at": now - 60, "renewed_at": now - 5, "expires_at": now + 15, "lease_s": 20}
    put_lock(lk, "l1", foreign)
    try:
        busy = run(lk, tmp_path, "l1")
        out = busy.stdout + busy.stderr
        assert busy.returncode != 0, out[-3000:]
        assert BUSY + "alice@laptop" in out, out[-3000:]
        assert "expires" in out
        assert lock_of(lk, "l1") == foreign
        time.sleep(max(0.0, foreign["expires_at"] - host_time(lk, "l1")) + 1)
        taken = run(lk, tmp_path, "l1")
        out = taken.stdout + taken.stderr
        assert taken.returncode == 0, out[-3000:]
        assert "alice@laptop" in out and "expired" in out and "taken over" in out
        assert lock_of(lk, "l1") is None
    finally:
        lk.run("l1", f"rm -f {LOCK}")


def test_the_lease_is_renewed_while_the_run_lives_and_status_shows_it(lk, tmp_path):
    """A run that holds the lock longer than its lease renews it: another run is refused all
    along, deploys/status.py shows the holder, since and expiry, and the lock is gone after."""
    lease = {"SPECFLEET_LOCK_LEASE_S": "4"}
    holder = start(lk, tmp_path, "l2", {"sleep": 14}, **lease)
    try:
        deadline = time.monotonic() + 120
        while lock_of(lk, "l2") is None:
            assert holder.poll() is None and time.monotonic() < deadline, holder.stdout.read()
            time.sleep(0.5)
        held = lock_of(lk, "l2")
        assert held["machine_id"] == MACHINE_ID and held["pid"] == holder.pid
        time.sleep(6)  # past the first lease: only the heartbeat keeps it
        assert holder.poll() is None
        assert lock_of(lk, "l2")["expires_at"] > host_time(lk, "l2")
        other = run(lk, tmp_path, "l2", **lease)
        assert other.returncode != 0
        assert BUSY in other.stdout + other.stderr
        status = run(lk, tmp_path, "l2", deploy=STATUS)
        text = status.stdout + status.stderr
        assert status.returncode == 0, text[-3000:]
        row = next(line for line in text.split("--> Status:", 1)[1].splitlines()
                   if line.split()[:1] == ["l2"])
        assert "held by" in row and "since" in row and "expires" in row, row
    finally:
        out = holder.communicate(timeout=300)[0]
    assert holder.returncode == 0, out[-3000:]
    assert lock_of(lk, "l2") is None
