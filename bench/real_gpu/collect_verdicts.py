"""Writes tests/fixtures/real_gpu/serverargs-verdicts.json from the verdict files of a real-GPU run
(``serverargs_check.py``'s JSON lines, under bench/real_gpu/results/<run>/).

    python bench/real_gpu/collect_verdicts.py COMMIT DATE results/<run>/verdicts-*.jsonl

A verdict where SGLang changed nothing at all (its rules did not run: run 2's 0.5.23 through
``from_cli_args`` alone, before ``serverargs_check.resolve`` called ``resolve_once``) is recorded
as ``inconclusive``: no verdict.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "real_gpu" / "serverargs-verdicts.json"
KEEP = ("release", "sglang_version", "build", "case", "key", "argv", "env", "gpus", "result",
        "error", "changed", "values", "modelled_load", "swapped", "caches_cleared", "path",
        "seconds")


def main(commit: str, date: str, *files: str) -> None:
    verdicts = []
    for path in files:
        for line in Path(path).read_text().splitlines():
            v = json.loads(line)
            out = {k: v[k] for k in KEEP if k in v}
            out["log"] = [ln for ln in (v.get("log") or "").splitlines()
                          if ln.startswith(("WARNING", "INFO sglang.srt.server_args", "ERROR"))]
            if v.get("result") == "accepted" and not v.get("changed"):
                out["result"] = "inconclusive"
                out["why"] = ("from_cli_args returned with no value changed in "
                              f"{v.get('seconds')} s: this release's rules did not run there")
            out["source"] = str(Path(path).resolve().relative_to(ROOT))
            verdicts.append(out)
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps({
        "about": "Every plan of the planner's matrix (tests/harness/real_gpu_plans.py) through a "
                 "real SGLang release's own ServerArgs (parse + the whole __post_init__; from "
                 "0.5.2x from_cli_args + resolve_once, as launch_server does) on a real H200, "
                 "each machine's GPU memory, compute capability, name and GPU count "
                 "put in place of the device's (bench/real_gpu/serverargs_check.py). Model "
                 "folders: bench/real_gpu/models/k2-target and k2-drafter (config.json only).",
        "refresh": "bench/real_gpu/README.md, 'Refresh the verdicts'",
        "commit": commit,
        "date": date,
        "machine": "1x NVIDIA H200 (143771 MiB), driver 580.159.04, torch 2.11.0+cu130, "
                   "Python 3.12",
        "verdicts": verdicts,
    }, indent=1) + "\n")
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[f"{v['release']} {v['result']}"] = counts.get(f"{v['release']} {v['result']}", 0) + 1
    print(FIXTURE, counts)


if __name__ == "__main__":
    main(*sys.argv[1:])
