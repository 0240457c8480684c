#!/usr/bin/env python3
"""The DDTree budget sweep on the borrowed GPU (issue 51): an OUTLINE, rehearsed on CPU with
``RG_DRY=1`` (plans only); its GPU run is issue 51's device part and has not been made.

On the machine (the fork's parts from ``build_parts.py`` in this folder, the lab pair of issue 49
under ``bench/real_gpu/models/lab-*``), each server goes the way ``bench/real_gpu/lab_run.py``
takes it (``drive.py``: live facts, ``python -m specfleet.plan``, the unit rendered, the server
started from its ExecStart without systemd, the readiness gate), then greedy ``/generate`` on the
prompts alone and in a batch of 8, SGLang's own acceptance length from ``/server_info``, output
tokens/s at batch 1 and 8, each point's output compared with the plain server's:

  P0  plain (no speculation), triton ........... the reference output
  D0  DFLASH without DDTree, triton ............ baseline (block 8)
  T*  DDTree at each of BUDGETS, triton ........ lossless? acceptance, tokens/s (main, weak)
  F*  DDTree at LOSSLESS_BUDGETS with fa3 ...... what fa3 does with the tree (the planner refuses
                                                  it, plan.extra_args included: the plan is
                                                  DFLASH on fa3 and the DDTree flags are appended
                                                  to its argv, recorded as an experiment)

A budget the plan refuses (its verify graphs cannot fit) is recorded as refused, as the sweep
drops it. Everything goes to ``$RG_WORK/ddtree-record.json``, resumable as lab_run's record.

``RG_DRY=1`` here: the fork's tree laid in from the shared tarball (tests/harness/sources.py),
its fact read by the real collector, the H200 capture of ``tests/fixtures/nvidia/h200x2`` as the
GPU facts, and every point planned; the plans go to ``$RG_WORK/ddtree-plans.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = Path(os.environ.get("RG_WORK", "/tmp/real_gpu"))
BUDGETS = (4, 8, 16, 32, 64)  # from at or below block - 1 to above the block size (8)
LOSSLESS_BUDGETS = (4, 16)  # one at or below 7, one above 8
DRAFTERS = ("lab-drafter", "lab-drafter-weak")
LAB = {"--random-seed": "1234", "--sampling-backend": "pytorch", "--cuda-graph-max-bs": "8"}
# The lab pair's size (issue 49: a 4M-parameter pair), rounded up: the plan's weights check.
LAB_WEIGHTS_BYTES = 64 * 1024**2
# A drafter trained at block 8 (issue 49's pair; the plan reads its config.json on the machine).
LAB_DRAFTER_CONFIG = {"dflash_config": {"block_size": 8}, "num_hidden_layers": 1}


def points() -> list[dict]:
    """Every server of the run: tag, the plan overrides, the drafter."""
    out = [{"tag": "P0", "plan": {"attention_backend": "triton",
                                  "extra_args": {**LAB, **{f: None for f in SPEC_FLAGS}}},
            "drafter": None},
           {"tag": "D0", "plan": {"attention_backend": "triton", "extra_args": LAB},
            "drafter": DRAFTERS[0]}]
    for drafter in DRAFTERS:
        for b in BUDGETS:
            out.append({"tag": f"T{b}-{drafter}", "drafter": drafter,
                        "plan": {"ddtree_budget": b, "extra_args": LAB}})
    for b in LOSSLESS_BUDGETS:
        # The planner refuses DDTree on fa3 (it drops the tree mask): the plan is DFLASH on fa3,
        # and the experiment's flags are appended to its argv, outside the plan.
        out.append({"tag": f"F{b}", "drafter": DRAFTERS[0],
                    "plan": {"attention_backend": "fa3", "extra_args": LAB},
                    "experiment": ["--speculative-dflash-enable-ddtree",
                                   "--speculative-num-draft-tokens", str(b)]})
    return out


SPEC_FLAGS = ("--speculative-algorithm", "--speculative-draft-model-path",
              "--speculative-num-draft-tokens", "--speculative-draft-attention-backend",
              "--speculative-dflash-draft-window-size")


def dry_facts() -> dict:
    from tests.harness.sources import ddtree_fork_site
    from tests.unit.test_facts_sglang import collect
    from tests.unit.test_plan import host_facts

    return {**host_facts("h200x2", sglang=None),
            "facts.sglang.SGLangInstall": collect(ddtree_fork_site())}


def plan_point(point: dict, facts: dict) -> dict:
    from specfleet.core.plan import PlanError, make_plan
    from specfleet.core.settings import settings_from_dict

    settings = settings_from_dict({"sglang": {"version": "0.5.13"}, "plan": point["plan"]})
    try:
        plan = make_plan(facts, settings, LAB_DRAFTER_CONFIG, weights_bytes=LAB_WEIGHTS_BYTES)
    except PlanError as exc:
        return {**point, "refused": exc.render()}
    reasons = {r.topic: f"{r.choice}: {r.why}" for r in plan.reasons if r.topic.startswith(
        ("ddtree", "attention-backend"))}
    argv = list(plan.argv)
    extra = point.get("experiment") or []
    if extra:  # not a plan: the flags the experiment forces, the budget replacing the block
        i = argv.index("--speculative-num-draft-tokens")
        del argv[i:i + 2]
        argv += extra
    return {**point, "argv": argv, "env": plan.env, "reasons": reasons}


def main() -> int:
    if not os.environ.get("RG_DRY"):
        print("lab_ddtree: an outline; only RG_DRY=1 (plans, no server) runs so far",
              file=sys.stderr)
        return 2
    facts = dry_facts()
    plans = [plan_point(p, facts) for p in points()]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "ddtree-plans.json").write_text(json.dumps(plans, indent=1))
    for p in plans:
        if "refused" in p:
            line = "refused: " + p["refused"].splitlines()[0][:150]
        else:
            argv = p["argv"]
            att = argv[argv.index("--attention-backend") + 1]
            tree = "DDTree" if "--speculative-dflash-enable-ddtree" in argv else (
                "DFLASH" if "--speculative-algorithm" in argv else "plain")
            line = f"{att} {tree}" + (" (experiment, not planned)" if p.get("experiment") else "")
        print(f"lab_ddtree: {p['tag']:<22} {line}")
    print(f"lab_ddtree: {len(plans)} plans in {OUT / 'ddtree-plans.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
