"""The SGLang server unit on real Debian hosts (tests.fleet): systemd, the readiness gate, restarts.

Host h1 has the real SGLang 0.5.11 installed with ``--no-deps`` from the fleet's wheelhouse, so
the facts read a real install; h2 stays fresh (nothing installed) for ``--dry``. There is no GPU
here, so the success path runs the stand-in server (tests/harness/standin_sglang_server.py) through the
test-only ``launcher`` setting, and the failure path runs the real ``sglang.launch_server``,
which dies at ``import numpy``. Each test uses its own unit name and port, so tests do not lean
on each other's state.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from operations import serving
from specfleet.core.plan import GPUS, SGLANG, TOPOLOGY, make_plan
from specfleet.core.settings import settings_from_dict
from tests.harness import HostSpec

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(REPO / ".venv" / "bin" / "pyinfra")
REV = "0123456789abcdef0123456789abcdef01234567"
VENV_PYTHON = "/opt/specfleet/sglang/bin/python"
STANDIN = "/opt/specfleet-standin/standin_sglang_server.py"
DRAFTER_DIR = "/srv/models/z-lab--Kimi-K2.6-DFlash"
# The real drafter's config.json fields the plan reads (sglang.md section 3: block_size 8).
DRAFTER_CONFIG = {"architectures": ["DFlashDraftModel"], "block_size": 8, "mask_token_id": 163838}

HEADER = """
from io import StringIO
from pyinfra.operations import files
from pyinfra.operations import server as shell
from pyinfra.operations.util import any_changed
from operations import serving
from pyinfra import host
from specfleet.core.settings import settings_for_host
settings = settings_for_host(host)
"""
DEPLOY = """
serving.unit(name="unit", settings=settings)
serving.service(name="service", settings=settings, running=True, enabled=True)
"""


@pytest.fixture(scope="module")
def srv(make_fleet):
    fleet = make_fleet(
        "server", [HostSpec("h1", gpu="h200x2", disk="8G"), HostSpec("h2", gpu="h200x2", disk="8G")]
    )
    install_standin(fleet, "h1")
    return fleet


def install_standin(fleet, host: str) -> None:
    """What the server's unit needs on ``host`` with no deploy: SGLang 0.5.11 in the deploy's
    venv (its files feed the plan), the drafter's config and the stand-in server."""
    pip = " ".join(fleet.pip_args())
    setup = (
        f"python3 -m venv /opt/specfleet/sglang && /opt/specfleet/sglang/bin/pip install -q "
        f"--disable-pip-version-check --no-deps {pip} sglang==0.5.11 && "
        f"mkdir -p /opt/specfleet-standin /run/standin {DRAFTER_DIR} && "
        f"echo {json.dumps(json.dumps(DRAFTER_CONFIG))} > {DRAFTER_DIR}/config.json"
    )
    res = fleet.run(host, setup, timeout=600)
    assert res.returncode == 0, res.stderr
    fleet.put(host, REPO / "tests" / "harness" / "standin_sglang_server.py", STANDIN)


def settings_data(name: str, port: int, **over) -> dict:
    data = {
        "service_name": f"sf-{name}",
        "port": port,
        "target": {"repo_id": "tests/tiny-target", "revision": REV},
        "drafter": {"repo_id": "z-lab/Kimi-K2.6-DFlash", "revision": REV},
        "sglang": {"version": "0.5.11"},
        "readiness_timeout_s": 120,
        "launcher": ["/usr/bin/python3", STANDIN, "--standin-record", record_path(name)],
    }
    data.update(over)
    return data


def record_path(name: str) -> str:
    return f"/run/standin/sf-{name}.json"


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, seconds: float):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.seconds = seconds
        self.by_host: dict[str, dict[str, str]] = {}
        current = None
        for line in self.out.splitlines():
            m = re.match(r"--> Starting operation: (.+?)\s*$", line)
            if m:
                current = m.group(1)
                continue
            m = re.match(r"\s+\[(h\d)\] (Success|No changes|Error)", line)
            if m and current:
                self.by_host.setdefault(m.group(1), {})[current] = m.group(2)
        self.ops = next(iter(self.by_host.values()), {}) if len(self.by_host) == 1 else {}

    def __repr__(self) -> str:
        return f"Run(rc={self.rc}, ops={self.ops})\n{self.out}"


