"""The per-host run lock, on the host: take, renew and release it as one compare-and-swap each.

    python3 -I -S run_lock.py take    PATH LEASE_S OWNER_JSON [FINGERPRINT]
    python3 -I -S run_lock.py renew   PATH LEASE_S TOKEN
    python3 -I -S run_lock.py release PATH LEASE_S TOKEN

Each holds ``flock`` on the lock's folder while it reads and writes the lock (written to a
temporary file and renamed into place), so two runs never both take it. ``take`` takes a lock
that is free, expired (``expires_at``, or for a lock without one ``LEASE_S`` after it was last
written, on this host's clock), or still exactly ``FINGERPRINT`` (the sha256 of the bytes the
control machine judged stale). A live lock of the same run id is *joined*, never replaced: the
holder's token stays (status ``joined``, ``mine`` the lock as it is), so another process of that
run can renew it but cannot take it from the holder or end it. ``renew`` and ``release`` act
only on the lock holding ``TOKEN``. One line out: ``specfleet-lock STATUS JSON`` with the host's
time, the lock as it was (``held``, with its ``mtime``) and its fingerprint.

Stdlib only, importing nothing of the project (``operations.preflight`` runs it with ``-c``).
"""

import fcntl
import hashlib
import json
import os
import sys
import time

MARK = "specfleet-lock"


def _read(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
            mtime = os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return None, None
    try:
        held = json.loads(raw.decode("utf-8"))
    except ValueError:
        held = None
    if not isinstance(held, dict):
        held = {"owner": "unknown", "unreadable": raw[:200].decode("utf-8", "replace")}
    held["mtime"] = mtime
    return held, hashlib.sha256(raw).hexdigest()


def _expires(held, lease):
    value = held.get("expires_at")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return held["mtime"] + lease


def _write(path, value):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(value, sort_keys=True) + "\n")
    os.replace(tmp, path)


def main(argv):
    mode, path, lease = argv[1], argv[2], float(argv[3])
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    now = time.time()
    held, fingerprint = _read(path)
    out = {"now": now, "held": held, "fingerprint": fingerprint}
    if mode == "take":
        me = json.loads(argv[4])
        replace = argv[5] if len(argv) > 5 else ""
        why = None
        same_run = bool(held and held.get("run_id") and held.get("run_id") == me.get("run_id"))
        if held is None:
            why = "free"
        elif _expires(held, lease) <= now:
            why = "expired"
        elif same_run and held.get("token") == me.get("token"):
            why = "ours"
        elif same_run:
            why = "joined"
        elif replace and replace == fingerprint:
            why = "replaced"
        if why is None:
            status = "held"
        elif why == "joined":
            # Another process of the holder's run: it shares the holder's lock as it is.
            status, out["why"] = "joined", why
            out["mine"] = {k: v for k, v in held.items() if k != "mtime"}
        else:
            mine = dict(me, taken_at=now, renewed_at=now, expires_at=now + lease, lease_s=lease)
            _write(path, mine)
            status, out["why"], out["mine"] = "taken", why, mine
    elif mode == "renew":
        if held is not None and held.get("token") == argv[4]:
            held.pop("mtime", None)
            held.update(renewed_at=now, expires_at=now + lease, lease_s=lease)
            _write(path, held)
            status = "renewed"
        else:
            status = "lost"
    elif mode == "release":
        if held is not None and held.get("token") == argv[4]:
            os.unlink(path)
            status = "released"
        else:
            status = "free" if held is None else "other"
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    sys.stdout.write(f"{MARK} {status} {json.dumps(out, sort_keys=True)}\n")


if __name__ == "__main__":
    main(sys.argv)
