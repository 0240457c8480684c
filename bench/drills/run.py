"""Fault drills: specfleet against faults on the local fleet, figures from independent evidence.

    python -m bench.drills.run [--only NAME,NAME] [--keep] [--list]

Boots a fleet of its own (tests.harness; d1 with a persistent disk, d2, d3, and c2, a second
control machine with its own machine id), serves small model repositories from the stand-in hub,
then runs each drill: a converged deploy (tests/deploys/rollout_deploy.py: SGLang from the
wheelhouse, the weights, the unit, the readiness gate, as deploys/kimi_k26.py orders them), a
fault while something runs, and the re-run that has to finish the job. One row per drill (fault,
where, what was checked, result), then

    drills: survived=S/N lost=L leaks=K tracebacks=T bad_inputs=B (commit C, DATE)

The counters never ask specfleet:
- lost: files of the SGLang wheel that differ from its RECORD hashes, weights that differ from the
  hub's own bytes (git blobs), and, from the stand-in hub's access log (one ``SENT`` line per file
  body with its bytes and the client), a file sent whole to one host more than once (a verified
  shard fetched twice), less the sends the drill itself corrupted;
- leaks: each secret (the HF token, the server's API key) found in a host's journal, in any
  process's command line on a host (sampled 10 times a second all along), or in the ``-vvv``
  output of any controller;
- tracebacks: ``Traceback`` anywhere in the controllers' output (not in a server journal line it
  quotes, ``| ...``);
- bad_inputs: generated bad settings and facts (hypothesis, tests/unit/test_bad_inputs.py), each
  answered by a SpecfleetError that names the problem and a fix.
A drill whose fault cannot be seen happening (the hub's log, the host's boot id, a process that
was there and is not) fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from collections import Counter
from pathlib import Path

from bench.drills.broken_verify import BROKEN_VERIFY
from bench.drills.hostile import HOSTILE_DRILLS
from bench.drills.kit import (
    DEPLOY,
    KEPT,
    MB,
    RECORD,
    REPO,
    SERVICE,
    STANDIN,
    VENV,
    Drill,
    DrillFailed,
    Env,
    ExpectedFailure,
    Row,
    Run,
    check,
    download_unit_active,
    shq,
    slow_download,
    verified,
    wait_until,
)
from bench.drills.security55 import SECURITY_DRILLS
from bench.stamp import stamp, stamp_line
from tests.harness import Fleet, HostSpec


def drill_kill_controller_deploy(env: Env, d: Drill) -> None:
    host = "d2"
    repo_id, run = slow_download(env, host, "ctlkill")
    check(download_unit_active(env, host), "no download unit ran when the controller died")
    rc = run.kill()
    check(rc == -signal.SIGKILL, f"pyinfra was not SIGKILLed (rc={rc})")
    check(download_unit_active(env, host), "the download died with the control machine")
    env.hub_config()
    again = env.deploy(host, repo_id)
    check(again.rc == 0, f"the re-run failed: {again.out[-2000:]}")
    env.converged(host, repo_id)


def drill_reboot_mid_download(env: Env, d: Drill) -> None:
    host = "d1"
    repo_id, run = slow_download(env, host, "reboot")
    boot = env.sh(host, "cat /proc/sys/kernel/random/boot_id").stdout
    kept = verified(env, host, repo_id)
    env.fleet.reboot(host, hard=True)
    run.wait(120)
    check(env.sh(host, "cat /proc/sys/kernel/random/boot_id").stdout not in ("", boot),
          "the host did not reboot")
    check(set(kept) <= set(verified(env, host, repo_id)), "verified shards were lost")
    env.start_recorders([host])
    env.sh(host, "mkdir -p /run/standin")  # the stand-in's record folder is a tmpfs
    env.hub_config()
    again = env.deploy(host, repo_id)
    check(again.rc == 0, f"the re-run after the reboot failed: {again.out[-2000:]}")
    env.converged(host, repo_id)


def drill_disk_full(env: Env, d: Drill) -> None:
    host = "d1"
    repo_id, run = slow_download(env, host, "diskfull")
    env.sh(host, "fallocate -l $(( $(df --output=avail -B1 /srv/models | tail -1) - 65536 )) "
                 "/srv/models/filler || true")
    avail = int(env.sh(host, "df --output=avail -B1 /srv/models | tail -1").stdout.strip())
    check(avail < MB, f"the disk did not fill ({avail} bytes free)")
    rc = run.wait(300)
    out = run.out
    check(rc != 0, "the deploy succeeded on a full disk")
    check(re.search(r"No space left|not enough (free )?space|disk at \S+ is full", out, re.I)
          is not None, f"no clear disk-full error: {out[-2500:]}")
    env.sh(host, "rm -f /srv/models/filler")
    env.hub_config()
    again = env.deploy(host, repo_id)
    check(again.rc == 0, f"the re-run after freeing space failed: {again.out[-2000:]}")
    env.converged(host, repo_id)


def drill_hub_knob(knob: str, log_word: str, name: str, host: str = "d2"):
    def drill(env: Env, d: Drill) -> None:
        repo_id = env.repo(name)
        since = len(env.hub.log_lines())
        env.hub_config(**{knob: ["model-00002-*"], f"{knob}_count": 1})
        first = env.deploy(host, repo_id)
        env.hub_config()
        seen = [ln for ln in env.hub_lines(since) if ln.startswith(log_word)]
        check(bool(seen), f"the hub never did it (no {log_word} in its log)")
        if knob == "corrupt":
            env.corrupt_sends[(env.fleet.hosts[host], repo_id, "model-00002-of-00004.safetensors")
                              ] += len(seen)
        if first.rc != 0:
            check(re.search(r"sha256|checksum|hash|corrupt|differs", first.out, re.I)
                  is not None, f"the failure does not say what was wrong: {first.out[-2000:]}")
            first = env.deploy(host, repo_id)
        check(first.rc == 0, f"not converged after a re-run: {first.out[-2000:]}")
        env.converged(host, repo_id)
    return drill


def drill_hostile_listing(env: Env, d: Drill) -> None:
    host = "d2"
    repo_id = env.repo("hostile", shards=1)
    hostile = ["../escape.json", "/tmp/escape-abs.json", "../../../../etc/drill-escape",
               "a\\..\\..\\bs.json", "new\nline.json"]
    listing = "find /srv/models -xdev 2>/dev/null | sort"
    before = env.sh(host, listing).stdout
    since = len(env.hub.log_lines())
    env.hub_config(aliases={repo_id: {n: "config.json" for n in hostile}})
    try:
        run = env.deploy(host, repo_id)
    finally:
        env.hub_config()
    check(any(f"/api/models/{repo_id}/" in ln for ln in env.hub_lines(since)),
          "the hub never served the listing")
    check(run.rc != 0, "a hostile listing was accepted")
    check("not safe" in run.out and repo_id in run.out, f"no clear error: {run.out[-2000:]}")
    after = env.sh(host, listing).stdout
    new = sorted(set(after.splitlines()) - set(before.splitlines()))
    outside = [p for p in new if not p.startswith(f"/srv/models/{repo_id.replace('/', '--')}")]
    check(not outside, f"created outside the revision folder: {outside}")
    for gone in ("/tmp/escape-abs.json", "/etc/drill-escape", "/srv/escape.json"):
        check(env.sh(host, f"test -e {gone}").returncode != 0, f"{gone} was written")


def drill_sglang_killed(env: Env, d: Drill) -> None:
    host = "d3"
    repo_id = env.repo("killed", shards=1)
    first = env.deploy(host, repo_id)
    check(first.rc == 0, f"the first deploy failed: {first.out[-2000:]}")
    pid = env.sh(host, f"systemctl show -p MainPID --value {SERVICE}").stdout.strip()
    check(pid not in ("", "0"), "no server ran")
    env.sh(host, f"kill -9 {pid}")
    check(wait_until(lambda: env.sh(host, f"test -d /proc/{pid}").returncode != 0, 10),
          "the server did not die")
    again = env.deploy(host, repo_id)
    check(again.rc == 0, f"the re-run failed: {again.out[-2000:]}")
    new = env.sh(host, f"systemctl show -p MainPID --value {SERVICE}").stdout.strip()
    check(new not in ("", "0", pid), f"the server was not started again ({pid} -> {new}): "
          f"{again.out[-1500:]}")
    env.converged(host, repo_id)


def drill_gate_timeout(env: Env, d: Drill) -> None:
    host = "d3"
    repo_id = env.repo("gate", shards=1)
    over = {"readiness_timeout_s": 5,
            "launcher": ["/usr/bin/python3", STANDIN, "--standin-record", RECORD,
                         "--standin-load-s", "600"]}
    t0 = time.monotonic()
    run = env.deploy(host, repo_id, **over)
    took = time.monotonic() - t0
    check(run.rc != 0, "a server that never got ready passed the gate")
    check("not ready within the budget of 5 s" in run.out, f"no clear error: {run.out[-2000:]}")
    check("readiness_timeout_s" in run.out, "the error names no fix")
    check(took >= 5, f"the gate gave up before its budget ({took:.1f}s)")
    again = env.deploy(host, repo_id)
    check(again.rc == 0, f"the re-run with a server that loads failed: {again.out[-2000:]}")
    env.converged(host, repo_id)


LOCKED_DEPLOY = "bench/drills/locked_deploy.py"


def changed(out: str, host: str) -> bool:
    """Whether a pyinfra run's -vvv output shows an operation that changed ``host``."""
    return re.search(rf"\[{host}\] Success", out) is not None


