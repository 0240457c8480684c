"""Removal's pure parts: the one footprint list, the leftovers fact's parser, the removal settings
(`specfleet remove`'s pyinfra run: tests/unit/test_cli.py). The removal itself runs on real hosts in
tests/fleet/test_deploy_fleet.py (test_removal_then_deploy_converges_again)."""

from __future__ import annotations

import subprocess

import pytest

from facts.removal import Leftovers, parse_leftovers, shell_glob
from operations.removal import footprint
from specfleet.core.errors import SettingsError
from specfleet.core.settings import settings_from_dict


def test_footprint_lists_everything_a_deploy_writes_but_the_weights_and_venv():
    s = settings_from_dict({"service_name": "kimi", "state_dir": "/var/lib/sf",
                            "venv": "/root/venv"})
    fp = footprint(s)
    assert fp.units == ("kimi.service", "kimi-*", "specfleet-*")
    for path in ("/etc/systemd/system/kimi.service", "/etc/systemd/system/kimi-*",
                 "/etc/systemd/system/specfleet-*", "/etc/specfleet/kimi.env",
                 "/etc/specfleet/secrets/kimi.yaml", "/etc/specfleet/kimi.logging",
                 "/var/lib/sf/kimi.restart-pending", "/opt/specfleet/tools", "/var/lib/sf/*",
                 # a watchdog of this service (its config, its program folder) is covered too
                 "/etc/specfleet/kimi.*", "/etc/specfleet/secrets/kimi.*", "/opt/specfleet/*"):
        assert path in fp.paths, path
    assert fp.lock == "/var/lib/sf/run.lock"
    assert fp.venvs == ("/root/venv", "/root/venv-sglang-*")
    assert fp.dirs == ("/etc/specfleet/secrets", "/etc/specfleet", "/opt/specfleet")
    # The weights only when asked; never the models root itself or the user's venv.
    assert fp.weights == ("/srv/models/moonshotai--Kimi-K2.6", "/srv/models/z-lab--Kimi-K2.6-DFlash",
                          "/srv/models/.cache")
    assert not any(p.startswith(("/srv/models", "/root/venv")) for p in fp.paths)
    # Another service's files on the same host are not this one's.
    assert not any(p.startswith("/etc/specfleet/") and "kimi" not in p for p in fp.paths)


def test_leftovers_parser():
    value = parse_leftovers([
        "path=/etc/specfleet/kimi.env", "path=/var/lib/sf/hf", "path=/etc/specfleet/kimi.env",
        "empty=/etc/specfleet",
        "venv=10/opt/specfleet/sglang", "venv=01/root/venv",
        "unit=kimi.service active", "unitfile=kimi.service enabled",
        "unitfile=specfleet-watchdog.timer disabled",
    ])
    assert value == {
        "paths": ["/etc/specfleet/kimi.env", "/var/lib/sf/hf"],
        "empty_dirs": ["/etc/specfleet"],
        "venvs": {"/opt/specfleet/sglang": {"created": True, "specfleet": False},
                  "/root/venv": {"created": False, "specfleet": True}},
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
        "venvs": {f"{tmp_path}/a b-2": {"created": False, "specfleet": False}},
    }


def test_removal_settings():
    s = settings_from_dict({"present": False, "removal": {"venv": True}})
    assert s.present is False and s.removal.venv and not s.removal.weights
    with pytest.raises(SettingsError, match="settings key 'present' is 'no'"):
        settings_from_dict({"present": "no"}, host="h")
