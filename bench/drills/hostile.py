"""Drills of a hostile fleet (issue #32): a compromised fan-out source, a flooded metrics relay.

Registered by ``bench/drills/run.py``'s ``main`` (``HOSTILE_DRILLS`` added to ``DRILLS``); each is
one row and counted in the drills line.
"""

from __future__ import annotations

import sys
import time

from bench.drills import kit as drills
from bench.drills.kit import MB, Drill, Env, Run, check, wait_until
from tests.fleet.test_day2_fleet import FLOODER

TOOLS = "/opt/specfleet/tools"
# Put in the seed's tools venv (a .pth line runs at every start of its python, so also in the
# fan-out's forced command): after the last chunk of each file it sends, a second copy of the
# same size with every byte inverted, under the same header. The genuine agent file stays (a
# fan-out run would upload it again); only what it sends is altered.
EVIL_SENDFILE = r'''
import json, os
_real_sendfile = os.sendfile


def _evil_sendfile(out_fd, in_fd, offset, count):
    n = _real_sendfile(out_fd, in_fd, offset, count)
    try:
        path, size = os.readlink("/proc/self/fd/%d" % in_fd), os.fstat(in_fd).st_size
        if n and offset + n == size and "/srv/models/" in path:
            rel = "/".join(path.split("/srv/models/", 1)[1].split("/")[2:])
            data = os.pread(in_fd, size, 0).translate(bytes(range(255, -1, -1)))
            view = memoryview((json.dumps({"file": rel, "size": size}) + "\n").encode() + data)
            while view:
                view = view[os.write(out_fd, view):]
    except OSError:
        pass
    return n


os.sendfile = _evil_sendfile
'''


def drill_malicious_source(env: Env, d: Drill) -> None:
    """d2 (the seed) is compromised: each file it sends is followed by a second copy of the
    same size with other bytes. d3 copies from it (specfleet fanout), its
    weights step a fast check: d3 must end with the hub's bytes, recording nothing it did not
    hash."""
    seed, receiver = "d2", "d3"
    repo_id = env.repo("evilsrc", shards=2, size=MB)
    rev = env.revs[repo_id]
    rev_dir = f"/srv/models/{repo_id.replace('/', '--')}/{rev}"
    inv = env.inventory({h: env.settings(repo_id) for h in (seed, receiver)})
    base = [sys.executable, "-m", "specfleet.cli", "fanout", str(inv), "--order",
            f"{seed},{receiver}"]
    first = Run(env, base + ["--limit", seed])
    check(first.wait(400) == 0, f"the seed's own download failed: {first.out[-2000:]}")
    site = env.sh(seed, f"ls -d {TOOLS}/lib/python3*/site-packages").stdout.strip()
    check(bool(site), f"no tools venv on {seed}")
    put = env.fleet.run(seed, f"cat > {site}/sf_drill_evil.py && echo 'import sf_drill_evil' "
                        f"> {site}/sf_drill_evil.pth", input=EVIL_SENDFILE)
    check(put.returncode == 0, f"could not plant the altered sender: {put.stderr}")
    since = len(env.hub.log_lines())
    try:
        # The planted sender really sends a second copy (seen on the seed itself).
        probe = env.sh(seed, f"{TOOLS}/bin/python -c 'import os; print(os.sendfile.__name__)'")
        check("_evil_sendfile" in probe.stdout, f"the altered sender is not in place: {probe}")
        run = Run(env, base + ["--limit", seed, "--limit", receiver])
        rc = run.wait(400)
    finally:
        env.sh(seed, f"rm -f {site}/sf_drill_evil.py {site}/sf_drill_evil.pth")
    journal = env.sh(receiver, "journalctl --no-pager -o cat -u 'specfleet-fanout-*'").stdout
    check(rc == 0, f"the fan-out failed: {run.out[-2000:]}")
    check("not asked for" in journal, f"{receiver} never saw the second copy: {journal[-1500:]}")
    bad = env.weights_mismatches(receiver, repo_id)
    check(not bad, f"{receiver} holds bytes that are not the hub's: {bad}")
    recorded = drills.verified(env, receiver, repo_id)
    check(bool(recorded), f"{receiver} recorded nothing (no verified.jsonl in {rev_dir})")
    from_hub = sorted({ln.split()[3] for ln in env.hub_lines(since)
                       if ln.startswith("SENT") and ln.split()[5] == env.fleet.hosts[receiver]})
    d.detail = (f"{receiver} refused the second copy, gave up on {seed}; "
                f"{len(from_hub)} file(s) from the hub; weights match the hub")


