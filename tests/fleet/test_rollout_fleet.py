"""specfleet rollout on four real Debian hosts (tests.fleet).

The rolled deploy is tests/deploys/rollout_deploy.py (software, weights, unit, restart, readiness, in
deploys/kimi_k26.py's order) with the prefetch stage running tests/deploys/rollout_weights.py. Weights are
small git repos served by the stand-in hub (tests/harness/weights_support.py); SGLang 0.5.11 is installed
for real (``--no-deps``) from the fleet's wheelhouse; the server is the stand-in
(tests/harness/standin_sglang_server.py) through the test-only ``launcher`` setting. A host is made to
fail readiness with the real ``sglang.launch_server`` (``launcher=None``: it dies at
``import numpy``) or with the stand-in's ``--standin-exit``.

Set SPECFLEET_ROLLOUT_FLEET=NAME to run on a fleet booted earlier with
``python -m tests.fleet up --name NAME --hosts h1:h200x2:disk=1G,...,h4:h200x2:disk=1G``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from specfleet.core.settings import deep_merge
from tests.harness import Fleet, HostSpec
from tests.harness.weights_support import StandinHub, commit_files, make_repo, random_bytes

REPO = Path(__file__).resolve().parents[2]
HOSTS = ("h1", "h2", "h3", "h4")
SERVICE = "sf-roll"
PORT = 30100
UNIT = f"/etc/systemd/system/{SERVICE}.service"
ENV = f"/etc/specfleet/{SERVICE}.env"
STANDIN = "/opt/specfleet-standin/standin_sglang_server.py"
RECORD = f"/run/standin/{SERVICE}.json"
VENV = "/opt/specfleet/sglang"
KEPT = f"/var/lib/specfleet/rollback/{SERVICE}"
DRAFTER_CONFIG = {"architectures": ["DFlashDraftModel"], "block_size": 8, "mask_token_id": 163838}
MB = 1_000_000


def target_files(seed: str) -> dict[str, bytes]:
    return {
        "model-00001-of-00001.safetensors": random_bytes(MB, seed),
        "config.json": json.dumps({"model_type": "test", "seed": seed}).encode(),
    }


@pytest.fixture(scope="module")
def env(make_fleet, tmp_path_factory):
    name = os.environ.get("SPECFLEET_ROLLOUT_FLEET")
    if name:
        fleet = Fleet.attach(name)
    else:
        fleet = make_fleet("rollout", [HostSpec(h, gpu="h200x2", disk="1G") for h in HOSTS])
    work = tmp_path_factory.mktemp("rollout")
    mirrors = work / "mirrors"
    revs = {
        "target": make_repo(mirrors, "testorg/tiny", target_files(f"tiny-{time.time()}")),
        "drafter": make_repo(mirrors, "testorg/drafter",
                             {"config.json": json.dumps(DRAFTER_CONFIG).encode()}),
    }
    hub = StandinHub(mirrors, fleet.bridge_ip, work)
    try:
        hub.wait("testorg/tiny")
        for h in HOSTS:
            fleet.run(h, "mkdir -p /opt/specfleet-standin /run/standin", check=True)
            fleet.put(h, REPO / "tests" / "harness" / "standin_sglang_server.py", STANDIN)
        e = {"fleet": fleet, "work": work, "mirrors": mirrors, "revs": revs, "hub": hub, "n": 0}
        base = baseline(e)
        first = rollout(e, {h: base for h in HOSTS}, "--batch-size", "3")
        assert first.rc == 0, first
        assert all(first.hosts[h]["status"] == "changed" for h in HOSTS), first
        e["first"] = first
        yield e
    finally:
        hub.stop()


def baseline(env, **over) -> dict:
    fleet = env["fleet"]
    data = {
        "target": {"repo_id": "testorg/tiny", "revision": env["revs"]["target"]},
        "drafter": {"repo_id": "testorg/drafter", "revision": env["revs"]["drafter"]},
        "weights": {"hf_endpoint": env["hub"].url, "poll_seconds": 0.5,
                    "margin_min_gib": 0.001, "stall_minutes": 1.0,
                    # The stand-in hub serves plain http on the fleet's bridge: allowed by name.
                    "allow_http_hosts": [urllib.parse.urlsplit(env["hub"].url).hostname]},
        "sglang": {"version": "0.5.11", "find_links": fleet.wheelhouse_url,
                   "trusted_hosts": [fleet.bridge_ip], "no_deps": True},
        "service_name": SERVICE,
        "port": PORT,
        "readiness_timeout_s": 60,
        "launcher": ["/usr/bin/python3", STANDIN, "--standin-record", RECORD],
    }
    return deep_merge(data, over)


class Result:
    def __init__(self, proc: subprocess.CompletedProcess, report: dict, seconds: float):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.report = report
        self.hosts = report.get("hosts", {})
        self.seconds = seconds

    def status(self) -> dict[str, str]:
        return {h: r["status"] for h, r in self.hosts.items()}

    def __repr__(self) -> str:
        return f"Result(rc={self.rc}, {self.status()})\n{self.out}\n{self.err[-8000:]}"


def rollout(env, per_host: dict[str, dict], *flags: str, during=None,
            prefetch: str | None = "tests/deploys/rollout_weights.py", edit=None,
            started=None) -> Result:
    """Write an inventory with ``per_host`` settings and run the rollout CLI on it. ``during`` is
    called with each line of its stderr as it comes (to act mid-rollout); ``edit`` rewrites the
    inventory's text; ``started`` receives the process."""
    env["n"] += 1
    inv = env["fleet"].write_inventory(
        env["work"] / f"inventory{env['n']}.py",
        host_data={h: {"specfleet": per_host[h]} for h in per_host},
    )
    if edit:
        inv.write_text(edit(inv.read_text()))
    report = env["work"] / f"report{env['n']}.json"
    argv = [sys.executable, "-m", "specfleet.cli", "rollout", str(inv), "tests/deploys/rollout_deploy.py",
            "--report", str(report), *flags]
    if prefetch:
        argv += ["--prefetch-deploy", prefetch]
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    if started:
        started(proc)
    err: list[str] = []

    def pump():
        for line in proc.stderr:
            err.append(line)
            if during:
                during(line)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    out = proc.stdout.read()
    proc.wait(timeout=900)
    t.join(timeout=30)
    done = subprocess.CompletedProcess(argv, proc.returncode, out, "".join(err))
    data = json.loads(report.read_text()) if report.exists() else {}
    return Result(done, data, time.monotonic() - start)