def drill_two_controllers(env: Env, d: Drill) -> None:
    """Two control machines (this one and c2, a fleet host with the checkout copied in and a
    machine id of its own) deploy d3 at the same moment, each under the run lock as
    deploys/kimi_k26.py takes it (bench/drills/locked_deploy.py). The first holds the lock while
    the hub serves slowly; the second must be refused as busy, naming the first, with nothing
    changed. Both changing the host (what a deploy without the lock does) fails the drill."""
    host = "d3"
    repo_id = env.repo("twoctl", shards=2)
    mine = env.sh("c2", "cat /etc/machine-id").stdout.strip()
    here = Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else ""
    check(bool(mine) and mine != here, "c2 has no machine id of its own")
    env.hub_config(rate_bps=300_000)  # ~7 s of download: the lock is held while c2 starts
    inv = env.inventory({host: env.settings(repo_id)}, path=env.fleet.dir / "drill-two.py")
    env.fleet.put("c2", inv, str(inv))
    env.fleet.put("c2", env.token_file, str(env.token_file))
    # c2's Python is Debian's: the checkout's venv packages by path (its interpreter is this
    # machine's), specfleet from the checkout.
    site = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))
    remote = (f"cd {REPO} && SPECFLEET_ALLOW_TEST_SETTINGS=1 PYTHONPATH={site}:{REPO} "
              f"/usr/bin/python3 -m pyinfra -y -vvv --limit {host} {inv} {LOCKED_DEPLOY}")
    a = Run(env, env.argv(inv, [host], deploy=LOCKED_DEPLOY))
    b = Run(env, ["bash", "-c", remote], ssh_host="c2")
    ra, rb = a.wait(600), b.wait(600)
    env.hub_config()
    check(b.started < a.ended and a.started < b.ended, "the two runs did not overlap")
    runs = {"here": a, "c2": b}
    busy = {k: r for k, r in runs.items() if "another specfleet run holds this host" in r.out}
    won = {k: r for k, r in runs.items() if k not in busy}
    check(len(busy) == 1, f"{len(busy)} of the two runs met the other's lock (rc here={ra}, "
          f"c2={rb}): {a.out[-1500:]} {b.out[-1500:]}")
    (loser_name, loser), (winner_name, winner) = next(iter(busy.items())), next(iter(won.items()))
    check(winner.rc == 0, f"the run holding the lock ({winner_name}) failed: "
          f"{winner.out[-2000:]}")
    check(changed(winner.out, host), f"the run holding the lock ({winner_name}) changed nothing")
    check(loser.rc != 0 and not changed(loser.out, host),
          f"the refused run ({loser_name}) changed {host} too: {loser.out[-2000:]}")
    holder_id = (here if winner_name == "here" else mine)[:8]
    check(f"on machine {holder_id}" in loser.out,
          f"the refusal does not name the other control machine ({holder_id}): "
          f"{loser.out[-1500:]}")
    final = Run(env, env.argv(inv, [host], deploy=LOCKED_DEPLOY))
    final.wait(600)
    check(final.rc == 0 and not changed(final.out, host),
          f"a run after both changed {host} again: {final.out[-2000:]}")
    env.converged(host, repo_id)
    d.detail = f"{winner_name} held the lock and changed {host}; {loser_name} refused as busy"


