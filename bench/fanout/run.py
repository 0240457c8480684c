"""Benchmark of the fan-out: N hosts (4 by default, 16 for issue #23), one upstream link limited
with ``tc ... tbf``.

The stand-in hub (tests/harness/standin_hub.py) runs in a network namespace of its own, joined
to the fleet's bridge by a veth pair; ``tc qdisc ... tbf`` on that veth limits the **upstream** link
(hub -> fleet) to 100 Mbit/s for every host together, while the LAN between the hosts (the
bridge) runs at full speed. The test model is a git repository of random bytes in the hub's
mirror (>= 500 MB, 32 MB shards, on disk); each host's models disk is a tmpfs.

Runs (the weights tools and the small drafter are installed first, everywhere, untimed):
1. single: one host fetches the model (the weights-only deploy);
2. fleet, no fan-out: the N hosts each fetch it from upstream (the same deploy on all); it takes
   about N times the single run (at 16 hosts ~11 minutes), so it runs only with ``--baseline``,
   the default up to 4 hosts;
3. fleet, fan-out: ``specfleet.fleet.fanout.run_prefetch`` (seed from upstream, peers from peers).
Each time is the whole pyinfra run, until every host has verified weights (manifest written,
``current`` flipped). Upstream bytes are counted from the hub's log: each GET of a file, times
the file's size. Between runs the model is removed from every host.

Usage (as root, from the repository root):
    .venv/bin/python bench/fanout/run.py [--hosts 4] [--mb 512] [--baseline|--no-baseline]
After the fan-out run, each peer's pull is profiled from its progress file (when its pull
started and ended, its depth in the tree). The last line is
``fanout: upstream_bytes/model=U.UU fleet/single=F.FF hosts=N (commit C, DATE)``.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()  # it drives the fan-out controller in this process, as `specfleet fanout` does

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NamedTuple  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench.stamp import stamp, stamp_line  # noqa: E402
from specfleet.fleet.fanout import run_prefetch  # noqa: E402
from specfleet.fleet.pyinfra_run import run_pyinfra  # noqa: E402
from tests.harness import Fleet, HostSpec  # noqa: E402
from tests.harness.weights_support import (  # noqa: E402
    commit_files,
    git,
    inventory,
    random_bytes,
    settings_data,
    wait_http,
)

LINK_MBIT = 100
# The "fleet, no fan-out" run by default only up to this many hosts (it takes ~N x single).
BASELINE_MAX_HOSTS = 4
WEIGHTS_ONLY = str(Path(__file__).with_name("weights_only.py"))
SHARD = 32_000_000
# The target: the fleet's time over one host's, at most.
TARGET_FLEET_OVER_SINGLE = 1.3


class Row(NamedTuple):
    """One timed run: its time, the bytes served upstream, the CPU seconds it used."""

    label: str
    hosts: int
    seconds: float
    upstream: int
    load_at: str
    control_cpu: float
    hosts_cpu: float
    hub_cpu: float

    @property
    def cpu(self) -> float:
        return self.control_cpu + self.hosts_cpu + self.hub_cpu


def make_repo(mirrors: Path, repo_id: str, files: dict[str, bytes]) -> str:
    repo = mirrors / "models" / repo_id
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for k, v in (("user.email", "bench@specfleet"), ("user.name", "bench"),
                 ("core.looseCompression", "1")):
        git(repo, "config", k, v)
    return commit_files(mirrors, repo_id, files)


class LimitedHub:
    """The stand-in hub in its own netns, its link to the fleet bridge limited with tbf."""

    def __init__(self, fleet: Fleet, mirrors: Path, work: Path, mbit: int):
        tag = str(os.getpid() % 100000)
        self.ns, self.veth = f"fobench-hub-{tag}", f"fobh{tag}"
        self.ip = fleet.bridge_ip.rsplit(".", 1)[0] + ".250"
        self.port = 8080
        self.url = f"http://{self.ip}:{self.port}"
        self.log_path = work / "hub.log"
        cfg = work / "hub-config.json"
        cfg.write_text(json.dumps({"lfs": ["*.safetensors"]}))
        run = lambda *a: subprocess.run(a, check=True, capture_output=True, text=True)  # noqa: E731
        run("ip", "netns", "add", self.ns)
        run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns",
            self.ns)
        run("ip", "link", "set", self.veth, "master", fleet.state["bridge"], "up")
        run("ip", "-n", self.ns, "link", "set", "lo", "up")
        run("ip", "-n", self.ns, "addr", "add", f"{self.ip}/24", "dev", "eth0")
        run("ip", "-n", self.ns, "link", "set", "eth0", "up")
        # The upstream limit: everything the hub sends, to all hosts together.
        run("ip", "netns", "exec", self.ns, "tc", "qdisc", "replace", "dev", "eth0", "root",
            "tbf", "rate", f"{mbit}mbit", "burst", "64kb", "latency", "400ms")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable,
             str(REPO_ROOT / "tests" / "harness" / "standin_hub.py"), "--root", str(mirrors),
             "--host",
             self.ip, "--port", str(self.port), "--config", str(cfg), "--log",
             str(self.log_path)],
            stdout=subprocess.DEVNULL, stderr=open(work / "hub.err", "w"),  # noqa: SIM115
        )

    def wait(self, repo_id: str) -> None:
        wait_http(f"{self.url}/api/models/{repo_id}/revision/main")

    def mark(self) -> int:
        return len(self.lines())

    def lines(self) -> list[str]:
        return self.log_path.read_text().splitlines() if self.log_path.exists() else []

    def upstream_bytes(self, since: int, sizes: dict[str, int], repo_id: str) -> int:
        total = 0
        for line in self.lines()[since:]:
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "GET" and f"/{repo_id}/resolve/" in parts[1] \
                    and parts[2] in ("200", "206"):
                total += sizes.get(parts[1].split("/resolve/", 1)[1].split("/", 1)[1], 0)
        return total

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


def proc_stats():
    """``(pid, program name, fields after the name)`` of each process's ``/proc/PID/stat``
    (``fields[1]`` is the parent, ``[11:15]`` utime stime cutime cstime, ``[19]`` starttime)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        head, tail = stat.rsplit(")", 1)
        yield int(entry.name), head.split("(", 1)[1], tail.split()


