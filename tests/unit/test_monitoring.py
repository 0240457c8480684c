"""Day two, pure and with the real tools: SGLang's metric names against the real wheels, the
generated Prometheus config and alert rules against Debian's ``promtool``, the watchdog's
settings, ``--enable-metrics`` in the plan."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from specfleet.core.errors import SettingsError
from specfleet.core.monitoring import (
    ALERTS,
    NODE_JOB,
    PANELS,
    SGLANG_JOB,
    alert_rules,
    dashboard,
    panel_queries,
    watchdog_config,
    watchdog_paths,
)
from specfleet.core.settings import settings_from_dict
from specfleet.core.tables.sglang_versions import VERSIONS
from specfleet.fleet.monitoring import write_monitoring
from tests.harness.releases import EACH_KIND
from tests.harness.sources import sglang_wheel

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "harness" / "standin_sglang_server.py"
SGLANG_NAME = re.compile(r"sglang:[a-z_]+")


def wheel_metric_names(version: str) -> set[str]:
    """Every ``name="sglang:..."`` a wheel's metrics declare (Counter names keep ``_total``)."""
    zf = zipfile.ZipFile(sglang_wheel(version))
    names: set[str] = set()
    for n in zf.namelist():
        if n.startswith("sglang/srt/") and n.endswith(".py"):
            text = zf.read(n).decode("utf-8", "replace")
            names |= set(re.findall(r"""name=["'](sglang:[a-z_]+)["']""", text))
    return names


def used_names() -> dict[str, set[str]]:
    exprs = [e for _, e in panel_queries(dashboard())] + [a[1] for a in ALERTS]
    return {
        "stand-in": set(SGLANG_NAME.findall(STANDIN.read_text())),
        "dashboard and alerts": {n for e in exprs for n in SGLANG_NAME.findall(e)},
    }


@pytest.mark.local
@pytest.mark.parametrize("version", EACH_KIND)
def test_every_sglang_metric_name_we_use_is_in_the_real_wheel(version):
    real = wheel_metric_names(version)
    assert "sglang:generation_tokens_total" in real  # the reader works
    for where, names in used_names().items():
        assert names, where
        assert sorted(names - real) == [], f"{where} uses names SGLang {version} does not export"


@pytest.mark.local
@pytest.mark.parametrize("version", ["0.5.11", "0.5.14", "0.5.23"])
def test_enable_metrics_flag_is_in_each_wheel(version):
    from tests.unit.test_plan_versions import declared_flags, wheel

    row = next(r for r in VERSIONS if r.sglang.contains(version, prereleases=True))
    assert row.metrics_flag in declared_flags(wheel(version))


def _settings(**over):
    base = {"target": {"revision": "0" * 40}, "drafter": {"revision": "1" * 40}}
    return settings_from_dict({**base, **over}, host="h1")


def test_the_plan_turns_metrics_on_unless_a_setting_says_no():
    from specfleet.core.plan.launch import plan_metrics
    from specfleet.core.plan.model import PlanBuilder

    class C:
        def __init__(self, settings):
            self.settings = settings
            self.row = VERSIONS[-2]
            self.b = PlanBuilder(host="h1")

    on = C(_settings())
    plan_metrics(on)
    assert ("--enable-metrics", None) in on.b.flags
    off = C(_settings(metrics={"enable": False}))
    plan_metrics(off)
    assert off.b.flags == [] and off.b.reasons[-1].why == "settings metrics.enable is False"


@pytest.mark.parametrize(
    "over,problem",
    [
        ({"watchdog": {"failures": 0}}, "'watchdog.failures' is 0, expected >= 1"),
        ({"watchdog": {"interval_s": -1}}, "'watchdog.interval_s' is -1, expected a number in (0, 3600]"),
        ({"watchdog": {"backoff_s": 60, "backoff_max_s": 10}}, "below 'watchdog.backoff_s'"),
        ({"metrics": {"relay_port": 30000}}, "is the server's port 30000"),
        ({"metrics": {"textfile_dir": "var/x"}}, "'metrics.textfile_dir'"),
        ({"watchdog": {"retries": 1}}, "unknown settings key 'watchdog.retries'"),
    ],
)
def test_bad_watchdog_and_metrics_settings_name_the_key(over, problem):
    with pytest.raises(SettingsError) as err:
        _settings(**over)
    assert problem in err.value.render()
    assert "h1" in err.value.render()


