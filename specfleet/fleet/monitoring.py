"""``specfleet monitoring`` and ``specfleet logs``: day two from the control machine.

    specfleet monitoring INVENTORY --out DIR [--scrape-interval S] [--alert-for DURATION]
    specfleet logs INVENTORY HOST [-n LINES] [--since WHEN] [--timeout S] [connection options]

``monitoring`` writes, from the inventory: ``DIR/prometheus.yml`` (scrape config),
``DIR/targets/<job>.json`` (file_sd: each host's metrics relay and node-exporter),
``DIR/rules/specfleet.rules.yml`` (alerts) and ``DIR/grafana/specfleet.json`` (a dashboard).
``--alert-for`` replaces every alert's ``for`` (a test's 0s).

``logs`` prints the server's journal on HOST with every secret redacted on the host, before it
leaves: the rules of ``specfleet/hostside/specfleet_log_redact.py`` (API key fields and flags),
plus the API key file's key and the host's Hugging Face token wherever they appear.
"""

from __future__ import annotations

import json
import shlex
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
from specfleet.fleet.pyinfra_run import host_address, load_inventory
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


def main_monitoring(inventory: str, out: str, scrape_interval: int,
                    alert_for: str | None) -> int:
    """``specfleet monitoring`` (its options declared in ``specfleet.cli``): prints each file."""
    hosts = [(name, host_address(name, data), s)
             for name, data, s in load_hosts(inventory)]  # fmt: skip
    for path in write_monitoring(hosts, Path(out), scrape_interval, alert_for):
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
    source = ship_ahead_of(_FILTER)
    journal = ["journalctl", "--no-pager", "-o", "short-iso", "-u", server_paths(s).unit_name,
               "-u", watchdog_paths(s).unit_name, "-n", str(lines)]  # fmt: skip
    if since:
        journal += ["--since", since]
    redactor = ["python3", "-I", "-S", "-c", source, *secret_paths(s)]
    return f"{shlex.join(journal)} | {shlex.join(redactor)}"


# The redactor cannot read a secret file it must redact: refuse rather than show a journal
# redacted by pattern only.
UNREADABLE_SECRETS_RC = 77
# The line that names the file (pyinfra's command output carries no exit status).
UNREADABLE_MARK = "specfleet-logs: cannot read "


def secret_paths(s: Settings) -> list[str]:
    """Files on the host holding the secrets the journal is redacted of: the server's secrets
    file, the host's own token and the deploy's copy of the token."""
    return [server_paths(s).secret, host_token_path(s), control_token_path(s)]


def guarded_logs_command(s: Settings, lines: int, since: str | None) -> str:
    """``logs_command``, refused on the host (exit ``UNREADABLE_SECRETS_RC``, naming the file)
    when a secret file exists that this user cannot read."""
    checks = " ".join(shlex.quote(p) for p in secret_paths(s))
    return f"{_UNREADABLE} for f in {checks}; do if unreadable \"$f\"; then " \
        f"echo \"{UNREADABLE_MARK}$f\"; exit {UNREADABLE_SECRETS_RC}; fi; done; " \
        f"{logs_command(s, lines, since)}"


# A secret file this user cannot read, or cannot tell is absent: readable, or absent under a
# folder it can search, is fine; there but unreadable, or under a folder it cannot search (a
# non-root user and /root), is not.
_UNREADABLE = (
    'unreadable() { [ -r "$1" ] && return 1; [ -e "$1" ] && return 0; d=$(dirname "$1"); '
    'while [ ! -e "$d" ]; do d=$(dirname "$d"); done; [ ! -x "$d" ]; };'
)


def fetch_logs(inventory: str, name: str, options: Any, lines: int, since: str | None,
               timeout: float) -> int:
    """``specfleet logs``: the journal over pyinfra's connection (its SSH settings, ``--sudo``
    or the host's ``_sudo`` data), within ``timeout`` seconds for connecting and reading; the
    redacted lines on stdout. Exit 1 when the host cannot be reached or refuses, 3 on bad input."""
    import gevent
    from pyinfra.api import Config

    read = load_inventory
    names = [h.name for h in read(inventory, options.override_data())]
    if name not in names:
        raise SpecfleetError(f"there is no host {name!r} in {inventory}",
                             fix=f"name one of: {', '.join(names) or '(none)'}")
    inv = read(inventory, options.override_data(), only=[name])
    config = Config(CONNECT_TIMEOUT=max(1, int(timeout)))
    if options.sudo:
        config.SUDO = True
    if options.sudo_user:
        config.SUDO_USER = options.sudo_user
    State(inventory=inv, config=config)  # hosts read their data and config through it
    host = inv.get_host(name)
    s = settings_for_host(host)
    sudo = bool(config.SUDO or host.data.get("_sudo"))
    command = guarded_logs_command(s, lines, since)
    try:
        with gevent.Timeout(timeout, TimeoutError):
            host.connect(reason="logs", show_errors=False, raise_exceptions=True)
            ok, output = host.run_shell_command(
                command, _sudo=sudo, _sudo_user=config.SUDO_USER or host.data.get("_sudo_user"),
                _timeout=timeout, print_output=False, print_input=False)
    except TimeoutError:
        return _logs_failed(name, f"no answer within {timeout:g} s",
                            "check that the host is up and reachable, or give --timeout more")
    except Exception as exc:  # noqa: BLE001 - pyinfra's connect errors, said as the host's
        return _logs_failed(name, f"cannot connect: {exc}",
                            "check the address and SSH settings (--ssh-user, --key, --port)")
    finally:
        try:
            host.disconnect()
        except Exception:  # noqa: BLE001 - a connection that never opened has nothing to close
            pass
    said = output.stdout_lines[-1:] if not ok else []
    if said and said[0].startswith(UNREADABLE_MARK):
        path = said[0][len(UNREADABLE_MARK):].strip()
        return _logs_failed(name, f"this user cannot read {path}, so its secrets would not be "
                            "redacted", "run with --sudo (or connect as root: --ssh-user root)")
    for line in output.stdout_lines:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if not ok:
        why = "; ".join(output.stderr_lines[-3:]) or "it printed no reason"
        return _logs_failed(name, f"journalctl failed: {why}",
                            "check that the host runs systemd and the unit exists")
    return 0


def _logs_failed(name: str, problem: str, fix: str) -> int:
    print(SpecfleetError(problem, host=name, fix=fix).render(), file=sys.stderr)
    return 1