def drill_kill_rollout(env: Env, d: Drill) -> None:
    """A rollout SIGKILLed while it deploys the canary; the rollback point must survive: a
    re-run whose new server fails the gate has to bring back the server of before."""
    hosts = ["d2", "d3"]
    repo_id = env.repo("rollout", shards=1)
    inv = env.inventory({h: env.settings(repo_id) for h in hosts})
    first = env.pyinfra(inv, hosts)
    check(first.rc == 0, f"the baseline deploy failed: {first.out[-2000:]}")
    files = f"cat /etc/systemd/system/{SERVICE}.service /etc/specfleet/{SERVICE}.env | sha1sum"
    before = {h: env.sh(h, files).stdout for h in hosts}
    bad = {h: env.settings(repo_id, plan={"extra_env": {"SF_GEN": "broken"}},
                           launcher=["/usr/bin/python3", STANDIN, "--standin-record", RECORD,
                                     "--standin-exit", "3"]) for h in hosts}
    inv2 = env.inventory(bad)
    report = env.work / "rollout-report.json"
    argv = [sys.executable, "-m", "specfleet.cli", "rollout", str(inv2), DEPLOY, "--report",
            str(report), "--no-prefetch", "--canary", "d2"]
    run = Run(env, argv)
    seen = wait_until(lambda: env.sh("d2", f"test -e {KEPT} && grep -qsE 'SF_GEN|standin-exit' "
                                           f"/etc/systemd/system/{SERVICE}.service "
                                           f"/etc/specfleet/{SERVICE}.env").returncode == 0,
                      240, 0.1)
    check(seen, f"the rollout never reached the canary's deploy: {run.out[-1500:]}")
    rc = run.kill()
    check(rc == -signal.SIGKILL, f"the rollout was not SIGKILLed (rc={rc})")
    again = Run(env, argv)
    again.wait(600)
    check(again.rc != 0, "a rollout of a failing server succeeded")
    restored = env.sh("d2", files).stdout
    check(restored == before["d2"], "the re-run rolled the canary back to the killed run's half "
          "state: the rollback point was lost")
    check(env.healthy("d2"), "the canary does not serve after the rollback")
    check(env.sh("d3", files).stdout == before["d3"], "the rollout touched d3 after the canary "
          "failed")


PATCH_DEPLOY = "tests/deploys/deploy_op_sglang.py"
PATCH_STATE = f"{VENV}/.specfleet/pr20547"
# The installed SGLang against its wheel's RECORD (changed, missing), the files under sglang/ that
# RECORD does not name (added: what the port creates), and one hash of every source file (paths
# and bytes, bytecode aside) to compare with an apply that was never interrupted.
TREE_CHECK = r"""
import base64, csv, glob, hashlib, json, os
site = glob.glob('@VENV@/lib/python3*/site-packages')[0]
rec = {}
for row in csv.reader(open(glob.glob(site + '/sglang-*.dist-info/RECORD')[0])):
    if len(row) > 1 and row[0].startswith('sglang/') and row[1].startswith('sha256='):
        rec[row[0]] = row[1].split('=', 1)[1]
out = {'changed': [], 'missing': [], 'added': []}
for path, want in sorted(rec.items()):
    try:
        data = open(os.path.join(site, path), 'rb').read()
    except OSError:
        out['missing'].append(path); continue
    if base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip('=') != want:
        out['changed'].append(path)
tree = hashlib.sha256()
for root, dirs, files in os.walk(os.path.join(site, 'sglang')):
    dirs[:] = sorted(d for d in dirs if d != '__pycache__')
    for name in sorted(files):
        rel = os.path.relpath(os.path.join(root, name), site)
        if rel not in rec and not name.endswith('.pyc'):
            out['added'].append(rel)
        if not name.endswith('.pyc'):
            tree.update(rel.encode() + b'\0' + hashlib.sha256(
                open(os.path.join(root, name), 'rb').read()).digest())
out['tree'] = tree.hexdigest()
print(json.dumps(out))
""".replace("@VENV@", VENV)
# A host-side watcher: prints the apply's stage the moment the host shows it (polled every ms), so
# that the control machine dies right there. The apply (operations/sglang_commands.apply_script)
# starts (site), lists and backs up the touched files, commits its journal (journal), then
# patches (the port's new worker file appears).
PATCH_WATCH = r"""
import os, sys, time
d, site = sys.argv[1], sys.argv[2]
marks = {'backup': d + '/site', 'journal': d + '/journal',
         'patching': site + '/sglang/srt/speculative/dflash_worker_v2.py'}
want = marks[sys.argv[3]]
print('WATCHING', flush=True)
deadline = time.time() + 300
while time.time() < deadline:
    if os.path.lexists(want):
        print('STAGE', sys.argv[3], flush=True)
        break
    time.sleep(0.001)
"""


def tree_state(env: Env, host: str) -> dict:
    r = env.sh(host, f"/usr/bin/python3 -c {shq(TREE_CHECK)}")
    check(r.returncode == 0, f"{host}: the SGLang tree could not be read: {r.stderr[-500:]}")
    return json.loads(r.stdout)


def op_status(out: str, op: str, host: str) -> str | None:
    """pyinfra's verdict for ``host`` in the operation named ``op`` (its -vvv output)."""
    section = out.split(f"Starting operation: {op}", 1)[-1] if op in out else ""
    m = re.search(rf"\[{host}\] (Success|No changes|Error)", section)
    return m.group(1) if m else None


def patch_run(env: Env, host: str, data: dict, ops: list[str], present: bool = True) -> Run:
    env.n += 1
    inv = env.fleet.write_inventory(env.work / f"inventory{env.n}.py", host_data={
        host: {"specfleet": data, "sglang_test": {"ops": ops, "pr20547_present": present}}})
    return Run(env, env.argv(inv, [host], deploy=PATCH_DEPLOY))


