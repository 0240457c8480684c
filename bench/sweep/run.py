"""The sweep's demo: `specfleet bench` and `specfleet sweep` on a demo fleet of the stand-ins, its
report copied here (the README shows ``heatmap.png``).

Boots tests.demo's fleet with two H200 hosts (the stand-in server with its performance model,
``tests/harness/standin_perf.py``, seeded with ``--seed``), deploys ``deploys/kimi_k26.py``,
benchmarks both, sweeps ``h1`` over draft tokens x draft window (x draft backend), and copies
``report.html``, the three PNGs and ``state.json`` into this folder. The figures are the stand-in
model's, not a GPU's (README, "Benchmark and tuning sweep").

Usage (as root, from the repository root): .venv/bin/python bench/sweep/run.py [--seed N]
The last line is ``sweep: best=KEY expected=KEY points=N rc=RC (commit C, DATE)``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench.stamp import stamp, stamp_line  # noqa: E402
from specfleet.core import bench as core  # noqa: E402
from tests.demo import DEMO_TOKEN, STANDIN, TEST_ENV, up  # noqa: E402
from tests.harness import HostSpec  # noqa: E402
from tests.harness import standin_perf as perf  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--blocks", default="2,4,8,16")
    p.add_argument("--windows", default="1024,2048,4096,8192")
    p.add_argument("--draft-backends", default="", help="e.g. fa3,flashinfer (default: the rule's)")
    p.add_argument("--copy-to", type=Path, default=HERE,
                   help="where the report, its PNGs and state.json go (default: bench/sweep/, "
                   "which the README shows; bench/final.sh keeps the tree clean with its results "
                   "folder, and python -m bench.stamp copies them here)")
    args = p.parse_args()
    print(stamp_line("sweep"), flush=True)
    args.copy_to.mkdir(parents=True, exist_ok=True)
    launcher = ["/usr/bin/python3", STANDIN, "--standin-record", "/run/standin.json",
                "--standin-perf-seed", str(args.seed)]
    demo = up("sweepdemo", [HostSpec("h1", gpu="h200x2", disk="64G"),
                            HostSpec("h2", gpu="h200x2", disk="64G")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(TEST_ENV, HF_TOKEN=DEMO_TOKEN)
    try:
        # The stand-in's acceptance length is low on purpose at the grid's corners (1.3 seen by
        # tests/fleet/test_bench_fleet.py) and was 1.88 at the inventory's own plan: below the
        # correctness probe's default floor (2.0), which failed the gate before the first point.
        # This measures the sweep; the floor has its own tests (as that fleet test does).
        probe = {"min_accept_length": 1.0}
        demo.write_inventory(h1={"launcher": launcher, "probe": probe},
                             h2={"launcher": launcher, "probe": probe})
        res = demo.pyinfra("-y")
        if res.returncode:
            print(res.stdout + res.stderr)
            return 1

        def cli(*a: str) -> int:
            return subprocess.run([sys.executable, "-m", "specfleet.cli", *a], cwd=REPO_ROOT,
                                  env=env, check=False).returncode

        cli("bench", str(demo.inventory), "--out", str(demo.workdir / "bench"))
        out = demo.workdir / "sweep"
        rc = cli("sweep", str(demo.inventory), "--host", "h1", "--allow-serving",
                 "--num-draft-tokens", args.blocks, "--draft-window", args.windows,
                 *(["--draft-backends", args.draft_backends] if args.draft_backends else []),
                 "--max-tokens", "48", "--out", str(out))
        for name in ("report.html", "tokens_per_s.png", "accept_length.png", "heatmap.png",
                     "state.json"):
            if (out / name).exists():
                shutil.copy(out / name, args.copy_to / name)
        state = json.loads((out / "state.json").read_text())
        grid = state["grid"]

        def model(point: dict) -> float:
            return perf.single_tps(perf.Point(
                "DFLASH", point["num_draft_tokens"], point["draft_window"],
                point.get("draft_attention_backend", "fa3"), "fa3"), args.seed)  # SM90: fa3

        expected = core.point_key(max(grid, key=model))
        print(f"sweep: best={state['best']} expected={expected} points={len(grid)} rc={rc} "
              f"({stamp()})")
        return 0 if state["best"] == expected else 1
    finally:
        demo.down()


if __name__ == "__main__":
    sys.exit(main())
