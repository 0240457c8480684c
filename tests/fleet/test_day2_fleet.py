"""Day two on a real Debian host: the health watchdog against a stand-in server made to hang,
load, be busy, or be watched while a run holds the lock; then a real Prometheus (Debian's) on
the control machine scraping the host's metrics relay and a real node-exporter's textfile, with
the alerts firing; and ``specfleet logs``.

One host, one module fleet. The watchdog runs with a 1 s interval and the stand-in's
``SGLANG_HEALTH_CHECK_TIMEOUT`` of 1 s, so each scenario takes seconds.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from specfleet.core.monitoring import watchdog_paths
from specfleet.core.settings import settings_from_dict
from tests.fleet.test_server_fleet import REV, STANDIN, deploy, install_standin
from tests.harness import HostSpec

REPO = Path(__file__).resolve().parents[2]
NAME = "sf-wd"
UNIT = f"{NAME}.service"
HANG = "/run/standin/hang"
BUSY = "/run/standin/busy"
RELAY_PORT = 30091
BODY = """
serving.unit(name="unit", settings=settings)
serving.service(name="service", settings=settings, running=True, enabled=True)
from operations import watchdog
watchdog.service(name="watchdog", settings=settings)
watchdog.deploy_record(name="record", settings=settings)
"""


def settings_data(load_s: float = 0, **watch) -> dict:
    return {
        "service_name": NAME,
        "port": 30100,
        "target": {"repo_id": "tests/tiny-target", "revision": REV},
        "drafter": {"repo_id": "z-lab/Kimi-K2.6-DFlash", "revision": REV},
        "sglang": {"version": "0.5.11"},
        "readiness_timeout_s": 60,
        "launcher": ["/usr/bin/python3", STANDIN, "--standin-hang-file", HANG,
                     "--standin-busy-file", BUSY, "--standin-load-s", str(load_s)],
        "plan": {"extra_env": {"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}},
        "watchdog": {"interval_s": 1, "probe_timeout_s": 4, "failures": 3, "backoff_s": 1,
                     "backoff_max_s": 2, "load_grace_s": 30, **watch},
        # Opened: the Prometheus of these tests scrapes it from the control machine.
        "metrics": {"relay_port": RELAY_PORT, "relay_listen": "0.0.0.0"},
    }  # fmt: skip


@pytest.fixture(scope="module")
def wd(make_fleet, tmp_path_factory):
    fleet = make_fleet("day2", [HostSpec("h1", gpu="h200x2", disk="8G")])
    install_standin(fleet, "h1")
    run = deploy(fleet, tmp_path_factory.mktemp("wd"), settings_data(), BODY)
    assert run.rc == 0, run
    return fleet


def sh(fleet, cmd: str) -> str:
    res = fleet.run("h1", cmd, timeout=60)
    assert res.returncode == 0, (cmd, res.stdout, res.stderr)
    return res.stdout


def textfile(fleet) -> dict[str, float]:
    path = watchdog_paths(settings_from_dict(settings_data(), environ={
        "SPECFLEET_ALLOW_TEST_SETTINGS": "1"})).textfile  # fmt: skip
    out = {}
    for line in sh(fleet, f"cat {path} 2>/dev/null || true").splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series.split("{")[0]] = float(value)
    return out


def restarts_in_journal(fleet) -> list[str]:
    out = sh(fleet, f"journalctl -u {NAME}-watchdog.service --no-pager -o cat")
    return [line for line in out.splitlines() if line.startswith(f"restarting {UNIT}:")]


def main_pid(fleet) -> str:
    return sh(fleet, f"systemctl show -p MainPID --value {UNIT}").strip()


def wait_for(what, check, timeout: float = 40.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def wait_ready(fleet) -> None:
    wait_for("the server ready in the textfile",
             lambda: textfile(fleet).get("specfleet_server_ready") == 1)  # fmt: skip


def test_a_second_deploy_leaves_the_watchdog_and_its_record_alone(wd, tmp_path):
    run = deploy(wd, tmp_path, settings_data(), BODY)
    assert run.rc == 0, run
    assert run.ops["watchdog"] == "No changes" and run.ops["record"] == "No changes", run
    record = json.loads(sh(wd, f"cat /var/lib/specfleet/{NAME}.deployed.json"))
    assert record["target_revision"] == REV and record["result"] == "ok"
    assert sh(wd, f"systemctl is-active {NAME}-watchdog.service").strip() == "active"


def test_a_hung_server_is_restarted_once_with_the_reason_in_the_journal(wd):
    wait_ready(wd)
    before, pid = len(restarts_in_journal(wd)), main_pid(wd)
    sh(wd, f"echo {pid} > {HANG}")  # alive, /health answers, nothing generates
    assert sh(wd, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30100/health") == "200"
    wait_for("a restart by the watchdog", lambda: main_pid(wd) not in (pid, "0"))
    wait_ready(wd)
    time.sleep(3)  # a second restart would come within failures x interval
    lines = restarts_in_journal(wd)
    assert len(lines) == before + 1, lines
    assert "3 failed generation probes in a row (/health_generate: HTTP 503)" in lines[-1]
    assert "sglang:generation_tokens_total flat" in lines[-1]
    assert textfile(wd)["specfleet_watchdog_restarts_total"] == before + 1


def test_a_loading_server_is_left_alone(wd, tmp_path):
    run = deploy(wd, tmp_path, settings_data(load_s=12), BODY)  # each start now loads 12 s
    assert run.rc == 0, run
    before = len(restarts_in_journal(wd))
    sh(wd, f"systemctl restart {UNIT}")
    pid = main_pid(wd)
    time.sleep(8)  # 8 probes answered 503 ("loading"), failures is 3
    assert main_pid(wd) == pid
    assert len(restarts_in_journal(wd)) == before
    assert textfile(wd)["specfleet_server_loading"] == 1
    run = deploy(wd, tmp_path, settings_data(), BODY)
    assert run.rc == 0, run


def test_a_busy_server_that_fails_its_probe_is_left_alone(wd):
    wait_ready(wd)
    before, pid = len(restarts_in_journal(wd)), main_pid(wd)
    sh(wd, f"touch {BUSY}")
    try:
        time.sleep(10)
        assert main_pid(wd) == pid
        assert len(restarts_in_journal(wd)) == before
        journal = sh(wd, f"journalctl -u {NAME}-watchdog.service --no-pager -o cat -n 50")
        assert "busy, not stuck: sglang:generation_tokens_total rose" in journal
    finally:
        sh(wd, f"rm -f {BUSY}")


def test_a_run_holding_the_lock_is_not_disturbed(wd):
    wait_ready(wd)
    before, pid = len(restarts_in_journal(wd)), main_pid(wd)
    lock = {"owner": "ops@laptop", "command": "pyinfra deploys/kimi_k26.py", "token": "t",
            "expires_at": time.time() + 3600}  # fmt: skip
    sh(wd, f"mkdir -p /var/lib/specfleet && echo '{json.dumps(lock)}' > /var/lib/specfleet/run.lock"
           f" && echo {pid} > {HANG}")  # fmt: skip
    try:
        time.sleep(8)
        assert main_pid(wd) == pid
        assert len(restarts_in_journal(wd)) == before
        assert "ops@laptop" in sh(wd, f"grep run_lock_held {watchdog_paths_textfile()}")
    finally:
        sh(wd, "rm -f /var/lib/specfleet/run.lock")
    # The same hang without the lock is restarted: the lock was what held it back.
    wait_for("a restart once the lock is gone", lambda: main_pid(wd) not in (pid, "0"))
    assert len(restarts_in_journal(wd)) == before + 1


# On the host: keep FLOOD_CONNECTIONS connections to the relay open, each with half a request,
# opening a new one for each the relay closes (a peer that floods it, or a slowloris).
FLOODER = """
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
socks = []
while True:
    socks = [s for s in socks if s.fileno() >= 0]
    alive = []
    for s in socks:
        try:
            s.setblocking(False)
            if s.recv(1) == b"":
                s.close()
                continue
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        alive.append(s)
    socks = alive
    while len(socks) < n:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            s.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n")  # never ends
        except OSError:
            break
        socks.append(s)
    time.sleep(0.05)