def test_watchdog_config_and_paths():
    s = _settings(service_name="sf-x", listen_host="0.0.0.0", readiness_timeout_s=900)
    cfg = watchdog_config(s)
    assert cfg["server_url"] == "http://127.0.0.1:30000"
    assert cfg["load_grace_s"] == 900 and cfg["unit"] == "sf-x.service"
    assert cfg["lock_path"] == "/var/lib/specfleet/run.lock"
    paths = watchdog_paths(s)
    assert paths.unit == "/etc/systemd/system/sf-x-watchdog.service"
    assert set(paths.files()) >= {paths.unit, paths.program, paths.config, paths.textfile}
    # The program reads every key the config gives.
    program = (REPO / "specfleet" / "hostside" / "watchdog.py").read_text()
    assert [k for k in cfg if f'"{k}"' not in program] == []


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd,
                          check=False)  # fmt: skip


@pytest.mark.local
def test_generated_config_and_rules_pass_promtool(tmp_path):
    opened = {"relay_listen": "0.0.0.0"}
    hosts = [("h1", "10.0.0.1", _settings(metrics=opened)),
             ("h2", "10.0.0.2", _settings(port=30001, metrics=opened))]
    write_monitoring(hosts, tmp_path)
    res = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 6 rules found" in res.stdout + res.stderr
    targets = json.loads((tmp_path / "targets" / f"{SGLANG_JOB}.json").read_text())
    assert targets[1] == {"targets": ["10.0.0.2:30091"],
                          "labels": {"host": "h2", "service": "specfleet-sglang"}}
    nodes = json.loads((tmp_path / "targets" / f"{NODE_JOB}.json").read_text())
    assert [t["targets"] for t in nodes] == [["10.0.0.1:9100"], ["10.0.0.2:9100"]]


@pytest.mark.local
def test_a_broken_rule_fails_promtool(tmp_path):
    rules = alert_rules()
    rules["groups"][0]["rules"][0]["expr"] = "up{ == 0"
    (tmp_path / "r.yml").write_text(json.dumps(rules))
    assert promtool("check", "rules", str(tmp_path / "r.yml")).returncode != 0


BUILD = ('specfleet_build_info{{instance="{i}",job="specfleet-node",host="{h}",service="sf",'
         'sglang_version="0.5.11",pr20547="none",target_revision="{t}",drafter_revision="d",'
         'plan_hash="p"}}')  # fmt: skip