def unit_sha(env, host: str) -> str:
    """The hash of the unit and its environment file together."""
    return env["fleet"].run(host, f"cat {UNIT} {ENV} | sha1sum | cut -c1-40",
                            check=True).stdout.strip()


def healthy(env, host: str) -> bool:
    res = env["fleet"].run(
        host, f"systemctl is-active {SERVICE}.service && curl -sf -o /dev/null "
        f"http://127.0.0.1:{PORT}/health_generate && echo HEALTHY",
    )
    return "HEALTHY" in res.stdout


def freeze(env, host: str) -> list[str]:
    res = env["fleet"].run(host, f"{VENV}/bin/python -m pip freeze", check=True)
    return sorted(res.stdout.split())


def gen(env, tag: str, **over) -> dict:
    """The baseline with a new environment variable: every host's unit changes."""
    return baseline(env, plan={"extra_env": {"SF_GEN": tag}}, **over)


# --------------------------------------------------------------------------------------------------


def test_first_rollout_converged_every_host(env):
    first = env["first"]
    assert first.report["batches"] == [["h1"], ["h2", "h3", "h4"]]
    for h in HOSTS:
        assert healthy(env, h)
        # The prefetch fetched the weights, so the deploy step found them in place.
        assert "Target weights" not in first.hosts[h]["changed_ops"], first
        assert set(first.hosts[h]["seconds"]) >= {"prefetch", "snapshot", "deploy", "gate"}
        kept = env["fleet"].run(h, f"ls /var/lib/specfleet/rollback/{SERVICE}", check=True)
        assert "taken" in kept.stdout.split()


