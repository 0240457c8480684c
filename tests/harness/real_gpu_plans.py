"""Every launch plan of the planner's matrix, as the real-GPU ServerArgs check runs them.

The matrix is the one the plan tests use: ``tests/unit/test_plan.py`` (one host: arch x
interconnect x SGLang build, facts from real nvidia-smi captures) and ``tests/unit/test_plan_group.py``
(serving groups; rank 0's plan stands for the group: the members differ only in --node-rank).
``bench/real_gpu/serverargs_check.py`` runs each plan through a release's own ``ServerArgs`` on a
real GPU; ``tests/unit/test_real_gpu_verdicts.py`` holds today's plans to the recorded verdicts.

    python -m tests.harness.real_gpu_plans OUT.json    # the plans, as the check reads them
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from specfleet.core.plan import PlanError, make_plan
from specfleet.core.plan.group import make_group_plan
from tests.unit.test_plan import BUILD, DRAFTER_CONFIG, HOSTS, host_facts, settings
from tests.unit.test_plan_group import GROUPS, members


def plan_key(argv: list[str], env: dict[str, str]) -> str:
    """What a verdict is about: the argv and env exactly (a changed plan has no verdict)."""
    text = json.dumps({"argv": argv, "env": dict(sorted(env.items()))}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _gpu_info(facts: dict[str, Any]) -> dict[str, Any]:
    gpus = facts["facts.gpu.Gpus"]["gpus"]
    return {
        "count": len(gpus),
        "name": gpus[0]["name"],
        "memory_mib": min(g["memory_mib"] for g in gpus),
        "capability": gpus[0]["compute_capability"],
    }


def _entry(case: str, build: str, facts: dict[str, Any], plan) -> dict[str, Any]:
    return {
        "case": case,
        "build": build,
        "gpus": _gpu_info(facts),
        "argv": plan.argv,
        "env": plan.env,
        "key": plan_key(plan.argv, plan.env),
        "reasons": [{"topic": r.topic, "choice": r.choice, "why": r.why} for r in plan.reasons],
    }


def matrix_plans() -> list[dict[str, Any]]:
    """Every plan the matrix makes today ({case, build, gpus, argv, env, key, reasons}), and a
    {case, build, refused} entry where the planner itself refuses the host."""
    out: list[dict[str, Any]] = []
    for arch, link, gpus, topo in HOSTS:
        where = gpus if topo == gpus else f"{gpus}-topo-from-{topo}"
        for build in BUILD:
            case = f"{arch}-{link}-{where}"
            facts = host_facts(gpus, topo, sglang=build)
            try:
                plan = make_plan(facts, settings(), DRAFTER_CONFIG)
            except PlanError as exc:
                out.append({"case": case, "build": build, "refused": exc.problem})
                continue
            out.append(_entry(case, build, facts, plan))
    for profile, n, topo, _arch, _nvlink in GROUPS:
        for build in BUILD:
            case = f"group-{n}x-{profile}" + (f"-topo-from-{topo}" if topo else "")
            group_members = members(profile, n, build, topo)
            try:
                group = make_group_plan(group_members, DRAFTER_CONFIG)
            except PlanError as exc:
                out.append({"case": case, "build": build, "refused": exc.problem})
                continue
            rank0 = group_members[0]
            out.append(_entry(case, build, dict(rank0.facts), group.plans[rank0.host]))
    return out


if __name__ == "__main__":
    plans = matrix_plans()
    with open(sys.argv[1], "w") as fh:
        json.dump(plans, fh, indent=1)
    print(f"{len(plans)} plans ({sum('refused' in p for p in plans)} refused by the planner)")
