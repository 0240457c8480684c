"""Settings refuse the host's own folders and units (issue 55, finding 1): a folder specfleet
owns is no system folder nor a parent of one, and the server is never named as a system unit."""

from __future__ import annotations

import pytest

from specfleet.core import layout
from specfleet.core.errors import SettingsError
from specfleet.core.settings import settings_from_dict
from specfleet.core.settings import validators as valid


@pytest.mark.parametrize("key, value", [
    ("state_dir", "/var/lib"), ("state_dir", "/var"), ("state_dir", "/srv"),
    ("state_dir", "/etc/specfleet"), ("state_dir", "/opt/specfleet"), ("state_dir", "/usr/local"),
    ("state_dir", "/etc/specfleet/state"), ("venv", "/usr"), ("venv", "/opt"),
    ("venv", "/opt/specfleet/tools"), ("venv", "/var/cache"), ("models_root", "/var/lib"),
    ("models_root", "/home"), ("models_root", "/opt/specfleet"), ("state_dir", "/var/log/"),
])
def test_system_folders_are_refused_with_the_fix(key, value):
    with pytest.raises(SettingsError) as err:
        settings_from_dict({key: value}, host="h1")
    text = str(err.value)
    assert f"settings key '{key}'" in text and "folder of its own" in text, text
    assert f"fix: set {key} to a folder of specfleet's own such as" in text, text


@pytest.mark.parametrize("key, value", [
    ("state_dir", "/var/lib/specfleet"), ("state_dir", "/srv/sf/state"),
    ("venv", "/opt/specfleet/sglang"), ("venv", "/root/venv"), ("models_root", "/srv/models"),
    ("models_root", "/opt/specfleet/models"), ("models_root", "/data/models"),
])
def test_folders_of_their_own_are_accepted(key, value):
    assert getattr(settings_from_dict({key: value}), key) == value


@pytest.mark.parametrize("name", ["ssh", "sshd", "dbus", "cron", "systemd-journald", "systemd",
                                  "NetworkManager", "nvidia-persistenced", "nvidia", "user",
                                  "getty", "user@0", "getty@tty1"])
def test_system_unit_names_are_refused_with_the_fix(name):
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"service_name": name}, host="h1")
    text = str(err.value)
    assert "settings key 'service_name'" in text and "system units" in text, text
    assert "fix: set service_name to a plain name of specfleet's own" in text, text


@pytest.mark.parametrize("name", ["specfleet-sglang", "kimi", "sglang-a", "ssh-proxy-llm"])
def test_own_unit_names_are_accepted(name):
    assert settings_from_dict({"service_name": name}).service_name == name


def test_venv_apart_from_state_and_models():
    for data in ({"venv": "/var/lib/specfleet/venv"}, {"venv": "/srv/models/venv"},
                 {"state_dir": "/srv/x", "venv": "/srv/x/venv"}):
        with pytest.raises(SettingsError, match="expected a folder apart from"):
            settings_from_dict(data, host="h1")


def test_specfleet_dirs_agree_with_the_layout():
    assert layout.ETC_DIR in valid.SPECFLEET_DIRS and layout.OPT_DIR in valid.SPECFLEET_DIRS
    assert layout.TOOLS_PATH in valid.SPECFLEET_INNER
    assert layout.join(layout.OPT_DIR, "watchdog") in valid.SPECFLEET_INNER
    assert layout.SYSTEMD_DIR.startswith(tuple(valid.SYSTEM_DIRS))


@pytest.mark.parametrize("name", ["PYTHONPYCACHEPREFIX", "TRITON_CACHE_DIR", "triton_cache_dir",
                                  "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME"])
def test_extra_env_refuses_the_compile_caches(name):
    """Issue 55: a cache folder anyone can write, given to the root server, runs their code."""
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"plan": {"extra_env": {name: "/tmp/cache"}}}, host="h1")
    assert "compile caches" in str(err.value) and "fix:" in str(err.value)


def test_the_refused_caches_are_the_ones_specfleet_places():
    from specfleet.core.unit import CACHE_ENV

    assert {n for n, _ in CACHE_ENV} | {"PYTHONPYCACHEPREFIX"} == valid.CODE_CACHE_ENV


@pytest.mark.parametrize("value", ['/srv/my"models', "/srv/my\\models"])
def test_quotes_and_backslashes_in_host_paths_are_refused(value):
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"models_root": value}, host="h1")
    assert "without '\"' or '\\'" in str(err.value)


@pytest.mark.parametrize("value, ok", [("127.0.0.1", True), ("0.0.0.0", True), ("::1", True),
                                       ("10.1.2.3", True), ("localhost", True),
                                       ("gpu7.example.com", False), ("server", False)])
def test_listen_host_is_an_address_not_a_dns_name(value, ok):
    """Issue 55: the gate and the status fact send the API key to listen_host; a DNS name may
    resolve to any machine."""
    if ok:
        assert settings_from_dict({"listen_host": value}).listen_host == value
        return
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"listen_host": value}, host="h1")
    assert "an IP address of the host (or localhost), not a DNS name" in str(err.value)
    assert "fix: set listen_host to an IP address of the host" in str(err.value)
