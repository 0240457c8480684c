"""operations.watchdog's own words: what ``--dry`` prints of the watchdog unit is a plan, never a
claim that something happened (the first command a new user runs is ``--dry``)."""

from types import SimpleNamespace

import pytest

import operations.watchdog as watchdog
from specfleet.core.settings import settings_from_dict


@pytest.mark.parametrize(("executing", "said"), [(False, "will restart it"),
                                                 (True, "restarting it")])
def test_a_changed_watchdog_is_said_to_restart_in_the_tense_of_the_run(monkeypatch, executing,
                                                                       said):  # fmt: skip
    logs: list[str] = []
    fake = SimpleNamespace(name="gpu-1", state=SimpleNamespace(is_executing=executing),
                           log=lambda message, *a: logs.append(message), noop=logs.append)
    monkeypatch.setattr(watchdog, "host", fake)
    # A fresh host: no file of the watchdog's there, its unit unknown to systemd.
    monkeypatch.setattr(watchdog, "_state", lambda s: {
        "files": {}, "need_daemon_reload": False, "load_state": "not-found",
        "unit_file_state": "", "active_state": "inactive"})  # fmt: skip
    commands = list(watchdog._service(settings_from_dict({}), present=True))
    assert any("restart" in str(c) for c in commands)
    (line,) = logs
    assert line.startswith("watchdog specfleet-sglang-watchdog.service: ") and line.endswith(
        f"changed, {said}"), line
    if not executing:
        assert "restarting" not in line
