"""A serving group on real hosts: two 8x H100 hosts (stand-in nvidia-smi replaying the real H100
capture) running one SGLang server as TP 16 across them, through deploys/kimi_k26.py.

The server is tests/harness/standin_sglang_server.py, which does SGLang's multi-node start-up
(rank 0 serves only once every rank joined its rendezvous; a rank that cannot join exits at the
distributed timeout). Checked here: the group converges and a second run changes nothing; a change
on one member restarts both exactly once; a member with another plan is refused before anything
changes; a member that cannot reach rank 0 is named; a rank that dies is named by rank 0's gate.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.demo import serve, standin_record
from tests.fleet.test_deploy_fleet import Env, assert_sglang_accepted, changed, op_results
from tests.harness import HostSpec

pytestmark = pytest.mark.timeout(1800)

SPECS = [HostSpec("g0", gpu="h100x8", disk="64G"), HostSpec("g1", gpu="h100x8", disk="64G")]
UNIT = "specfleet-sglang.service"
GATE = "SGLang server running, enabled and ready"


class GroupEnv(Env):
    def group(self, **extra) -> dict:
        return {"group": {"name": "kimi-pair", "members": ["g0", "g1"],
                          "dist_timeout_s": 20, **extra}}  # fmt: skip

    def inventory(self, name: str = "inventory.py", **extra) -> Path:
        over = {h: {**self.group(), **extra.get(h, {})} for h in self.fleet.hosts}
        return self.demo.write_inventory(self.demo.workdir / name, **over)

    def argv(self, host: str) -> list[str]:
        return standin_record(self.fleet, host)["argv"]

    def pid(self, host: str) -> str:
        return self.run(host, f"systemctl show -p MainPID --value {UNIT}").strip()


@pytest.fixture(scope="module")
def genv(make_fleet, tmp_path_factory):
    demo = serve(make_fleet("group", SPECS), tmp_path_factory.mktemp("group"))
    try:
        yield GroupEnv(demo)
    finally:
        demo.hub.stop()


def test_group_converges_as_one_server_then_changes_nothing(genv):
    rc, out = genv.pyinfra("-y")
    assert rc == 0, out[-5000:]
    ip0 = genv.fleet.hosts["g0"]
    for rank, host in enumerate(("g0", "g1")):
        argv = genv.argv(host)
        at = argv.index("--nnodes")
        assert argv[at : at + 8] == ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr",
                                     f"{ip0}:20000", "--dist-timeout", "20"]  # fmt: skip
        assert argv[argv.index("--tp-size") + 1] == "16"
        env = standin_record(genv.fleet, host)["env"]
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] != "lo"
        assert_sglang_accepted(genv, host)
    journal0 = genv.run("g0", f"journalctl -u {UNIT} -o cat --no-pager")
    assert "all 2 node ranks joined" in journal0
    assert f"node rank 1 joined from {genv.fleet.hosts['g1']}" in journal0
    # Rank 0 serves the API; rank 1 only the dummy health server SGLang runs there.
    info = json.loads(genv.run("g0", "curl -s http://127.0.0.1:30000/get_model_info"))
    assert info["model_path"].startswith("/srv/models/demo--Kimi-K2.6-mini/")
    assert genv.run("g1", "curl -s -o /dev/null -w %{http_code} "
                          "http://127.0.0.1:30000/get_model_info") == "404"  # fmt: skip
    # The gate ran on rank 0 only: pyinfra prefixes the gate's output lines with the host.
    assert "[g0] gate: " in out
    assert "[g1] gate: " not in out
    pids = {h: genv.pid(h) for h in ("g0", "g1")}

    rc, out = genv.pyinfra("-y")
    assert rc == 0, out[-5000:]
    assert changed(out) == {"g0": [], "g1": []}, changed(out)
    assert {h: genv.pid(h) for h in ("g0", "g1")} == pids


def test_change_on_one_member_restarts_both_exactly_once(genv):
    starts = {h: genv.starts(h) for h in ("g0", "g1")}
    # Drift on one member only: g1's unit edited by hand. The deploy rewrites it there, and the
    # whole group restarts.
    genv.run("g1", f"sed -i 's/^Description=.*/Description=edited by hand/' "
                   f"/etc/systemd/system/{UNIT}")  # fmt: skip
    rc, out = genv.pyinfra("-y")
    assert rc == 0, out[-5000:]
    # g0's own unit did not change: it restarts because its group does.
    assert "SGLang unit from the launch plan" not in changed(out)["g0"], changed(out)["g0"]
    assert {"Serving group restarts as one", GATE} <= set(changed(out)["g0"]), changed(out)["g0"]
    assert {h: genv.starts(h) - starts[h] for h in ("g0", "g1")} == {"g0": 1, "g1": 1}
    results = op_results(out)
    assert results["g0"]["Serving group restarts as one"] == "Success"
    assert results["g1"]["SGLang unit from the launch plan"] == "Success"
    assert results["g1"][GATE] == "Success" and results["g0"][GATE] == "Success"
    journal0 = genv.run("g0", f"journalctl -u {UNIT} -o cat --no-pager")
    assert journal0.count("all 2 node ranks joined") == 2
    rc, out = genv.pyinfra("-y")
    assert rc == 0 and changed(out) == {"g0": [], "g1": []}, out[-5000:]


def test_member_with_another_plan_refused_before_anything_changes(genv):
    before = {h: genv.snapshot(h) for h in ("g0", "g1")}
    inv = genv.inventory("differs.py", g1={"plan": {"mem_fraction_static": 0.7}})
    rc, out = genv.pyinfra("-y", inventory=inv)
    assert rc != 0
    assert "member g1's plan differs from rank 0 (g0): --mem-fraction-static 0.7" in out
    assert {h: genv.snapshot(h) for h in ("g0", "g1")} == before


def test_member_that_cannot_reach_rank0_is_named_before_anything_changes(genv):
    before = {h: genv.snapshot(h) for h in ("g0", "g1")}
    ip0 = genv.fleet.hosts["g0"]
    # g1's network namespace drops what it sends to g0 (set from outside: the container itself
    # may not change its routes).
    netns = ["ip", "netns", "exec", genv.fleet.state["hosts"]["g1"]["netns"]]
    subprocess.run([*netns, "ip", "route", "add", "blackhole", f"{ip0}/32"], check=True)
    try:
        rc, out = genv.pyinfra("-y", inventory=genv.inventory())
    finally:
        subprocess.run([*netns, "ip", "route", "del", "blackhole", f"{ip0}/32"], check=True)
    assert rc != 0
    assert f"preflight rendezvous-reach: serving group kimi-pair: g1 cannot reach rank 0 (g0) at " \
        f"{ip0}:20000" in out  # fmt: skip
    assert "serving group kimi-pair: member g1 failed earlier in this run" in out
    assert {h: genv.snapshot(h) for h in ("g0", "g1")} == before


def test_rank_that_dies_is_named_by_rank0s_gate(genv):
    # g1's server crashes at start (its own marker file, read by the stand-in knob through an
    # environment file only g1 has), so rank 0 waits for it until the distributed timeout.
    genv.run("g1", "mkdir -p /etc/systemd/system/specfleet-sglang.service.d && printf "
                   "'[Service]\\nEnvironment=STANDIN_CRASH=1\\n' > "
                   "/etc/systemd/system/specfleet-sglang.service.d/crash.conf && "
                   "systemctl daemon-reload")  # fmt: skip
    try:
        inv = genv.inventory("crash.py", **{h: {"launcher": genv.demo.settings(h)["launcher"] + [
            "--standin-fail-if-env", "STANDIN_CRASH"], "readiness_timeout_s": 45.0,
            **genv.group()} for h in ("g0", "g1")})
        rc, out = genv.pyinfra("-y", inventory=inv)
    finally:
        genv.run("g1", "rm -rf /etc/systemd/system/specfleet-sglang.service.d && "
                       "systemctl daemon-reload")  # fmt: skip
    assert rc != 0
    said = [ln for ln in out.splitlines() if "serving group kimi-pair:" in ln]
    assert any("members not running: g1 (rank 1): server" in ln
               and "crashing at start as asked" in ln for ln in said), said
    rc, out = genv.pyinfra("-y")
    assert rc == 0, out[-5000:]
