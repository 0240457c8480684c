"""Day two, as pure functions: where the watchdog's files live on a host, its config, and what
Prometheus and Grafana are given (scrape config with file_sd targets, alert rules, a dashboard).

``specfleet.core.layout.watchdog_paths`` is the one list of every file and unit the watchdog puts
on a host: removal (``present=False``) and the operation read it, nothing else names them.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import WatchdogPaths, lock_path, watchdog_paths  # noqa: F401
from specfleet.core.runlock import DEFAULT_LEASE_S
from specfleet.core.settings import Settings

# Prometheus job names: the server's own metrics (through the relay) and node-exporter.
SGLANG_JOB = "specfleet-sglang"
NODE_JOB = "specfleet-node"
LOOPBACK = ("127.0.0.1", "0.0.0.0", "::", "::1", "localhost")


def probe_address(listen_host: str) -> str:
    """Where the watchdog on the host reaches the server: the loopback unless it listens on one
    address only."""
    host = "127.0.0.1" if listen_host in LOOPBACK else listen_host
    return f"[{host}]" if ":" in host else host


def watchdog_config(settings: Settings) -> dict[str, Any]:
    """The watchdog's JSON config (``specfleet/hostside/watchdog.py`` reads every key)."""
    w, m = settings.watchdog, settings.metrics
    paths = watchdog_paths(settings)
    relay = None
    if m.enable and m.relay_port is not None:
        relay = {"listen": m.relay_listen, "port": m.relay_port}
    return {
        "unit": f"{settings.service_name}.service",
        "service_name": settings.service_name,
        "server_url": f"http://{probe_address(settings.listen_host)}:{settings.port}",
        "interval_s": w.interval_s,
        "probe_timeout_s": w.probe_timeout_s,
        "failures": w.failures,
        "backoff_s": w.backoff_s,
        "backoff_max_s": w.backoff_max_s,
        "max_restarts": w.max_restarts,
        "window_s": w.window_s,
        "load_grace_s": w.load_grace_s if w.load_grace_s is not None
        else settings.readiness_timeout_s,
        "lock_path": lock_path(settings),
        "lock_lease_s": DEFAULT_LEASE_S,
        "state_path": paths.state,
        "deploy_state": paths.deploy_state,
        "textfile": paths.textfile,
        "relay": relay,
    }


def deploy_state(build: dict[str, str], plan_hash: str, weights_ok: dict[str, bool]) -> dict:
    """What the deploy records for the textfile (no time in it: the file's mtime is the time, so
    a converged run rewrites nothing)."""

    def rev(text: str) -> str:
        return text.rpartition("@")[2]

    return {
        "sglang_version": build.get("sglang", ""),
        "pr20547": build.get("patch", ""),
        "target_revision": rev(build.get("target", "")),
        "drafter_revision": rev(build.get("drafter", "")),
        "plan_hash": plan_hash,
        "result": "ok",
        "weights_ok": weights_ok,
    }