def test_a_failing_canary_stops_is_rolled_back_and_the_rest_is_untouched(env):
    before = {h: unit_sha(env, h) for h in HOSTS}
    pid = json.loads(env["fleet"].run("h1", f"cat {RECORD}", check=True).stdout)["pid"]
    hosts = {h: gen(env, "canary-fails") for h in HOSTS}
    hosts["h1"]["launcher"] = None  # the real sglang.launch_server: dies at import numpy
    res = rollout(env, hosts, "--batch-size", "2")
    assert res.rc == 2, res
    assert res.status() == {"h1": "rolled back", "h2": "not started", "h3": "not started",
                            "h4": "not started"}, res
    assert "STOPPED: the canary h1 failed" in res.err
    why = " ".join(res.hosts["h1"]["why"])
    assert "not ready" in why and "rolled back" in why, res
    assert {"snapshot", "deploy", "rollback"} <= set(res.hosts["h1"]["seconds"])
    # The summary table names every host with its result.
    for h, status in res.status().items():
        assert any(line.startswith(h) and status in line for line in res.out.splitlines()), res.out
    # h1 is back on its old unit and serving; the others were never touched.
    assert {h: unit_sha(env, h) for h in HOSTS} == before
    assert healthy(env, "h1")
    assert json.loads(env["fleet"].run("h1", f"cat {RECORD}").stdout)["pid"] != pid
    assert env["fleet"].run("h1", "test -e /var/lib/specfleet/sf-roll.restart-pending").returncode


def test_second_batch_failure_within_the_budget_finishes(env):
    before = {h: unit_sha(env, h) for h in HOSTS}
    hosts = {h: gen(env, "within") for h in HOSTS}
    hosts["h3"]["launcher"] = [*baseline(env)["launcher"], "--standin-exit", "3"]
    res = rollout(env, hosts, "--batch-size", "2", "--max-fail-percent", "50")
    assert res.rc == 1, res
    assert res.report["batches"] == [["h1"], ["h2", "h3"], ["h4"]]
    assert res.status() == {"h1": "changed", "h2": "changed", "h3": "rolled back",
                            "h4": "changed"}, res
    assert unit_sha(env, "h3") == before["h3"]
    assert all(unit_sha(env, h) != before[h] for h in ("h1", "h2", "h4"))
    assert all(healthy(env, h) for h in HOSTS)


def test_second_batch_failure_past_the_budget_stops(env):
    before = {h: unit_sha(env, h) for h in HOSTS}
    hosts = {h: gen(env, "past") for h in HOSTS}
    hosts["h2"]["launcher"] = [*baseline(env)["launcher"], "--standin-exit", "3"]
    res = rollout(env, hosts, "--order", "h1,h2,h3,h4", "--batch-size", "2",
                  "--max-fail-percent", "49")
    assert res.rc == 2, res
    assert res.status() == {"h1": "changed", "h2": "rolled back", "h3": "changed",
                            "h4": "not started"}, res
    assert "1 of 2 hosts of batch 1/2 failed, over the budget of 49%" in res.err
    assert unit_sha(env, "h4") == before["h4"]
    assert unit_sha(env, "h2") == before["h2"]
    assert all(healthy(env, h) for h in HOSTS)


def test_a_host_unreachable_mid_rollout_is_reported_and_counted(env):
    fleet = env["fleet"]
    veth = fleet.state["hosts"]["h3"]["veth"]
    before = unit_sha(env, "h3")
    cut = threading.Event()

    def during(line: str) -> None:
        if not cut.is_set() and "rollout: canary: every host passed" in line:
            subprocess.run(["ip", "link", "set", veth, "down"], check=True)
            cut.set()

    hosts = {h: gen(env, "unreachable") for h in HOSTS}
    try:
        res = rollout(env, hosts, "--batch-size", "2", "--max-fail-percent", "50", during=during)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    assert cut.is_set(), res
    assert res.rc == 1, res
    assert res.status() == {"h1": "changed", "h2": "changed", "h3": "failed",
                            "h4": "changed"}, res
    assert res.hosts["h3"]["unreachable"] is True
    assert "unreachable" in " ".join(res.hosts["h3"]["why"]), res
    assert "rollback" not in res.hosts["h3"]["seconds"]
    deadline = time.monotonic() + 30
    while fleet.run("h3", "true", timeout=20).returncode and time.monotonic() < deadline:
        time.sleep(1)
    assert unit_sha(env, "h3") == before
    assert healthy(env, "h3")


