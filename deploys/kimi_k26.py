"""Kimi K2.6 + the DFlash drafter on SGLang, on every host in play of an inventory.

    pyinfra inventories/ct200.py deploys/kimi_k26.py [--dry] [--diff] [--limit HOST]

The steps are ``operations.kimi_k26.kimi_k26``: preflight under a per-host run lock, SGLang and
compressed-tensors pinned, PR#20547 where missing, the weights, the unit from the launch plan,
restart only on change, the readiness gate. Every option comes from the host's ``specfleet`` data
(``specfleet/core/settings/schema.py``); ``present: False`` there removes the deploy instead
(``specfleet remove``). Settings are read for the hosts in play only: a host with bad ones fails
alone, with its error, and the others go on.
"""

try:
    from operations.util import settings_in_play
except ModuleNotFoundError as exc:  # pyinfra puts the current directory on sys.path, not this one
    if exc.name != "operations":
        raise
    raise SystemExit(
        f"specfleet: {__file__} needs the checkout's operations/ and facts/, which pyinfra finds "
        "in the current directory only\n  fix: cd "
        f"{__import__('pathlib').Path(__file__).resolve().parents[1]} and run pyinfra from there"
    ) from None
from operations.kimi_k26 import kimi_k26
from operations.pyinfra_speedups import install as install_speedups

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_in_play()
if settings is not None:
    kimi_k26(settings=settings)