@pytest.mark.local
def test_promtool_test_rules(tmp_path):
    (tmp_path / "rules.yml").write_text(json.dumps(alert_rules()))
    node = 'instance="n1:9100",job="specfleet-node",host="h1",service="sf"'
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'up{instance="n1:30091",job="specfleet-sglang",host="h1",service="sf"}',
                 "values": "1 1 0 0 0 0"},
                {"series": f"specfleet_server_ready{{{node}}}", "values": "1 1 0 0 0 0 0 0"},
                {"series": f"specfleet_server_loading{{{node}}}", "values": "0 0 0 0 0 0 0 0"},
                {"series": f"specfleet_watchdog_restarts_total{{{node}}}", "values": "0 0 1 1"},
                {"series": f'specfleet_weights_manifest_ok{{{node},model="target"}}',
                 "values": "1 0"},
                {"series": BUILD.format(i="n1:9100", h="h1", t="a"), "values": "1x40"},
                {"series": BUILD.format(i="n2:9100", h="h2", t="b"), "values": "1x40"},
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "SpecfleetServerDown", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "SpecfleetServerDown", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "instance": "n1:30091",
                                    "job": "specfleet-sglang", "host": "h1", "service": "sf"},
                     "exp_annotations": {"summary": "h1: the SGLang server's /metrics does not "
                                         "answer (server or relay down); see `specfleet logs "
                                         "INVENTORY h1`"}}]},
                {"eval_time": "7m", "alertname": "SpecfleetServerNotReady", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "instance": "n1:9100",
                                    "job": "specfleet-node", "host": "h1", "service": "sf"},
                     "exp_annotations": {"summary": "h1: sf fails its generation probe"}}]},
                {"eval_time": "3m", "alertname": "SpecfleetWatchdogRestarting", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "instance": "n1:9100",
                                    "job": "specfleet-node", "host": "h1", "service": "sf"},
                     "exp_annotations": {"summary": "h1: the watchdog restarted sf; the reason "
                                         "is in its journal"}}]},
                {"eval_time": "1m", "alertname": "SpecfleetWeightsManifestFailed", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "instance": "n1:9100",
                                    "job": "specfleet-node", "host": "h1", "service": "sf",
                                    "model": "target"},
                     "exp_annotations": {"summary": "h1: target weights do not match their "
                                         "manifest"}}]},
                {"eval_time": "10m", "alertname": "SpecfleetRevisionDrift", "exp_alerts": []},
                {"eval_time": "35m", "alertname": "SpecfleetRevisionDrift", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "service": "sf"},
                     "exp_annotations": {"summary": "hosts of sf run different SGLang or "
                                         "weights revisions"}}]},
            ],
        }],
    }  # fmt: skip
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    res = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dashboard_has_the_panels_and_one_query_each():
    board = dashboard()
    assert [p["title"] for p in board["panels"]] == [p[0] for p in PANELS]
    assert all(len(p["targets"]) == 1 for p in board["panels"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.local
def test_standin_metrics_pass_promtool_check_metrics(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--model-path", "/m", "--port",
                             str(port), "--enable-metrics"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("the stand-in did not come up")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                         text=True, check=False)  # fmt: skip
    # The lint's one complaint is SGLang's own naming (its names have a colon).
    problems = [line for line in res.stderr.splitlines()
                if line and not line.endswith("metric names should not contain ':'")]  # fmt: skip
    assert problems == [], res.stderr
    assert 'sglang:generation_tokens_total{model_name="/m"}' in text


@pytest.mark.local
def test_server_down_stays_quiet_through_a_slow_restart_and_a_held_lock(tmp_path):
    """A restart that loads for 10 minutes (the relay's target is down the whole time) or a deploy
    that holds the run lock is no outage; once neither holds, a dead /metrics alerts."""
    (tmp_path / "rules.yml").write_text(json.dumps(alert_rules()))

    def series(host: str, up: str, loading: str, locked: str) -> list[dict[str, str]]:
        node = f'instance="{host}:9100",job="specfleet-node",host="{host}",service="sf"'
        return [
            {"series": f'up{{instance="{host}:30091",job="specfleet-sglang",host="{host}",'
                       'service="sf"}', "values": up},
            {"series": f"specfleet_server_loading{{{node}}}", "values": loading},
            {"series": f'specfleet_run_lock_held{{{node},holder="run-1"}}', "values": locked},
        ]

    down = {"severity": "critical", "job": "specfleet-sglang", "service": "sf"}
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        # h1: loading for 10 min, then up; h2: a deploy holds the lock while it is down for
        # 10 min, then up; h3: loading ends at 10 min but the server stays down.
        "input_series": series("h1", "1 0x10 1x5", "0 1x9 0x6", "0x16")
        + series("h2", "1 0x10 1x5", "0x16", "0 1x9 0x6")
        + series("h3", "1 0x15", "0 1x9 0x6", "0x16"),
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": "SpecfleetServerDown", "exp_alerts": []},
            {"eval_time": "13m", "alertname": "SpecfleetServerDown", "exp_alerts": [
                {"exp_labels": {**down, "instance": "h3:30091", "host": "h3"},
                 "exp_annotations": {"summary": "h3: the SGLang server's /metrics does not "
                                     "answer (server or relay down); see `specfleet logs "
                                     "INVENTORY h3`"}}]},
        ],
    }]}  # fmt: skip
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    res = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dashboard_has_a_host_variable_and_real_units():
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["host"]["multi"] and variables["host"]["includeAll"]
    assert "label_values(" in variables["host"]["definition"]
    units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in board["panels"]}
    assert units["Generation throughput per host"] == "tokens/s"
    assert units["Free disk, smallest filesystem"] == "bytes"
    assert units["Ready"] == "bool_yes_no"
    assert all(p["fieldConfig"]["defaults"]["custom"]["axisLabel"] for p in board["panels"])
    # Every query follows the host picker.
    assert all('host=~"$host"' in expr for _, expr in panel_queries(board))