def drill_kill_patch(env: Env, d: Drill) -> None:
    """The control machine SIGKILLed while PR#20547 is being applied to d3's SGLang, at three
    points of the apply (backing up, journal committed, files being patched). Judged against
    the wheel's RECORD (unpatched: every file as RECORD says, nothing added) and the tree of an
    apply never interrupted (patched): the re-run must end fully patched, a removal fully
    unpatched."""
    from tests.harness.port_build import port_patch, port_settings

    host = "d3"
    port_id = hashlib.sha256(port_patch().text.encode()).hexdigest()
    data = env.settings(env.repo("patch", shards=1), patch=port_settings())

    def marker() -> str:
        return env.sh(host, f"cat {PATCH_STATE}/sha256 2>/dev/null").stdout.strip()

    def unpatched(what: str) -> None:
        t = tree_state(env, host)
        check(not (t["changed"] or t["missing"] or t["added"]),
              f"{what}: SGLang differs from its RECORD: {dict(t, tree=None)}")

    def remove(what: str) -> None:
        r = patch_run(env, host, data, ["pr20547"], present=False)
        r.wait(600)
        check(r.rc == 0, f"{what}: the removal failed: {r.out[-2000:]}")
        unpatched(f"after the removal ({what})")
        check(env.sh(host, f"test -e {PATCH_STATE}").returncode != 0,
              f"{what}: the patch state is left after the removal")

    # The references: SGLang as its wheel has it, and as an apply never interrupted leaves it.
    base = patch_run(env, host, data, ["installed", "pr20547"])
    base.wait(900)
    check(base.rc == 0, f"the uninterrupted apply failed: {base.out[-2000:]}")
    check(marker() == port_id, f"the uninterrupted apply left no marker {port_id[:12]}")
    patched = tree_state(env, host)
    check(bool(patched["added"]) and bool(patched["changed"]),
          f"the port changed nothing that RECORD sees: {patched}")
    remove("the reference")
    site = env.sh(host, f"ls -d {VENV}/lib/python3*/site-packages").stdout.strip()
    landed = []
    for stage in ("backup", "journal", "patching"):
        watch = Run(env, ["/usr/bin/python3", "-u", "-c", PATCH_WATCH, PATCH_STATE, site, stage],
                    ssh_host=host)
        check(watch.wait_for(r"WATCHING", 30), f"the watcher did not start on {host}")
        run = patch_run(env, host, data, ["pr20547"])
        deadline = time.monotonic() + 300
        while not (seen := any(ln.startswith("STAGE") for ln in watch.lines)):
            if run.proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.001)
        rc = run.kill() if run.proc.poll() is None else run.wait(60)
        if not seen:
            watch.kill()
        watch.wait(30)
        check(seen, f"the apply never reached '{stage}': {run.out[-1500:]}")
        check(rc == -signal.SIGKILL, f"pyinfra finished before it was killed at '{stage}' "
              f"(rc={rc})")
        time.sleep(3)  # what the host was running when its controller died ends (or dies)
        after = tree_state(env, host)
        # The fault, seen on the host: the apply had begun (its state folder) and was never
        # declared done (the marker only the control machine writes, after verifying it).
        began = env.sh(host, f"test -d {PATCH_STATE}").returncode == 0
        check(began and not marker(), f"'{stage}': the kill left no interrupted apply "
              f"(state folder: {began}, marker: {marker()[:12]})")
        state = ("unpatched" if not (after["changed"] or after["missing"] or after["added"])
                 else "patched" if after["tree"] == patched["tree"] else "half-patched")
        landed.append(f"{stage}: {state}")
        again = patch_run(env, host, data, ["pr20547"])
        again.wait(600)
        check(again.rc == 0, f"'{stage}': the re-run failed: {again.out[-2000:]}")
        now = tree_state(env, host)
        check(now["tree"] == patched["tree"] and now["added"] == patched["added"],
              f"'{stage}': the re-run did not end fully patched: changed {now['changed']}, "
              f"added {now['added']}, missing {now['missing']}")
        check(marker() == port_id, f"'{stage}': the re-run left no marker")
        settled = patch_run(env, host, data, ["pr20547"])
        settled.wait(600)
        check(settled.rc == 0 and op_status(settled.out, "sglang.pr20547", host) == "No changes"
              and tree_state(env, host)["tree"] == patched["tree"],
              f"'{stage}': a second re-run changed the tree: {settled.out[-1500:]}")
        remove(stage)
    d.detail = "killed at " + ", ".join(landed)


FANOUT_STATE = "/var/lib/specfleet/fanout"


def netns_run(env: Env, host: str, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", env.fleet.state["hosts"][host]["netns"], *argv],
                   check=True, capture_output=True, text=True)


