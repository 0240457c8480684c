"""``specfleet bench`` and ``specfleet sweep`` end to end on two real hosts (tests.demo's stand-ins:
nvidia-smi captures, the stand-in hub, the stand-in server with its performance model,
tests/harness/standin_perf.py).

The stand-in's best speculative point is drawn from a seed chosen at random for each run (printed
below; ``SPECFLEET_STANDIN_PERF_SEED`` replays one) and handed to the server through the test-only
``launcher`` setting. h1 runs on that best point and h2 on a far one, so the benchmark must flag
h2; the sweep then runs on h2, is killed mid-way, is run again, and must end with h2 on the best
point of its grid, changed only through the deploy path.
"""

from __future__ import annotations

import json
import os
import random
import runpy
import signal
import subprocess
import sys
import time

import pytest

from specfleet.core import bench as core
from tests.demo import DEMO_TOKEN, REPO_ROOT, STANDIN, STANDIN_RECORD, TEST_ENV, standin_record, up
from tests.harness import HostSpec
from tests.harness import standin_perf as perf
from tests.harness.sources import (
    DDTREE_FORK_HOST_SRC,
    DDTREE_FORK_TARBALL,
    ddtree_fork_host_script,
)
from tests.unit.test_standin_refusal import assert_accepted

pytestmark = pytest.mark.timeout(1500)

HOSTS = [HostSpec("h1", gpu="h200x2", disk="64G"), HostSpec("h2", gpu="h200x2", disk="64G")]
SEED = int(os.environ.get(perf.SEED_ENV) or random.SystemRandom().randrange(1, 10**9))
BEST = perf.best_point(SEED)
# h2's plan is far from the best on every axis: a corner of BLOCKS x WINDOWS, another backend.
FAR_BLOCK = 16 if BEST.block == 4 else 2
FAR_BACKEND = next(b for b in perf.DRAFT_BACKENDS if b != BEST.draft_backend)
GRID_BLOCKS, GRID_WINDOWS = (2, 4, 8, 16), (2048, 4096)
UNIT_FILES = "/etc/systemd/system/specfleet-sglang.service /etc/specfleet/specfleet-sglang.env"