# --------------------------------------------------------------------------------------------------
# Prometheus and Grafana
# --------------------------------------------------------------------------------------------------


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: reachable from the host itself only."""
    if address.strip().lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def relay_target_problem(hosts: list[tuple[str, str, Settings]]) -> SpecfleetError | None:
    """Relays that listen on the loopback, scraped from another machine: they would never
    answer (the relay has no auth, so the loopback is its default). One error for every such
    host of ``(host name, address, settings)``, with the data that opens each."""
    bad = [(name, address, s) for name, address, s in hosts
           if is_loopback(s.metrics.relay_listen) and not is_loopback(address)]
    if not bad:
        return None
    name, address, s = bad[0]
    example = f'specfleet = {{"metrics": {{"relay_listen": "{address}"}}}}'
    fix = (f"give each host's data its fleet address, e.g. {example} for {name} (or '0.0.0.0' "
           "in group data, behind a firewall that admits only the scraper), deploy again, then "
           "run specfleet monitoring again; the relay has no auth")
    if len(bad) == 1:
        return SpecfleetError(
            f"the metrics relay listens on {s.metrics.relay_listen} (metrics.relay_listen), so "
            f"Prometheus cannot scrape it at {address}:{s.metrics.relay_port}; nothing was "
            "written", host=name, fix=fix)
    return SpecfleetError(
        f"the metrics relay listens on the loopback (metrics.relay_listen) of {len(bad)} hosts, "
        "so a Prometheus on another machine cannot scrape them; nothing was written:\n" + "\n".join(
            f"  {n}: {t.metrics.relay_listen}, scraped at {a}:{t.metrics.relay_port}"
            for n, a, t in bad), fix=fix)


def file_sd(hosts: list[tuple[str, str, Settings]]) -> dict[str, list[dict[str, Any]]]:
    """The file_sd target lists of a fleet: ``{job: [{"targets": [...], "labels": {...}}]}``
    from ``(host name, address, settings)``. A host without a relay has no server target; a
    relay on the loopback of a host scraped from elsewhere is refused (``SpecfleetError``)."""
    relayed = [(n, a, s) for n, a, s in hosts
               if s.metrics.enable and s.metrics.relay_port is not None]
    problem = relay_target_problem(relayed)
    if problem is not None:
        raise problem
    sglang, node = [], []
    for name, address, s in hosts:
        addr = f"[{address}]" if ":" in address else address
        labels = {"host": name, "service": s.service_name}
        if s.metrics.enable and s.metrics.relay_port is not None:
            sglang.append({"targets": [f"{addr}:{s.metrics.relay_port}"], "labels": labels})
        node.append({"targets": [f"{addr}:{s.metrics.node_exporter_port}"],
                     "labels": {"host": name}})  # fmt: skip
    return {SGLANG_JOB: sglang, NODE_JOB: node}


def prometheus_config(targets_dir: str, rules_file: str, interval_s: int = 15) -> dict[str, Any]:
    """prometheus.yml (as JSON, which YAML reads) scraping the file_sd lists in ``targets_dir``."""
    return {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "rule_files": [rules_file],
        "scrape_configs": [
            {"job_name": job, "file_sd_configs": [{"files": [f"{targets_dir}/{job}.json"]}]}
            for job in (SGLANG_JOB, NODE_JOB)
        ],
    }


# (name, expression, for, summary): each names the host and what to do.
ALERTS: tuple[tuple[str, str, str, str], ...] = (
    # A (re)start loads for minutes and a deploy holds the run lock while it restarts: the
    # textfile's gauges say so, matched by the labels both jobs carry (host and service).
    ("SpecfleetServerDown", f'up{{job="{SGLANG_JOB}"}} == 0 '
     "unless on(host, service) specfleet_server_loading == 1 "
     "unless on(host, service) specfleet_run_lock_held == 1", "2m",
     "{{ $labels.host }}: the SGLang server's /metrics does not answer (server or relay down); "
     "see `specfleet logs INVENTORY {{ $labels.host }}`"),
    ("SpecfleetServerNotReady",
     "specfleet_server_ready == 0 unless on(instance, service) specfleet_server_loading == 1 "
     "unless on(instance, service) specfleet_run_lock_held == 1", "5m",
     "{{ $labels.host }}: {{ $labels.service }} fails its generation probe"),
    ("SpecfleetWatchdogRestarting", "increase(specfleet_watchdog_restarts_total[1h]) > 0", "0s",
     "{{ $labels.host }}: the watchdog restarted {{ $labels.service }}; the reason is in its "
     "journal"),
    ("SpecfleetWatchdogCapped", "specfleet_watchdog_capped == 1", "0s",
     "{{ $labels.host }}: the watchdog reached max_restarts and stopped restarting "
     "{{ $labels.service }}"),
    ("SpecfleetRevisionDrift",
     "count by (service) (count by (service, sglang_version, target_revision, "
     "drafter_revision) (specfleet_build_info)) > 1", "30m",
     "hosts of {{ $labels.service }} run different SGLang or weights revisions"),
    ("SpecfleetWeightsManifestFailed", "specfleet_weights_manifest_ok == 0", "0s",
     "{{ $labels.host }}: {{ $labels.model }} weights do not match their manifest"),
)


def alert_rules(for_override: str | None = None) -> dict[str, Any]:
    """The alert rules file (JSON, which YAML reads); ``for_override`` replaces every ``for``."""
    rules = [
        {"alert": name, "expr": expr, "for": for_override or hold,
         "labels": {"severity": "warning" if name == "SpecfleetRevisionDrift" else "critical"},
         "annotations": {"summary": summary}}
        for name, expr, hold, summary in ALERTS
    ]  # fmt: skip
    return {"groups": [{"name": "specfleet", "rules": rules}]}


# Every panel's query is limited to the hosts chosen in the dashboard's ``host`` variable.
HOSTS = 'host=~"$host"'

# (title, expression, Grafana unit id, axis label): one panel each.
PANELS: tuple[tuple[str, str, str, str], ...] = (
    ("Generation throughput per host", f'sum by (host) (rate(sglang:generation_tokens_total'
     f'{{job="{SGLANG_JOB}",{HOSTS}}}[5m]))', "tokens/s", "tokens/s"),  # fmt: skip
    ("Queue per host", f"sum by (host) (sglang:num_queue_reqs{{{HOSTS}}})", "short", "requests"),
    ("Running requests per host", f"sum by (host) (sglang:num_running_reqs{{{HOSTS}}})",
     "short", "requests"),
    ("Speculative accept length", f"avg by (host) (sglang:spec_accept_length{{{HOSTS}}})",
     "short", "accepted tokens per verify step"),
    ("Watchdog restarts (1 h)",
     f"sum by (host) (increase(specfleet_watchdog_restarts_total{{{HOSTS}}}[1h]))",
     "short", "restarts"),
    ("Ready", f"max by (host) (specfleet_server_ready{{{HOSTS}}})", "bool_yes_no", "ready"),
    ("Free disk, smallest filesystem", f'min by (host) (node_filesystem_avail_bytes{{{HOSTS},'
     'fstype!~"tmpfs|overlay"})', "bytes", "bytes free"),
    ("Revision", "max by (host, sglang_version, pr20547, target_revision, drafter_revision, "
     f"plan_hash) (specfleet_build_info{{{HOSTS}}})", "string", "info"),
)


def dashboard() -> dict[str, Any]:
    """A Grafana dashboard (JSON model, schema 39) with one panel per ``PANELS`` row."""
    panels = []
    for i, (title, expr, unit, label) in enumerate(PANELS):
        table = expr.startswith("max by (host, sglang_version")
        panels.append({
            "id": i + 1, "title": title, "type": "table" if table else "timeseries",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 24 if table else 12, "x": 0 if table else (i % 2) * 12,
                        "y": (i // 2) * 8},
            "fieldConfig": {"defaults": {"unit": unit, "custom": {"axisLabel": label}},
                            "overrides": []},
            "targets": [{"refId": "A", "expr": expr, "format": "table" if table else "time_series",
                         "instant": table, "legendFormat": "{{host}}"}],
        })  # fmt: skip
    return {
        "title": "specfleet: SGLang fleet", "uid": "specfleet-fleet", "schemaVersion": 39,
        "version": 1, "editable": True, "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Prometheus"},
            {"name": "host", "type": "query", "label": "Host", "multi": True, "includeAll": True,
             "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "refresh": 2,
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(specfleet_build_info, host)", "refId": "hosts"},
             "definition": "label_values(specfleet_build_info, host)", "sort": 1},
        ]},
        "panels": panels,
    }  # fmt: skip


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expression)`` of every query of a dashboard."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]