def drill_fanout_peer_cut(env: Env, d: Drill) -> None:
    """d3 copies the target's shards from d2 (the fan-out's seed, python -m
    specfleet.fleet.fanout) when d2's link is cut, mid-file. d2's sending is slowed (a token
    bucket on its link, 4 Mbit/s) so that the cut finds a copy in flight; the cut is d2's veth
    down, as a pulled cable (no reset: the copy has to find out by itself)."""
    seed, receiver = "d2", "d3"
    repo_id = env.repo("fanout", shards=3, size=3 * MB)
    rev = env.revs[repo_id]
    rev_dir = f"/srv/models/{repo_id.replace('/', '--')}/{rev}"
    inv = env.inventory({h: env.settings(repo_id) for h in (seed, receiver)})
    argv = [sys.executable, "-m", "specfleet.cli", "fanout", str(inv), "--order",
            f"{seed},{receiver}", "--limit", seed, "--limit", receiver]
    since = len(env.hub.log_lines())
    veth = env.fleet.state["hosts"][seed]["veth"]
    ip = {h: env.fleet.hosts[h] for h in (seed, receiver)}
    in_flight = ("find " + rev_dir + " -maxdepth 1 -name '.model-*.sf-part' -size +0 "
                 "-printf '%f %s\\n' 2>/dev/null | head -1")
    netns_run(env, seed, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
              "4mbit", "burst", "32kb", "latency", "400ms")
    run = Run(env, argv)
    partial = ""
    try:
        seen: list[str] = []

        def copying() -> bool:
            found = env.sh(receiver, in_flight, timeout=20).stdout.strip()
            if found:
                seen.append(found)
            return bool(found) or run.proc.poll() is not None

        wait_until(copying, 300, 0.2)
        partial = seen[-1] if seen else ""
        check(bool(partial) and run.proc.poll() is None,
              f"no copy from {seed} was ever in flight on {receiver}: {run.out[-2000:]}")
        subprocess.run(["ip", "link", "set", veth, "down"], check=True)
        rc = run.wait(400)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
        netns_run(env, seed, "tc", "qdisc", "del", "dev", "eth0", "root")
    check(not run.timed_out, f"the fan-out hung on the cut link (killed after 400 s): "
          f"{run.out[-2000:]}")
    name, size = partial.split()
    full = MB * 3
    check(0 < int(size) < full, f"the copy in flight was not partial at the cut ({partial})")
    out = run.out
    journal = env.sh(receiver, "journalctl --no-pager -o cat -u 'specfleet-fanout-*'").stdout
    # A cut link answers nothing (no reset): the receiver's stall clock ends the source (#55).
    check(re.search(rf"{seed} unreachable|the copy from {seed} failed|made no progress|"
                    rf"{seed} left a file asked for unanswered", journal) is not None,
          f"{receiver} never said its peer copy from {seed} failed: {journal[-1500:]}")
    if rc != 0:
        check(re.search(rf"{seed}.*(unreachable|failed)|(unreachable|failed).*{seed}", out)
              is not None, f"the fan-out failed without naming {seed}: {out[-2000:]}")
    deadline = time.monotonic() + 60
    while env.sh(seed, "true", timeout=20).returncode and time.monotonic() < deadline:
        time.sleep(1)
    # No partial shard counts as verified: whatever the receiver recorded has the hub's bytes.
    leftovers = env.sh(receiver, f"find {rev_dir} -maxdepth 1 -name '.model-*'").stdout.split()
    rec = verified(env, receiver, repo_id)
    bad = [p for p in env.weights_mismatches(receiver, repo_id) if p.split("/")[-1].split()[0]
           in rec]
    check(not bad, f"a shard recorded as verified differs from the hub: {bad}")
    again = Run(env, argv)
    again.wait(400)
    check(again.rc == 0, f"the re-run of the fan-out failed: {again.out[-2000:]}")
    for h in (seed, receiver):
        w = env.weights_mismatches(h, repo_id)
        check(not w, f"{h}: weights differ from the hub after the re-run: {w}")
        left = env.sh(h, f"find {FANOUT_STATE} -mindepth 1 ! -name '*.pull.json' 2>/dev/null; "
                         "systemctl list-units --no-legend --state=active 'specfleet-fanout-*'"
                    ).stdout.strip()
        check(not left, f"{h}: the fan-out left {left}")
    tmp = env.sh(receiver, f"find {rev_dir} -maxdepth 1 -name '.model-*'").stdout.split()
    check(not tmp, f"{receiver}: partial files of the copy left in the revision folder: {tmp}")
    sends = Counter()
    for ln in env.hub_lines(since):
        parts = ln.split()
        if parts[:1] == ["SENT"] and parts[1] == repo_id and parts[-1] == "full":
            sends[(parts[5], parts[3])] += 1
    twice = {k: n for k, n in sends.items() if n > 1}
    check(not twice, f"the hub sent a shard whole twice to one host: {twice}")
    shards = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    check(all(sends[(ip[seed], f)] == 1 for f in shards),
          f"the seed did not fetch each shard once: {dict(sends)}")
    from_hub = sorted(f for (c, f) in sends if c == ip[receiver])
    d.detail = (f"cut during {name.lstrip('.').removesuffix('.sf-part')} at "
                f"{int(size) // 1000} kB; {receiver} took {len(from_hub)} shard(s) from the hub; "
                f"partial files left by the cut: {len(leftovers)}; first run rc={rc}")


def drill_pidns_controller(env: Env, d: Drill) -> None:
    """A second control machine in another pid namespace of this kernel (``unshare --pid --fork
    --mount-proc``: a container with this machine's machine id and boot id, as CI runners are)
    deploys d3 while this one holds its run lock. The holder's pid means nothing in that
    namespace (it looks dead there), so the lock must not be taken over as stale: the second is
    refused as busy, naming the holder, and changes nothing."""
    host = "d3"
    repo_id = env.repo("pidns", shards=2)
    env.hub_config(rate_bps=300_000)  # ~7 s of download: the lock is held while the second starts
    inv = env.inventory({host: env.settings(repo_id)})
    a = Run(env, env.argv(inv, [host], deploy=LOCKED_DEPLOY))
    lock = "cat /var/lib/specfleet/run.lock 2>/dev/null"
    check(wait_until(lambda: f'"pid": {a.proc.pid},' in env.sh(host, lock).stdout, 300),
          f"the first run never held the lock: {a.out[-1500:]}")
    unshare = ["unshare", "--pid", "--fork", "--mount-proc"]
    seen = subprocess.run([*unshare, "sh", "-c", f"test -e /proc/{a.proc.pid} || echo gone"],
                          capture_output=True, text=True, timeout=60).stdout.strip()
    check(seen == "gone", "the first run's pid is visible from the new pid namespace: no fault")
    b = Run(env, [*unshare, *env.argv(inv, [host], deploy=LOCKED_DEPLOY)])
    rb, ra = b.wait(600), a.wait(600)
    env.hub_config()
    check(b.started < a.ended, "the two runs did not overlap")
    check(rb != 0 and "another specfleet run holds this host" in b.out,
          f"the second control machine was not refused as busy (rc {rb}): {b.out[-2000:]}")
    check(f"pid {a.proc.pid} on machine" in b.out,
          f"the refusal does not name the holder (pid {a.proc.pid}): {b.out[-1500:]}")
    check(not changed(b.out, host), f"the refused run changed {host}: {b.out[-2000:]}")
    check(ra == 0 and changed(a.out, host) and "lost the run lock" not in a.out,
          f"the holder did not finish its deploy under its lock (rc {ra}): {a.out[-2000:]}")
    env.converged(host, repo_id)
    d.detail = f"pid {a.proc.pid} held the lock; the run in another pid namespace was refused"