def launcher() -> list[str]:
    return ["/usr/bin/python3", STANDIN, "--standin-record", STANDIN_RECORD,
            "--standin-perf-seed", str(SEED)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    print(f"stand-in performance seed {SEED}: best {BEST}")
    d = up(f"bench-{os.getpid()}"[:31], HOSTS, tmp_path_factory.mktemp("bench"))
    # h2's plan and the sweep's grid corners are slow on purpose: the stand-in's acceptance length
    # there (1.3 seen) is below the probe's default floor (2.0), which would fail the gate. This
    # module measures speed; the floor has its own tests (test_probe*.py).
    probe = {"min_accept_length": 1.0}
    try:
        d.write_inventory(
            h1={"launcher": launcher(), "probe": probe, "plan": {
                "draft_attention_backend": BEST.draft_backend,
                "draft_window_size": BEST.window,
                "extra_args": {core.NUM_DRAFT_TOKENS_FLAG: str(BEST.block)}}},
            h2={"launcher": launcher(), "probe": probe, "plan": {
                "draft_attention_backend": FAR_BACKEND, "draft_window_size": 1024,
                "extra_args": {core.NUM_DRAFT_TOKENS_FLAG: str(FAR_BLOCK)}}},
        )
        res = d.pyinfra("-y")
        assert res.returncode == 0, res.stdout + res.stderr
        yield d
    finally:
        d.down()


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SPECFLEET_RUN_ID"))}
    e.update(TEST_ENV, HF_TOKEN=DEMO_TOKEN)
    return e


def specfleet(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specfleet.cli", *args], cwd=REPO_ROOT, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def unit_sha(demo, host: str) -> str:
    return demo.fleet.run(host, f"cat {UNIT_FILES} | sha1sum", check=True).stdout.split()[0]


def test_bench_reports_every_host_and_flags_the_slow_one(demo):
    out = demo.workdir / "bench"
    res = specfleet("bench", str(demo.inventory), "--out", str(out), "--concurrency", "1,4",
                    "--max-tokens", "32", "--slow-fraction", "0.8")
    text = res.stdout + res.stderr
    assert res.returncode == 1, text  # one host flagged
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[2:]}
    assert "SLOW" in rows["h2"] and "sm90 median" in rows["h2"], text
    assert rows["h1"].rstrip().endswith("ok"), text
    for host in ("h1", "h2"):
        result = json.loads((out / f"{host}.json").read_text())
        assert result["client"] == "specfleet stdlib"
        assert result["meta"]["arch"] == "sm90"
        assert [lv["concurrency"] for lv in result["levels"]] == [1, 4]
        assert all(lv["completed"] == lv["requests"] and lv["mean_ttft_ms"] > 0
                   for lv in result["levels"])
        assert result["accept_length_source"] == "/server_info internal_states"
    h1, h2 = (json.loads((out / f"{h}.json").read_text()) for h in ("h1", "h2"))
    assert h1["accept_length"] > h2["accept_length"] > 1.0
    # The host keeps its result, the one before it as previous.json (the rollout's speed gate).
    res = specfleet("bench", str(demo.inventory), "--out", str(out), "--limit", "h1",
                    "--concurrency", "1,4", "--max-tokens", "32")
    assert res.returncode == 0, res.stdout + res.stderr
    prev = demo.fleet.run("h1", "cat /var/lib/specfleet/bench/previous.json", check=True)
    assert core.speed_gate(json.loads((out / "h1.json").read_text()),
                           json.loads(prev.stdout)).passed
    assert not core.speed_gate(h2, h1, 0.85).passed


def test_sweep_resumes_after_a_kill_and_leaves_the_host_on_the_best_point(demo):
    inv = str(demo.inventory)
    out = demo.workdir / "sweep"
    grid_args = ["--num-draft-tokens", ",".join(map(str, GRID_BLOCKS)),
                 "--draft-window", ",".join(map(str, GRID_WINDOWS)),
                 "--concurrency", "1,4", "--max-tokens", "32", "--out", str(out)]
    before = unit_sha(demo, "h2")

    # h2 serves: refused, nothing changed.
    res = specfleet("sweep", inv, "--host", "h2", *grid_args)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "is serving" in res.stderr and "--allow-serving" in res.stderr, res.stderr
    assert unit_sha(demo, "h2") == before

    # Killed (the whole process group, pyinfra with it) once two points are done.
    argv = [sys.executable, "-m", "specfleet.cli", "sweep", inv, "--host", "h2",
            "--allow-serving", *grid_args]
    log = open(demo.workdir / "sweep-killed.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env(), stdout=log, stderr=log,
                            start_new_session=True)
    state_path = out / "state.json"

    def points_done() -> int:
        if not state_path.exists():
            return 0
        return sum(p["status"] == "done" for p in json.loads(state_path.read_text())["points"].values())

    deadline = time.monotonic() + 600
    try:
        while proc.poll() is None and points_done() < 2:
            if time.monotonic() > deadline:
                pytest.fail(f"waited 600 s for the sweep to finish 2 points: {points_done()} done"
                            f"\n{(demo.workdir / 'sweep-killed.log').read_text()[-4000:]}")
            time.sleep(0.5)
        assert proc.poll() is None, (demo.workdir / "sweep-killed.log").read_text()
        time.sleep(3)  # into the next point's deploy
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        # Every process of the group gone (pyinfra reaped by init) before the sweep runs again:
        # a survivor would still be deploying a point beside the resumed sweep.
        gone_by = time.monotonic() + 10
        while group_alive(proc.pid):
            if time.monotonic() > gone_by:
                left = subprocess.run(["ps", "-o", "pid,stat,args", "-s", str(proc.pid)],
                                      capture_output=True, text=True).stdout
                pytest.fail(f"the killed sweep's processes (session {proc.pid}) are still there "
                            f"10 s after SIGKILL:\n{left}")
            time.sleep(0.1)
    finally:
        log.close()
    killed = json.loads(state_path.read_text())
    done = {k: p for k, p in killed["points"].items() if p["status"] == "done"}
    assert 2 <= len(done) < len(killed["points"])
    assert killed["current"] in killed["points"]  # the host is on a recorded grid point

    # Run again (no --allow-serving needed: it resumes its own sweep); only the rest is done.
    group_data = demo.workdir / "sm90_winner.py"
    res = specfleet("sweep", inv, "--host", "h2", *grid_args,
                    "--write-group-data", str(group_data))
    text = res.stdout + res.stderr
    assert res.returncode == 0, text
    assert f"resuming: {len(done)} of 8 points done" in text, text
    ran = [ln for ln in res.stderr.splitlines() if ln.startswith("sweep: point ")]
    assert len(ran) == 8 - len(done), text
    assert not any(k in ln for k in done for ln in ran), text
    final = json.loads(state_path.read_text())
    assert all(final["points"][k]["started"] == p["started"] for k, p in done.items())
    assert all(p["status"] == "done" for p in final["points"].values()), text

    # The best point of the stand-in's model over this grid: never a corner.
    def model_tps(block: int, window: int) -> float:
        return perf.single_tps(perf.Point("DFLASH", block, window, FAR_BACKEND, "fa3"), SEED)

    expected = max(((b, w) for b in GRID_BLOCKS for w in GRID_WINDOWS),
                   key=lambda bw: model_tps(*bw))
    assert expected[0] not in (GRID_BLOCKS[0], GRID_BLOCKS[-1])
    best_key = core.point_key({"num_draft_tokens": expected[0], "draft_window": expected[1]})
    assert final["best"] == best_key, text
    assert final["current"] == best_key and final["finished"]

    # The server runs the winner's flags...
    argv_now = standin_record(demo.fleet, "h2")["argv"]
    now = perf.point_from_argv(argv_now)
    assert (now.block, now.window) == expected
    # ...and the deploy path with the winning overrides has nothing left to change.
    plan = core.point_overrides(final["points"][best_key]["point"])
    unit_state = ("sha1sum /etc/systemd/system/specfleet-sglang.service "
                  "/etc/specfleet/specfleet-sglang.env; "
                  "systemctl show -p MainPID -p InvocationID specfleet-sglang")  # fmt: skip
    before = demo.fleet.run("h2", unit_state, check=True).stdout
    res = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "--limit", "h2", "--data",
         f"specfleet={json.dumps({'plan': plan})}", inv, "deploys/kimi_k26.py"],
        cwd=REPO_ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert demo.fleet.run("h2", unit_state, check=True).stdout == before

    # The winner as group data, and the report.
    assert runpy.run_path(str(group_data))["specfleet"] == {"plan": plan}
    assert "<img src=\"heatmap.png\"" in (out / "report.html").read_text()
    for png in ("tokens_per_s.png", "accept_length.png", "heatmap.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


# -- DDTree: the fork's tree on h1, planned at a budget, swept by budget, rolled out ---------------

DDTREE_VENV = "/opt/specfleet/ddtree"
BUDGETS = perf.BUDGETS  # 8,16,32,64,128: the stand-in's best is an inner one
FIRST_BUDGET = 32


def ddtree_settings(plan: dict) -> dict:
    """h1 on the DDTree fork's tree (tests/harness/sources.py lays it in, named as such): a
    source install keyed by its folder, beside the release venv; the stand-in started by the
    venv's own python runs the fork's parser and rules (sglang_rules.py)."""
    return {
        "venv": DDTREE_VENV,
        "sglang": {"kind": "source", "source_path": DDTREE_FORK_HOST_SRC},
        "launcher": [f"{DDTREE_VENV}/bin/python", STANDIN, "--standin-record", STANDIN_RECORD,
                     "--standin-perf-seed", str(SEED)],
        # The sweep's budget corners are slow on purpose (see the module's fixture).
        "probe": {"min_accept_length": 1.0},
        "plan": plan,
    }


def standin_argv(demo, host: str) -> list[str]:
    return standin_record(demo.fleet, host)["argv"]


def test_ddtree_fork_planned_swept_by_budget_and_rolled_out(demo):
    demo.fleet.put("h1", DDTREE_FORK_TARBALL, "/tmp/sglang-ddtree-fork.tar.gz")
    demo.fleet.run("h1", ddtree_fork_host_script("/tmp/sglang-ddtree-fork.tar.gz", DDTREE_VENV),
                   check=True, timeout=300)  # fmt: skip
    # Building that tree on the host (a fresh venv): its Rust extension needs cargo, which the
    # host lacks, and its rust/ sources, which the tarball lacks: refused before anything changes.
    build = {**ddtree_settings({"ddtree_budget": FIRST_BUDGET}), "venv": DDTREE_VENV + "-build"}
    inv = demo.write_inventory(demo.workdir / "ddtree_build_inventory.py", h1=build)
    before = unit_sha(demo, "h1")
    res = demo.pyinfra("-y", "--limit", "h1", inventory=inv)
    text = res.stdout + res.stderr
    assert res.returncode != 0, text[-4000:]
    assert "sglang.srt.grpc._core" in text and "no Rust toolchain (cargo not found)" in text, (
        text[-4000:])
    assert demo.fleet.run("h1", f"test -e {DDTREE_VENV}-build").returncode != 0
    assert unit_sha(demo, "h1") == before

    inv = demo.write_inventory(demo.workdir / "ddtree_inventory.py",
                               h1=ddtree_settings({"ddtree_budget": FIRST_BUDGET}))

    # Planned with DDTree at the budget, the stand-in started with the fork's exact flags, the
    # readiness gate passed; a second run changes nothing.
    res = demo.pyinfra("-y", "--limit", "h1", inventory=inv)
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-4000:]
    argv = standin_argv(demo, "h1")
    assert argv[0] == f"{DDTREE_VENV}/bin/python"
    # The start is a verdict: the fork's own parser and rules ran on its flags and accepted them.
    assert_accepted(standin_record(demo.fleet, "h1")["sglang_rules"], f"{DDTREE_VENV}/lib")
    assert "--speculative-dflash-enable-ddtree" in argv
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == str(FIRST_BUDGET)
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    before = unit_sha(demo, "h1")
    res = demo.pyinfra("-y", "--limit", "h1", inventory=inv)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert unit_sha(demo, "h1") == before
    assert standin_argv(demo, "h1") == argv

    # The budget sweep finds the stand-in's best budget and writes its plots.
    out = demo.workdir / "sweep-ddtree"
    gd = demo.workdir / "group_data_ddtree"
    gd.mkdir()
    grid = ["--ddtree-budgets", ",".join(map(str, BUDGETS)), "--draft-window", "4096",
            "--concurrency", "1", "--max-tokens", "32", "--out", str(out)]
    res = specfleet("sweep", str(inv), "--host", "h1", "--allow-serving", *grid,
                    "--write-group-data", str(gd / "h200x2.py"))
    text = res.stdout + res.stderr
    print(res.stdout)  # the sweep's table (pytest -s shows it)
    assert res.returncode == 0, text[-4000:]
    state = json.loads((out / "state.json").read_text())
    best = core.point_key({"ddtree_budget": perf.best_budget(SEED), "draft_window": 4096})
    assert state["best"] == best, text
    assert perf.best_budget(SEED) not in (BUDGETS[0], BUDGETS[-1])
    assert (out / "ddtree_budget.png").read_bytes()[:4] == b"\x89PNG"
    assert 'src="ddtree_budget.png"' in (out / "report.html").read_text()
    accepts = [state["points"][core.point_key({"ddtree_budget": b, "draft_window": 4096})]
               ["result"]["accept_length"] for b in BUDGETS]  # fmt: skip
    assert accepts == sorted(accepts), accepts

    # The winner rolls out through group data: the inventory's h1 names no budget, the group
    # data file the sweep wrote does; the host (restored to the best point) has nothing to change.
    assert runpy.run_path(str(gd / "h200x2.py"))["specfleet"]["plan"]["ddtree_budget"] == (
        perf.best_budget(SEED))
    inv = demo.write_inventory(demo.workdir / "ddtree_inventory.py", h1=ddtree_settings({}))
    before = unit_sha(demo, "h1")
    res = demo.pyinfra("-y", "--limit", "h1", "--group-data", str(gd), inventory=inv)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert unit_sha(demo, "h1") == before
    now = standin_argv(demo, "h1")
    assert now[now.index("--speculative-num-draft-tokens") + 1] == str(perf.best_budget(SEED))

    # A host without DDTree (h2: the 0.5.11 release) refuses a budget axis, changing nothing.
    before = unit_sha(demo, "h2")
    res = specfleet("sweep", str(inv), "--host", "h2", "--allow-serving", "--ddtree-budgets",
                    "16,32", "--out", str(demo.workdir / "sweep-no-ddtree"))
    assert res.returncode == 3, res.stdout + res.stderr
    assert "cannot be swept here" in res.stderr and "no DDTree" in res.stderr, res.stderr
    assert unit_sha(demo, "h2") == before
