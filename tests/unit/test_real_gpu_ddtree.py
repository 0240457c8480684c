"""bench/real_gpu/ddtree: the lab outline's CPU rehearsal (RG_DRY) plans every point on the fork's
real tree (laid in from the shared tarball, its fact read by the real collector) and an H200
capture; the parts script's roots and pins come from the fork's own pyproject."""

from __future__ import annotations

import json
import runpy

import pytest

from bench.real_gpu.ddtree import build_parts
from specfleet.core.tables.ddtree_designs import FORK_DFLASH_SWITCH

LAB = "bench/real_gpu/ddtree/lab_ddtree.py"


def test_parts_take_the_forks_pins():
    roots, pins = build_parts.roots_and_pins()
    assert pins == {"sglang-kernel": "==0.4.3", "flashinfer-python": "==0.6.12",
                    "transformers": "==5.8.1", "torch": "==2.11.0"}
    assert not any(r.startswith("sglang==") for r in roots) and "pyinfra==3.10.0" in roots


@pytest.mark.local
def test_lab_outline_rehearsal_plans_every_point(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RG_DRY", "1")
    monkeypatch.setenv("RG_WORK", str(tmp_path))
    lab = runpy.run_path(LAB)
    assert lab["main"]() == 0
    plans = {p["tag"]: p for p in json.loads((tmp_path / "ddtree-plans.json").read_text())}
    assert "--speculative-algorithm" not in plans["P0"]["argv"]
    assert FORK_DFLASH_SWITCH.switch_flag not in plans["D0"]["argv"]
    for budget in lab["BUDGETS"]:
        argv = plans[f"T{budget}-lab-drafter-weak"]["argv"]
        assert argv[argv.index("--attention-backend") + 1] == "triton"
        assert argv[argv.index("--speculative-num-draft-tokens") + 1] == str(budget)
        assert FORK_DFLASH_SWITCH.switch_flag in argv
    fa3 = plans["F16"]
    assert fa3["argv"][fa3["argv"].index("--attention-backend") + 1] == "fa3"
    assert fa3["argv"].count("--speculative-num-draft-tokens") == 1 and fa3["experiment"]
    assert "(experiment, not planned)" in capsys.readouterr().out
