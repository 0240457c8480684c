"""Benchmark: re-running `deploys/kimi_k26.py` on a converged fleet, over ~50 ms of RTT.

Usage (as root, from the repository root):

    .venv/bin/python bench/converged/run.py [--hosts 32] [--runs 3] [--delay-ms 25] [--keep|--reuse]

1. Boots the demo fleet (``tests.demo``: real Debian hosts, the stand-in hub and SGLang server)
   with N hosts named ``p1..pN`` (GPU profiles h100x8, b200x8, rtx6000x8 in turn) as fleet
   ``perf``, and converges it once with ``pyinfra -y`` over the direct (fast) link.
2. Puts a delaying TCP relay (``bench/converged/relay.py``) in front of each host's sshd: every
   chunk is held ``--delay-ms`` (25) each way, so about 50 ms of round-trip time (this kernel has
   no ``netem``). A benchmark inventory points ``ssh_hostname``/``ssh_port`` at the relays.
3. For 1, 8, 16 and N hosts (``--limit``; ``--sizes``), side by side in one run, ``--runs``
   times interleaved: the time of a converged ``pyinfra -y INV deploys/kimi_k26.py`` and of
   ``pyinfra -y INV exec -- true``, and the CPU seconds of each pyinfra process and its children
   on the control machine (``wait4``'s rusage: not the hosts'), per host; ``ratio`` is of the
   wall-time medians, ``cpu_ratio`` of the CPU medians. Every deploy run must report no change,
   or the benchmark fails. The tree is byte-compiled first, as ``pip install`` does. A third
   run each time, ``bench/converged/noop_ops.py`` (stock pyinfra, 15 operations that do
   nothing), is the reference for what pyinfra itself needs for that many operations.
4. SSH commands per host in a converged run, from one extra run with ``--debug``: each
   ``Running command on HOST`` line (one remote process started: an exec channel) plus each
   ``Attempting upload`` (an SFTP channel). The same counter on ``exec -- true`` must give 1.

The machine's 2 CPUs are shared with other fleets, so by default what is measured runs at nice
-10 (``--nice``): this process with pyinfra and the relays, and each host's sshd with every
command it starts; ``--nice 0`` measures without it. Times are medians of ``--runs``; the minima
are printed too.

It prints a table, and the last line ``converged: ratio=R.RR commands_per_host=N hosts=H
rtt_ms=M cpu_ratio=C.CC vs_noop=V.VV (commit C, DATE)`` for the largest fleet (``bench/stamp.py``;
``vs_noop``: the deploy's control CPU over the 15 no-op operations).
``--keep`` leaves the fleet and hub up (state in ``/run/specfleet-fleet/perf/bench.json``);
``--reuse`` attaches to them instead of booting, and restarts the stand-in hub on its old port.
``python -m tests.fleet down --name perf`` tears down.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench.converged.relay import Relays  # noqa: E402
from bench.stamp import stamp, stamp_line  # noqa: E402
from tests import demo as demo_mod  # noqa: E402
from tests.harness import (  # noqa: E402
    Fleet,
    HostSpec,
    weights_support,  # noqa: E402
)
from tests.harness.core import STATE_ROOT  # noqa: E402

FLEET = "perf"
PROFILES = ["h100x8", "b200x8", "rtx6000x8"]
PYINFRA = demo_mod.PYINFRA
DEPLOY = demo_mod.DEPLOY
# What stock pyinfra needs for as many operations as a converged deploy runs (the reference).
NOOP_OPS = str(Path(__file__).with_name("noop_ops.py"))
RUN_RE = re.compile(r"Running command on (\S+?):")
UPLOAD_RE = re.compile(r"Attempting upload of ")
MISS_RE = re.compile(r"fact cache miss on \S+: (.*)")
TOTAL_RE = re.compile(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)")


# The source tree pyinfra runs the deploy from (``--tree``: e.g. an export of an older commit).
TREE = REPO_ROOT


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_TOKEN"] = demo_mod.DEMO_TOKEN
    env.update(demo_mod.TEST_ENV)  # the demo's settings use test-only keys (launcher)
    if TREE != REPO_ROOT:
        # Ahead of the editable install of /work/main.
        env["PYTHONPATH"] = str(TREE)
    return env


def pyinfra_argv(inventory: Path, *args: str, limit: list[str] | None = None) -> list[str]:
    argv = [PYINFRA, "-y"]
    for name in limit or []:
        argv += ["--limit", name]
    return [*argv, str(inventory), *args]


def pyinfra(inventory: Path, *args: str, limit: list[str] | None = None,
            timeout: float = 900) -> tuple[float, subprocess.CompletedProcess]:
    argv = pyinfra_argv(inventory, *args, limit=limit)
    t, done, _ = pyinfra_timed(argv, timeout)
    return t, done


def pyinfra_timed(argv: list[str], timeout: float = 900,
                  ) -> tuple[float, subprocess.CompletedProcess, float]:
    """Wall seconds, the finished process, and the CPU seconds (user + system) of the pyinfra
    process and every child it waited for: ``wait4``'s rusage of that one process tree, on the
    control machine only (the hosts' work runs in their own containers, not below it)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=TREE, env=_env(), stdout=out, stderr=err, text=True)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())
    return wall, done, usage.ru_utime + usage.ru_stime


def changes(out: str) -> int | None:
    """The results table's change count (its "Success" column), None if there is no table."""
    m = TOTAL_RE.search(out)
    if not m:
        return None
    return 0 if m.group(2) == "-" else int(m.group(2))


def count_commands(debug_output: str, hosts: list[str]) -> dict[str, float]:
    """Remote processes started per host, from ``--debug`` output."""
    per = {h: 0.0 for h in hosts}
    for m in RUN_RE.finditer(debug_output):
        if m.group(1) in per:
            per[m.group(1)] += 1
    # Upload lines do not name the host: share them out evenly.
    uploads = len(UPLOAD_RE.findall(debug_output))
    for h in per:
        per[h] += uploads / len(hosts)
    return per


def _fail(what: str, done: subprocess.CompletedProcess) -> RuntimeError:
    tail = (done.stdout + done.stderr)[-4000:]
    return RuntimeError(f"{what} failed (exit {done.returncode}):\n{tail}")


def boot(n: int, keep: bool) -> demo_mod.Demo:
    specs = [HostSpec(f"p{i + 1}", gpu=PROFILES[i % len(PROFILES)], disk="64G") for i in range(n)]
    print(f"==> booting fleet {FLEET!r}: {n} hosts", flush=True)
    demo = demo_mod.up(FLEET, specs)
    if keep:
        (STATE_ROOT / FLEET / "bench.json").write_text(json.dumps({
            "workdir": str(demo.workdir), "revisions": demo.revisions, "hub_port": demo.hub.port,
            "hub_epoch": demo.hub.epoch,
        }))
    print("==> converging it once (direct link)", flush=True)
    t, done = pyinfra(demo.inventory, DEPLOY)
    if done.returncode:
        raise _fail("the converging run", done)
    print(f"    first run: {t:.1f} s, {changes(done.stdout + done.stderr)} changes", flush=True)
    return demo


def reattach() -> demo_mod.Demo:
    saved = json.loads((STATE_ROOT / FLEET / "bench.json").read_text())
    fleet = Fleet.attach(FLEET)
    workdir = Path(saved["workdir"])
    with mock.patch.object(weights_support, "free_port", lambda ip: saved["hub_port"]):
        hub = weights_support.StandinHub(workdir / "mirrors", fleet.bridge_ip, workdir)
    import hashlib

    hub.epoch = saved["hub_epoch"] - 1
    token_hash = hashlib.sha256(demo_mod.DEMO_TOKEN.encode()).hexdigest()
    hub.configure(gated={demo_mod.DRAFTER: [token_hash]})
    hub.wait(demo_mod.TARGET)
    demo = demo_mod.Demo(fleet, hub, workdir, saved["revisions"])
    demo.write_inventory()
    return demo


def compile_tree(tree: Path) -> None:
    """Byte-compile the project's packages, as ``pip install`` does: pyinfra's CLI turns
    ``sys.dont_write_bytecode`` on, so a deploy run from a source tree would otherwise compile
    every module of ours on every run, and the bare exec it is compared with loads pyinfra's
    compiled modules from site-packages. (Deploy files are run by path and never cached.)"""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "operations", "facts", "specfleet"],
                   cwd=tree, check=True, stdout=subprocess.DEVNULL)