def test_a_host_that_had_no_server_goes_back_to_none(env):
    hosts = {h: baseline(env, service_name="sf-new", port=PORT + 1) for h in HOSTS}
    hosts["h1"]["launcher"] = None
    res = rollout(env, hosts, "--batch-size", "3")
    assert res.rc == 2 and res.status()["h1"] == "rolled back", res
    gone = env["fleet"].run("h1", "ls /etc/systemd/system/sf-new.service /etc/specfleet/sf-new.env")
    assert gone.returncode != 0 and gone.stdout == ""
    state = env["fleet"].run("h1", "systemctl show -p LoadState -p ActiveState sf-new.service")
    assert state.stdout.split() == ["LoadState=not-found", "ActiveState=inactive"], state.stdout
    assert healthy(env, "h1")  # the other server on the host was never touched
    assert all(env["fleet"].run(h, "test -e /etc/systemd/system/sf-new.service").returncode
               for h in ("h2", "h3", "h4"))


def test_a_new_sglang_that_fails_is_rolled_back_to_the_kept_pins(env):
    before_pins = freeze(env, "h1")
    assert "sglang==0.5.11" in before_pins
    before_unit = unit_sha(env, "h1")
    hosts = {h: gen(env, "new-sglang") for h in HOSTS}
    hosts["h1"] = gen(env, "new-sglang", sglang={"version": "0.5.14"}, launcher=None)
    res = rollout(env, hosts, "--batch-size", "3")
    assert res.rc == 2 and res.status()["h1"] == "rolled back", res
    assert freeze(env, "h1") == before_pins
    assert unit_sha(env, "h1") == before_unit
    assert healthy(env, "h1")
    wheels = env["fleet"].run("h1", "ls /var/lib/specfleet/rollback/wheels", check=True).stdout
    assert any(w.startswith("sglang-0.5.11-") for w in wheels.split()), wheels


