"""Removal's pure parts: the one footprint list, the leftovers fact's parser, the removal settings
(`specfleet remove`'s pyinfra run: tests/unit/test_cli.py). The removal itself runs on real hosts in
tests/fleet/test_deploy_fleet.py (test_removal_then_deploy_converges_again)."""

from __future__ import annotations

import subprocess

import pytest

from facts.removal import Leftovers, parse_leftovers, shell_glob
from operations.removal import footprint, own_units
from specfleet.core.errors import SettingsError
from specfleet.core.settings import settings_from_dict


def test_footprint_lists_everything_a_deploy_writes_by_exact_name():
    s = settings_from_dict({"service_name": "kimi", "state_dir": "/var/lib/sf",
                            "venv": "/root/venv"})
    fp = footprint(s)
    assert fp.units == ("kimi.service", "kimi-watchdog.service")
    for path in ("/etc/systemd/system/kimi.service", "/etc/systemd/system/kimi-watchdog.service",
                 "/etc/specfleet/kimi.env", "/etc/specfleet/secrets/kimi.yaml",
                 "/etc/specfleet/kimi.logging", "/etc/specfleet/kimi.logging/logging.json",
                 "/var/lib/sf/kimi.restart-pending", "/opt/specfleet/tools",
                 "/opt/specfleet/watchdog/kimi", "/etc/specfleet/kimi.watchdog.json",
                 "/var/lib/sf/hf", "/var/lib/sf/rollback/kimi", "/var/lib/sf/fanout",
                 "/var/lib/sf/weights"):
        assert path in fp.paths, path
    # No glob over a folder or a name prefix: another service's files, the host's, the user's
    # files in state_dir are never in it.
    assert not any("*" in p for p in (*fp.paths, *fp.units, *fp.dirs))
    assert "/var/lib/sf/run.lock" not in fp.paths and fp.lock == "/var/lib/sf/run.lock"
    assert fp.venvs == ("/root/venv", "/root/venv-sglang-*")
    assert fp.dirs == ("/etc/specfleet/secrets", "/etc/specfleet", "/opt/specfleet/watchdog",
                       "/opt/specfleet", "/var/lib/sf/rollback", "/var/lib/sf")
    # The weights only when asked; never the models root itself or the user's venv.
    assert fp.weights == ("/srv/models/moonshotai--Kimi-K2.6", "/srv/models/z-lab--Kimi-K2.6-DFlash",
                          "/srv/models/.cache")
    assert not any(p.startswith(("/srv/models", "/root/venv")) for p in fp.paths)
    # The transient units: only the names specfleet gives them.
    assert own_units(fp, {u: {} for u in (
        "specfleet-weights-moonshotai--Kimi-K2.6-run-0123abcd.service",
        "specfleet-weights-moonshotai--Kimi-K2.6.service",
        "specfleet-fanout-pull-z-lab--Kimi-K2.6-DFlash-r1.service",
        "specfleet-fanout-sshd-r1.service",
        "kimi-b.service", "kimi-watchdog2.service", "specfleet-sglang.service",
        "specfleet-weights-moonshotai--Kimi-K2.6-b.service", "kimi.service")}) == {
        u: {} for u in ("specfleet-weights-moonshotai--Kimi-K2.6-run-0123abcd.service",
                        "specfleet-weights-moonshotai--Kimi-K2.6.service",
                        "specfleet-fanout-pull-z-lab--Kimi-K2.6-DFlash-r1.service",
                        "specfleet-fanout-sshd-r1.service", "kimi.service")}


def test_leftovers_parser():
    value = parse_leftovers([
        "path=/etc/specfleet/kimi.env", "path=/var/lib/sf/hf", "path=/etc/specfleet/kimi.env",
        "empty=/etc/specfleet",
        "venv=101/opt/specfleet/sglang", "venv=011/root/venv", "venv=000/usr",
        "unit=kimi.service active", "unitfile=kimi.service enabled",
        "unitfile=specfleet-watchdog.timer disabled",
    ])
    assert value == {
        "paths": ["/etc/specfleet/kimi.env", "/var/lib/sf/hf"],
        "empty_dirs": ["/etc/specfleet"],
        "venvs": {"/opt/specfleet/sglang": {"created": True, "specfleet": False, "venv": True},
                  "/root/venv": {"created": False, "specfleet": True, "venv": True},
                  "/usr": {"created": False, "specfleet": False, "venv": False}},
        "units": {"kimi.service": {"active": "active", "enabled": "enabled"},
                  "specfleet-watchdog.timer": {"active": "inactive", "enabled": "disabled"}},
    }
    assert Leftovers.default() == {"paths": [], "units": {}, "empty_dirs": [], "venvs": {}}


@pytest.mark.local
def test_leftovers_command_globs_only_the_trailing_star(tmp_path):
    (tmp_path / "a b-1").write_text("x")
    (tmp_path / "a b-2").mkdir()
    (tmp_path / "keep").write_text("x")
    (tmp_path / "empty").mkdir()
    assert shell_glob("/x y/*") == "'/x y/'*"
    cmd = Leftovers().command(paths=[f"{tmp_path}/a b-*", f"{tmp_path}/none", f"{tmp_path}/*$(x)"],
                              units=[], dirs=[f"{tmp_path}/empty", f"{tmp_path}/keep"],
                              venvs=[f"{tmp_path}/a b-2"])
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
    assert parse_leftovers(out.splitlines()) == {
        "paths": [f"{tmp_path}/a b-1", f"{tmp_path}/a b-2"], "units": {},
        "empty_dirs": [f"{tmp_path}/empty"],
        "venvs": {f"{tmp_path}/a b-2": {"created": False, "specfleet": False, "venv": False}},
    }


def test_removal_settings():
    s = settings_from_dict({"present": False, "removal": {"venv": True}})
    assert s.present is False and s.removal.venv and not s.removal.weights
    with pytest.raises(SettingsError, match="settings key 'present' is 'no'"):
        settings_from_dict({"present": "no"}, host="h")