def test_a_loopback_relay_is_refused_as_a_remote_target_with_the_fix(tmp_path):
    """The relay has no auth, so it listens on the loopback unless the settings open it; a
    scrape config that would point a remote Prometheus at it is refused, naming host and fix."""
    from specfleet.core.errors import SpecfleetError

    assert _settings().metrics.relay_listen == "127.0.0.1"
    with pytest.raises(SpecfleetError) as err:
        write_monitoring([("h1", "10.0.0.1", _settings())], tmp_path)
    text = str(err.value)
    assert "h1" in text and "127.0.0.1" in text and "metrics.relay_listen" in text
    assert "fix" in text and not (tmp_path / "prometheus.yml").exists()
    # Scraped on the host itself, or with the relay opened: written.
    write_monitoring([("h1", "127.0.0.1", _settings())], tmp_path / "local")
    write_monitoring([("h1", "10.0.0.1", _settings(metrics={"relay_listen": "10.0.0.1"}))],
                     tmp_path / "open")
    assert (tmp_path / "open" / "prometheus.yml").exists()


def test_loopback_relays_of_several_hosts_are_one_error_naming_each_with_the_data_to_set(
        tmp_path):
    """The default relay (loopback) on every host of an inventory, as in the example fleet:
    one error naming every host and where it would be scraped, that nothing was written, and
    the data that fixes it (not the first host alone, to be met again host by host)."""
    from specfleet.core.errors import SpecfleetError

    hosts = [("h1", "10.0.0.1", _settings()), ("h2", "10.0.0.2", _settings()),
             ("h3", "10.0.0.3", _settings(metrics={"relay_listen": "10.0.0.3"}))]
    with pytest.raises(SpecfleetError) as err:
        write_monitoring(hosts, tmp_path)
    text = err.value.render()
    assert "of 2 hosts" in text and "nothing was written" in text, text
    assert "h1: 127.0.0.1, scraped at 10.0.0.1:30091" in text, text
    assert "h2: 127.0.0.1, scraped at 10.0.0.2:30091" in text, text
    assert "h3" not in text
    assert """specfleet = {"metrics": {"relay_listen": "10.0.0.1"}}""" in text, text
    assert not (tmp_path / "targets").exists()


@pytest.mark.local
def test_every_dashboard_query_parses_as_promql(tmp_path):
    """Each panel's query, with the host picker's values put in as Grafana does, is valid PromQL
    (promtool checks it as a recording rule)."""
    board = dashboard()
    (picker,) = [v for v in board["templating"]["list"] if v["name"] == "host"]
    rules = [{"record": f"specfleet:panel_{i}_{j}", "expr": expr.replace("$host", value)}
             for i, (_, expr) in enumerate(panel_queries(board))
             for j, value in enumerate((picker["allValue"], "h1"))]
    (tmp_path / "panels.yml").write_text(json.dumps({"groups": [{"name": "p", "rules": rules}]}))
    res = promtool("check", "rules", str(tmp_path / "panels.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