def test_the_patch_state_is_rolled_back_both_ways(env, tmp_path):
    """A new PR#20547 that fails readiness is taken off again; an upgrade that drops an applied
    patch and fails is rolled back to the old pins with the patch applied again, from the host's
    own rollback point. The drafter RoPE patch (#52), which the same deploys apply (its wheels
    come from patch.source too), follows the point as the port does."""
    from specfleet.core.sglang.rope import load_rope_patch, rope_patch_id
    from tests.fleet.test_op_sglang_fleet import PR, port_id, tree_sha

    patch = PR  # the port onto 0.5.11, its upstream text from the shared fixtures (recipe)
    marker = f"{VENV}/.specfleet/pr20547/sha256"
    rope = f"{VENV}/.specfleet/dflash-rope"
    rope_id = rope_patch_id(load_rope_patch("0.5.11"))
    # The baseline has no patch.source: its RoPE patch was left out (no PyPI here).
    assert env["fleet"].run("h1", f"test -e {rope}").returncode != 0
    pristine = tree_sha(env["fleet"], "h1", VENV, sources_only=True)
    others = {h: gen(env, "patch") for h in ("h2", "h3", "h4")}

    # 1. The canary gets the patch and a server that dies: back to the unpatched install.
    hosts = {**others, "h1": gen(env, "patch", launcher=None,
                                 patch=dict(patch))}
    res = rollout(env, hosts, "--batch-size", "3")
    assert res.rc == 2 and res.status()["h1"] == "rolled back", res
    assert tree_sha(env["fleet"], "h1", VENV, sources_only=True) == pristine
    assert env["fleet"].run("h1", f"test -e {marker}").returncode != 0
    # The RoPE patch the failed deploy applied beside the port is off too: not in the point.
    assert env["fleet"].run("h1", f"test -e {rope}").returncode != 0
    assert env["fleet"].run("h1", f"test -e {KEPT}/rope").returncode != 0
    assert healthy(env, "h1")
    # The port failed a readiness gate there: remembered, so that no later run applies it again
    # unasked. The operator clears it to try again (here: with a good server).
    rejected = f"{VENV}/.specfleet/pr20547.rejected"
    assert env["fleet"].run("h1", f"cat {rejected}").stdout.strip() == port_id()
    env["fleet"].run("h1", f"rm {rejected}", check=True)

    # 2. The patch with a good server: applied everywhere it is asked for.
    hosts["h1"] = gen(env, "patch", patch=dict(patch))
    res = rollout(env, hosts, "--batch-size", "3")
    assert res.rc == 0, res
    patched = tree_sha(env["fleet"], "h1", VENV, sources_only=True)
    assert patched != pristine
    assert env["fleet"].run("h1", f"cat {marker}").stdout.strip() == port_id()
    assert env["fleet"].run("h1", f"cat {rope}/sha256").stdout.strip() == rope_id
    # The state that passed its gate is the point, both patches with it.
    assert env["fleet"].run("h1", f"cat {KEPT}/rope/sha256").stdout.strip() == rope_id
    assert env["fleet"].run("h1", f"cat {KEPT}/patch/sha256").stdout.strip() == port_id()
    pins = freeze(env, "h1")

    # 3. An upgrade to 0.5.14 (which drops the patch: it has its own v2 worker) that fails.
    hosts["h1"] = gen(env, "patch-upgrade", launcher=None, sglang={"version": "0.5.14"},
                      patch=dict(patch))
    res = rollout(env, hosts, "--batch-size", "3")
    assert res.rc == 2 and res.status()["h1"] == "rolled back", res
    assert freeze(env, "h1") == pins
    assert tree_sha(env["fleet"], "h1", VENV, sources_only=True) == patched
    assert env["fleet"].run("h1", f"cat {marker}").stdout.strip() == port_id()
    assert healthy(env, "h1")
    # The PatchState fact agrees: every file the apply wrote is as it left it.
    state = env["fleet"].run(
        "h1", f"cd $(cat {VENV}/.specfleet/pr20547/site) && "
        f"sha256sum --status -c {VENV}/.specfleet/pr20547/applied.sha256")
    assert state.returncode == 0, state.stdout + state.stderr
    # And the RoPE patch is applied again from the point, intact.
    assert env["fleet"].run("h1", f"cat {rope}/sha256").stdout.strip() == rope_id
    state = env["fleet"].run(
        "h1", f"cd $(cat {rope}/site) && sha256sum --status -c {rope}/applied.sha256")
    assert state.returncode == 0, state.stdout + state.stderr


def test_a_new_weights_revision_rolls_out_everywhere_then_nothing_changes(env):
    rev2 = commit_files(env["mirrors"], "testorg/tiny", target_files("tiny-rev2"), "rev2")
    hosts = {h: baseline(env, target={"revision": rev2}) for h in HOSTS}
    res = rollout(env, hosts, "--batch-size", "2")
    assert res.rc == 0, res
    assert res.status() == {h: "changed" for h in HOSTS}, res
    pids = {}
    for h in HOSTS:
        link = env["fleet"].run(h, "readlink /srv/models/testorg--tiny/current", check=True)
        assert link.stdout.strip() == rev2
        assert f"testorg/tiny@{rev2}" in env["fleet"].run(h, f"cat {UNIT}").stdout
        assert healthy(env, h)
        # The prefetch stage fetched the new revision before the host's deploy step ran.
        assert "Target weights" not in res.hosts[h]["changed_ops"], res
        pids[h] = json.loads(env["fleet"].run(h, f"cat {RECORD}").stdout)["pid"]

    taken = {h: env["fleet"].run(h, f"cat {KEPT}/taken", check=True).stdout for h in HOSTS}
    again = rollout(env, copy.deepcopy(hosts), "--batch-size", "2")
    assert again.rc == 0, again
    assert again.status() == {h: "ok" for h in HOSTS}, again
    for h in HOSTS:
        assert again.hosts[h]["changed_ops"] == []
        assert json.loads(env["fleet"].run(h, f"cat {RECORD}").stdout)["pid"] == pids[h]
        # The rollback point was current: the snapshot step left it as it was.
        assert env["fleet"].run(h, f"cat {KEPT}/taken", check=True).stdout == taken[h]