"""
FLOOD_CONNECTIONS = 1500


def test_a_flooded_relay_does_not_stop_the_watchdog(wd):
    """1500 half-open connections to the relay, kept up, with the watchdog at a task limit of 64
    and 64 open files: the relay holds at most its cap of them, the watchdog goes on probing
    and restarts a hung server (before: a thread and a file per connection for good, and the
    watchdog died when its tick could not open a pipe or fork)."""
    wait_ready(wd)
    before, pid = len(restarts_in_journal(wd)), main_pid(wd)
    watchdog_unit = f"{NAME}-watchdog.service"
    # The unit's budget, small: a task limit (where the container's cgroup enforces one) and
    # 64 open files (each connection held is one; the tick's systemctl needs a few).
    sh(wd, f"systemctl set-property --runtime {watchdog_unit} TasksMax=64 && prlimit --pid "
           f"$(systemctl show -p MainPID --value {watchdog_unit}) --nofile=64:64")
    res = wd.run("h1", "cat > /run/standin/flooder.py", input=FLOODER)
    assert res.returncode == 0, res.stderr
    sh(wd, "systemd-run --quiet --collect --unit=sf-relay-flood -p LimitNOFILE=8192 "
           f"/usr/bin/python3 /run/standin/flooder.py {RELAY_PORT} {FLOOD_CONNECTIONS}")
    try:
        wait_for("the flood on its way", lambda: int(sh(
            wd, f"ss -Htn state established '( dport = :{RELAY_PORT} )' | wc -l")) >= 16)
        time.sleep(5)  # the relay has taken what it takes of the flood
        wpid = sh(wd, f"systemctl show -p MainPID --value {watchdog_unit}").strip()
        sh(wd, f"echo {pid} > {HANG}")
        wait_for("a restart by the watchdog under the flood",
                 lambda: main_pid(wd) not in (pid, "0"), timeout=60)
        assert len(restarts_in_journal(wd)) == before + 1
        assert sh(wd, f"systemctl show -p MainPID --value {watchdog_unit}").strip() == wpid
        threads = int(sh(wd, f"ls /proc/{wpid}/task | wc -l"))
        assert threads <= 20, threads  # its own, and the relay's cap of connections
    finally:
        wd.run("h1", "systemctl stop sf-relay-flood; rm -f /run/standin/flooder.py")
        wd.run("h1", f"systemctl set-property --runtime {watchdog_unit} TasksMax=infinity")
        # A fresh watchdog: its limits back, and its restart window (max_restarts) empty again
        # for the tests after this one.
        wd.run("h1", f"systemctl restart {watchdog_unit}")
    wait_ready(wd)


def watchdog_paths_textfile() -> str:
    return watchdog_paths(settings_from_dict(settings_data(), environ={
        "SPECFLEET_ALLOW_TEST_SETTINGS": "1"})).textfile  # fmt: skip


# --------------------------------------------------------------------------------------------------
# A real Prometheus on the control machine, a real node-exporter on the host
# --------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - local
        return json.loads(resp.read())["data"]


def firing(port: int) -> set[tuple[str, str]]:
    return {(a["labels"]["alertname"], a["labels"].get("host", ""))
            for a in api(port, "alerts")["alerts"] if a["state"] == "firing"}  # fmt: skip


@pytest.fixture(scope="module")
def prom(wd, tmp_path_factory):
    exporter = shutil.which("prometheus-node-exporter")
    prometheus = shutil.which("prometheus")
    assert exporter and prometheus, "apt-get install prometheus prometheus-node-exporter"
    wd.put("h1", exporter, "/usr/local/bin/prometheus-node-exporter")
    sh(wd, "chmod 755 /usr/local/bin/prometheus-node-exporter && "
           "systemd-run --unit sf-node-exporter /usr/local/bin/prometheus-node-exporter "
           "--collector.textfile.directory=/var/lib/prometheus/node-exporter "
           "--web.listen-address=:9100")  # fmt: skip
    out = tmp_path_factory.mktemp("prom")
    inv = wd.write_inventory(out / "inventory.py", host_data={"h1": {"specfleet": settings_data()}})
    res = subprocess.run([sys.executable, "-m", "specfleet.cli", "monitoring", str(inv), "--out",
                          str(out / "mon"), "--scrape-interval", "1", "--alert-for", "0s"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    port = free_port()
    proc = subprocess.Popen(
        [prometheus, f"--config.file={out / 'mon' / 'prometheus.yml'}",
         f"--storage.tsdb.path={out / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(out / "prometheus.log", "w"),  # noqa: SIM115
    )  # fmt: skip
    try:
        wait_for("Prometheus up", lambda: _up(port), timeout=60)
        yield port, out / "mon"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        wd.run("h1", "systemctl stop sf-node-exporter")


def _up(port: int) -> bool:
    try:
        return bool(api(port, "query", query="up"))
    except OSError:
        return False


def series(port: int, query: str) -> list[dict]:
    return api(port, "query", query=query)["result"]


def test_prometheus_scrapes_the_host_and_the_alerts_fire(wd, prom):
    port, mon = prom
    wait_ready(wd)
    for query in ('up{job="specfleet-sglang",host="h1"} == 1', 'up{job="specfleet-node"} == 1',
                  "sglang:generation_tokens_total", 'specfleet_build_info{sglang_version="0.5.11"}',
                  "specfleet_server_ready == 1", "specfleet_watchdog_restarts_total"):
        wait_for(f"series of {query}", lambda q=query: series(port, q), timeout=30)
    # Every dashboard panel's query returns series from this Prometheus, with the host picker
    # on "All" (Grafana puts its allValue, .*, for $host) and on this one host.
    board = json.loads((mon / "grafana" / "specfleet.json").read_text())
    (picker,) = [v for v in board["templating"]["list"] if v["name"] == "host"]
    for chosen in (picker["allValue"], "h1"):
        for panel in board["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$host", chosen)
                wait_for(f"panel {panel['title']!r} ($host={chosen})",
                         lambda e=expr: series(port, e), timeout=30)
    # Watchdog restarting: a hang, a restart, the counter rises.
    sh(wd, f"echo {main_pid(wd)} > {HANG}")
    wait_for("SpecfleetWatchdogRestarting", lambda: ("SpecfleetWatchdogRestarting", "h1")
             in firing(port))  # fmt: skip
    # Server down and not ready: the server stops; the relay answers 502, the probe fails.
    wait_ready(wd)
    sh(wd, f"systemctl stop {UNIT}")
    try:
        wait_for("SpecfleetServerDown", lambda: ("SpecfleetServerDown", "h1") in firing(port))
        wait_for("SpecfleetServerNotReady",
                 lambda: ("SpecfleetServerNotReady", "h1") in firing(port))  # fmt: skip
    finally:
        sh(wd, f"systemctl reset-failed {UNIT}; systemctl start {UNIT}")
    wait_ready(wd)


def test_logs_shows_the_journal_with_secrets_redacted(wd, tmp_path):
    key = "sk-day2-" + "x7" * 12
    data = settings_data()
    data["api_key"] = key
    run = deploy(wd, tmp_path, data, BODY)
    assert run.rc == 0, run
    # The key in the server's journal as a careless client puts it there: in a query string,
    # which the server's access log prints as it is (on stdout, past its logging config).
    sh(wd, f"curl -s -o /dev/null 'http://127.0.0.1:30100/v1/models?api_key={key}&k2={key}'")
    assert key in sh(wd, f"journalctl -u {UNIT} --no-pager -o cat | tail -n 50")
    inv = wd.write_inventory(tmp_path / "inv.py", host_data={"h1": {"specfleet": data}})
    res = subprocess.run([sys.executable, "-m", "specfleet.cli", "logs", str(inv), "h1", "-n",
                          "400"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "GET /v1/models?api_key=<redacted>" in res.stdout
    assert key not in res.stdout
    assert re.search(r"server_args=ServerArgs\(.*api_key='<redacted>'", res.stdout), res.stdout
