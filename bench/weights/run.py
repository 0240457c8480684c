"""Benchmark of the weights feature on a fleet host.

1. Download rate over a link limited with ``tc qdisc ... tbf`` to 100 Mbit/s (below the rate
   of the mirror, the stand-in hub on the fleet bridge), divided by that link rate. The rate is
   the repository's bytes over the download unit's wall time (plan, download, verification,
   manifest: everything the agent does); the end-to-end ``pyinfra`` time is printed too.
2. The time to re-check a converged host (the whole weights deploy: tools, token, model; all
   no-ops) divided by the time of a bare ``pyinfra -y INVENTORY exec -- true`` on it (medians).

Usage (as root, from the repository root): .venv/bin/python bench/weights/run.py [--mb 96]
The last line is ``weights: rate/link=R.RR recheck/bare=C.CC (commit C, DATE)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench.stamp import stamp, stamp_line  # noqa: E402
from tests.harness import Fleet, HostSpec  # noqa: E402
from tests.harness.weights_support import (  # noqa: E402
    PYINFRA,
    StandinHub,
    inventory,
    make_repo,
    op_status,
    pyinfra,
    random_bytes,
    settings_data,
)

LINK_MBIT = 100


def timed(fn):
    t0 = time.monotonic()
    r = fn()
    return time.monotonic() - t0, r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=96, help="repository size in MB (16 MB shards)")
    ap.add_argument("--runs", type=int, default=5, help="runs for each re-check median")
    a = ap.parse_args()
    shards = max(1, a.mb // 16)
    print(stamp_line("weights"), flush=True)
    fleet = Fleet.up(f"wbench-{os.getpid()}"[:31], [HostSpec("h1", disk=f"{a.mb * 2 + 64}M")])
    work = Path(tempfile.mkdtemp(prefix="specfleet-wbench-"))
    hub = None
    try:
        mirrors = work / "mirrors"
        files = {f"model-{i:05d}-of-{shards:05d}.safetensors": random_bytes(16_000_000, f"b{i}")
                 for i in range(1, shards + 1)}
        files["config.json"] = b'{"model_type": "bench"}'
        big = make_repo(mirrors, "bench/big", files)
        tiny = make_repo(mirrors, "bench/tiny", {"config.json": b"{}"})
        total = sum(len(v) for v in files.values())
        hub = StandinHub(mirrors, fleet.bridge_ip, work)
        hub.wait("bench/tiny")

        # Warm up: the tools venv and the agent, through an unlimited link.
        sf = settings_data(fleet, hub.url, "bench/tiny", tiny)
        r = pyinfra(inventory(fleet, work / "inv-tiny.py", {"h1": sf}))
        if r.returncode:
            print(r.stdout + r.stderr)
            return 1

        veth = fleet.state["hosts"]["h1"]["veth"]
        subprocess.run(["tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate",
                        f"{LINK_MBIT}mbit", "burst", "64kb", "latency", "400ms"], check=True)
        try:
            sf = settings_data(fleet, hub.url, "bench/big", big, weights={"poll_seconds": 0.5})
            inv = inventory(fleet, work / "inv-big.py", {"h1": sf})
            wall, r = timed(lambda: pyinfra(inv, timeout=600))
        finally:
            subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
        if r.returncode:
            print(r.stdout + r.stderr)
            return 1
        prog = json.loads(fleet.run(
            "h1", "cat /var/lib/specfleet/weights/bench--big.progress.json").stdout)
        unit_s = prog["updated_at"] - prog["started_at"]
        print(f"unit timeline (s from start): {prog.get('timeline')}")
        link_bps = LINK_MBIT * 1e6 / 8
        rate = total / unit_s
        print(f"download: {total / 1e6:.1f} MB in {unit_s:.2f} s (unit) = {rate / 1e6:.2f} MB/s;"
              f" end to end (pyinfra) {wall:.2f} s = {total / wall / 1e6:.2f} MB/s;"
              f" link {link_bps / 1e6:.2f} MB/s")

        rechecks, bares = [], []
        for _ in range(a.runs):
            t, r = timed(lambda: pyinfra(inv))
            if r.returncode or op_status(r.stdout + r.stderr, "h1") != "No changes":
                print(r.stdout + r.stderr)
                return 1
            rechecks.append(t)
            t, r = timed(lambda: subprocess.run(
                [PYINFRA, "-y", str(inv), "exec", "--", "true"], cwd=REPO_ROOT,
                capture_output=True, text=True))
            if r.returncode:
                print(r.stdout + r.stderr)
                return 1
            bares.append(t)
        recheck, bare = statistics.median(rechecks), statistics.median(bares)
        print(f"re-check of a converged host: median {recheck:.2f} s "
              f"({', '.join(f'{x:.2f}' for x in rechecks)}); bare exec -- true: median "
              f"{bare:.2f} s ({', '.join(f'{x:.2f}' for x in bares)})")
        print(f"weights: rate/link={rate / link_bps:.2f} recheck/bare={recheck / bare:.2f} "
              f"({stamp()})")
        return 0
    finally:
        if hub:
            hub.stop()
        fleet.down()


if __name__ == "__main__":
    sys.exit(main())
