"""One point of ``specfleet sweep``: the normal deploy with that point's ``plan`` overrides (the
sweep passes them as pyinfra ``--data specfleet='{"plan": {...}}'``, which the settings merge
over the inventory's), its readiness gate, then the smoke benchmark of the server it started.

The sweep passes ``specfleet_sweep`` (``allow_serving``) and ``specfleet_bench`` (as
``deploys/bench_kimi.py`` takes it) in the host data.
"""

from pyinfra import host

from operations import bench
from operations.kimi_k26 import kimi_k26
from operations.pyinfra_speedups import install as install_speedups
from operations.util import settings_in_play

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_in_play()
if settings is not None:
    sweep = host.data.get("specfleet_sweep") or {}
    bench.not_serving(name="Not serving (a sweep restarts the server)", settings=settings,
                      allow=bool(sweep.get("allow_serving")))
    if settings.plan.ddtree_budget is not None:
        bench.ddtree_available(name="DDTree in the installed SGLang (a budget axis)",
                               settings=settings)
    kimi_k26(settings=settings)
    bench.locked_smoke(settings, host.data.get("specfleet_bench"), result="sweep")
