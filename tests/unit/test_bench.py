"""The smoke benchmark's pure parts (specfleet.core.bench), its host-side client against the
stand-in server run here, the sweep's state file, and the report."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specfleet import cli
from specfleet.core import bench as core
from specfleet.core.errors import SpecfleetError
from specfleet.fleet import bench as fleet_bench
from specfleet.fleet import report, sweep
from specfleet.fleet.pyinfra_run import HostStep
from specfleet.fleet.sweep import State
from specfleet.hostside import bench_client
from tests.harness import standin_perf as perf

HARNESS = Path(__file__).parents[1] / "harness"


def result(tps: dict[int, float], accept: float | None = 3.0, arch: str = "sm90") -> dict:
    return {"meta": {"arch": arch}, "accept_length": accept,
            "levels": [{"concurrency": c, "completed": 2, "output_tokens_per_s": t,
                        "mean_ttft_ms": 40.0} for c, t in tps.items()]}


# -- fleet table ----------------------------------------------------------------------------------


def test_a_host_far_below_its_arch_median_is_flagged_and_other_archs_are_not_compared():
    rows = core.fleet_rows({
        "a": result({1: 90, 4: 200}), "b": result({1: 95, 4: 210}), "c": result({1: 40, 4: 90}),
        "b200": result({1: 20, 4: 50}, arch="sm100"),  # alone in its arch: never flagged
        "dead": None,
    })
    by = {r.host: r for r in rows}
    assert by["c"].flag and "sm90 median 200.0" in by["c"].flag
    assert by["a"].flag is None and by["b"].flag is None and by["b200"].flag is None
    assert by["dead"].error == "no result"
    table = core.fleet_table(rows)
    assert "tok/s@1" in table and "tok/s@4" in table and "SLOW" in table


# -- the rollout's speed gate ---------------------------------------------------------------------


def test_speed_gate_compares_tokens_per_s_and_accept_length_with_the_previous_result():
    before = result({1: 100, 4: 200}, accept=3.0)
    assert core.speed_gate(result({1: 99, 4: 190}, accept=2.9), before, 0.9).passed
    slow = core.speed_gate(result({1: 99, 4: 150}), before, 0.9)
    assert not slow.passed and "75% of the earlier 200.0" in slow.why
    worse = core.speed_gate(result({1: 100, 4: 200}, accept=2.0), before, 0.9)
    assert not worse.passed and "accept length 2.00" in worse.why
    assert core.speed_gate(result({4: 10}), None).passed  # nothing to compare with
    assert not core.speed_gate({"error": "cannot benchmark", "levels": []}, before).passed
    assert not core.speed_gate(None, before).passed
    with pytest.raises(SpecfleetError, match="not in"):
        core.speed_gate(before, before, 1.5)


def test_speed_gate_fails_nan_and_a_vanished_acceptance():
    """Issue 55: NaN compared as never below the gate, and a new result without an acceptance
    length skipped its check."""
    before = result({1: 100, 4: 200}, accept=3.0)
    nan = core.speed_gate(result({1: 100, 4: float("nan")}, accept=3.0), before, 0.9)
    assert not nan.passed and "no number" in nan.why
    gone = core.speed_gate(result({1: 100, 4: 200}, accept=None), before, 0.9)
    assert not gone.passed and "accept length None now, 3.00 before" in gone.why
    nan_acc = core.speed_gate(result({1: 100, 4: 200}, accept=float("nan")), before, 0.9)
    assert not nan_acc.passed and "accept length nan now" in nan_acc.why
    # No acceptance before either (a plain server): nothing to keep.
    assert core.speed_gate(result({1: 100, 4: 200}, accept=None),
                           result({1: 100, 4: 200}, accept=None), 0.9).passed


# -- the grid -------------------------------------------------------------------------------------


def test_grid_points_keys_and_the_plan_overrides_of_a_point():
    grid = core.parse_grid({"num_draft_tokens": [4, 8], "draft_window": [2048],
                            "draft_attention_backend": ["fa3", "flashinfer"]})
    assert len(grid) == 4
    assert core.point_key(grid[0]) == (
        "num_draft_tokens=4,draft_window=2048,draft_attention_backend=fa3")
    assert core.point_overrides(grid[0]) == {
        "extra_args": {"--speculative-num-draft-tokens": "4"}, "draft_window_size": 2048,
        "draft_attention_backend": "fa3"}
    for bad, match in (({"block": [1]}, "unknown sweep axis"), ({}, "empty"),
                       ({"num_draft_tokens": [4, 4]}, "repeats"),
                       ({"num_draft_tokens": [0]}, "positive integer")):
        with pytest.raises(SpecfleetError, match=match):
            core.parse_grid(bad)
    with pytest.raises(SpecfleetError, match="integers"):
        core.parse_axis("4,eight", integer=True)


def test_best_point_is_the_fastest_done_one():
    points = {
        "a": {"status": "done", "result": result({4: 150})},
        "b": {"status": "done", "result": result({4: 180})},
        "c": {"status": "failed", "result": result({4: 900})},
        "d": {"status": "pending"},
    }
    assert core.best_key(points) == "b"
    assert core.best_key({"d": {"status": "pending"}}) is None


def test_the_winner_as_group_data_is_python_that_loads(tmp_path):
    plan = {"draft_window_size": 2048, "extra_args": {"--speculative-num-draft-tokens": "8"}}
    path = tmp_path / "sm90.py"
    path.write_text(core.group_data_text("sm90", plan))
    ns: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    assert ns["specfleet"] == {"plan": plan}


# -- the sweep's state file -----------------------------------------------------------------------


def test_sweep_state_resumes_only_the_same_sweep(tmp_path):
    grid = core.parse_grid({"num_draft_tokens": [4, 8]})
    st = State(tmp_path / "state.json", "h1", grid)
    assert not st.resumed()
    st.points[core.point_key(grid[0])].update(status="done", result=result({4: 1}))
    st.save()
    again = State(tmp_path / "state.json", "h1", grid)
    assert again.resumed() and again.points[core.point_key(grid[0])]["status"] == "done"
    with pytest.raises(SpecfleetError, match="another sweep"):
        State(tmp_path / "state.json", "h1", core.parse_grid({"num_draft_tokens": [4, 16]}))
    with pytest.raises(SpecfleetError, match="another sweep"):
        State(tmp_path / "state.json", "h2", grid)


# -- the stand-in's performance model -------------------------------------------------------------


def test_standin_best_point_is_never_a_corner_and_is_the_unique_argmax_with_a_margin():
    corners = {(b, w) for b in (perf.BLOCKS[0], perf.BLOCKS[-1])
               for w in (perf.WINDOWS[0], perf.WINDOWS[-1])}
    seen = set()
    for seed in range(200):
        best = perf.best_point(seed)
        seen.add((best.block, best.window, best.draft_backend))
        assert (best.block, best.window) not in corners
        rates = {(b, w, d): perf.single_tps(perf.Point("DFLASH", b, w, d, "fa3"), seed)
                 for b in perf.BLOCKS for w in perf.WINDOWS for d in perf.DRAFT_BACKENDS}
        top = max(rates, key=rates.get)
        assert top == (best.block, best.window, best.draft_backend)
        assert sorted(rates.values())[-2] <= 0.8 * rates[top]
    assert len(seen) == 16  # every inner point is drawn for some seed


# -- the host-side client against the stand-in server, here -----------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    port = free_port()
    key_file = tmp_path / "secret.yaml"
    key_file.write_text('api-key: "sk-bench-test"\n')
    proc = subprocess.Popen(
        [sys.executable, str(HARNESS / "standin_sglang_server.py"), "--model-path", "/m",
         "--port", str(port), "--config", str(key_file), "--speculative-algorithm", "DFLASH",
         "--speculative-num-draft-tokens", "8", "--speculative-dflash-draft-window-size", "4096",
         "--speculative-draft-attention-backend", "fa3", "--standin-perf-seed", "11",
         "--enable-metrics"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield argparse.Namespace(url=url, key_file=key_file)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.local
def test_bench_client_measures_the_streaming_server_and_keeps_the_previous_result(server, tmp_path):
    out = tmp_path / "bench" / "latest.json"
    argv = ["--url", server.url, "--api-key-file", str(server.key_file), "--concurrency", "1,2",
            "--max-tokens", "24", "--out", str(out), "--meta", "arch=sm90"]
    assert bench_client.main(argv) == 0
    first = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in first["levels"]] == [1, 2]
    assert all(lv["output_tokens"] == lv["requests"] * 24 for lv in first["levels"])
    assert first["levels"][0]["mean_ttft_ms"] > 0 and first["meta"] == {"arch": "sm90"}
    point = perf.Point("DFLASH", 8, 4096, "fa3", None)
    assert first["accept_length"] == pytest.approx(perf.accept_length(point, 11), rel=0.2)
    assert first["accept_length_source"] == "/server_info internal_states"
    assert bench_client.main(argv) == 0
    assert json.loads((out.parent / "previous.json").read_text()) == first
    second = json.loads(out.read_text())
    assert second["previous"]["levels"] == first["levels"]
    assert core.speed_gate(second, second["previous"], 0.5).passed
    # The same figure on /metrics, under SGLang's name.
    assert bench_client.accept_length(server.url + "/nothing", "sk-bench-test") == (None, None)
    with bench_client._request(server.url + "/metrics", "sk-bench-test") as resp:
        assert "sglang:spec_accept_length{" in resp.read().decode()


@pytest.mark.local
def test_standin_chat_completions_answer_whole_and_streamed(server):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi there"}],
            "max_tokens": 5}
    with bench_client._request(server.url + "/v1/chat/completions", "sk-bench-test", body) as r:
        whole = json.loads(r.read())
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"]["content"].split() == ["tok"] * 5
    assert whole["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    with bench_client._request(server.url + "/v1/chat/completions", "sk-bench-test",
                               {**body, "stream": True}) as r:
        lines = [ln.decode().strip() for ln in r if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[5:]) for ln in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).split() == (
        ["tok"] * 5)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.local
def test_bench_client_without_the_key_fails_with_the_reason_and_keeps_no_result(server, tmp_path):
    out = tmp_path / "latest.json"
    assert bench_client.main(["--url", server.url, "--concurrency", "1", "--max-tokens", "4",
                              "--out", str(out)]) == 2
    assert not out.exists()
    failed = json.loads((tmp_path / "latest.json.failed").read_text())
    assert "cannot benchmark" in failed["error"] and "401" in failed["error"]


# -- the report -----------------------------------------------------------------------------------


def test_report_writes_three_pngs_and_an_html_page(tmp_path):
    grid = core.parse_grid({"num_draft_tokens": [4, 8, 16], "draft_window": [2048, 4096]})
    points = {}
    for i, p in enumerate(grid):
        points[core.point_key(p)] = {"point": p, "status": "done" if i != 5 else "failed",
                                     "result": result({1: 50 + i, 4: 100 + 10 * i}, 2 + i / 10)}
    state = {"host": "h1", "grid": grid, "points": points, "best": core.point_key(grid[4]),
             "current": core.point_key(grid[4])}
    page = report.write_report(state, tmp_path)
    for png in ("tokens_per_s.png", "accept_length.png", "heatmap.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
        assert f'src="{png}"' in page.read_text()
    _, _, ys, xs, cells = report.heat_grid(state)
    assert ys == [4, 8, 16] and xs == [2048, 4096]
    assert cells[2][1] is None and cells[2][0] == 140
    assert "BEST" in page.read_text()


def _sweep_state(n_draft, windows, server="stand-in"):
    grid = core.parse_grid({"num_draft_tokens": n_draft, "draft_window": windows})
    points = {}
    for i, p in enumerate(grid):
        res = result({1: 50 + i, 4: 100 + 10 * i, 16: 150 + 12 * i}, 2 + i / 10)
        res["meta"] = {"server": server}
        points[core.point_key(p)] = {"point": p, "status": "done", "result": res}
    best = core.point_key(grid[-1])
    return {"host": "h1", "grid": grid, "points": points, "best": best, "current": best}


def test_report_plots_read_as_a_user_needs(tmp_path):
    import matplotlib.pyplot as plt

    state = _sweep_state([2, 4, 8, 16], [1024, 2048, 4096, 8192])  # 16 lines
    fig = report.plot_tokens(state)
    ax = fig.axes[0]
    # The concurrency axis is categorical: one tick per level measured, labelled with the level.
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16"]
    assert list(ax.get_xticks()) == [0, 1, 2]
    assert ax.get_xlabel().startswith("concurrency") and ax.get_ylabel() == "output tokens/s"
    # 16 lines, 16 different (colour, marker, dash) styles, the legend outside the data.
    styles = {(line.get_color(), line.get_marker(), line.get_linestyle()) for line in ax.lines}
    assert len(ax.lines) == 16 and len(styles) == 16
    assert len({line.get_color() for line in ax.lines}) == 16
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1
    assert "stand-in server" in ax.get_title()
    plt.close(fig)

    fig = report.plot_accept(state)
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("acceptance length") and ax.get_ylabel() == "grid point"
    assert all(t.get_rotation() == 0 for t in ax.get_yticklabels())
    assert "stand-in server" in ax.get_title()
    plt.close(fig)

    fig = report.plot_heatmap(state)
    ax = fig.axes[0]
    texts = {t.get_text(): t for t in ax.texts}
    best = max(texts, key=lambda k: float(k) if k != "-" else -1)
    # The best cell (the brightest viridis yellow) is labelled in black, bold.
    assert texts[best].get_color() == "black" and texts[best].get_fontweight() == "bold"
    assert ax.get_xlabel() and ax.get_ylabel() and "stand-in server" in ax.get_title()
    plt.close(fig)

    page = report.write_report(state, tmp_path).read_text()
    assert "stand-in server" in page


def test_report_of_a_real_server_does_not_say_stand_in(tmp_path):
    state = _sweep_state([4, 8], [2048], server="sglang")
    assert report.standin_note(state) is None
    assert "stand-in" not in report.write_report(state, tmp_path).read_text()


# -- the rollout's hook -----------------------------------------------------------------------------


def test_speed_gate_step_benchmarks_the_batch_and_gates_each_host_on_its_previous(tmp_path):
    calls = []

    def runner(inventory, deploy, hosts, data, log):
        calls.append((deploy, hosts, data))
        out = Path(data["specfleet_bench"]["fetch_to"])
        fast = result({4: 200})
        (out / "h1.json").write_text(json.dumps({**fast, "previous": result({4: 210})}))
        (out / "h2.json").write_text(json.dumps({**result({4: 100}), "previous": fast}))
        (out / "h3.json").write_text(json.dumps(fast))  # a first benchmark: nothing to compare
        return fleet_bench.DataRun(0, 1.0, {"h1": HostStep("ok"), "h2": HostStep("ok"),
                                            "h3": HostStep("ok"),
                                            "h4": HostStep("failed", why=["no server"])}, "")

    verdicts = fleet_bench.speed_gate_step("inv.py", ["h1", "h2", "h3", "h4"], tmp_path, 0.85,
                                           runner=runner)
    assert calls[0][0].endswith("deploys/bench_kimi.py") and calls[0][1] == ["h1", "h2", "h3", "h4"]
    assert calls[0][2]["specfleet_bench"]["result"] == "latest"
    assert verdicts["h1"].passed and verdicts["h3"].passed
    assert not verdicts["h2"].passed and "50% of the earlier 200.0" in verdicts["h2"].why
    assert not verdicts["h4"].passed and "no server" in verdicts["h4"].why


def test_a_sweep_point_that_finds_the_run_lock_held_is_retried_not_failed(tmp_path, monkeypatch):
    calls = []

    def fake_run(inventory, deploy, hosts, data, log, connection=None):
        calls.append(deploy)
        if len(calls) == 1:
            why = [f"in 'Hold the run lock': {sweep.LOCK_HELD}: root@vm (pid 1)"]
            return fleet_bench.DataRun(1, 1.0, {"h1": HostStep("failed", why=why)}, "")
        if deploy.endswith(sweep.POINT_DEPLOY):
            out = Path(data["specfleet_bench"]["fetch_to"])
            (out / "h1.json").write_text(json.dumps(result({4: 123})))
        return fleet_bench.DataRun(0, 1.0, {"h1": HostStep("changed")}, "")

    monkeypatch.setattr(sweep, "run_with_data", fake_run)
    monkeypatch.setattr(sweep, "LOCK_WAIT_S", 0.0)
    args = cli.flags("sweep", ["inv.py", "--host", "h1", "--num-draft-tokens", "8",
                               "--draft-window", "4096", "--no-report", "--allow-serving"])
    (tmp_path / "results").mkdir()
    run = sweep.Sweep(args, sweep.grid_from_args(args), tmp_path)
    assert run.run() == 0
    assert [c.rsplit("/", 1)[1] for c in calls] == ["sweep_point.py", "sweep_point.py",
                                                     "kimi_k26.py"]
    state = json.loads((tmp_path / "state.json").read_text())
    key = "num_draft_tokens=8,draft_window=4096"
    assert state["points"][key]["status"] == "done" and state["current"] == key
