"""One typed settings object for every option a specfleet deploy takes: ``schema`` (the models
and each value's checks), ``checks`` (the error text, checks across keys), ``layers`` (merge)."""

from specfleet.core.errors import SettingsError
from specfleet.core.settings.layers import (
    allow_test_settings,
    check_inventory_settings,
    deep_merge,
    probe_from_file,
    settings_for_host,
    settings_from_dict,
    settings_from_layers,
)
from specfleet.core.settings.schema import (
    DATA_KEY,
    TEST_SETTINGS_ENV,
    ProbeOptions,
    RolloutOptions,
    ServingGroup,
    Settings,
    WeightsOptions,
)
from specfleet.core.settings.validators import api_key_chars_ok

__all__ = ["DATA_KEY", "TEST_SETTINGS_ENV", "ProbeOptions", "RolloutOptions", "ServingGroup",
           "Settings", "SettingsError", "WeightsOptions", "allow_test_settings", "api_key_chars_ok",
           "check_inventory_settings", "deep_merge", "probe_from_file", "settings_for_all_hosts",
           "settings_for_host", "settings_from_dict", "settings_from_layers"]
settings_for_all_hosts = check_inventory_settings  # its name before the CLI checked at load
