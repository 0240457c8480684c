"""specfleet rollout with the real deploy, deploys/kimi_k26.py (preflight and run lock,
software, weights, unit, restart, readiness), on the demo's stand-ins (tests/demo.py: nvidia-smi
captures, the stand-in hub with a gated Kimi-shaped drafter, the stand-in server) and with the
default prefetch, the fan-out of specfleet/fleet/fanout.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.demo import DEMO_TOKEN, REPO_ROOT, TEST_ENV, up
from tests.harness import HostSpec

pytestmark = pytest.mark.timeout(1800)

HOSTS = [
    HostSpec("ct200", gpu="rtx6000x8", disk="64G"),
    HostSpec("b200", gpu="b200x8", disk="64G"),
    HostSpec("h200", gpu="h200x2", disk="64G"),
]
UNIT = "specfleet-sglang.service"
FILES = f"/etc/systemd/system/{UNIT} /etc/specfleet/specfleet-sglang.env"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = up(f"rollkimi-{os.getpid()}"[:31], HOSTS, tmp_path_factory.mktemp("rollkimi"))
    try:
        yield d
    finally:
        d.down()


def rollout(demo, name: str, *flags: str, **per_host_over) -> tuple[int, str, dict]:
    inv = demo.write_inventory(demo.workdir / f"{name}.py", **per_host_over)
    report = demo.workdir / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_TOKEN"] = DEMO_TOKEN
    env.update(TEST_ENV)  # the demo's settings use test-only keys (launcher)
    res = subprocess.run(
        [sys.executable, "-m", "specfleet.cli", "rollout", str(inv), "deploys/kimi_k26.py",
         "--report", str(report), *flags],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )
    data = json.loads(report.read_text()) if report.exists() else {}
    return res.returncode, res.stdout + res.stderr, data


def status(data: dict) -> dict[str, str]:
    return {h: r["status"] for h, r in data["hosts"].items()}


def files_sha(demo, host: str) -> str:
    return demo.fleet.run(host, f"cat {FILES} | sha1sum", check=True).stdout.split()[0]


def healthy(demo, host: str) -> bool:
    res = demo.fleet.run(host, f"systemctl is-active {UNIT} && curl -sf -o /dev/null "
                               "http://127.0.0.1:30000/health_generate && echo HEALTHY")
    return "HEALTHY" in res.stdout


def test_kimi_k26_rolls_out_converges_and_a_failing_canary_is_rolled_back(demo):
    rc, out, data = rollout(demo, "first", "--batch-size", "2")
    assert rc == 0, out
    assert data["batches"] == [["ct200"], ["b200", "h200"]]
    assert status(data) == {h: "changed" for h in ("ct200", "b200", "h200")}, out
    assert "fanout: target" in out
    assert all(healthy(demo, h) for h in ("ct200", "b200", "h200"))

    rc, out, data = rollout(demo, "again", "--batch-size", "2")
    assert rc == 0, out
    assert status(data) == {h: "ok" for h in ("ct200", "b200", "h200")}, out

    before = {h: files_sha(demo, h) for h in ("ct200", "b200", "h200")}
    rc, out, data = rollout(demo, "bad-canary", "--batch-size", "2",
                            ct200={"launcher": None, "plan": {"extra_env": {"SF_GEN": "2"}}},
                            b200={"plan": {"extra_env": {"SF_GEN": "2"}}},
                            h200={"plan": {"extra_env": {"SF_GEN": "2"}}})
    assert rc == 2, out
    assert status(data) == {"ct200": "rolled back", "b200": "not started",
                            "h200": "not started"}, out
    assert {h: files_sha(demo, h) for h in before} == before
    assert healthy(demo, "ct200")
    # The failed deploy's run released its lock (a failed host releases it): the next run goes.
    rc, out, data = rollout(demo, "after", "--batch-size", "2")
    assert rc == 0, out
    assert status(data) == {h: "ok" for h in ("ct200", "b200", "h200")}, out