# A key with spaces and both quotes (and a backslash): the settings refuse it, yet one may reach
# a host's key file some other way (written by hand, an older deploy); whatever shows it, no log
# reader may. Each piece is marked XK so that a leak of any piece shows.
HOSTILE_KEY = "sk drill \"XK1\" 'XK2' \\XK3 XK4"
# Run on the host under systemd (so its output is the unit's journal): every log form of the
# key through the server's redacting formatter (tagged FORMATTED), then each form raw on stderr
# split over two lines, as a crash would print it before any formatter (tagged RAW).
REDACT_EMITTER = r"""
import json, logging.config, sys
folder, secret = sys.argv[1], sys.argv[2]
sys.path.insert(0, folder)
forms = json.load(open(folder + '/forms.json'))
logging.config.dictConfig({'version': 1, 'disable_existing_loggers': False,
    'formatters': {'f': {'()': 'specfleet_log_redact.RedactingFormatter',
                         'fmt': 'FORMATTED %(message)s', 'secret_files': [secret]}},
    'handlers': {'h': {'class': 'logging.StreamHandler', 'formatter': 'f',
                       'stream': 'ext://sys.stdout'}},
    'root': {'level': 'INFO', 'handlers': ['h']}})
for form in forms:
    logging.getLogger('sglang').info(form)
sys.stdout.flush()
for form in forms:
    half = len(form) // 2
    sys.stderr.write('RAW ' + form[:half] + '\n')
    sys.stderr.flush()
    sys.stderr.write(form[half:] + '\n')
    sys.stderr.flush()
"""


def drill_key_every_form(env: Env, d: Drill) -> None:
    """A key with spaces and quotes: refused by the settings with a clear error; and where such
    a key is in a host's key file, every log form of it (SGLang's ServerArgs, JSON, argv, env
    names, bearer headers, JSON inside JSON, each split over two journal lines) is found by none
    of the readers: the server's formatter, the readiness gate's journal excerpt and
    ``specfleet logs``. The raw lines are in the journal (the fault is real) and the readers saw
    them (their output holds as many <redacted>)."""
    from operations.readiness import gate_source
    from specfleet.core.errors import SettingsError
    from specfleet.core.settings import settings_from_dict
    from specfleet.core.unit import secret_yaml
    from specfleet.fleet.monitoring import logs_command
    from tests.unit.test_redaction import forms

    host = "d3"
    try:
        settings_from_dict({"api_key": HOSTILE_KEY}, host=host)
        check(False, "the settings accepted a key with spaces")
    except SettingsError as e:
        said = str(e)
        check(host in said and "api_key" in said and "fix:" in said and "XK" not in said,
              f"the refusal does not name host, key and fix, or shows the key: {said}")
    unit = f"drill-redact-{os.getpid() % 100000}"
    folder, secret = f"/run/{unit}", f"/etc/specfleet/secrets/{unit}.yaml"
    lines = forms(HOSTILE_KEY)
    env.sh(host, f"umask 077; mkdir -p {folder} /etc/specfleet/secrets", timeout=60)
    env.fleet.put(host, REPO / "specfleet" / "hostside" / "specfleet_log_redact.py",
                  f"{folder}/specfleet_log_redact.py")
    env.fleet.run(host, f"umask 077; cat > {folder}/forms.json", input=json.dumps(lines))
    # The key file as a deploy writes it (serving.secret_yaml), the key never on a command line.
    env.fleet.run(host, f"umask 077; cat > {secret}", input=secret_yaml(HOSTILE_KEY))
    env.fleet.run(host, f"cat > {folder}/emit.py", input=REDACT_EMITTER)
    try:
        ran = env.sh(host, f"systemd-run --quiet --wait --unit={unit} /usr/bin/python3 "
                           f"{folder}/emit.py {folder} {secret}", timeout=120)
        check(ran.returncode == 0, f"the emitter failed: {ran.stderr[-500:]}")
        journal = env.sh(host, f"journalctl --no-pager -o cat -u {unit}.service").stdout
        formatted = [ln for ln in journal.splitlines() if ln.startswith("FORMATTED ")]
        check(len(formatted) == len(lines), f"{len(formatted)} of {len(lines)} formatted lines "
              "in the journal")
        check(not any("XK" in ln for ln in formatted),
              f"the server's formatter let the key through: "
              f"{[ln for ln in formatted if 'XK' in ln][:2]}")
        raw = [ln for ln in journal.splitlines() if "XK" in ln and not ln.startswith("FORMATTED")]
        check(len(raw) >= len(lines), "the raw split lines are not in the journal: no fault")
        # The readiness gate's journal excerpt, as a host runs it (stdin: the shipped source).
        gate = env.fleet.run(host, f"python3 - --unit {unit}.service --journal-since 0 "
                                   f"--journal-lines 1000 --secret-file {secret}",
                             input=gate_source(), timeout=120)
        check(gate.returncode == 0 and gate.stdout.count("| ") >= 3 * len(lines),
              f"the gate's excerpt is short: {gate.stdout[-500:]} {gate.stderr[-500:]}")
        check("XK" not in gate.stdout, "the gate's journal excerpt shows the key: "
              f"{[ln for ln in gate.stdout.splitlines() if 'XK' in ln][:2]}")
        # ``specfleet logs``: its own command, run on the host as it runs it.
        command = logs_command(settings_from_dict({"service_name": unit}, host=host), 1000, None)
        logs = env.sh(host, command, timeout=120)
        check(logs.returncode == 0 and logs.stdout.count("<redacted>") >= len(lines),
              f"specfleet logs printed too little: {logs.stdout[-500:]} {logs.stderr[-300:]}")
        check("XK" not in logs.stdout, "specfleet logs shows the key: "
              f"{[ln for ln in logs.stdout.splitlines() if 'XK' in ln][:2]}")
    finally:
        env.sh(host, f"rm -rf {folder} {secret}; systemctl reset-failed {unit} 2>/dev/null; true")
    d.detail = (f"{len(lines)} forms x (formatted, raw split over 2 lines): none in the "
                "formatter's, the gate's or specfleet logs' output")


