"""bench/real_gpu/ddtree: the lab outline's CPU rehearsal (RG_DRY) plans every point on the fork's
real tree (laid in from the shared tarball, its fact read by the real collector) and an H200
capture; the parts script's roots and pins come from the fork's own pyproject."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import runpy
import shutil
import sys
from pathlib import Path

import pytest

from bench.real_gpu.ddtree import build_parts
from specfleet.core.tables.ddtree_designs import FORK_DFLASH_SWITCH

LAB = "bench/real_gpu/ddtree/lab_ddtree.py"
PLOT = "bench/real_gpu/ddtree/plot_ddtree.py"


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


# --------------------------------------------------------------------------------------------------
# The GPU path's record, resume and comparison (lab_ddtree.py), on synthetic entries: no server,
# no process. The sweep is specfleet sweep's own loop (Sweep.run) with the point served here.
# --------------------------------------------------------------------------------------------------

REFERENCE_JSON = Path(__file__).resolve().parents[2] / "bench/real_gpu/lab/reference.json"


@contextlib.contextmanager
def fresh_lab_modules(monkeypatch):
    """lab_ddtree and the lab_run it imports read their record at import: each test imports them
    afresh (under its own RG_WORK) and leaves sys.modules and sys.path as they were."""
    monkeypatch.setenv("RG_RECORD", "ddtree-record.json")  # restored after: lab_ddtree sets it
    monkeypatch.delenv("RG_DRY", raising=False)
    names = ("drive", "lab_run", "lab_ddtree")
    saved_path = list(sys.path)
    for name in names:
        sys.modules.pop(name, None)
    try:
        yield
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.path[:] = saved_path


@pytest.fixture
def ddtree(tmp_path, monkeypatch):
    monkeypatch.setenv("RG_WORK", str(tmp_path))
    with fresh_lab_modules(monkeypatch):
        spec = importlib.util.spec_from_file_location("lab_ddtree", LAB)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["lab_ddtree"] = mod
        spec.loader.exec_module(mod)
        yield mod


def _expected() -> list[list[int]]:
    return [p["expected_output"] for p in json.loads(REFERENCE_JSON.read_text())["prompts"]]


def _entry(outputs, acc=4.0, seconds=0.1, batch_seconds=0.2, tps=(500.0, 2000.0)):
    g = {"single": [{"output_ids": o, "meta": {"spec_accept_length": acc}, "seconds": seconds}
                    for o in outputs],
         "batches": [[{"output_ids": o} for o in outputs]], "batch_seconds": [batch_seconds],
         "acceptance_length": acc}
    return {"checks_done": True, "generate": g, "timed": [{"1": tps[0], "8": tps[1]}] * 3,
            "server_info": {"accept_length": acc + 0.1}}


def test_points_in_order_of_value_with_the_sweeps_overrides(ddtree):
    tags = [s["tag"] for s in ddtree.first_specs()]
    assert tags == ["P0", "T4-lab-drafter", "T16-lab-drafter", "F4", "F16", "D0"]
    specs = {s["tag"]: s for s in ddtree.all_specs()}
    assert len(specs) == 2 + 2 * len(ddtree.BUDGETS) + len(ddtree.LOSSLESS_BUDGETS)
    assert specs["T2-lab-drafter-weak"]["plan"] == {"ddtree_budget": 2,
                                                     "attention_backend": "triton"}
    assert specs["F16"]["plan"] == {"attention_backend": "fa3"}
    assert specs["F16"]["experiment"] == [FORK_DFLASH_SWITCH.switch_flag,
                                          "--speculative-num-draft-tokens", "16"]
    assert specs["P0"]["extra"]["--speculative-algorithm"] is None
    # The experiment's flags go over the plan's argv: the budget replaces the block size.
    argv = ["--attention-backend", "fa3", "--speculative-num-draft-tokens", "8", "--x"]
    assert ddtree.lab_run.override_argv(argv, specs["F16"]["experiment"]) == [
        "--attention-backend", "fa3", "--x", FORK_DFLASH_SWITCH.switch_flag,
        "--speculative-num-draft-tokens", "16"]


def test_speeds_result_and_point_status(ddtree):
    exp = _expected()
    e = _entry(exp, seconds=0.5, batch_seconds=1.0)
    got = ddtree.speeds(e["generate"])
    n = sum(len(o) for o in exp)
    assert got == {"1": round(n / (0.5 * len(exp)), 3), "8": round(n / 1.0, 3)}
    e["timed"] = [{"1": 10.0, "8": 80.0}, {"1": 30.0, "8": 20.0}, {"1": 20.0, "8": 50.0}]
    res = ddtree.result_of(e)
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 8]
    assert ddtree.core.top_tps(res) == 50.0 and res["accept_length"] == 4.0  # the medians
    assert ddtree.point_status(e)["status"] == "done"
    refused = ddtree.point_status({"refused": "error: DDTree budget refused: plan.ddtree_budget "
                                              "64 needs verify CUDA-graph buffers ..."})
    assert refused["status"] == "dropped" and "64" in refused["why"]
    other = ddtree.point_status({"refused": "error: no GPU"})
    assert other["status"] == "failed" and other["why"].startswith("refused by the plan")
    assert ddtree.point_status({"skipped": "out of time"})["status"] == "pending"
    assert ddtree.point_status({"healthy": False})["status"] == "failed"


def test_each_point_is_compared_with_the_plain_server(ddtree):
    exp = _expected()
    servers = ddtree.RECORD["servers"]
    servers["P0"] = _entry(exp)
    servers["T4-lab-drafter"] = _entry(exp)
    wrong = [list(o) for o in exp]
    wrong[2][5] += 1
    servers["F16"] = _entry(wrong)
    servers["T64-lab-drafter"] = {"refused": "DDTree budget refused: ..."}
    s = ddtree.summary()
    assert s["lossless"] == {"T4-lab-drafter": True, "T16-lab-drafter": None, "F4": None,
                             "F16": False}
    f16 = s["servers"]["F16"]
    assert f16["differing"] == 2  # prompt 2 alone and in the batch
    assert ("alone", 2, 5) in [tuple(d) for d in f16["first_differences"]]
    assert f16["budget"] == 16 and f16["backend"] == "fa3" and f16["experiment"]
    assert s["servers"]["T64-lab-drafter"]["status"] == "refused"
    assert s["servers"]["T8-lab-drafter"]["status"] == "not reached"


def test_the_sweep_resumes_keeps_done_points_and_drops_refused_budgets(ddtree, tmp_path):
    exp = _expected()
    servers = ddtree.RECORD["servers"]
    servers["T4-lab-drafter"] = _entry(exp, tps=(400.0, 1000.0))  # served before the sweep
    servers["T16-lab-drafter"] = _entry(exp, tps=(400.0, 3000.0))
    served = []

    def serve(s):
        served.append(s["tag"])
        b = s["plan"]["ddtree_budget"]
        servers[s["tag"]] = ({"refused": "DDTree budget refused: (synthetic)"} if b == 64
                             else _entry(exp, tps=(300.0, 100.0 * b)))
        return servers[s["tag"]]

    assert ddtree.LabSweep("lab-drafter", serve, 1e6).run() == 0
    assert served == ["T2-lab-drafter", "T8-lab-drafter", "T64-lab-drafter"]
    state = json.loads((tmp_path / "sweep-lab-drafter" / "state.json").read_text())
    status = {k: p["status"] for k, p in state["points"].items()}
    assert status["ddtree_budget=64,attention_backend=triton"] == "dropped"
    assert state["best"] == "ddtree_budget=16,attention_backend=triton"  # 3000 tok/s at batch 8
    record = json.loads((tmp_path / "ddtree-record.json").read_text())
    assert record["sweeps"]["lab-drafter"]["points"] == state["points"]
    # A second call: nothing done or dropped is served again.
    served.clear()
    assert ddtree.LabSweep("lab-drafter", serve, 1e6).run() == 0 and served == []


def test_no_sweep_point_starts_past_the_calls_budget(ddtree):
    served = []
    rc = ddtree.LabSweep("lab-drafter-weak", lambda s: served.append(s) or {}, 0).run()
    assert rc == 1 and served == []
    points = ddtree.RECORD["sweeps"]["lab-drafter-weak"]["points"]
    assert {p["status"] for p in points.values()} == {"pending"}


def test_the_first_gpu_record_reads_back_and_plots(tmp_path, monkeypatch):
    """The committed record of the DDTree run's first calls (an H100): its summary recomputed by
    the code the machine ran says triton lossless and fa3 not, and the plot names that GPU."""
    src = Path(__file__).resolve().parents[2] / "bench/real_gpu/results/ddtree1-dfb1482"
    shutil.copy(src / "ddtree-record.json", tmp_path / "ddtree-record.json")
    with fresh_lab_modules(monkeypatch):
        spec = importlib.util.spec_from_file_location("plot_ddtree", PLOT)
        plot_ddtree = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plot_ddtree)
        summary = plot_ddtree.load_summary(tmp_path)
        assert summary["lossless"] == {"T4-lab-drafter": True, "T16-lab-drafter": True,
                                       "F4": False, "F16": False}
        assert summary["gpu"] == "NVIDIA H100 80GB HBM3"
        assert summary["servers"]["D0"]["accept_length"] == 4.1391  # 0.5.11's, the same pair
        assert plot_ddtree.plot(summary, tmp_path / "p.png").stat().st_size > 10_000