def deploy(fleet, tmp_path, data: dict, body: str = DEPLOY, *args: str, host: str = "h1") -> Run:
    """Run pyinfra on one host (or host="all": every host, each with ``data``)."""
    names = list(fleet.hosts) if host == "all" else [host]
    inv = fleet.write_inventory(
        tmp_path / "inventory.py", host_data={h: {"specfleet": data} for h in names}
    )
    dep = tmp_path / "deploy.py"
    dep.write_text(HEADER + body)
    start = time.monotonic()
    yes = [] if "--dry" in args else ["-y"]  # -y skips the change detection --dry shows
    limit = [] if host == "all" else ["--limit", host]
    proc = subprocess.run(
        [PYINFRA, *yes, *limit, *args, str(inv), str(dep)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    proc.stdout += proc.stderr
    return Run(proc, time.monotonic() - start)


def host_json(fleet, path: str, host: str = "h1") -> dict:
    res = fleet.run(host, f"cat {path}")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def unit_prop(fleet, unit: str, prop: str) -> str:
    return fleet.run("h1", f"systemctl show -p {prop} --value {unit}").stdout.strip()


def plan_for(fleet, tmp_path, data: dict):
    """The plan as a person gets it: the facts from `pyinfra fact --json`, then make_plan."""
    inv = fleet.write_inventory(tmp_path / "facts-inventory.py")
    proc = subprocess.run(
        [PYINFRA, "--limit", "h1", str(inv), "fact", "facts.gpu.Gpus", "facts.gpu.GpuTopology",
         "facts.sglang.SGLangInstall", f"python={VENV_PYTHON}", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    raw = json.loads(proc.stdout)
    facts = {}
    for key, per_host in raw.items():
        facts[key.split(" ")[0]] = per_host["h1"]
    assert set(facts) == {GPUS, TOPOLOGY, SGLANG}
    return make_plan(facts, settings_from_dict(data), DRAFTER_CONFIG), facts


# --------------------------------------------------------------------------------------------------


def test_every_rendered_unit_passes_systemd_analyze_verify(srv, tmp_path):
    from tests.unit.test_server_render import _facts

    units = {}
    for version in ("0.5.11", "0.5.14", "0.5.23", "pr20547"):
        for key in (None, "sk-verify"):
            data = settings_data("verify", 30100, api_key=key, launcher=None)
            s = settings_from_dict(data)
            facts = _facts(version)
            plan = make_plan(facts, s, DRAFTER_CONFIG)
            ctx = serving.unit_context(plan.argv, plan.env, s, serving.build_info(s, facts[SGLANG]))
            units[f"sf-v-{version.replace('.', '')}-{bool(key)}.service"] = serving.render(
                serving.UNIT_TEMPLATE, ctx
            )
    tricky = settings_data(
        "verify", 30100,
        launcher=["/usr/bin/python3", STANDIN, "--standin-note", 'a "b" $HOME %n ; \\ é'],
        plan={"extra_args": {"--served-model-name": "x y"}},
    )
    s = settings_from_dict(tricky)
    plan = make_plan(_facts("0.5.11"), s, DRAFTER_CONFIG)
    ctx = serving.unit_context(plan.argv, plan.env, s, serving.build_info(s, None))
    units["sf-v-tricky.service"] = serving.render(serving.UNIT_TEMPLATE, ctx)
    # A control that must fail, so a silent verify cannot pass this test.
    units["sf-v-broken.service"] = units["sf-v-tricky.service"].replace(
        "ExecStart=/usr/bin/python3", "ExecStart=python3-nowhere \"unbalanced"
    )

    srv.run("h1", "mkdir -p /tmp/sf-verify /etc/specfleet && touch /etc/specfleet/sf-verify.env")
    for name, text in units.items():
        (tmp_path / name).write_text(text)
        srv.put("h1", tmp_path / name, f"/tmp/sf-verify/{name}")
    for name in units:
        res = srv.run("h1", f"systemd-analyze verify /tmp/sf-verify/{name}")
        if name == "sf-v-broken.service":
            assert res.returncode != 0 or res.stderr.strip(), "the broken control unit passed"
        else:
            assert res.returncode == 0 and not res.stderr.strip(), (name, res.stderr, units[name])


def test_success_path_runs_exactly_the_plans_argv_and_env(srv, tmp_path):
    tricky = 'a "b" $HOME `x` \\ %n ; é'
    data = settings_data(
        "ok", 30001,
        launcher=["/usr/bin/python3", STANDIN, "--standin-record", record_path("ok"),
                  "--standin-load-s", "4", "--standin-note", tricky, ";", ""],
        plan={"extra_args": {"--served-model-name": "kimi k2.6 $X %i"},
              "extra_env": {"SF_TRICKY": tricky}},
    )
    run = deploy(srv, tmp_path, data)
    assert run.rc == 0 and run.ops == {"unit": "Success", "service": "Success"}, run
    # Visible progress while the stand-in "loads" (503), then the gate's verdict.
    assert re.search(r"\[h1\] gate: +\d+ s: sf-ok.service active/running, /health_generate 503",
                     run.out), run.out
    assert "gate: READY after" in run.out

    plan, _facts = plan_for(srv, tmp_path, data)
    record = host_json(srv, record_path("ok"))
    assert record["argv"] == plan.argv
    for key, value in serving.server_env(plan.env, settings_from_dict(data)).items():
        assert record["env"][key] == value, key
    assert record["env"]["SF_TRICKY"] == tricky
    assert record["cwd"] == "/srv/models"
    assert int(unit_prop(srv, "sf-ok.service", "MainPID")) == record["pid"]
    assert unit_prop(srv, "sf-ok.service", "UnitFileState") == "enabled"
    modes = srv.run("h1", "stat -c '%a %U' /etc/systemd/system/sf-ok.service /etc/specfleet/sf-ok.env")
    assert modes.stdout.split("\n")[:2] == ["644 root", "600 root"]
    assert srv.run("h1", "test -e /var/lib/specfleet/sf-ok.restart-pending").returncode == 1

    # A second run changes nothing: no op reports a change and the server keeps its pid.
    again = deploy(srv, tmp_path, data, DEPLOY, "--debug")
    assert again.rc == 0 and again.ops == {"unit": "No changes", "service": "No changes"}, again
    # And it costs two remote commands: one probe for the unit op, one fact for the service op.
    commands = [ln for ln in again.out.splitlines() if "Running command on h1:" in ln]
    assert len(commands) == 2, "\n".join(commands)
    assert host_json(srv, record_path("ok"))["pid"] == record["pid"]

    # The gate on its own (as a rollout uses it): a check of the running server, no restart.
    check = deploy(srv, tmp_path, data, 'serving.ready(name="ready", settings=settings, timeout_s=30)\n')
    assert check.rc == 0 and check.ops == {"ready": "Success"}, check
    assert "gate: READY after" in check.out
    assert host_json(srv, record_path("ok"))["pid"] == record["pid"]


def test_a_changed_setting_restarts_exactly_once(srv, tmp_path):
    data = settings_data("chg", 30002)
    first = deploy(srv, tmp_path, data)
    assert first.rc == 0, first
    pid = host_json(srv, record_path("chg"))["pid"]
    starts_before = srv.run("h1", "journalctl -u sf-chg.service -o cat | grep -c '^Started'")

    data["plan"] = {"extra_env": {"SF_CHANGED": "1"}}
    changed = deploy(srv, tmp_path, data)
    assert changed.rc == 0 and changed.ops == {"unit": "Success", "service": "Success"}, changed
    assert "restarting sf-chg.service: the unit and the environment file changed" not in changed.out
    assert "restarting sf-chg.service: the environment file changed" in changed.out
    record = host_json(srv, record_path("chg"))
    assert record["pid"] != pid and record["env"]["SF_CHANGED"] == "1"

    settled = deploy(srv, tmp_path, data)
    assert settled.ops == {"unit": "No changes", "service": "No changes"}, settled
    assert host_json(srv, record_path("chg"))["pid"] == record["pid"]
    starts_after = srv.run("h1", "journalctl -u sf-chg.service -o cat | grep -c '^Started'")
    assert int(starts_after.stdout) - int(starts_before.stdout) == 1


def test_a_run_that_fails_before_the_restart_leaves_it_pending(srv, tmp_path):
    data = settings_data("pend", 30003)
    assert deploy(srv, tmp_path, data).rc == 0
    pid = host_json(srv, record_path("pend"))["pid"]

    data["plan"] = {"extra_args": {"--served-model-name": "renamed"}}
    broken = """
serving.unit(name="unit", settings=settings)
shell.shell(name="something else fails", commands=["echo failing on purpose; exit 3"])
serving.service(name="service", settings=settings, running=True, enabled=True)
"""
    failed = deploy(srv, tmp_path, data, broken)
    assert failed.rc != 0 and failed.ops["unit"] == "Success", failed
    assert "service" not in failed.ops
    marker = srv.run("h1", "cat /var/lib/specfleet/sf-pend.restart-pending")
    assert marker.stdout.strip() == "the unit changed"
    assert host_json(srv, record_path("pend"))["pid"] == pid  # still the stale server

    # The unit is already current, yet the next run restarts: it does not report "no change".
    healed = deploy(srv, tmp_path, data)
    assert healed.ops == {"unit": "No changes", "service": "Success"}, healed
    assert "restarting sf-pend.service: the unit changed" in healed.out
    record = host_json(srv, record_path("pend"))
    assert record["pid"] != pid and "renamed" in record["argv"]
    assert srv.run("h1", "test -e /var/lib/specfleet/sf-pend.restart-pending").returncode == 1
    assert deploy(srv, tmp_path, data).ops == {"unit": "No changes", "service": "No changes"}


def test_software_or_weights_changes_restart_through_any_changed(srv, tmp_path):
    data = settings_data("anyc", 30004)
    body = """
software = files.put(name="software", src=StringIO(open("{v}").read()), dest="/tmp/sf-anyc-sw")
weights = files.put(name="weights", src=StringIO("rev-1"), dest="/tmp/sf-anyc-w")
serving.unit(name="unit", settings=settings)
serving.restart_pending(name="pending", settings=settings, reason="the software or weights",
                       _if=any_changed(software, weights))
serving.service(name="service", settings=settings, running=True, enabled=True)
"""
    version = tmp_path / "version"
    version.write_text("0.5.11")
    body = body.replace("{v}", str(version))
    assert deploy(srv, tmp_path, data, body).rc == 0
    pid = host_json(srv, record_path("anyc"))["pid"]
    quiet = deploy(srv, tmp_path, data, body)
    assert set(quiet.ops.values()) == {"No changes"}, quiet
    assert host_json(srv, record_path("anyc"))["pid"] == pid

    version.write_text("0.5.11.post1")
    bumped = deploy(srv, tmp_path, data, body)
    assert bumped.ops == {"software": "Success", "weights": "No changes", "unit": "No changes",
                          "pending": "Success", "service": "Success"}, bumped
    assert "restarting sf-anyc.service: the software or weights changed" in bumped.out
    assert host_json(srv, record_path("anyc"))["pid"] != pid
    assert set(deploy(srv, tmp_path, data, body).ops.values()) == {"No changes"}


def test_failure_path_real_entry_point_reports_the_journal_fast(srv, tmp_path):
    # The real `python -m sglang.launch_server` of a --no-deps install: it dies at import numpy.
    data = settings_data("real", 30005, launcher=None, readiness_timeout_s=600)
    run = deploy(srv, tmp_path, data)
    assert run.rc != 0 and run.ops == {"unit": "Success", "service": "Error"}, run
    assert run.seconds < 60, f"the gate took {run.seconds:.0f} s; it must not wait for the budget"
    error = run.out[run.out.index("sf-real.service not ready"):]
    assert "systemd reports sf-real.service failed" in error
    assert "journal lines of sf-real.service:" in error
    assert re.search(r"\| ModuleNotFoundError: No module named 'numpy'", error), error
    assert "fix: " in error
    # The restart stays pending: the next run tries again instead of reporting no change.
    assert srv.run("h1", "test -e /var/lib/specfleet/sf-real.restart-pending").returncode == 0
    print(f"failure path: gate failed in {run.seconds:.1f} s (whole pyinfra run)")


def test_the_api_key_stays_out_of_argv_unit_env_and_output(srv, tmp_path):
    key = "sk-" + secrets.token_hex(16)
    data = settings_data("key", 30006, api_key=key)
    run = deploy(srv, tmp_path, data, DEPLOY, "--diff")
    assert run.rc == 0 and run.ops == {"unit": "Success", "service": "Success"}, run
    assert key not in run.out
    assert "API key file /etc/specfleet/secrets/sf-key.yaml will change (sha256 " in run.out
    record = host_json(srv, record_path("key"))
    assert record["api_key_sha_prefix"] == hashlib.sha256(key.encode()).hexdigest()[:12]
    assert key not in json.dumps(record["argv"]) and key not in json.dumps(record["env"])
    assert record["argv"][-2:] == ["--config", "/etc/specfleet/secrets/sf-key.yaml"]
    files = srv.run("h1", "cat /etc/systemd/system/sf-key.service /etc/specfleet/sf-key.env")
    assert key not in files.stdout
    perms = srv.run("h1", "stat -c '%a %U' /etc/specfleet/secrets /etc/specfleet/secrets/sf-key.yaml")
    assert perms.stdout.split("\n")[:2] == ["700 root", "600 root"]
    # The gate passed, and it needed the key: the stand-in answers 401 without it.
    assert "gate: READY" in run.out
    port = srv.run("h1", "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30006/get_model_info")
    assert port.stdout == "401"

    # A new key restarts the server; nothing else in the unit changed.
    data["api_key"] = key + "-2"
    rotated = deploy(srv, tmp_path, data, DEPLOY, "--diff")
    assert rotated.ops == {"unit": "Success", "service": "Success"}, rotated
    assert key not in rotated.out
    assert "restarting sf-key.service: the API key changed" in rotated.out

    # No key any more: the file goes, --config leaves the argv, the server restarts open.
    del data["api_key"]
    opened = deploy(srv, tmp_path, data)
    assert opened.ops == {"unit": "Success", "service": "Success"}, opened
    assert srv.run("h1", "test -e /etc/specfleet/secrets/sf-key.yaml").returncode == 1
    assert "--config" not in host_json(srv, record_path("key"))["argv"]
    plain = srv.run("h1", "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30006/get_model_info")
    assert plain.stdout == "200"


def test_the_gate_fails_fast_when_another_process_holds_the_port(srv, tmp_path):
    # A hand-started server (like the one on CT200) already serves the same model on our port.
    foreign = srv.run(
        "h1",
        f"systemd-run --unit sf-foreign /usr/bin/python3 {STANDIN} "
        "--model-path /srv/models/tests--tiny-target --port 30007",
    )
    assert foreign.returncode == 0, foreign.stderr
    try:
        time.sleep(1)
        run = deploy(srv, tmp_path, settings_data("port", 30007))
        assert run.rc != 0 and run.ops["service"] == "Error", run
        assert run.seconds < 60
        assert re.search(r"port 30007 is held by 'python3' \(pid \d+, uid 0\), outside "
                         r"sf-port.service: the API key was not sent"
                         r"|systemd reports sf-port.service failed", run.out), run.out
        assert "Address already in use" in run.out
    finally:
        srv.run("h1", "systemctl stop sf-foreign")


SQUATTER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[2], "a") as f:
            f.write(self.path + " " + str(self.headers.get("Authorization")) + "\n")
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_squatter_on_the_port_gets_no_api_key(srv, tmp_path):
    """Issue 55, finding 2: a local unprivileged user binds the server's port first; the gate
    checks who listens before it sends anything, fails naming the squatter, and the squatter
    never sees the key (before: the gate sent it, then found the stranger)."""
    key = "sk-" + secrets.token_hex(16)
    (tmp_path / "squatter.py").write_text(SQUATTER)
    srv.put("h1", tmp_path / "squatter.py", "/tmp/squatter.py")
    held = srv.run("h1", "rm -f /tmp/squat.log; touch /tmp/squat.log; chmod 666 /tmp/squat.log; "
                         "systemd-run --unit sf-squatter --uid nobody /usr/bin/python3 "
                         "/tmp/squatter.py 30011 /tmp/squat.log")
    assert held.returncode == 0, held.stderr
    try:
        time.sleep(1)
        # The server loads for 20 s before it binds (as SGLang loads its weights first): the
        # unit's process runs, the squatter holds the port.
        data = settings_data("squat", 30011, api_key=key)
        data["launcher"] = ["/bin/sh", "-c", 'sleep 20; exec "$0" "$@"', *data["launcher"]]
        run = deploy(srv, tmp_path, data)
        assert run.rc != 0 and run.ops["service"] == "Error", run
        # Before: the gate sent /health_generate and /get_model_info with the key, then saw
        # "port 30011 is served by pid [N], a process outside sf-squat.service".
        seen = srv.run("h1", "cat /tmp/squat.log").stdout
        assert key not in seen and "Bearer" not in seen, seen
        assert re.search(r"port 30011 is held by 'python3' \(pid \d+, uid 65534\), outside "
                         r"sf-squat.service: the API key was not sent", run.out), run.out
    finally:
        srv.run("h1", "systemctl stop sf-squatter sf-squat.service; rm -f /tmp/squatter.py")


def test_present_false_stops_disables_and_removes(srv, tmp_path):
    data = settings_data("gone", 30008)
    assert deploy(srv, tmp_path, data).rc == 0
    absent = 'serving.unit(name="unit", settings=settings, present=False)\n'
    run = deploy(srv, tmp_path, data, absent)
    assert run.rc == 0 and run.ops == {"unit": "Success"}, run
    left = srv.run(
        "h1", "ls /etc/systemd/system/sf-gone.service /etc/specfleet/sf-gone.env 2>/dev/null"
    )
    assert left.stdout == ""
    assert unit_prop(srv, "sf-gone.service", "LoadState") == "not-found"
    assert unit_prop(srv, "sf-gone.service", "ActiveState") == "inactive"
    assert srv.run("h1", "curl -s http://127.0.0.1:30008/health").returncode != 0
    assert deploy(srv, tmp_path, data, absent).ops == {"unit": "No changes"}


def test_dry_on_a_fresh_host_shows_the_predicted_plan_and_changes_nothing(srv, tmp_path):
    data = settings_data("dry", 30009)
    run = deploy(srv, tmp_path, data, DEPLOY, "--dry", "--diff", host="h2")
    assert run.rc == 0, run
    assert "plan (predicted: SGLang not installed yet):" in run.out
    assert "(predicted: SGLang is not installed in /opt/specfleet/sglang yet" in run.out
    assert "# PREDICTED: SGLang is not installed" in run.out  # the diff of the unit to be written
    assert "--speculative-algorithm DFLASH" in run.out
    assert srv.run("h2", "ls /etc/systemd/system/sf-dry.service").returncode != 0
    # And a real run on that fresh host refuses to write a unit from a prediction.
    real = deploy(srv, tmp_path, data, DEPLOY, host="h2")
    assert real.rc != 0 and "cannot write the unit from a predicted plan" in real.out, real


def test_the_journal_excerpt_redacts_the_api_key(srv, tmp_path):
    # SGLang logs its ServerArgs, API key included; the stand-in does the same, then dies.
    key = "sk-" + secrets.token_hex(16)
    data = settings_data("redact", 30010, api_key=key)
    data["launcher"] = [*data["launcher"], "--standin-exit", "1"]
    run = deploy(srv, tmp_path, data)
    assert run.rc != 0 and run.ops["service"] == "Error", run
    assert "api_key='<redacted>'" in run.out, run
    assert key not in run.out
    # Nor in the host's journal: specfleet's logging config redacts it as the server logs it.
    journal = srv.run("h1", "journalctl -u sf-redact.service -o cat")
    assert key not in journal.stdout
    assert "api_key='<redacted>'" in journal.stdout, journal.stdout


def starts_of(fleet, unit: str) -> int:
    """How many times systemd started ``unit`` (its journal's "Started" lines)."""
    res = fleet.run("h1", f"journalctl -u {unit} -o cat | grep -c '^Started'")
    return int(res.stdout.strip() or 0)


def test_the_api_key_stays_out_of_the_journal(srv, tmp_path):
    # SGLang logs its ServerArgs at start, API key included (0.5.11 srt/entrypoints/engine.py);
    # the stand-in logs them the same way, through `logging` and SGLANG_LOGGING_CONFIG_PATH. A
    # key with both quote kinds, a backslash and regex characters: its repr escapes the quote.
    parts = [secrets.token_hex(6) for _ in range(3)]
    key = f"sk-{parts[0]}'{parts[1]}\"{parts[2]}\\.*+?[(|$^"
    data = settings_data("nolog", 30014, api_key=key)
    run = deploy(srv, tmp_path, data)
    assert run.rc == 0 and run.ops == {"unit": "Success", "service": "Success"}, run
    assert "gate: READY" in run.out  # the key works: the gate needed it
    journal = srv.run("h1", "journalctl -u sf-nolog.service -o cat").stdout
    for part in parts:
        assert part not in journal, journal
    lines = [ln for ln in journal.splitlines() if "server_args=ServerArgs(" in ln]
    assert lines, journal
    for line in lines:
        assert re.fullmatch(
            r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] server_args=ServerArgs\(model_path="
            r"'/srv/models/tests--tiny-target/[0-9a-f]{40}', host='127.0.0.1', port=30014, "
            r"api_key='<redacted>', admin_api_key=None\)", line), line
    # The config and its formatter module are root's alone, beside the unit's other files.
    record = host_json(srv, record_path("nolog"))
    config = record["env"]["SGLANG_LOGGING_CONFIG_PATH"]
    folder = config.rsplit("/", 1)[0]
    assert folder.startswith("/etc/specfleet/") and record["env"]["PYTHONPATH"] == folder
    files = f"$(find {folder} -maxdepth 1 -type f)"
    perms = srv.run("h1", f"stat -c '%a %U' {folder} {files}").stdout.split("\n")
    assert perms[0] == "700 root" and set(perms[1:-1]) == {"600 root"}, perms
    assert len(perms) == 4, perms  # the config and its formatter module
    assert key not in srv.run("h1", f"cat {files}").stdout
    # They are written once (a second run changes nothing) and go with the unit.
    assert deploy(srv, tmp_path, data).ops == {"unit": "No changes", "service": "No changes"}
    gone = deploy(srv, tmp_path, data, 'serving.unit(name="unit", settings=settings, present=False)\n')
    assert gone.ops == {"unit": "Success"}, gone
    assert srv.run("h1", f"test -e {folder}").returncode == 1


def test_a_server_still_loading_after_a_failed_gate_is_waited_on_not_restarted(srv, tmp_path):
    # A server that needs 20 s to load, under a 5 s gate budget: run 1 restarts it and the gate
    # fails; later runs find the restart-pending marker but the same unit and the same server
    # (its invocation): they wait on it instead of restarting it, and clear the marker once ready.
    unit = "sf-loadwait.service"
    marker = "/var/lib/specfleet/sf-loadwait.restart-pending"
    data = settings_data("loadwait", 30015, readiness_timeout_s=5)
    data["launcher"] = [*data["launcher"], "--standin-load-s", "20"]
    first = deploy(srv, tmp_path, data)
    assert first.rc != 0 and first.ops == {"unit": "Success", "service": "Error"}, first
    assert "not ready within the budget of 5 s" in first.out, first
    pid = host_json(srv, record_path("loadwait"))["pid"]
    invocation = unit_prop(srv, unit, "InvocationID")
    starts = starts_of(srv, unit)
    assert invocation and starts >= 1
    assert srv.run("h1", f"test -e {marker}").returncode == 0

    second = deploy(srv, tmp_path, data)  # the server is still loading
    said = [ln.strip() for ln in second.out.splitlines() if "[h1]" in ln and "sf-loadwait" in ln]
    print(f"run 2 ({second.seconds:.1f} s):\n  " + "\n  ".join(said))
    assert f"restarting {unit}" not in second.out, second
    assert f"waiting on {unit}" in second.out, second
    assert "restarted for the unit" in second.out, second  # what it waits for
    assert starts_of(srv, unit) == starts
    assert unit_prop(srv, unit, "InvocationID") == invocation
    assert host_json(srv, record_path("loadwait"))["pid"] == pid
    still_loading = second.rc != 0
    if still_loading:
        assert second.ops == {"unit": "No changes", "service": "Error"}, second
        assert "still loading" in second.out, second
        assert srv.run("h1", f"test -e {marker}").returncode == 0
    else:
        assert "gate: READY" in second.out, second

    health = "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30015/health_generate"
    deadline = time.monotonic() + 60
    while srv.run("h1", health).stdout != "200" and time.monotonic() < deadline:
        time.sleep(1)
    third = deploy(srv, tmp_path, data)  # healthy now, by itself
    said = [ln.strip() for ln in third.out.splitlines() if "[h1]" in ln and "sf-loadwait" in ln]
    print(f"run 3 ({third.seconds:.1f} s):\n  " + "\n  ".join(said))
    assert third.rc == 0, third
    assert f"restarting {unit}" not in third.out, third
    if still_loading:
        assert third.ops == {"unit": "No changes", "service": "Success"}, third
        assert f"waiting on {unit}" in third.out and "gate: READY" in third.out, third
    assert starts_of(srv, unit) == starts
    assert unit_prop(srv, unit, "InvocationID") == invocation
    assert host_json(srv, record_path("loadwait"))["pid"] == pid
    assert srv.run("h1", f"test -e {marker}").returncode == 1
    assert deploy(srv, tmp_path, data).ops == {"unit": "No changes", "service": "No changes"}


def test_the_gate_gives_up_at_the_budget_with_progress(srv, tmp_path):
    data = settings_data("slow", 30011, readiness_timeout_s=6)
    data["launcher"] = [*data["launcher"], "--standin-load-s", "600"]
    run = deploy(srv, tmp_path, data)
    assert run.rc != 0 and run.ops["service"] == "Error", run
    assert "not ready within the budget of 6 s (last: /health_generate 503)" in run.out
    assert "raise settings.readiness_timeout_s" in run.out
    assert 6 <= run.seconds < 40
    assert srv.run("h1", "test -e /var/lib/specfleet/sf-slow.restart-pending").returncode == 0


def test_a_host_with_bad_input_fails_alone(srv, tmp_path):
    # h2 is fresh (no SGLang): its unit cannot be planned for real. h1 must still converge, and
    # the error is the host's, with no traceback (pyinfra would otherwise stop every host).
    data = settings_data("both", 30012)
    run = deploy(srv, tmp_path, data, DEPLOY, "--fail-percent", "100", host="all")
    assert run.by_host["h1"] == {"unit": "Success", "service": "Success"}, run
    assert run.by_host["h2"] == {"unit": "Error"}, run
    assert re.search(r"\[h2\] cannot write the unit from a predicted plan: SGLang is not "
                     r"installed in /opt/specfleet/sglang yet", run.out), run.out
    assert "Traceback" not in run.out
    assert host_json(srv, record_path("both"))["argv"][-1] == "30012"


def test_an_applied_patch_changes_the_unit_and_restarts(srv, tmp_path):
    # operations.sglang records an applied PR#20547 diff's sha256 in the venv; the unit carries it.
    data = settings_data("patch", 30013)
    assert deploy(srv, tmp_path, data).rc == 0
    pid = host_json(srv, record_path("patch"))["pid"]
    marker = "/opt/specfleet/sglang/.specfleet/pr20547/sha256"
    srv.run("h1", f"mkdir -p $(dirname {marker}) && echo {'9f2c4e0d' * 8} > {marker}")
    try:
        run = deploy(srv, tmp_path, data)
        assert run.ops == {"unit": "Success", "service": "Success"}, run
        unit = srv.run("h1", "cat /etc/systemd/system/sf-patch.service").stdout
        assert "# SGLang 0.5.11, patch: pr20547 sha256:9f2c4e0d9f2c4e0d" in unit
        assert host_json(srv, record_path("patch"))["pid"] != pid
        assert deploy(srv, tmp_path, data).ops == {"unit": "No changes", "service": "No changes"}
    finally:
        srv.run("h1", f"rm -rf $(dirname {marker})")