# Per kind (settings, host facts): hypothesis tries at least this many of each, so that the two
# kinds together pass the 300 the suite's line promises (the runs gave 2 x 150 -> 307, 319).
BAD_INPUT_EXAMPLES = 200


def drill_bad_inputs(env: Env, d: Drill) -> None:
    from tests.unit.test_bad_inputs import run_generated

    tried, failures = run_generated(examples=BAD_INPUT_EXAMPLES)
    env.bad_inputs = tried
    check(tried >= 300, f"only {tried} bad inputs were tried")
    check(not failures, f"{len(failures)} bad inputs gave no clear error: {failures[:3]}")


DRILLS = [
    Drill("ctl-kill-deploy", "control machine SIGKILLed mid-download", "d2 (pyinfra)",
          "download unit outlives pyinfra; re-run converges; no shard fetched twice",
          drill_kill_controller_deploy, "before 'weights: detached, resumable downloads'"),
    Drill("reboot-mid-download", "host power-cut and rebooted mid-download", "d1 (persistent)",
          "boot id changed; verified shards kept, not fetched again; re-run converges",
          drill_reboot_mid_download,
          "c51bb1c^: no persistent host disk, no Fleet.reboot (the drill cannot run)"),
    Drill("disk-full", "disk filled mid-download", "d1 /srv/models",
          "clear ENOSPC error, no traceback; re-run after freeing converges, no refetch",
          drill_disk_full, "993c195^: a full disk was reported as a slow link"),
    Drill("hub-timeout", "hub stops answering mid-file", "stand-in hub (stall)",
          "STALL in the hub log; watchdog retries; converges; hashes", drill_hub_knob(
              "stall", "STALL", "stall"), "before the stall watchdog"),
    Drill("hub-truncated", "hub closes the connection half-way", "stand-in hub (truncate)",
          "TRUNCATE in the hub log; resumes; hashes match the hub", drill_hub_knob(
              "truncate", "TRUNCATE", "trunc"), "a download that trusts the byte count"),
    Drill("hub-corrupt", "hub serves a shard with a flipped byte", "stand-in hub (corrupt)",
          "CORRUPT in the hub log; sha256 catches it; converges", drill_hub_knob(
              "corrupt", "CORRUPT", "corrupt"), "before LFS sha256 verification"),
    Drill("hostile-listing", "hub lists ../, absolute, backslash, newline names", "d2",
          "clear 'not safe' error; nothing created outside the revision folder",
          drill_hostile_listing, "43bc2c8^: Hub file names unchecked"),
    Drill("sglang-killed", "server SIGKILLed after ready", "d3 (unit main pid)",
          "re-run starts it again; healthy; no traceback", drill_sglang_killed,
          "c39195d^: auto-restart counted as running, No changes, nothing serving"),
    Drill("gate-timeout", "server never ready", "d3 readiness gate",
          "fails after its 5 s budget naming readiness_timeout_s; next run converges",
          drill_gate_timeout, "8b23489^ (a failed gate's loading server restarted on every run)"),
    Drill("two-controllers", "two control machines deploy one host at once", "d3 from here + c2",
          "runs overlap; one changes d3, the other is refused as busy naming the first and "
          "changes nothing; a third run changes nothing", drill_two_controllers,
          "a deploy without the run lock (this drill's form in 914541e): both change d3"),
    Drill("ctl-kill-rollout", "rollout controller SIGKILLed mid-canary", "d2, d3",
          "rerun of a failing change rolls the canary back to the server of before; d3 untouched",
          drill_kill_rollout,
          "2f6088d (before #19): a re-run snapshots the killed run's half state"),
    Drill("ctl-kill-patch", "control machine SIGKILLed during the PR#20547 apply (3 points)",
          "d3 SGLang venv", "apply begun, never marked done; re-run ends fully patched (tree of "
          "an uninterrupted apply), then changes nothing; removal gives RECORD back",
          drill_kill_patch, "58140e9 (before b43d9d6): after a kill at 'patching' the re-run "
          "calls the port built in and leaves SGLang unpatched"),
    Drill("fanout-peer-cut", "fan-out peer's link cut mid-copy", "d2 (seed) -> d3",
          "a partial copy in flight at the cut; the receiver gives up on the peer, takes the rest "
          "from the hub; nothing unverified recorded; re-run converges, no file sent twice, no "
          "fan-out sshd or key left", drill_fanout_peer_cut,
          "the pull's ssh without keepalives (ServerAliveInterval=0): the fan-out hangs on "
          "the cut link"),
    Drill("pidns-controller", "a second control machine in another pid namespace (same "
          "machine id and boot id) deploys a host whose lock is held", "d3 from here + unshare",
          "refused as busy naming the holder's pid; changes nothing; the holder converges",
          drill_pidns_controller,
          "c37640b^: the holder's pid looks dead there, its live lock is taken over as stale"),
    Drill("key-every-form", "an API key with spaces and quotes in every log form, also split "
          "over two journal lines", "d3 journal", "settings refuse it (host, key, fix); the "
          "server's formatter, the gate's excerpt and specfleet logs show no piece of it",
          drill_key_every_form,
          "48fd89f: the key leaks in part (spaces, patterns before the key, split lines)"),
    Drill("bad-inputs", "generated bad settings and facts (hypothesis)", "control machine",
          ">=300 inputs, each a SpecfleetError naming problem and fix", drill_bad_inputs,
          "978a0ca^: no generated bad inputs"),
]


def boot(name: str, keep: bool) -> Fleet:
    specs = [HostSpec("d1", gpu="h200x2", disk="24M", persistent=True),
             HostSpec("d2", gpu="h200x2", disk="1G"), HostSpec("d3", gpu="h200x2", disk="1G"),
             HostSpec("c2", disk="64M")]
    # Reaped by the next fleet's boot once this process is gone, unless it is to be kept.
    return Fleet.up(name, specs, owner_pid=None if keep else os.getpid())


# Git-ignored top-level folders the second controller needs: the venv (its scripts name this
# path) and the editable install's metadata.
CONTROLLER_KEEPS = {".venv", "specfleet.egg-info"}


