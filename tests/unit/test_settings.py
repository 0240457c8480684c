"""The typed settings object: merging over defaults and clear errors for bad data."""

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

from specfleet.core.settings import (
    Settings,
    SettingsError,
    settings_for_host,
    settings_from_dict,
    settings_from_layers,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_defaults_are_the_kimi_deploy():
    s = settings_from_dict(None)
    assert s == Settings()
    assert s.target.repo_id == "moonshotai/Kimi-K2.6"
    assert s.drafter.repo_id == "z-lab/Kimi-K2.6-DFlash" and s.drafter.gated
    assert s.port == 30000 and s.listen_host == "127.0.0.1"


def test_layers_merge_key_by_key_host_wins():
    group = {"target": {"revision": COMMIT}, "port": 31000, "plan": {"extra_env": {"A": "1"}}}
    host = {"port": 32000, "plan": {"extra_env": {"B": "2"}}}
    s = settings_from_layers([group, None, host], host="h1")
    assert s.port == 32000
    assert s.target.revision == COMMIT and s.target.repo_id == "moonshotai/Kimi-K2.6"
    assert s.plan.extra_env == {"A": "1", "B": "2"}


BAD = [
    ({"prot": 1}, "unknown settings key 'prot'"),
    ({"target": {"revison": COMMIT}}, "unknown settings key 'target.revison'"),
    ({"port": "30000"}, "settings key 'port' is '30000' (str), expected an integer"),
    ({"port": 70000}, "settings key 'port' is 70000, expected 1..65535"),
    ({"sglang": {"kind": "svn"}}, "settings key 'sglang.kind' is 'svn' (str), expected 'index' or 'git'"),
    ({"target": {"revision": "main"}}, "settings key 'target.revision' is 'main', which is not a commit"),
    ({"weights": {"stall_minutes": "3"}}, "settings key 'weights.stall_minutes' is '3' (str)"),
    ({"plan": {"tp_size": True}}, "settings key 'plan.tp_size' is True (bool), expected an integer"),
    ({"plan": {"mem_fraction_static": 1.5}}, "'plan.mem_fraction_static' is 1.5"),
    ({"target": "moonshotai/Kimi-K2.6"}, "settings key 'target' is 'moonshotai/Kimi-K2.6' (str)"),
    ({"launcher": "python3 x.py"}, "settings key 'launcher' is 'python3 x.py' (str), expected a list"),
    ({"patch": {"source": "/tmp/pr.diff"}}, "'patch.source' is set without 'patch.sha256'"),
    ({"sglang": {"kind": "git"}}, "'sglang.git_url' or 'sglang.git_ref' is unset"),
]


@pytest.mark.parametrize(("data", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_settings_name_key_host_and_fix(data, message):
    with pytest.raises(SettingsError) as err:
        settings_from_dict(data, host="gpu-7")
    text = str(err.value)
    assert text.startswith("[gpu-7] ")
    assert message in text
    assert "\n  fix: " in text


def test_specfleet_data_must_be_a_mapping():
    with pytest.raises(SettingsError, match=r"\[h\] 'specfleet' data is list, expected a mapping"):
        settings_from_layers([["port", 1]], host="h")


def _inventory_settings(path):
    ctx_state.set(State())
    return {h.name: settings_for_host(h) for h in make_inventory(path)}


def test_ct200_inventory_reuses_its_venv_and_follows_main_on_purpose():
    # Loads the inventory file only: nothing connects to CT200.
    s = _inventory_settings("inventories/ct200.py")["ct200"]
    assert s.venv == "/root/venv_sglang211"
    assert s.sglang.version == "0.5.11"
    assert s.models_root == "/root/models"
    assert s.target.follow_branch and s.target.revision == "main"


def test_fleet_example_group_data_differs_by_arch():
    hosts = _inventory_settings("inventories/fleet_example.py")
    assert hosts["rtx-a1"].plan.mem_fraction_static == 0.85
    assert hosts["b200-02"].plan.mem_fraction_static == 0.9
    assert hosts["h200-01"].plan.draft_attention_backend == "fa3"
    assert hosts["h200-01"].port == 30001
    # The fleet-wide group still reaches every host.
    assert {s.sglang.version for s in hosts.values()} == {"0.5.23"}


def test_every_bad_host_is_listed_in_one_error(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text(
        "hosts = [\n"
        "    ('a', {'specfleet': {'port': 'x'}}),\n"
        "    ('b', {'specfleet': {'port': 30001}}),\n"
        "    ('c', {'specfleet': {'prot': 1}}),\n"
        "]\n"
    )
    from specfleet.core.settings import settings_for_all_hosts

    ctx_state.set(State())
    with pytest.raises(SettingsError) as err:
        settings_for_all_hosts(make_inventory(str(inv)))
    text = str(err.value)
    assert "2 hosts have bad settings" in text
    assert "[a] settings key 'port' is 'x'" in text
    assert "[c] unknown settings key 'prot'" in text
    assert "[b]" not in text


def test_fleet_example_agrees_on_one_rollout():
    from specfleet.fleet.rollout import resolve_options

    hosts = _inventory_settings("inventories/fleet_example.py")
    options = resolve_options({h: s.rollout for h, s in hosts.items()}, {})
    assert options.canary == "b200-01" and options.batch_percent == 25.0
