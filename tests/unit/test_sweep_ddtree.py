"""The DDTree budget axis: the grid, the stand-in's model (best budget never at a corner, acceptance
rising with diminishing returns), the stand-in server started with the fork's exact flags measured
by the real bench client, the report's budget plot, the winner as group data."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from specfleet import cli
from specfleet.core import bench as core
from specfleet.core.errors import SpecfleetError
from specfleet.fleet import report, sweep
from specfleet.hostside import bench_client
from tests.harness import standin_perf as perf
from tests.unit.test_bench import HARNESS, free_port, result

FORK_ARGV = ["--speculative-algorithm", "DFLASH", "--speculative-dflash-enable-ddtree"]


def test_budget_axis_in_the_grid_and_the_plan_overrides():
    args = cli.flags("sweep", ["inv.py", "--host", "h", "--ddtree-budgets", "8,16,32,64,128",
                               "--draft-window", "4096"])  # fmt: skip
    grid = sweep.grid_from_args(args)
    assert [p["ddtree_budget"] for p in grid] == [8, 16, 32, 64, 128]
    assert all("num_draft_tokens" not in p for p in grid)  # the budget sets the draft tokens
    assert core.point_key(grid[2]) == "ddtree_budget=32,draft_window=4096"
    assert core.point_overrides(grid[2]) == {"ddtree_budget": 32, "draft_window_size": 4096}
    plain = sweep.grid_from_args(cli.flags("sweep", ["inv.py", "--host", "h"]))
    assert {p["num_draft_tokens"] for p in plain} == {4, 8, 16}
    with pytest.raises(SpecfleetError, match="both a num_draft_tokens and a ddtree_budget"):
        core.parse_grid({"num_draft_tokens": [8], "ddtree_budget": [16, 32]})
    with pytest.raises(SpecfleetError, match="below 2"):
        core.parse_grid({"ddtree_budget": [1, 16]})


def run_for(budget: int, design: str = "fork") -> tuple[perf.Point, perf.DDTreeRun]:
    if design == "fork":
        argv = [*FORK_ARGV, "--speculative-num-draft-tokens", str(budget)]
    else:
        argv = ["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", str(budget),
                "--speculative-num-draft-tokens", "8"]
    return perf.point_from_argv(argv), perf.ddtree_from_argv(argv)


@pytest.mark.parametrize("design", ["fork", "pr29907"])
def test_standin_best_budget_is_inner_and_the_unique_argmax(design):
    seen = set()
    for seed in range(60):
        best = perf.best_budget(seed)
        seen.add(best)
        assert best not in (perf.BUDGETS[0], perf.BUDGETS[-1])
        rates = {b: perf.ddtree_single_tps(*run_for(b, design), seed) for b in perf.BUDGETS}
        top = max(rates, key=rates.get)
        assert top == best
        assert sorted(rates.values())[-2] <= 0.9 * rates[top]  # ranks on a busy machine
        accepts = [perf.ddtree_accept_length(run_for(b, design)[1], seed) for b in perf.BUDGETS]
        assert accepts == sorted(accepts)  # rising with the budget
        # With diminishing returns: each further tree node adds less.
        per_node = [(a2 - a1) / (b2 - b1) for a1, a2, b1, b2 in zip(
            accepts, accepts[1:], perf.BUDGETS, perf.BUDGETS[1:], strict=False)]
        assert per_node == sorted(per_node, reverse=True)
    assert seen == set(perf.BUDGETS[1:-1])


def test_the_forks_drafter_over_the_whole_budget_costs_more():
    fork, pr = run_for(64)[1], run_for(64, "pr29907")[1]
    assert perf._ddtree_cost(fork, 128, 0.0) > perf._ddtree_cost(pr, 128, 0.0)


@pytest.fixture
def ddtree_server(tmp_path):
    port = free_port()
    key = tmp_path / "secret.yaml"
    key.write_text('api-key: "sk-ddtree"\n')

    def start(budget: int):
        proc = subprocess.Popen(
            [sys.executable, str(HARNESS / "standin_sglang_server.py"), "--model-path", "/m",
             "--port", str(port), "--config", str(key), *FORK_ARGV,
             "--speculative-num-draft-tokens", str(budget),
             "--speculative-draft-window-size", "4096", "--standin-perf-seed", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        for _ in range(100):
            try:
                bench_client._request(f"http://127.0.0.1:{port}/health", "sk-ddtree").close()
                break
            except OSError:
                time.sleep(0.05)
        return proc

    yield start, f"http://127.0.0.1:{port}", key


@pytest.mark.local
def test_standin_started_with_the_forks_flags_is_measured_by_the_bench_client(ddtree_server,
                                                                               tmp_path):
    start, url, key = ddtree_server
    measured = {}
    for budget in (32, 64, 128):  # seed 0's best is 64
        proc = start(budget)
        try:
            out = tmp_path / f"b{budget}.json"
            assert bench_client.main(["--url", url, "--api-key-file", str(key), "--concurrency",
                                      "1", "--max-tokens", "48", "--out", str(out)]) == 0
            measured[budget] = json.loads(out.read_text())
            with bench_client._request(url + "/server_info", "sk-ddtree") as resp:
                info = json.loads(resp.read())
            assert info["speculative_ddtree_budget"] == budget
            assert info["speculative_ddtree_design"] == "fork"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    tps = {b: core.top_tps(r) for b, r in measured.items()}
    assert max(tps, key=tps.get) == 64, tps
    accepts = [measured[b]["accept_length"] for b in (32, 64, 128)]
    assert accepts == sorted(accepts)


def budget_state(tmp_path):
    grid = core.parse_grid({"ddtree_budget": list(perf.BUDGETS), "draft_window": [2048, 4096]})
    points = {}
    for p in grid:
        run = run_for(p["ddtree_budget"])[1]
        tps = perf.ddtree_single_tps(perf.Point("DFLASH", p["ddtree_budget"], p["draft_window"],
                                                "flashinfer", None), run, 0)  # fmt: skip
        res = result({1: tps, 4: 3 * tps}, perf.ddtree_accept_length(run, 0))
        res["meta"] = {"server": "stand-in", "arch": "sm120"}
        points[core.point_key(p)] = {"point": p, "status": "done", "result": res}
    best = core.best_key(points)
    return {"host": "ct", "grid": grid, "points": points, "best": best, "current": best}


def test_report_plots_acceptance_and_speed_against_the_budget(tmp_path):
    state = budget_state(tmp_path)
    assert state["points"][state["best"]]["point"]["ddtree_budget"] == perf.best_budget(0)
    page = report.write_report(state, tmp_path)
    assert (tmp_path / "ddtree_budget.png").read_bytes()[:4] == b"\x89PNG"
    assert 'src="ddtree_budget.png"' in page.read_text()
    fig = report.plot_budget(state)
    acc, tps = fig.axes[:2]
    assert [t.get_text() for t in tps.get_xticklabels()] == [str(b) for b in perf.BUDGETS]
    assert "budget" in tps.get_xlabel() and "acceptance" in acc.get_ylabel()
    assert "stand-in" in tps.get_title()
    assert len([ln for ln in acc.lines]) == 2  # one line per draft window
    # The winner as group data: Python that loads, with the budget.
    plan = core.point_overrides(state["points"][state["best"]]["point"])
    text = core.group_data_text("sm120", plan)
    namespace: dict = {}
    exec(compile(text, "group_data.py", "exec"), namespace)
    assert namespace["specfleet"]["plan"]["ddtree_budget"] == perf.best_budget(0)


@pytest.mark.local
def test_a_budget_the_hosts_plan_refuses_is_dropped_from_the_grid(tmp_path, monkeypatch, capsys):
    """The point deploy plans on the host's facts: CT200 with the fork (its real tree) refuses
    budget 128 (its triton verify graphs cannot fit). The sweep drops that point with a line, runs
    the others, and a resume does not try it again. The deploy itself is a stand-in that makes
    the real plan and fails the host with its error, as the deploy's plan step does."""
    from pathlib import Path

    from specfleet.core.plan import PlanError, make_plan
    from specfleet.core.settings import settings_from_dict
    from specfleet.fleet import bench as fleet_bench
    from specfleet.fleet.pyinfra_run import HostStep
    from tests.harness.sources import ddtree_fork_site
    from tests.unit.test_facts_sglang import collect
    from tests.unit.test_plan import DRAFTER_CONFIG, host_facts

    facts = {**host_facts("rtx6000x8"), "facts.sglang.SGLangInstall": collect(ddtree_fork_site())}
    deploys = []

    def fake_run(inventory, deploy, hosts, data, log, connection=None):
        plan = (data.get("specfleet") or {}).get("plan") or {}
        deploys.append((deploy.rsplit("/", 1)[1], plan.get("ddtree_budget")))
        try:
            make_plan(facts, settings_from_dict({"plan": plan}), DRAFTER_CONFIG, host="ct200")
        except PlanError as exc:
            return fleet_bench.DataRun(1, 1.0, {"h1": HostStep("failed", why=[exc.render()])}, "")
        if deploy.endswith(sweep.POINT_DEPLOY):
            out = Path(data["specfleet_bench"]["fetch_to"])
            (out / "h1.json").write_text(json.dumps(result({1: 50 + plan["ddtree_budget"]})))
        return fleet_bench.DataRun(0, 1.0, {"h1": HostStep("changed")}, "")

    monkeypatch.setattr(sweep, "run_with_data", fake_run)
    args = cli.flags("sweep", ["inv.py", "--host", "h1", "--ddtree-budgets", "8,64,128",
                               "--draft-window", "4096", "--no-report", "--allow-serving"])  # fmt: skip
    (tmp_path / "results").mkdir()
    assert sweep.Sweep(args, sweep.grid_from_args(args), tmp_path).run() == 0
    state = json.loads((tmp_path / "state.json").read_text())
    dropped = state["points"]["ddtree_budget=128,draft_window=4096"]
    assert dropped["status"] == "dropped" and "13.50 GiB per GPU" in dropped["why"]
    assert state["points"]["ddtree_budget=64,draft_window=4096"]["status"] == "done"
    assert state["best"] == state["current"] == "ddtree_budget=64,draft_window=4096"
    seen = capsys.readouterr()
    out = seen.out + seen.err
    assert "dropped" in seen.out  # the sweep's table names the point's status
    assert "ddtree_budget=128,draft_window=4096: dropped from the grid: " in out
    assert "DDTree budget refused" in out
    deploys.clear()
    assert sweep.Sweep(args, sweep.grid_from_args(args), tmp_path).run() == 0  # resumed
    assert deploys == [("kimi_k26.py", 64)]  # no point again, the best restored
