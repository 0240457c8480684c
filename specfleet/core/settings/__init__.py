"""One typed settings object for every option a specfleet deploy takes: ``schema`` (the models
and each value's checks), ``checks`` (the error text, checks across keys), ``layers`` (merge)."""

from specfleet.core.errors import SettingsError
from specfleet.core.settings.layers import (
    allow_test_settings,
    check_inventory_settings,
    deep_merge,
    settings_for_host,
    settings_from_dict,
    settings_from_layers,
)
from specfleet.core.settings.schema import (
    DATA_KEY,
    TEST_SETTINGS_ENV,
    MetricsOptions,
    ModelSource,
    PatchSource,
    PlanOverrides,
    RemovalOptions,
    RolloutOptions,
    ServingGroup,
    Settings,
    SGLangSource,
    WatchdogOptions,
    WeightsOptions,
)

# The name deploys and tests used before the CLI checked the inventory at load.
settings_for_all_hosts = check_inventory_settings

__all__ = [
    "DATA_KEY", "TEST_SETTINGS_ENV", "MetricsOptions", "ModelSource", "PatchSource",
    "PlanOverrides", "RemovalOptions", "RolloutOptions", "SGLangSource", "ServingGroup",
    "Settings", "SettingsError", "WatchdogOptions", "WeightsOptions", "allow_test_settings",
    "check_inventory_settings", "deep_merge", "settings_for_all_hosts", "settings_for_host",
    "settings_from_dict", "settings_from_layers",
]