def test_the_default_prefetch_fans_the_weights_out_host_to_host(env):
    """Without --prefetch-deploy the prefetch is specfleet/fleet/fanout.py's: the hub serves each new
    file once for the whole fleet, the hosts copy it from each other."""
    rev3 = commit_files(env["mirrors"], "testorg/tiny", target_files("tiny-rev3"), "rev3")
    shard = "model-00001-of-00001.safetensors"
    before = env["hub"].gets("testorg/tiny", shard)
    hosts = {h: baseline(env, target={"revision": rev3}) for h in HOSTS}
    res = rollout(env, hosts, "--batch-size", "3", prefetch=None)
    assert res.rc == 0, res
    assert res.status() == {h: "changed" for h in HOSTS}, res
    assert "fanout: target" in res.err
    assert env["hub"].gets("testorg/tiny", shard) - before == 1
    for h in HOSTS:
        link = env["fleet"].run(h, "readlink /srv/models/testorg--tiny/current", check=True)
        assert link.stdout.strip() == rev3
        assert "Target weights" not in res.hosts[h]["changed_ops"], res
        assert healthy(env, h)
    print(f"fan-out rollout of a new revision over 4 hosts: {res.seconds:.1f}s "
          f"(prefetch {res.hosts['h1']['seconds']['prefetch']:.1f}s)")


# --------------------------------------------------------------------------------------------------
# The controller: locks for the whole rollout, rollback points, pyinfra's options, --dry, --json,
# hooks (specfleet/fleet/ROLLOUT.md)

LOCK = "/var/lib/specfleet/run.lock"


def host_state(env, host: str) -> str:
    """One hash of what a rollout may change on a host: the unit and env file, the venv's
    distributions (RECORD files) and PR#20547 state, the weights, the rollback point, the run
    lock, and the server's process."""
    script = (
        f"(cat {UNIT} {ENV} 2>/dev/null; "
        f"find {VENV}/lib -path '*.dist-info/RECORD' | sort | xargs -r sha1sum; "
        f"find {VENV}/.specfleet /srv/models {KEPT} {LOCK} -type f 2>/dev/null | sort "
        "| xargs -r sha1sum; "
        f"find /srv/models -type l | sort | xargs -r readlink; "
        f"systemctl show -p ActiveState -p MainPID {SERVICE}.service) | sha1sum | cut -c1-40"
    )
    return env["fleet"].run(host, script, check=True).stdout.strip()


def hold_lock(env, host: str, who: str = "bob@ci") -> dict:
    """The host's run lock, held by another (live) run of another control machine."""
    code = (
        "import json, time; now = time.time(); "
        f"json.dump({{'owner': {who!r}, 'control_host': 'ci', 'machine_id': 'f' * 32, "
        "'boot_id': 'b', 'pid': 4242, 'run_id': 'otherrun00000001', 'token': 'tok', "
        "'command': 'pyinfra inv.py deploys/kimi_k26.py', 'started': now, 'taken_at': now, "
        "'renewed_at': now, 'expires_at': now + 900, 'lease_s': 900.0}, "
        f"open({LOCK!r}, 'w'))"
    )
    env["fleet"].run(host, f"mkdir -p /var/lib/specfleet && python3 -c \"{code}\"", check=True)
    return json.loads(env["fleet"].run(host, f"cat {LOCK}", check=True).stdout)


def kept_unit_is_live(env, host: str) -> bool:
    r = env["fleet"].run(host, f"cmp -s {KEPT}/unit {UNIT} && cmp -s {KEPT}/env {ENV}")
    return r.returncode == 0


def kept_by(env, host: str) -> str:
    return env["fleet"].run(host, f"cat {KEPT}/run_id", check=True).stdout.strip()