HANG = "/run/standin/hang"
WATCH = {"interval_s": 1, "probe_timeout_s": 4, "failures": 3, "backoff_s": 1, "backoff_max_s": 2,
         "load_grace_s": 30}


def drill_relay_flood(env: Env, d: Drill) -> None:
    """d3 serves (the stand-in server) with its health watchdog and /metrics relay; a local
    process keeps 1500 half-open connections to the relay while the watchdog is held to 64 tasks
    and 64 open files; then the server hangs. The watchdog must restart it, and live through it."""
    host = "d3"
    repo_id = env.repo("relayflood", shards=1, size=MB)
    settings = env.settings(repo_id, watchdog=WATCH, launcher=[
        "/usr/bin/python3", drills.STANDIN, "--standin-record", drills.RECORD,
        "--standin-hang-file", HANG])
    inv = env.inventory({host: settings})
    run = Run(env, env.argv(inv, [host], deploy="tests/deploys/watchdog_drill_deploy.py"))
    check(run.wait(600) == 0, f"the deploy with the watchdog failed: {run.out[-2000:]}")
    unit, wunit = f"{drills.SERVICE}.service", f"{drills.SERVICE}-watchdog.service"

    def main_pid(u: str) -> str:
        return env.sh(host, f"systemctl show -p MainPID --value {u}").stdout.strip()

    check(wait_until(lambda: env.healthy(host), 120), f"{host} never became healthy")
    time.sleep(3)  # the watchdog has seen it ready
    pid, wpid = main_pid(unit), main_pid(wunit)
    env.sh(host, f"systemctl set-property --runtime {wunit} TasksMax=64 && "
                 f"prlimit --pid {wpid} --nofile=64:64")
    put = env.fleet.run(host, "cat > /run/standin/flooder.py", input=FLOODER)
    check(put.returncode == 0, put.stderr)
    env.sh(host, "systemd-run --quiet --collect --unit=sf-drill-flood -p LimitNOFILE=8192 "
                 "/usr/bin/python3 /run/standin/flooder.py 30091 1500")
    try:
        time.sleep(6)
        held = env.sh(host, "ss -Htn state established '( sport = :30091 )' | wc -l").stdout
        env.sh(host, f"echo {pid} > {HANG}")
        restarted = wait_until(lambda: main_pid(unit) not in (pid, "0", ""), 60, 0.5)
        journal = env.sh(host, f"journalctl -u {wunit} --no-pager -o cat -n 200").stdout
    finally:
        env.sh(host, "systemctl stop sf-drill-flood; rm -f /run/standin/flooder.py "
                     f"{HANG}; systemctl set-property --runtime {wunit} TasksMax=infinity")
    check(restarted, f"the hung server was not restarted under the flood: {journal[-1500:]}")
    check(main_pid(wunit) == wpid, f"the watchdog died under the flood: {journal[-1500:]}")
    check(wait_until(lambda: env.healthy(host), 120), f"{host} not healthy after the restart")
    d.detail = (f"relay held {held.strip()} connections of 1500; hung server restarted; "
                "watchdog alive")


HOSTILE_DRILLS = [
    Drill("fanout-evil-source", "fan-out seed sends a second, altered copy of each file",
          "d2 (seed) -> d3", "the receiver refuses the second copy and the seed, records only "
          "what it hashed; its fast weights check ends with the hub's bytes",
          drill_malicious_source, "48fd89f (before #32): the second copy renamed over the first "
          "after its hash was checked, recorded as verified (shown by the fleet test)"),
    Drill("relay-flood", "1500 half-open connections to the metrics relay, watchdog at 64 files",
          "d3 watchdog", "the watchdog lives and restarts a hung server; the relay holds at most "
          "its cap", drill_relay_flood, "48fd89f (before #32): a thread per connection, the "
          "watchdog died when its tick could not open a pipe (shown by the fleet test)"),
]
