"""The read-only status view (operations/status.py, facts/status.py): its pure parts, and the Health
fact's real command against the SGLang stand-in on loopback. The fleet runs of
``pyinfra INVENTORY deploys/status.py`` are in tests/fleet/test_deploy_fleet.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from facts.status import Health, parse_health
from operations.serving import (
    ENV_TEMPLATE,
    UNIT_TEMPLATE,
    build_info,
    render,
    server_paths,
    sha1_text,
    unit_context,
)
from operations.status import (
    HostStatus,
    format_table,
    health_status,
    sglang_status,
    unit_status,
    weights_status,
)
from specfleet.core.settings import settings_from_dict
from tests.unit.test_plan_sglang_fixtures import load as load_sglang

STANDIN = Path(__file__).parents[1] / "harness" / "standin_sglang_server.py"
REV = "0123456789abcdef0123456789abcdef01234567"
REV2 = "fedcba9876543210fedcba9876543210fedcba98"


def settings(**over):
    data = {"target": {"revision": REV}, "drafter": {"revision": REV, "gated": True},
            "sglang": {"version": "0.5.11"}}
    data.update(over)
    return settings_from_dict(data, host="h1")


def weights(current=REV, complete=True, changed=(), missing=()):
    return {"path": "/srv/models/x", "current": current, "revisions": {current: {
        "complete": complete, "files": 3, "bytes": 10, "changed": list(changed),
        "missing": list(missing)}}} if current else {"path": None, "current": None,
                                                     "revisions": {}}


def test_sglang_status_version_and_patch_states():
    s = settings()
    st = HostStatus("h1")
    sglang_status(s, load_sglang("0.5.11"), None, st)
    assert (st.sglang, st.patch, st.drift) == ("0.5.11", "none (DFLASH v1)", [])

    st = HostStatus("h1")
    sglang_status(settings(sglang={"version": "0.5.23"}), load_sglang("0.5.11"), None, st)
    assert st.sglang == "0.5.11 (want 0.5.23)" and st.drift == ["SGLang 0.5.11, want 0.5.23"]

    st = HostStatus("h1")
    git = settings(sglang={"kind": "git", "git_url": "https://github.com/sgl-project/sglang",
                           "git_ref": REV})
    sglang_status(git, load_sglang("pr20547"), None, st)
    assert st.patch == "PR#20547 built in" and st.drift == []

    st = HostStatus("h1")
    applied = {"sha256": "9f2c" * 16, "site": "/x", "intact": True, "partial": False}
    opted = settings(patch={"source": "/p.diff", "sha256": "ab" * 32})
    sglang_status(opted, load_sglang("0.5.11"), applied, st)
    assert st.patch == "PR#20547 port applied (9f2c9f2c9f2c)" and st.drift == []
    st = HostStatus("h1")
    sglang_status(s, load_sglang("0.5.11"), applied, st)
    assert st.drift == ["PR#20547 port applied, the settings do not opt in"]

    st = HostStatus("h1")
    sglang_status(s, load_sglang("0.5.11"), {**applied, "intact": False}, st)
    assert st.drift == ["PR#20547 marker no longer matches the files"]

    st = HostStatus("h1")
    sglang_status(opted, load_sglang("0.5.11"), None, st)
    assert st.drift == ["PR#20547 port not applied"]
    # No port for 0.5.14's tree is needed, nor one for a rejected port: no drift a deploy
    # cannot fix.
    st = HostStatus("h1")
    sglang_status(opted, load_sglang("0.5.11"), {"rejected": "ab" * 32}, st)
    assert st.drift == [] and "failed a readiness gate" in st.patch
    st = HostStatus("h1")
    sglang_status(settings(sglang={"version": "0.5.14"}, patch={"source": "/p.diff",
                  "sha256": "ab" * 32}), load_sglang("0.5.14"), None, st)  # fmt: skip
    assert st.drift == [] and st.patch == "DFLASH v2 built in"
    st = HostStatus("h1")
    sglang_status(s, None, None, st, configured_venv="/root/venv")
    assert st.drift == ["SGLang 0.5.11 not installed yet in /opt/specfleet/sglang (beside "
                        "/root/venv, which holds another release)"]

    st = HostStatus("h1")
    sglang_status(s, None, None, st)
    assert st.sglang == "not installed" and st.drift == [
        "SGLang not installed in /opt/specfleet/sglang"]


@pytest.mark.parametrize("state, words, drift", [
    (weights(), "0123456789 ok (3 files)", []),
    (weights(current=REV2), "fedcba9876 ok (3 files) (want 0123456789)",
     ["target weights at fedcba9876, want 0123456789"]),
    (weights(complete=False), "0123456789 incomplete", ["target weights incomplete"]),
    (weights(changed=["a"], missing=["b"]), "0123456789 2 files changed",
     ["target weights: 2 files changed or missing since verified"]),
    (weights(current=None), "absent", ["target weights absent"]),
])
def test_weights_status(state, words, drift):
    st = HostStatus("h1")
    assert weights_status(settings(), "target", state, st) == words
    assert st.drift == drift


def test_unit_status_compares_hashes_with_what_the_plan_renders():
    s = settings()
    paths = server_paths(s)
    argv = ["/opt/specfleet/sglang/bin/python", "-m", "sglang.launch_server", "--tp-size", "2"]
    ctx = unit_context(argv, {"HF_HUB_OFFLINE": "1"}, s, build_info(s, load_sglang("0.5.11")))
    unit, envf = render(UNIT_TEMPLATE, ctx), render(ENV_TEMPLATE, ctx)
    expected = {paths.unit: unit, paths.env: envf}

    def service(unit_text, env_text, pending=None):
        return {"files": {paths.unit: {"sha1": sha1_text(unit_text)},
                          paths.env: {"sha1": sha1_text(env_text)}},
                "restart_pending": pending, "active_state": "active"}

    st = HostStatus("h1")
    unit_status(s, service(unit, envf), expected, None, st)
    assert st.drift == [] and st.unit == sha1_text(unit)[:10]

    st = HostStatus("h1")
    unit_status(s, service(unit + "#", envf), expected, None, st)
    assert st.drift == ["unit differs: the next deploy would restart the server"] and st.unit.endswith("!= plan")

    st = HostStatus("h1")
    unit_status(s, service(unit + "#", envf + "#", pending="the unit changed"), expected, None, st)
    assert st.drift == ["unit and env differ: the next deploy would restart the server",
                        "restart pending (the unit changed)"]

    st = HostStatus("h1")
    unit_status(s, {"files": {}}, expected, None, st)
    assert st.unit == "absent" and st.drift == ["no unit"]

    st = HostStatus("h1")
    unit_status(s, service(unit, envf), None, "no GPUs", st)
    assert st.drift == ["no plan: no GPUs"]


@pytest.mark.parametrize("active, health, words", [
    ("active", {"health_code": 200, "model_path": "/srv/models/m"}, "healthy"),
    ("active", {"health_code": 503, "model_path": "/srv/models/m"},
     "unhealthy (/health_generate 503, active)"),
    ("inactive", {"health_code": None}, "down (inactive, nothing on 127.0.0.1:30000)"),
    ("active", {"health_code": 200, "model_path": "/other"}, "wrong model (/other on 127.0.0.1:30000)"),
    ("inactive", {"health_code": 200, "model_path": "/srv/models/m"},
     "answering, but the unit is inactive"),
])
def test_health_status(active, health, words):
    st = HostStatus("h1")
    health_status(settings(), {"active_state": active}, health, "/srv/models/m", st)
    assert st.health == words
    assert st.healthy == (words == "healthy")


def test_verdict_and_table():
    ok = HostStatus("ct200", sglang="0.5.11", patch="none (DFLASH v1)", target="abc ok",
                    drafter="def ok", unit="0d6a2bf700", health="healthy", healthy=True)
    bad = HostStatus("b200", sglang="0.5.11", unit="1234 != plan", health="down (inactive)",
                     drift=["unit differs"])
    assert ok.verdict == "in sync, healthy"
    assert bad.verdict == "drift: unit differs; down (inactive)"
    table = format_table([ok, bad]).splitlines()
    assert table[0].split() == ["HOST", "SGLANG", "PATCH", "TARGET", "DRAFTER", "UNIT", "HEALTH",
                                "LOCK"]
    assert table[1].startswith("ct200  0.5.11")
    assert table[3] == ""
    assert table[4:] == ["ct200  in sync, healthy", "b200   drift: unit differs; down (inactive)"]
    # Columns line up: every row's UNIT cell starts where the header's does.
    col = table[0].index("UNIT")
    assert table[1][col:].startswith("0d6a2bf700") and table[2][col:].startswith("1234 != plan")


def test_parse_health():
    assert parse_health(["##specfleet-health=000", "##specfleet-model-info="]) == {
        "health_code": None, "model_path": None, "model_info": None, "port_held": None}
    out = parse_health(["##specfleet-health=200",
                        '##specfleet-model-info={"model_path": "/m", "is_generation": true}'])
    assert out["health_code"] == 200 and out["model_path"] == "/m"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standin(tmp_path):
    """The SGLang stand-in on loopback, with an API key given through --config (as the unit does)."""
    port = _free_port()
    config = tmp_path / "secret.yaml"
    config.write_text('# Managed by specfleet.\napi-key: "k-123"\n')
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--model-path", "/srv/models/m",
                             "--host", "127.0.0.1", "--port", str(port), "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield port, config
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _run_fact(cls, **kwargs):
    out = subprocess.run(["sh", "-c", cls().command(**kwargs)], capture_output=True, text=True,
                         timeout=60)
    return cls().process(out.stdout.splitlines())


@pytest.mark.local
def test_health_fact_command_against_the_standin(standin):
    port, config = standin
    with_key = _run_fact(Health, host="127.0.0.1", port=port, secret_file=str(config))
    assert with_key["health_code"] == 200 and with_key["model_path"] == "/srv/models/m"
    assert json.dumps(with_key["model_info"])
    # Without the key the server refuses /get_model_info; with nothing listening, curl says 000.
    assert _run_fact(Health, host="127.0.0.1", port=port)["model_path"] is None
    assert _run_fact(Health, host="127.0.0.1", port=_free_port()) == Health.default()
    # The key is read on the host from the file: it is not in the command.
    assert "k-123" not in Health().command(host="127.0.0.1", port=port, secret_file=str(config))


@pytest.mark.local
def test_run_lock_fact_and_the_lock_column(tmp_path):
    """The RunLock fact reads the lock with the host's clock and the file's mtime; the status
    shows who holds it, since when, and its expiry (or that the next run takes it over)."""
    from facts.preflight import RunLock
    from operations.status import LOCK, host_status

    path = tmp_path / "run.lock"
    assert _run_fact(RunLock, path=str(path)) is None
    now = time.time()
    path.write_text(json.dumps({"owner": "alice@laptop", "machine_id": "ab" * 16, "pid": 42,
                                "run_id": "r1", "taken_at": now - 60, "expires_at": now + 120}))
    held = _run_fact(RunLock, path=str(path))
    assert held["owner"] == "alice@laptop" and abs(held["host_now"] - now) < 30
    assert abs(held["mtime"] - now) < 30
    st = host_status(settings(), {LOCK: held}, "h1")
    assert st.lock.startswith("held by alice@laptop (run r1, pid 42 on machine abababab, since ")
    assert ", expires " in st.lock and "(in " in st.lock
    assert host_status(settings(), {}, "h1").lock == "free"
    path.write_text("not json")
    assert _run_fact(RunLock, path=str(path))["unreadable"] == "not json"


def test_status_document_holds_what_the_table_shows():
    from operations.status import status_document

    ok = HostStatus("a", sglang="0.5.11", healthy=True)
    drift = HostStatus("b", sglang="0.5.11 (want 0.5.14)", drift=["SGLang 0.5.11, want 0.5.14"],
                       health="down (inactive)")
    doc = json.loads(json.dumps(status_document([ok, drift])))
    assert doc["hosts"]["a"]["verdict"] == "in sync, healthy"
    assert doc["hosts"]["b"]["verdict"] == "drift: SGLang 0.5.11, want 0.5.14; down (inactive)"
    assert doc["hosts"]["b"]["drift"] == ["SGLang 0.5.11, want 0.5.14"]
    assert format_table([ok, drift]).splitlines()[-1] == "b  " + doc["hosts"]["b"]["verdict"]


@pytest.mark.parametrize("key", ["unit", "env", "secret", "log_config", "log_module"])
def test_status_reports_a_change_to_any_of_the_servers_files_as_a_restart(key):
    """Every file the deploy writes for the server (the one list, ``ServerPaths.files``) is
    compared: a change to any of them restarts the server on the next deploy, and status says so
    (issue 57: it compared only the unit, env and key)."""
    s = settings()
    files = server_paths(s).files()
    assert set(files) == {"unit", "env", "secret", "log_config", "log_module"}
    expected = {path: f"text of {k}\n" for k, path in files.items()}
    service = {"files": {p: {"sha1": sha1_text(text)} for p, text in expected.items()},
               "restart_pending": None, "active_state": "active"}
    st = HostStatus("h1")
    unit_status(s, service, expected, None, st)
    assert st.drift == []
    service["files"][files[key]] = {"sha1": sha1_text("changed on the host\n")}
    st = HostStatus("h1")
    unit_status(s, service, expected, None, st)
    assert st.unit.endswith("!= plan")
    assert len(st.drift) == 1 and st.drift[0].endswith("differs: the next deploy would restart "
                                                        "the server"), st.drift
