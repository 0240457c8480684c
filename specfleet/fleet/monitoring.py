"""``specfleet monitoring`` and ``specfleet logs``: day two from the control machine.

    specfleet monitoring INVENTORY --out DIR [--scrape-interval S] [--alert-for DURATION]
    specfleet logs INVENTORY HOST [-n LINES] [--since WHEN]

``monitoring`` writes, from the inventory: ``DIR/prometheus.yml`` (scrape config),
``DIR/targets/<job>.json`` (file_sd: each host's metrics relay and node-exporter),
``DIR/rules/specfleet.rules.yml`` (alerts) and ``DIR/grafana/specfleet.json`` (a dashboard).
``--alert-for`` replaces every alert's ``for`` (a test's 0s).

``logs`` prints the server's journal on HOST with every secret redacted on the host, before it
leaves: the rules of ``specfleet/hostside/specfleet_log_redact.py`` (API key fields and flags),
plus the API key file's key and the host's Hugging Face token wherever they appear.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from pyinfra.api import State

from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import control_token_path, host_token_path, server_paths
from specfleet.core.monitoring import (
    alert_rules,
    dashboard,
    file_sd,
    prometheus_config,
    watchdog_paths,
)
from specfleet.core.settings import Settings, settings_for_host
from specfleet.fleet.pyinfra_run import load_inventory
from specfleet.hostside.specfleet_log_redact import ship_ahead_of


def load_hosts(inventory: str) -> list[tuple[str, dict[str, Any], Settings]]:
    """``(name, host data, settings)`` of every host of the inventory, in order."""
    inv = load_inventory(inventory)
    State(inventory=inv)  # hosts read their data through the state they belong to
    return [(h.name, dict(h.data.dict()), settings_for_host(h)) for h in inv]


def write_monitoring(hosts: list[tuple[str, str, Settings]], out: Path, interval_s: int = 15,
                     alert_for: str | None = None) -> list[Path]:  # fmt: skip
    """Write the scrape config, targets, rules and dashboard under ``out``; the paths written."""
    targets, rules = out / "targets", out / "rules" / "specfleet.rules.yml"
    written = []
    for job, groups in file_sd(hosts).items():
        written.append(_write(targets / f"{job}.json", groups))
    written.append(_write(rules, alert_rules(alert_for)))
    written.append(_write(out / "prometheus.yml",
                          prometheus_config(str(targets.resolve()), str(rules.resolve()),
                                            interval_s)))  # fmt: skip
    written.append(_write(out / "grafana" / "specfleet.json", dashboard()))
    return written


def _write(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")
    return path


def main_monitoring(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specfleet monitoring")
    p.add_argument("inventory")
    p.add_argument("--out", required=True)
    p.add_argument("--scrape-interval", type=int, default=15)
    p.add_argument("--alert-for", help="every alert's `for` (e.g. 0s in a test)")
    a = p.parse_args(argv)
    hosts = [(name, str(data.get("ssh_hostname") or name), s)
             for name, data, s in load_hosts(a.inventory)]  # fmt: skip
    for path in write_monitoring(hosts, Path(a.out), a.scrape_interval, a.alert_for):
        print(path)
    return 0


# --------------------------------------------------------------------------------------------------
# logs
# --------------------------------------------------------------------------------------------------

# Runs on the host (python3 -I -S -c), after specfleet_log_redact.py's own source: the journal
# from stdin, redacted as one text (a key split over two lines too) with its rules and the
# secrets read from the files named.
_FILTER = """
import sys as _sys
_keys = read_secrets([_sys.argv[1]])
for _path in _sys.argv[2:]:
    try:
        with open(_path, encoding="utf-8") as _f:
            _keys.append(_f.read().strip())
    except (OSError, UnicodeDecodeError):
        pass
for _line in redact_lines(_sys.stdin.read().splitlines(), [k for k in _keys if k]):
    _sys.stdout.write(_line + "\\n")
"""


def logs_command(s: Settings, lines: int, since: str | None) -> str:
    """The shell command that prints the server's journal with every secret redacted."""
    server = server_paths(s)
    source = ship_ahead_of(_FILTER)
    journal = ["journalctl", "--no-pager", "-o", "short-iso", "-u", server.unit_name,
               "-u", watchdog_paths(s).unit_name, "-n", str(lines)]  # fmt: skip
    if since:
        journal += ["--since", since]
    # The API key, the host's own token and the copy of the token a deploy makes.
    redactor = ["python3", "-I", "-S", "-c", source, server.secret, host_token_path(s),
                control_token_path(s)]
    return f"{shlex.join(journal)} | {shlex.join(redactor)}"


def ssh_argv(data: dict[str, Any], name: str) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes"]
    if data.get("ssh_key"):
        argv += ["-i", str(data["ssh_key"])]
    if data.get("ssh_port"):
        argv += ["-p", str(data["ssh_port"])]
    if data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={data['ssh_known_hosts_file']}"]
    strict = data.get("ssh_strict_host_key_checking")
    if strict is not None:
        argv += ["-o", f"StrictHostKeyChecking={strict}"]
    target = str(data.get("ssh_hostname") or name)
    user = data.get("ssh_user")
    return [*argv, f"{user}@{target}" if user else target]


def main_logs(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specfleet logs")
    p.add_argument("inventory")
    p.add_argument("host")
    p.add_argument("-n", "--lines", type=int, default=200)
    p.add_argument("--since", help="journalctl's --since (e.g. '-1h', '2026-12-01 14:00')")
    a = p.parse_args(argv)
    found = {name: (data, s) for name, data, s in load_hosts(a.inventory)}
    if a.host not in found:
        raise SpecfleetError(f"there is no host {a.host!r} in {a.inventory}",
                             fix=f"name one of: {', '.join(found) or '(none)'}")  # fmt: skip
    data, s = found[a.host]
    cmd = ssh_argv(data, a.host) + [logs_command(s, a.lines, a.since)]
    res = subprocess.run(cmd, check=False)
    if res.returncode != 0:
        print(f"specfleet logs: [{a.host}] ssh or journalctl exited {res.returncode}",
              file=sys.stderr)  # fmt: skip
    return res.returncode
