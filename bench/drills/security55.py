"""Drills of issue 55 (security, third pass): hostile settings on removal, a squatter on the
server's port, a flooding fan-out source. Each is one row and counted in the drills line; the leak
counter (journals, every command line, every controller's output) covers the API key, and each
drill also checks the place the fault would put the key or the damage.

Registered by ``bench/drills/run.py``'s ``main`` (``SECURITY_DRILLS`` added to ``DRILLS``).
"""

from __future__ import annotations

import json

from bench.drills import kit as drills
from bench.drills.kit import MB, PORT, SERVICE, Drill, Env, Run, check, wait_until

REMOVE = "deploys/kimi_k26.py"
# A listener any local user could start: it answers 200 and writes down each request's path and
# Authorization header (what it would have been given).
SQUATTER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[2], "a") as f:
            f.write(self.path + " " + str(self.headers.get("Authorization")) + "\n")
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    do_POST = do_GET
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
# The receiver's end of a fan-out channel (the real SourceChannel of the agent on the host) fed by
# a source that floods statuses and stderr for 9 s; the driver prints its own peak memory.
FLOOD_DRIVER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import fanout_agent as fa
flood = ("import json, sys\npad = 'x' * 1000\nn = 0\nwhile True:\n"
         "    sys.stdout.write(json.dumps({'n': n, 'verified': {}, 'pad': pad}) + '\\n')\n"
         "    sys.stderr.write('e' * 2000 + '\\n')\n    n += 1\n")
ch = fa.SourceChannel([sys.executable, "-c", flood], lambda stream, head, asked: None)
began, seen = time.monotonic(), 0
while time.monotonic() - began < 9:
    st = ch.latest(1)
    seen = st["n"] if st else seen
    time.sleep(0.5)  # a slow consumer: what comes meanwhile must not pile up
hwm = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
ch.close()
print(json.dumps({"newest": seen, "hwm_kib": int(hwm), "error": ch.error()}))
"""


def drill_hostile_removal(env: Env, d: Drill) -> None:
    """Settings that name the host's own folders and units are refused before anything runs;
    the removal of a real deploy leaves a second service whose name starts with this one's,
    the user's files in state_dir and the weights alone."""
    host = "d2"
    repo_id = env.repo("rmhostile", shards=1, size=MB)
    hostile = env.settings(repo_id, present=False, state_dir="/var/lib", service_name="ssh",
                           venv="/usr", removal={"venv": True})
    before = env.sh(host, "ls /var/lib | wc -l; systemctl is-active ssh; "
                          "test -e /var/lib/dpkg/status && echo dpkg").stdout
    run = Run(env, env.argv(env.inventory({host: hostile}), [host], deploy=REMOVE))
    check(run.wait(300) != 0, f"hostile settings were accepted: {run.out[-1500:]}")
    check("settings key 'state_dir'" in run.out and "fix: set state_dir to a folder of "
          "specfleet's own" in run.out, f"the refusal does not name state_dir and its fix: "
          f"{run.out[-1500:]}")
    after = env.sh(host, "ls /var/lib | wc -l; systemctl is-active ssh; "
                         "test -e /var/lib/dpkg/status && echo dpkg").stdout
    check(after == before and "dpkg" in after, f"the host changed: {before!r} -> {after!r}")

    deployed = env.deploy(host, repo_id)
    check(deployed.rc == 0, f"the deploy failed: {deployed.out[-2000:]}")
    neighbour = f"{SERVICE}-b"
    env.fleet.run(host, f"cat > /etc/systemd/system/{neighbour}.service",
                  input="[Service]\nExecStart=/bin/sleep infinity\n")
    env.sh(host, f"systemctl daemon-reload && systemctl start {neighbour} && "
                 "echo mine > /var/lib/specfleet/notes.txt")
    try:
        gone = Run(env, env.argv(env.inventory({host: env.settings(repo_id, present=False)}),
                                 [host], deploy=REMOVE))
        check(gone.wait(300) == 0, f"the removal failed: {gone.out[-2000:]}")
        left = env.sh(host, f"systemctl is-active {neighbour}; cat /var/lib/specfleet/notes.txt; "
                            f"systemctl show -p LoadState --value {SERVICE}.service; "
                            f"ls /srv/models | wc -l").stdout.split()
        check(left[:2] == ["active", "mine"], f"the removal touched what is not its own: {left}")
        check(left[2] == "not-found", f"{SERVICE}.service is still there: {left}")
        check(int(left[3]) > 0, "the weights went without --weights")
    finally:
        env.sh(host, f"systemctl stop {neighbour}; rm -f /etc/systemd/system/{neighbour}.service "
                     "/var/lib/specfleet/notes.txt; systemctl daemon-reload")
    d.detail = ("state_dir /var/lib, service_name ssh, venv /usr refused, host unchanged; "
                f"removal left {neighbour}, the user's file and the weights")


