"""Kimi K2.6 + the DFlash drafter on SGLang, on every host of an inventory.

    pyinfra inventories/ct200.py deploys/kimi_k26.py [--dry] [--diff]

1. preflight (with a per-host run lock), before anything changes;
2. SGLang pinned, compressed-tensors pinned, PR#20547 where missing;
3. the target and drafter weights, pinned and verified;
4. the launch plan and the systemd unit;
5. restart only on change, then the readiness gate.

Every option comes from the host's ``specfleet`` data (``deploys/settings.py``).
"""

from pyinfra import host, inventory
from pyinfra.operations.util import any_changed

from operations import preflight, serving, sglang, weights
from specfleet.core.settings import settings_for_all_hosts

settings = settings_for_all_hosts(inventory)[host.name]

preflight.lock(name="Hold the run lock", settings=settings)
preflight.checks(name="Preflight", settings=settings)

software = sglang.ensure_software(settings)

weights.host_tools(name="Weights tools")
weights.host_token(name="Hugging Face token")
target = weights.model(name=f"Target weights {settings.target.repo_id}", which="target")
drafter = weights.model(name=f"Drafter weights {settings.drafter.repo_id}", which="drafter")

serving.unit(name="SGLang unit from the launch plan", settings=settings)
serving.restart_pending(
    name="Restart for new software or weights",
    settings=settings,
    reason="the software or weights",
    _if=any_changed(*software.values(), target, drafter),
)
serving.service(
    name="SGLang server running, enabled and ready",
    settings=settings,
    running=True,
    enabled=True,
    ready=True,
)

preflight.lock(name="Release the run lock", settings=settings, present=False)