def test_a_host_another_run_holds_is_busy_untouched_and_every_lock_is_held_throughout(env):
    """h3's lock is another run's: h3 is "not started: busy (held by ...)", byte for byte as it
    was; the rollout holds every other host's lock from its start to its end (h4's, seen while
    the canary's gate runs, is this rollout's)."""
    hold_lock(env, "h3")
    try:
        before = host_state(env, "h3")
        seen: dict[str, dict] = {}

        def during(line: str) -> None:
            if "rollout: canary gate:" in line and "h4" not in seen:
                out = env["fleet"].run("h4", f"cat {LOCK}").stdout
                seen["h4"] = json.loads(out) if out.strip() else {}

        hosts = {h: gen(env, "busy") for h in HOSTS}
        res = rollout(env, hosts, "--batch-size", "3", during=during)
        assert res.rc == 1, res
        assert res.status() == {"h1": "changed", "h2": "changed", "h3": "not started",
                                "h4": "changed"}, res
        why = res.hosts["h3"]["why"]
        assert len(why) == 1 and why[0].startswith("not started: busy (held by bob@ci (run "
                                                   "otherrun0000"), why
        assert "since" in why[0]
        assert host_state(env, "h3") == before
        assert seen["h4"].get("run_id") == res.report["run_id"], (seen, res)
        # The end of the rollout released every lock it held, and only those.
        for h in ("h1", "h2", "h4"):
            assert env["fleet"].run(h, f"test -e {LOCK}").returncode != 0
        assert json.loads(env["fleet"].run("h3", f"cat {LOCK}").stdout)["owner"] == "bob@ci"
    finally:
        env["fleet"].run("h3", f"rm -f {LOCK}")


def test_two_overlapping_rollouts_keep_their_own_hosts_and_rollback_points(env):
    """Rollout A (h1, h2) is in its canary's gate when rollout B (h2, h3) starts: B finds h2
    busy (A holds it) and rolls out h3; A goes on with h2. Each host's rollback point is the
    state that passed its gate, taken by the rollout that changed it."""
    slow = [*baseline(env)["launcher"], "--standin-load-s", "12"]
    a_hosts = {h: gen(env, "overlap-a") for h in ("h1", "h2")}
    a_hosts["h1"]["launcher"] = slow
    b_hosts = {h: gen(env, "overlap-b") for h in ("h2", "h3")}
    b_result: dict[str, Result] = {}

    def start_b(line: str) -> None:
        if "rollout: canary gate: h1" in line and "thread" not in b_result:
            t = threading.Thread(target=lambda: b_result.__setitem__(
                "res", rollout(env, b_hosts, "--canary", "h3", "--limit", "h2,h3")),
                daemon=True)
            b_result["thread"] = t  # type: ignore[assignment]
            t.start()

    a = rollout(env, a_hosts, "--canary", "h1", "--limit", "h1", "--limit", "h2",
                during=start_b)
    b_result["thread"].join(timeout=600)  # type: ignore[attr-defined]
    b = b_result["res"]
    assert a.rc == 0 and a.status() == {"h1": "changed", "h2": "changed"}, a
    assert b.rc == 1, b
    assert b.status() == {"h3": "changed", "h2": "not started"}, b
    assert b.hosts["h2"]["why"][0].startswith("not started: busy (held by "), b
    assert a.report["run_id"] != b.report["run_id"]
    for h, res in (("h1", a), ("h2", a), ("h3", b)):
        assert kept_unit_is_live(env, h), h
        assert kept_by(env, h) == res.report["run_id"], h
        assert healthy(env, h)


