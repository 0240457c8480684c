"""Kimi K2.6 + the DFlash drafter on SGLang, on every host of an inventory.

    pyinfra inventories/ct200.py deploys/kimi_k26.py [--dry] [--diff]

The steps are ``operations.kimi_k26.kimi_k26``: preflight under a per-host run lock, SGLang and
compressed-tensors pinned, PR#20547 where missing, the weights, the unit from the launch plan,
restart only on change, the readiness gate. Every option comes from the host's ``specfleet`` data
(``specfleet/core/settings.py``).
"""

from pyinfra import host, inventory

from operations.kimi_k26 import kimi_k26
from specfleet.core.settings import settings_for_all_hosts

kimi_k26(settings=settings_for_all_hosts(inventory)[host.name])
