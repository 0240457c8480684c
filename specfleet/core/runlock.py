"""The per-host run lock's decisions, as pure functions (``operations.preflight`` does the I/O).

The lock is a lease in one JSON file on the host (``<state_dir>/run.lock``)::

    {"owner": "ops@laptop", "control_host": "laptop", "machine_id": "9f1c...", "boot_id": "2d7a...",
     "pid_ns": 4026531836, "pid": 4242, "pid_start": 81723, "run_id": "5e0b7c1d2a9f4e63",
     "token": "c0ffee...", "command": "pyinfra inventories/ct200.py deploys/kimi_k26.py",
     "started": 1796050619.1, "taken_at": 1796050620.0, "renewed_at": 1796050680.0,
     "expires_at": 1796050860.0, "lease_s": 180.0}

- **The owner** is the run, not a host name: the control machine's ``/etc/machine-id`` and boot
  id, the pid namespace (``pid_ns``, the inode of ``/proc/self/ns/pid``), the pid (with its
  start time, so a recycled pid is not mistaken for the run), and the run id
  (``SPECFLEET_RUN_ID``: a controller sets it so that all its steps are one owner).
- **A lease**: ``expires_at`` is on the host's clock (so control machines' clocks never matter);
  the run renews it while it lives; a run that died stops renewing and its lock expires by
  itself, whoever and wherever it was.
- **Taking it** is a compare-and-swap on the host, under ``flock`` of the lock's folder
  (``specfleet/hostside/run_lock.py``): a free or expired lock is taken there at once, one of
  this run id is joined (below); a lock this control machine can prove dead is replaced only
  if it is still byte for byte the one judged. Of two runs that take at once, exactly one wins.
- **Proving a run dead** needs the same machine id, boot id *and* pid namespace: only then does
  a pid mean the same process here as there. Containers on one kernel share the boot id and
  often the machine id (CI runners, cloned images), and a pid of another namespace looks dead
  from this one; so anything short of all three, a reboot included (a clone with the same
  machine id boots with its own boot id), is left to the lease's expiry.
- **Re-entry by run id keeps the holder's token**: another process of the same run (a rollout
  hook, ``specfleet fanout`` under a rollout) *joins* the lock: it renews it with the holder's
  token but never releases it, so it can neither replace the holder nor end its lock.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from specfleet.core.text import printable

# The run id a controller sets for the pyinfra runs it starts: its steps are one lock owner.
RUN_ID_ENV = "SPECFLEET_RUN_ID"
# Tests shorten the lease with it.
LEASE_ENV = "SPECFLEET_LOCK_LEASE_S"

# How long a lease lasts without a renewal, and how often a live run renews it.
DEFAULT_LEASE_S = 180.0
RENEWALS_PER_LEASE = 4

TAKE, OURS, EXPIRED, STALE, BUSY = "take", "ours", "expired", "stale", "busy"


def new_run_id() -> str:
    """A fresh run id (16 hex digits)."""
    return uuid.uuid4().hex[:16]


def controller_run_id(environ: dict) -> str:
    """The run id of a controller (rollout, fan-out): the one it was given in ``environ``
    (``SPECFLEET_RUN_ID``), else a new one, set there for the pyinfra runs it starts."""
    value = (environ.get(RUN_ID_ENV) or "").strip() or new_run_id()
    environ[RUN_ID_ENV] = value
    return value


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def expires_at(held: dict, lease_s: float = DEFAULT_LEASE_S) -> float | None:
    """When ``held`` expires on the host's clock: its ``expires_at``, else (a lock written by an
    older specfleet, or unreadable) ``lease_s`` after the file was last written (``mtime``, as
    the RunLock fact and the host-side script read it)."""
    value = _num(held.get("expires_at"))
    if value is not None:
        return value
    mtime = _num(held.get("mtime"))
    return None if mtime is None else mtime + lease_s


def is_expired(held: dict, host_now: float | None, lease_s: float = DEFAULT_LEASE_S) -> bool:
    until = expires_at(held, lease_s)
    return until is not None and host_now is not None and until <= host_now


def _clock(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts is not None else "?"


def _ago(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def holder(held: dict) -> str:
    """``alice@laptop (run 5e0b7c1d2a9f, pid 4242 on machine 9f1c2b3a, since 2026-...)``."""
    bits = []
    if held.get("run_id"):
        bits.append(f"run {str(held['run_id'])[:12]}")
    where = f" on machine {str(held['machine_id'])[:8]}" if held.get("machine_id") else ""
    bits.append(f"pid {held.get('pid', '?')}{where}")
    since = _num(held.get("taken_at")) or _num(held.get("started"))
    bits.append(f"since {_clock(since)}")
    # The lock file is the host's: its words reach the operator's terminal printable only.
    return printable(f"{held.get('owner', 'unknown')} ({', '.join(bits)})", 300)


def lease_words(held: dict, host_now: float | None, lease_s: float = DEFAULT_LEASE_S) -> str:
    """``expires 2026-... (in 95 s)`` or ``expired 2026-... (3 min ago)`` or ``expiry unknown``."""
    until = expires_at(held, lease_s)
    if until is None:
        return "expiry unknown"
    if host_now is None:
        return f"expires {_clock(until)} (host time)"
    if until <= host_now:
        return f"expired {_clock(until)} ({_ago(host_now - until)} ago)"
    return f"expires {_clock(until)} (in {_ago(until - host_now)})"


def same_process_space(held: dict, me: dict) -> bool:
    """Whether a pid in ``held`` names a process ``me`` can see: the same machine id, boot id and
    pid namespace, each known on both sides (a lock of an older specfleet has no ``pid_ns``)."""
    return all(
        held.get(key) not in (None, "") and held.get(key) == me.get(key)
        for key in ("machine_id", "boot_id", "pid_ns")
    )


def lock_verdict(held: dict | None, me: dict, alive, host_now: float | None = None,
                 lease_s: float = DEFAULT_LEASE_S) -> tuple[str, str | None]:
    """What to do with the lock a host holds, and what to say: ``(verdict, message)``.

    - ``take``: nobody holds it;
    - ``ours``: this run holds it (the same run id: a controller's earlier step, or this process);
    - ``expired``: its lease ran out (``host_now`` is the host's clock): its run stopped renewing
      it, so it is dead or cut off; taken over;
    - ``stale``: held from this control machine, this boot and this pid namespace
      (``same_process_space``) by a run that is provably gone: its pid is dead or now another
      process (``alive(pid, pid_start)`` says); taken over;
    - ``busy``: anything else: a live run, a run of another control machine, boot or pid
      namespace whose lease runs, an unreadable lock (until its lease, counted from its last
      write, runs out).
    """
    if not held:
        return TAKE, None
    who = holder(held)
    if held.get("run_id") and held.get("run_id") == me.get("run_id"):
        return OURS, None
    if is_expired(held, host_now, lease_s):
        return EXPIRED, (f"a lock left by {who} {lease_words(held, host_now, lease_s)}: its run "
                         "stopped renewing it; taken over")
    if same_process_space(held, me):
        pid = held.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and (
                pid != me.get("pid") and not alive(pid, held.get("pid_start"))):
            return STALE, f"a lock left by a dead run of {who} is taken over"
    return BUSY, busy_message(held, host_now, lease_s)


def busy_message(held: dict, host_now: float | None, lease_s: float = DEFAULT_LEASE_S) -> str:
    command = f": {held['command']}" if held.get("command") else ""
    return (f"another specfleet run holds this host: {holder(held)}{command}; its lease "
            f"{lease_words(held, host_now, lease_s)}, renewed while that run lives")


def busy_fix(path: str) -> str:
    return (f"wait for that run to end; if it is dead, its lease expires by itself and the next "
            f"run takes the lock over (to clear it sooner, on the host: rm -f {path})")


def lost_message(path: str, held: dict | None, host_now: float | None,
                 lease_s: float = DEFAULT_LEASE_S) -> str:
    """What a run that lost its lease says as it stops changing the host."""
    now = (f"{holder(held)}, {lease_words(held, host_now, lease_s)}" if held
           else "nobody: it was removed")
    return (f"this run lost the run lock {path} (its lease of {lease_s:.0f} s ran out before a "
            f"renewal reached the host; it now holds {now}): this run changes nothing more on "
            "this host")


LOST_FIX = ("run again once the other run is done; a slow or cut-off connection to the host lets "
            f"the lease run out (raise {LEASE_ENV} for a link that stalls longer than the lease)")


def lock_status(held: dict | None, host_now: float | None,
                lease_s: float = DEFAULT_LEASE_S) -> str:
    """The lock in the status view: ``free``, or who holds it since when, and its expiry."""
    if not held:
        return "free"
    words = f"held by {holder(held)}, {lease_words(held, host_now, lease_s)}"
    if is_expired(held, host_now, lease_s):
        words += ": the next run takes it over"
    return words