def tree_cpu(root_pid: int) -> float:
    """CPU seconds of a process tree so far: each live process's own time and that of the
    children it reaped (so every process that ended counts once, in its reaper's)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    for pid, _, fields in proc_stats():
        children.setdefault(int(fields[1]), []).append(pid)
        times[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total / tick


def program_label(pid: int, comm: str) -> str:
    """``comm``, and for a Python program its script and first word after it (``python
    fanout_agent.py pull``): the agents' verbs use the CPU differently."""
    if not comm.startswith("python"):
        return comm
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return comm
    args = argv[1:]
    while args and args[0].startswith("-") and args[0] != "-c":  # the interpreter's options
        args = args[1:]
    if args[:1] == ["-c"]:
        return f"{comm} -c"
    if args and args[0].endswith(".py"):
        return " ".join([comm, os.path.basename(args[0]), *args[1:2]])
    return comm


class CpuByProgram:
    """Samples, once a second while a run goes, the CPU time of every process of the fleet's
    hosts by program name (rsync, ssh, sshd, python3, ...): where the hosts' CPU goes. A process
    that lives less than a sample's interval is missed (its time shows in ``fleet_cpu`` only)."""

    def __init__(self, fleet: Fleet):
        import threading

        self.roots = [h["pid"] for h in fleet.state["hosts"].values() if h.get("pid")]
        self.seen: dict[tuple[int, str], tuple[str, int, int]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def sample(self) -> None:
        parent: dict[int, int] = {}
        info: dict[int, tuple[str, int, str]] = {}
        for pid, name, fields in proc_stats():
            parent[pid] = int(fields[1])
            # starttime tells a reused pid apart
            info[pid] = (name, int(fields[11]) + int(fields[12]), fields[19])
        roots = set(self.roots)
        for pid, (comm, ticks, start) in info.items():
            p, hops = pid, 0
            while p in parent and p not in roots and hops < 64:
                p, hops = parent[p], hops + 1
            if p in roots:
                known = self.seen.get((pid, start))
                label = known[0] if known else program_label(pid, comm)
                first = known[1] if known else ticks
                self.seen[(pid, start)] = (label, first, ticks)

    def loop(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(1.0)

    def __enter__(self) -> CpuByProgram:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def by_program(self) -> list[tuple[str, float]]:
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for comm, first, last in self.seen.values():
            out[comm] = out.get(comm, 0.0) + (last - first) / tick
        return sorted(((c, v) for c, v in out.items() if v >= 0.5), key=lambda x: -x[1])


def fleet_cpu(fleet: Fleet) -> float:
    """CPU seconds the fleet's hosts (every process of their containers) used so far: on this
    machine they share its CPUs with the control process, unlike a real fleet's."""
    return sum(tree_cpu(h["pid"]) for h in fleet.state["hosts"].values() if h.get("pid"))


def control_cpu() -> float:
    """CPU seconds of this process (pyinfra runs in it) and its reaped children."""
    import resource

    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cores() -> int:
    """The CPUs this process (and the fleet, the hub) may run on."""
    return len(os.sched_getaffinity(0))


def load() -> str:
    """The load averages (1, 5, 15 min): the machine is shared, so each run notes its load."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def timed(fn):
    t0 = time.monotonic()
    r = fn()
    return time.monotonic() - t0, r


def wipe(fleet: Fleet, dir_name: str) -> None:
    # daemon-reload: on these nspawn hosts a finished transient unit can stay loaded (its cgroup
    # kill fails with EIO), and the weights unit of the next run would then be refused.
    for h in fleet.hosts:
        fleet.run(h, f"rm -rf /srv/models/{dir_name} /var/lib/specfleet/fanout "
                  "/var/lib/specfleet/weights; systemctl daemon-reload", check=True)


def check_verified(fleet: Fleet, hosts, dir_name: str, rev: str) -> None:
    for h in hosts:
        m = json.loads(fleet.run(h, f"cat /srv/models/{dir_name}/{rev}/.specfleet/manifest.json",
                                 check=True).stdout)
        link = fleet.run(h, f"readlink /srv/models/{dir_name}/current").stdout.strip()
        if not (m["complete"] and m["revision"] == rev and link == rev):
            raise RuntimeError(f"{h}: no verified copy of {dir_name}@{rev}")


def step_ok(step, what: str) -> None:
    bad = {h: r.why for h, r in step.results.items() if not r.passed}
    if bad:
        raise RuntimeError(f"{what} failed: {bad}")


def seed_line(fleet: Fleet, host: str, dir_name: str, t0: float) -> list[str]:
    """When (seconds after the run started) the host's own download started and ended."""
    raw = fleet.run(host, f"cat /var/lib/specfleet/weights/{dir_name}.progress.json").stdout
    try:
        p = json.loads(raw)
    except ValueError:
        return [f"  {host:<4} no download progress file"]
    return [f"  {host:<4} download {(p.get('started_at') or 0) - t0:6.1f} -> "
            f"{(p.get('updated_at') or 0) - t0:6.1f} s ({p.get('state')})"]


def pull_profile(fleet: Fleet, plan: dict, dir_name: str, t0: float) -> list[str]:
    """One line per host of the target's swarm: its depth in the tree, its source, and when
    (seconds after the fan-out run started) its pull started, took its first file and ended."""
    swarm = next(sw for sw in plan["swarms"] if sw["which"] == "target")
    lines = []
    for i, h in enumerate(swarm["hosts"]):
        srcs = plan["hosts"][h]["models"]["target"]["sources"]
        depth = len(srcs)
        if i == 0:
            lines += seed_line(fleet, h, dir_name, t0)
            continue
        raw = fleet.run(h, f"cat /var/lib/specfleet/fanout/{dir_name}.pull.json").stdout
        try:
            p = json.loads(raw)
        except ValueError:
            lines.append(f"  {h:<4} depth {depth}: no progress file")
            continue
        start = p.get("started_at") or 0
        end = p.get("updated_at") or 0
        events = p.get("events") or []
        listed = [e["at"] for e in events if "to take from peers" in e["text"]]
        copied = [e["at"] for e in events if e["text"].startswith("every file of")]
        lines.append(f"  {h:<4} depth {depth} from {srcs[0]['host']:<4}: pull {start - t0:6.1f}"
                     f" -> {end - t0:6.1f} s ({p.get('state')}, "
                     f"{p.get('files_from_peers')} files from peers"
                     f"{', listed at %.1f s' % (listed[0] - t0) if listed else ''}"
                     f"{', all copied at %.1f s' % (copied[0] - t0) if copied else ''})")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4, help="fleet size (hosts h1..hN)")
    ap.add_argument("--mb", type=int, default=512, help="model size in MB (32 MB shards)")
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                    help="also time every host downloading from upstream (default: on up to "
                    f"{BASELINE_MAX_HOSTS} hosts; it takes ~N x the single run)")
    ap.add_argument("--keep-output", action="store_true", help="print pyinfra's output")
    a = ap.parse_args()
    if a.hosts < 2:
        ap.error("--hosts: at least 2 (a seed and a peer)")
    hosts_all = tuple(f"h{i}" for i in range(1, a.hosts + 1))
    baseline = a.baseline if a.baseline is not None else a.hosts <= BASELINE_MAX_HOSTS
    shards = max(1, a.mb * 1_000_000 // SHARD)
    disk = f"{a.mb + 160}M"
    print(stamp_line("fanout"), flush=True)
    print(f"load before boot: {load()}", flush=True)
    fleet = Fleet.up(f"fobench-{os.getpid()}"[:31], [HostSpec(h, disk=disk) for h in hosts_all])
    work = Path(tempfile.mkdtemp(prefix="specfleet-fobench-"))
    hub = None
    quiet = open(os.devnull, "w")  # noqa: SIM115
    real_stderr = sys.stderr
    try:
        mirrors = work / "mirrors"
        files = {f"model-{i:05d}-of-{shards:05d}.safetensors": random_bytes(SHARD, f"fo{i}")
                 for i in range(1, shards + 1)}
        files["config.json"] = b'{"model_type": "bench"}'
        big = make_repo(mirrors, "bench/big", files)
        sizes = {p: len(v) for p, v in files.items()}
        model_bytes = sum(sizes.values())
        del files
        tiny = make_repo(mirrors, "bench/tiny", {"config.json": b"{}"})
        drafter = make_repo(mirrors, "bench/drafter", {"model.safetensors":
                                                       random_bytes(1_000_000, "d"),
                                                       "config.json": b"{}"})
        hub = LimitedHub(fleet, mirrors, work, LINK_MBIT)
        hub.wait("bench/tiny")

        def inv(repo: str, rev: str) -> str:
            sf = settings_data(fleet, hub.url, repo, rev, weights={"poll_seconds": 0.5},
                               drafter={"repo_id": "bench/drafter", "revision": drafter})
            return str(inventory(fleet, work / f"inv-{repo.replace('/', '-')}.py",
                                 {h: sf for h in fleet.hosts}))

        def run_fanout(hosts, name: str, inventory_path: str, plan_out: dict):
            if not a.keep_output:
                sys.stderr = quiet
            try:
                return run_prefetch(inventory_path, list(hosts), name=name, plan_out=plan_out)
            finally:
                sys.stderr = real_stderr

        def run(deploy_or_fanout: str, hosts, name: str, inventory_path: str):
            if not a.keep_output:
                sys.stderr = quiet
            try:
                if deploy_or_fanout == "fanout":
                    return run_prefetch(inventory_path, list(hosts), name=name)
                return run_pyinfra(inventory_path, WEIGHTS_ONLY, list(hosts), name)
            finally:
                sys.stderr = real_stderr

        # Warm-up (untimed): tools, agents, the drafter everywhere.
        step_ok(run("fanout", hosts_all, "warm-up", inv("bench/tiny", tiny)), "warm-up")
        big_inv = inv("bench/big", big)
        os.environ.pop("HF_TOKEN", None)
        rows = []

        n = len(hosts_all)
        runs = [("single host", "plain", hosts_all[:1])]
        if baseline:
            runs.append((f"{n} hosts, no fan-out", "plain", hosts_all))
        runs.append((f"{n} hosts, fan-out", "fanout", hosts_all))
        plan: dict = {}
        profile: list[str] = []
        programs: list[tuple[str, float]] = []
        for label, mode, hosts in runs:
            wipe(fleet, "bench--big")
            mark = hub.mark()
            load_at = load()
            cpu0 = (control_cpu(), fleet_cpu(fleet), tree_cpu(hub.proc.pid))
            t0 = time.time()
            if mode == "fanout":
                plan.clear()
                with CpuByProgram(fleet) as sampler:
                    seconds, step = timed(lambda h=hosts, lb=label: run_fanout(h, lb, big_inv,
                                                                               plan))
                programs = sampler.by_program()
            else:
                seconds, step = timed(lambda h=hosts, lb=label: run("plain", h, lb, big_inv))
            step_ok(step, label)
            check_verified(fleet, hosts, "bench--big", big)
            up = hub.upstream_bytes(mark, sizes, "bench/big")
            ctl, hosts_cpu = control_cpu() - cpu0[0], fleet_cpu(fleet) - cpu0[1]
            hub_cpu = tree_cpu(hub.proc.pid) - cpu0[2]
            rows.append(Row(label, len(hosts), seconds, up, load_at, ctl, hosts_cpu, hub_cpu))
            print(f"{label}: {seconds:.1f} s, upstream {up / 1e6:.0f} MB (load {load_at}; CPU s: "
                  f"control {ctl:.1f}, hosts {hosts_cpu:.1f}, hub {hub_cpu:.1f})", flush=True)
            if mode == "fanout":
                profile = pull_profile(fleet, plan, "bench--big", t0)
            elif len(hosts) == 1:
                print("\n".join(seed_line(fleet, hosts[0], "bench--big", t0)), flush=True)
        single = rows[0].seconds
        print()
        print(f"model {model_bytes / 1e6:.0f} MB in {shards + 1} files; upstream link "
              f"{LINK_MBIT} Mbit/s (tbf on the hub's veth), LAN unlimited")
        if not baseline:
            print(f"(no \"{n} hosts, no fan-out\" run: --baseline adds it, ~{n} x single)")
        ncpu = cores()
        print(f"{'run':<22} {'hosts':>5} {'time s':>8} {'x single':>9} {'upstream MB':>12} "
              f"{'x model':>8} {'ctl CPU s':>9} {'hosts CPU s':>11} {'hub CPU s':>9} "
              f"{'busy':>5}  load average at start")
        for r in rows:
            print(f"{r.label:<22} {r.hosts:>5} {r.seconds:>8.1f} {r.seconds / single:>9.2f} "
                  f"{r.upstream / 1e6:>12.0f} {r.upstream / model_bytes:>8.2f} "
                  f"{r.control_cpu:>9.1f} {r.hosts_cpu:>11.1f} {r.hub_cpu:>9.1f} "
                  f"{r.cpu / (ncpu * r.seconds):>5.2f}  {r.load_at}")
        print(f"(busy: the run's CPU seconds, control + hosts + hub, over its time on this "
              f"machine's {ncpu} CPUs, which the hosts share; a real fleet's hosts each have "
              "their own)")
        print("fan-out, the hosts' CPU seconds by program (sampled each second): "
              + ", ".join(f"{c} {v:.1f}" for c, v in programs))
        print("fan-out, per host (seconds after the run started):")
        print("\n".join(profile))
        print(f"load at the end: {load()}")
        fan = rows[-1]
        fan_s, fan_up = fan.seconds, fan.upstream
        allowed_s = single * TARGET_FLEET_OVER_SINGLE
        print(f"fan-out, CPU: {fan.cpu:.1f} CPU-s on {ncpu} CPUs is at least "
              f"{fan.cpu / ncpu:.1f} s of the {fan_s:.1f} s run; one host's run took "
              f"{single:.1f} s ({allowed_s:.1f} s, the target {TARGET_FLEET_OVER_SINGLE}x, "
              f"allows at most {allowed_s * ncpu:.0f} CPU-s)")
        print(f"fanout: upstream_bytes/model={fan_up / model_bytes:.2f} "
              f"fleet/single={fan_s / single:.2f} hosts={n} ({stamp()})")
        return 0
    finally:
        sys.stderr = real_stderr
        if hub:
            hub.stop()
        fleet.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