def drill_port_squatter(env: Env, d: Drill) -> None:
    """While the server is down, an unprivileged local user binds its port; the next deploy
    starts the server (which cannot bind) and its readiness gate must send nothing to the
    squatter, fail naming it, and the run after the squatter left converges."""
    host = "d3"
    repo_id = env.repo("squat", shards=1, size=MB)
    first = env.deploy(host, repo_id)
    check(first.rc == 0, f"the first deploy failed: {first.out[-2000:]}")
    env.fleet.run(host, "cat > /var/tmp/squatter.py", input=SQUATTER)
    env.sh(host, f"systemctl stop {SERVICE}.service; rm -f /var/tmp/squat.log; "
                 "install -m 666 /dev/null /var/tmp/squat.log; "
                 f"systemd-run --quiet --unit=drill-squatter --uid=nobody /usr/bin/python3 "
                 f"/var/tmp/squatter.py {PORT} /var/tmp/squat.log")
    try:
        check(wait_until(lambda: env.sh(host, f"ss -Hltn 'sport = :{PORT}'").stdout.strip() != "",
                         30), "the squatter never listened")
        run = env.deploy(host, repo_id)
        seen = env.sh(host, "cat /var/tmp/squat.log").stdout
    finally:
        env.sh(host, "systemctl stop drill-squatter; rm -f /var/tmp/squatter.py")
    check(run.rc != 0, f"the deploy passed with a squatter on the port: {run.out[-1500:]}")
    check(drills.API_KEY not in seen and "Bearer" not in seen,
          f"the squatter was sent the key: {seen[-500:]}")
    check(f"port {PORT} is held by 'python3'" in run.out and "uid 65534" in run.out,
          f"the failure does not name the squatter: {run.out[-2000:]}")
    again = env.deploy(host, repo_id)
    check(again.rc == 0, f"the run after the squatter left failed: {again.out[-2000:]}")
    env.converged(host, repo_id)
    d.detail = (f"gate sent nothing ({len(seen.splitlines())} requests reached the squatter), "
                "named it; next run converged")


def drill_fanout_flood(env: Env, d: Drill) -> None:
    """A compromised fan-out source floods its channel with statuses and stderr for 9 s while
    the receiver reads slowly: the receiver (the real agent on the host) holds the newest status
    and a few stderr lines, its memory stays flat, and nothing goes to a temporary file."""
    host = "d3"
    folder = "/run/drill-flood"
    env.sh(host, f"mkdir -p {folder}")
    for name in ("fanout_agent.py", "weights_agent.py"):
        env.fleet.put(host, drills.REPO / "specfleet" / "hostside" / name, f"{folder}/{name}")
    env.fleet.run(host, f"cat > {folder}/driver.py", input=FLOOD_DRIVER)
    tmp_before = env.sh(host, "df --output=used /tmp | tail -1").stdout.strip()
    try:
        r = env.sh(host, f"cd /tmp && /usr/bin/python3 {folder}/driver.py {folder}", timeout=120)
        tmp_after = env.sh(host, "df --output=used /tmp | tail -1").stdout.strip()
    finally:
        env.sh(host, f"rm -rf {folder}")
    check(r.returncode == 0, f"the driver failed: {r.stderr[-1500:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    check(out["newest"] > 1000, f"the flood did not happen: {out}")
    check(out["hwm_kib"] < 200 * 1024, f"the receiver grew to {out['hwm_kib']} KiB")
    grew = (int(tmp_after) - int(tmp_before)) if tmp_before.isdigit() and tmp_after.isdigit() else 0
    check(grew < 50 * 1024, f"/tmp grew by {grew} KiB during the flood")
    d.detail = (f"{out['newest']} statuses in 9 s; peak {out['hwm_kib'] // 1024} MiB; "
                f"/tmp +{max(grew, 0)} KiB")


SECURITY_DRILLS = [
    Drill("hostile-removal", "settings name /var/lib, ssh and /usr; a second service "
          f"{SERVICE}-b beside the one removed", "d2", "hostile settings refused with the fix, "
          "host unchanged; removal leaves the neighbour, the user's file and the weights",
          drill_hostile_removal, "acb8bee^ (before #55): rm -rf /var/lib/*, the neighbour "
          "stopped (shown by tests/unit/test_removal_property.py)"),
    Drill("port-squatter", "an unprivileged user binds the server's port while it is down",
          "d3 readiness gate", "the gate sends nothing (no key) to the squatter and names it; "
          "next run converges", drill_port_squatter,
          "cfa3c8e^ (before #55): the gate sent /health_generate with the key, then refused"),
    Drill("fanout-flood", "a fan-out source floods statuses and stderr for 9 s", "d3 receiver",
          "newest status only, memory flat, no temporary file growth", drill_fanout_flood,
          "3a569f9^ (before #55): 0.9-2.8 GB in 9 s, stderr to an unbounded temp file"),
]