def ignored_top_level() -> set[str]:
    """The checkout's git-ignored top-level entries (build outputs: the GPU lab's parts in
    build/ and .carryN are gigabytes), which c2's 64M disk cannot take."""
    out = subprocess.run(["git", "-C", str(REPO), "status", "--ignored", "--porcelain"],
                         capture_output=True, text=True)
    return {line[3:].rstrip("/") for line in out.stdout.splitlines()
            if line.startswith("!! ") and "/" not in line[3:].rstrip("/")} - CONTROLLER_KEEPS


def prepare_controller(env: Env) -> None:
    """c2 becomes a second control machine: this checkout and its venv at the same path (the
    venv's scripts name it), the fleet's key, and a machine id of its own (systemd made it)."""
    tar = env.work / "checkout.tar"
    skip = {f"{str(REPO).lstrip('/')}/{name}" for name in ignored_top_level()}
    with tarfile.open(tar, "w") as t:
        t.add(REPO, arcname=str(REPO).lstrip("/"), filter=lambda i: None if i.name in skip or any(
            p in i.name for p in ("/.git/", "/__pycache__", ".ruff_cache", ".pytest_cache"))
            else i)
    env.fleet.put("c2", tar, "/tmp/checkout.tar")
    env.sh("c2", f"tar -C / -xf /tmp/checkout.tar && rm /tmp/checkout.tar && mkdir -p "
                 f"{env.fleet.dir} && mkdir -p {env.work}", timeout=300)
    env.fleet.put("c2", env.fleet.key_path, str(env.fleet.key_path))
    env.sh("c2", f"chmod 600 {env.fleet.key_path}")



# A server's journal line quoted by the gate or an operation's error ("| ...", after pyinfra's
# "[host] "): the server's own traceback (SGLang dies on a taken port with one), not specfleet's.
_JOURNAL_QUOTE = re.compile(r"^\s*(\[[^\]]+\]\s*)?\| ")


def specfleet_tracebacks(output: str) -> int:
    """``Traceback`` lines in a controller's output, journal lines it quotes left out."""
    return sum(1 for line in output.splitlines()
               if "Traceback" in line and not _JOURNAL_QUOTE.match(line))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.drills.run", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--only", help="comma-separated drill names")
    ap.add_argument("--keep", action="store_true", help="leave the fleet up")
    ap.add_argument("--fleet", help="use this fleet of an earlier --keep run (not torn down)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    DRILLS.extend(d for d in [*HOSTILE_DRILLS, BROKEN_VERIFY, *SECURITY_DRILLS]
                  if d.name not in {x.name for x in DRILLS})
    drills = [d for d in DRILLS if not a.only or d.name in a.only.split(",")]
    if a.list:
        for d in DRILLS:
            print(f"{d.name:20} {d.fault}")
        return 0
    os.environ["SPECFLEET_ALLOW_TEST_SETTINGS"] = "1"
    print(stamp_line("drills"), flush=True)
    work = Path(f"/var/tmp/specfleet-drills-{os.getpid()}")
    work.mkdir(parents=True)
    print(f"drills: work folder {work} (each controller's output in output-NNN.txt)", flush=True)
    fleet = Fleet.attach(a.fleet) if a.fleet else boot(f"drills-{os.getpid() % 100000}", a.keep)
    a.keep = a.keep or bool(a.fleet)
    rows: list[Row] = []
    try:
        env = Env(fleet, work)
        env.bad_inputs = 0
        hosts = list(fleet.hosts)
        for h in hosts:
            fleet.run(h, "mkdir -p /opt/specfleet-standin /run/standin", check=True)
            fleet.put(h, REPO / "tests" / "harness" / "standin_sglang_server.py", STANDIN)
        env.start_recorders(hosts)
        seen_leaks: set[str] = set()
        if any(d.name == "two-controllers" for d in drills):
            prepare_controller(env)
        for d in drills:
            t0, n_out = time.monotonic(), len(env.outputs)
            try:
                d.run(env, d)
                result = "survived"
            except ExpectedFailure as e:
                result = f"expected-fail {d.known_issue}: {e}"
            except DrillFailed as e:
                result = f"FAILED: {e}"
            except Exception as e:  # a drill's own bug is a failed drill, shown whole
                result = f"FAILED (drill error): {e!r} {traceback.format_exc()[-800:]}"
            tb = sum(specfleet_tracebacks(o) for o in env.outputs[n_out:])
            if tb and result == "survived":
                result = f"FAILED: {tb} traceback(s) in the output"
            # Leaks after each drill, so that a leak is the drill's that caused it.
            new_leaks = [x for x in env.leaks(hosts) if x.split(" (")[0] not in seen_leaks]
            seen_leaks.update(x.split(" (")[0] for x in new_leaks)
            if new_leaks and result == "survived":
                result = f"FAILED: leaked: {'; '.join(new_leaks)}"
            if d.detail and result == "survived":
                result = f"survived ({d.detail})"
            row = Row(d, result, time.monotonic() - t0, tracebacks=tb)
            rows.append(row)
            print(f"| {d.name} | {d.fault} | {d.where} | {d.checked} | {result[:300]} | "
                  f"{row.seconds:.0f}s |", flush=True)
        lost = env.refetched()
        for h in ("d1", "d2", "d3"):
            if env.sh(h, f"test -d {VENV}").returncode == 0:
                lost += env.record_mismatches(h)
        leaks = env.leaks(hosts)
        survived = sum(r.result.startswith("survived") for r in rows)
        print("\n| drill | fault | where | checked | result | time | fails on |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r.drill.name} | {r.drill.fault} | {r.drill.where} | {r.drill.checked} | "
                  f"{r.result[:200]} | {r.seconds:.0f}s | {r.drill.fails_on} |")
        for what in lost:
            print(f"lost: {what}")
        for what in leaks:
            print(f"leak: {what}")
        print(f"drills: survived={survived}/{len(rows)} lost={len(lost)} leaks={len(leaks)} "
              f"tracebacks={sum(r.tracebacks for r in rows)} bad_inputs={env.bad_inputs} "
              f"({stamp()})", flush=True)
        return 0 if survived == len(rows) and not lost and not leaks else 1
    finally:
        if "env" in locals():
            env.hub.stop()
        if a.keep:
            print(f"left running: python -m tests.fleet down --name {fleet.name}", flush=True)
        else:
            fleet.down()


if __name__ == "__main__":
    sys.exit(main())