def prioritise(fleet: Fleet, nice: int) -> None:
    """The machine's CPUs are shared with other fleets: give what is measured, on both sides, the
    same head start, so that the ratio is less about the neighbours' load. Each host's listening
    sshd passes its nice value on to every session and command it starts."""
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    for name in fleet.hosts:
        fleet.run(name, f"renice -n {nice} -p $(pgrep -o -x sshd) >/dev/null", check=True)


def bench_inventory(demo: demo_mod.Demo, relays: Relays) -> Path:
    path = demo.workdir / "bench_inventory.py"
    host_data = {
        h: {"specfleet": demo.settings(h), "ssh_hostname": "127.0.0.1",
            "ssh_port": relays.ports[h]}
        for h in demo.fleet.hosts
    }
    demo.fleet.write_inventory(path, host_data=host_data)
    return path


def settle(inv: Path, hosts: list[str]) -> None:
    """An untimed deploy run, so that the timed ones find the hosts converged (the working tree
    may have changed since the fleet converged: another agent source, another template)."""
    _, done = pyinfra(inv, DEPLOY, limit=hosts)
    if done.returncode:
        raise _fail("the settling deploy run", done)


def measure(inv: Path, hosts: list[str], runs: int) -> dict:
    t_exec, t_deploy, cpu_exec, cpu_deploy, cpu_noop = [], [], [], [], []
    settle(inv, hosts)
    retries = 2
    while len(t_deploy) < runs:
        t, done, cpu = pyinfra_timed(pyinfra_argv(inv, "exec", "--", "true", limit=hosts))
        if done.returncode:
            raise _fail("exec -- true", done)
        t_exec.append(t)
        cpu_exec.append(cpu)
        t, done, cpu = pyinfra_timed(pyinfra_argv(inv, DEPLOY, limit=hosts))
        out = done.stdout + done.stderr
        if done.returncode or changes(out) != 0:
            if done.returncode == 0 and retries:
                retries -= 1
                print(f"    a timed run changed {changes(out)} things: not converged, again",
                      flush=True)
                t_exec.pop()
                cpu_exec.pop()
                continue
            raise _fail(f"converged deploy (changes={changes(out)})", done)
        t_deploy.append(t)
        cpu_deploy.append(cpu)
        _, done, cpu = pyinfra_timed(pyinfra_argv(inv, NOOP_OPS, limit=hosts))
        if done.returncode:
            raise _fail("the no-op reference deploy", done)
        cpu_noop.append(cpu)
    _, done = pyinfra(inv, "--debug", "exec", "--", "true", limit=hosts)
    exec_cmds = count_commands(done.stdout + done.stderr, hosts)
    _, done = pyinfra(inv, "--debug", DEPLOY, limit=hosts)
    if done.returncode:
        raise _fail("converged deploy (--debug)", done)
    deploy_cmds = count_commands(done.stdout + done.stderr, hosts)
    # Facts the run's probe (facts.cache, operations/probe.py) did not answer on a clean host.
    misses = sorted({m.group(1) for m in MISS_RE.finditer(done.stdout + done.stderr)})
    for miss in misses:
        print(f"    asked live (not in the probe): {miss}", flush=True)
    n = len(hosts)
    return {
        "hosts": n,
        "exec_s": statistics.median(t_exec),
        "deploy_s": statistics.median(t_deploy),
        "ratio": statistics.median(t_deploy) / statistics.median(t_exec),
        "exec_cpu_per_host": statistics.median(cpu_exec) / n,
        "deploy_cpu_per_host": statistics.median(cpu_deploy) / n,
        "cpu_ratio": statistics.median(cpu_deploy) / statistics.median(cpu_exec),
        "noop_cpu_per_host": statistics.median(cpu_noop) / n,
        # The target: at or below stock pyinfra's CPU for as many no-op operations.
        "vs_noop": statistics.median(cpu_deploy) / statistics.median(cpu_noop),
        "all_noop_cpu_s": cpu_noop,
        "exec_cmds": max(exec_cmds.values()),
        "deploy_cmds": max(deploy_cmds.values()),
        "all_exec_s": t_exec,
        "all_deploy_s": t_deploy,
        "all_exec_cpu_s": cpu_exec,
        "all_deploy_cpu_s": cpu_deploy,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each, medians")
    ap.add_argument("--delay-ms", type=float, default=25.0, help="hold per chunk, each way")
    ap.add_argument("--sizes", default="", help="fleet sizes to measure (default 1,8,16,HOSTS)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--nice", type=int, default=-10,
                    help="nice value for what is measured: this process (pyinfra, the relays) "
                    "and each host's sshd (what it starts); 0 leaves priorities alone")
    ap.add_argument("--tree", type=Path, default=REPO_ROOT,
                    help="run the deploy from this source tree (git archive COMMIT | tar -x -C "
                    "DIR), e.g. to measure a baseline next to the working tree")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--keep", action="store_true", help="leave the fleet up afterwards")
    group.add_argument("--reuse", action="store_true", help="use the fleet left by --keep")
    a = ap.parse_args(argv)
    global TREE
    TREE = a.tree.resolve()
    # A plain `kill` still tears down (the fleet, the hub, the relays).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = ([int(s) for s in a.sizes.split(",")] if a.sizes
             else sorted({s for s in (1, 8, 16) if s < a.hosts} | {a.hosts}))
    print(stamp_line("converged"), flush=True)
    compile_tree(TREE)
    demo = reattach() if a.reuse else boot(a.hosts, a.keep)
    relays = None
    try:
        hosts = list(demo.fleet.hosts)
        if a.nice:
            prioritise(demo.fleet, a.nice)
        relays = Relays({h: (ip, 22) for h, ip in demo.fleet.hosts.items()},
                        delay_ms=a.delay_ms).start()
        inv = bench_inventory(demo, relays)
        rtt_ms = int(round(2 * a.delay_ms))
        print(f"==> relays: {relays.ports} (+{a.delay_ms:g} ms each way); inventory {inv}; "
              f"deploy from {TREE}; nice {a.nice}", flush=True)
        rows = []
        for n in sizes:
            row = measure(inv, hosts[:n], a.runs)
            rows.append(row)
            print(f"    {n} hosts: exec {row['all_exec_s']}, deploy {row['all_deploy_s']}",
                  flush=True)
        print()
        print("| hosts | RTT ms | exec -- true s (median, min) | converged deploy s (median, min) "
              "| ratio of medians | control CPU s/host exec | control CPU s/host deploy "
              "| cpu_ratio | control CPU s/host, 15 no-op operations (stock pyinfra) "
              "| vs_noop | commands/host exec | commands/host deploy |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['hosts']} | {rtt_ms} | {r['exec_s']:.2f}, {min(r['all_exec_s']):.2f} | "
                  f"{r['deploy_s']:.2f}, {min(r['all_deploy_s']):.2f} | {r['ratio']:.2f} | "
                  f"{r['exec_cpu_per_host']:.3f} | {r['deploy_cpu_per_host']:.3f} | "
                  f"{r['cpu_ratio']:.2f} | {r['noop_cpu_per_host']:.3f} | {r['vs_noop']:.2f} | "
                  f"{r['exec_cmds']:g} | "
                  f"{r['deploy_cmds']:g} |")
        if a.json:
            a.json.write_text(json.dumps({"rtt_ms": rtt_ms, "rows": rows}, indent=1))
        last = rows[-1]
        print(f"converged: ratio={last['ratio']:.2f} commands_per_host={last['deploy_cmds']:g} "
              f"hosts={last['hosts']} rtt_ms={rtt_ms} cpu_ratio={last['cpu_ratio']:.2f} "
              f"vs_noop={last['vs_noop']:.2f} "
              f"({stamp()})")
        return 0
    finally:
        if relays:
            relays.stop()
        if a.nice:
            prioritise(demo.fleet, 0)
        if a.keep or a.reuse:
            demo.hub.stop()
            print(f"==> fleet left up: python -m tests.fleet down --name {FLEET}", flush=True)
        else:
            demo.down()


if __name__ == "__main__":
    sys.exit(main())