def test_a_crashing_change_killed_in_the_canary_gate_then_run_again_rolls_back(env):
    """SIGKILL of the rollout while its canary waits on a server that will crash, then the same
    rollout again: the canary goes back to its last known-good state (the point its last gate
    proved, never the crashing unit) and serves. The re-run's --json result says why, in the
    words of the table a person reads."""
    good = unit_sha(env, "h1")
    assert kept_unit_is_live(env, "h1")
    crash = [*baseline(env)["launcher"], "--standin-exit", "3", "--standin-exit-after-s", "8"]
    hosts = {h: gen(env, "crash") for h in HOSTS}
    hosts["h1"]["launcher"] = crash
    procs: list[subprocess.Popen] = []
    deploying = threading.Event()

    def kill_in_gate(line: str) -> None:
        # The deploy's own readiness wait after the restart is the canary's gate here.
        if "rollout: canary deploy: h1" in line:
            deploying.set()
        if deploying.is_set() and f"restarting {SERVICE}.service" in line and procs:
            time.sleep(3)
            procs[0].kill()
            procs.clear()

    killed = rollout(env, hosts, "--batch-size", "3", during=kill_in_gate,
                     started=procs.append)
    assert killed.rc == -9, killed
    assert unit_sha(env, "h1") != good  # the crashing unit is in place, never gated
    again = rollout(env, hosts, "--batch-size", "3", "--json")
    assert again.rc == 2, again
    doc = json.loads(again.out)  # stdout is the JSON document and nothing else
    assert doc["hosts"]["h1"]["status"] == "rolled back", again
    assert {doc["hosts"][h]["status"] for h in ("h2", "h3", "h4")} == {"not started"}
    assert unit_sha(env, "h1") == good
    assert healthy(env, "h1")
    why = "; ".join(doc["hosts"]["h1"]["why"])
    assert "not ready" in why, why
    table_row = next(ln for ln in again.err.splitlines() if ln.startswith("h1 "))
    assert table_row.endswith(why), (table_row, why)


def test_pyinfra_options_reach_a_fleet_only_they_can_reach(env, tmp_path):
    """An inventory without ssh_user or ssh_key: only --ssh-user/--key on the command line reach
    the hosts. --limit keeps the rollout to two of them, and the badly configured h3 outside it
    is never read."""
    key = str(env["fleet"].key_path)

    def strip(text: str) -> str:
        out = text.replace(f"'ssh_key': {key!r}, ", "").replace("'ssh_user': 'root', ", "")
        assert key not in out and "ssh_user" not in out
        return out

    hosts = {h: gen(env, "options") for h in HOSTS}
    hosts["h3"]["port"] = "not-a-port"
    without = rollout(env, hosts, "--limit", "h1", "--ssh-user", "nobody", edit=strip)
    assert without.rc == 2 and without.status() == {"h1": "failed"}, without
    assert "unreachable" in without.hosts["h1"]["why"][0], without
    res = rollout(env, hosts, "--limit", "h1", "--limit", "h2", "--ssh-user", "root",
                  "--key", key, "--data", "ssh_connect_retries=1", edit=strip)
    assert res.rc == 0, res
    assert res.status() == {"h1": "changed", "h2": "changed"}, res
    assert set(res.report["hosts"]) == {"h1", "h2"}


def test_dry_changes_nothing_and_says_what_would_change(env):
    before = {h: host_state(env, h) for h in HOSTS}
    hosts = {h: gen(env, "dry") for h in HOSTS}
    res = rollout(env, hosts, "--batch-size", "2", "--dry")
    assert res.rc == 0, res
    assert res.report["dry"] is True and res.report["batches"] == [["h1"], ["h2", "h3"], ["h4"]]
    for h in HOSTS:
        assert res.hosts[h]["status"] == "would change", res
        assert "SGLang unit" in res.hosts[h]["changed_ops"], res
        assert f"--port {PORT}" in (res.hosts[h]["launch_plan"] or ""), res
    assert {h: host_state(env, h) for h in HOSTS} == before


def test_a_failing_pre_hook_leaves_its_host_untouched(env, tmp_path):
    log = tmp_path / "hooks.log"
    before = host_state(env, "h2")
    hosts = {h: gen(env, "hooks") for h in ("h1", "h2")}
    res = rollout(
        env, hosts, "--batch-size", "1", "--max-fail-percent", "100", "--limit", "h1,h2",
        "--pre-hook", f'echo "drain $SPECFLEET_HOST" >> {log}; '
                      'test "$SPECFLEET_HOST" != h2 || { echo "lb refuses" >&2; exit 1; }',
        "--post-hook", f'echo "undrain $SPECFLEET_HOST" >> {log}',
    )
    assert res.rc == 1, res
    assert res.status() == {"h1": "changed", "h2": "not started"}, res
    assert "pre-hook" in res.hosts["h2"]["why"][0] and "lb refuses" in res.hosts["h2"]["why"][0]
    assert host_state(env, "h2") == before
    assert log.read_text().split("\n")[:3] == ["drain h1", "undrain h1", "drain h2"]
