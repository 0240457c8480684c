"""One point of ``specfleet sweep``: the normal deploy with that point's ``plan`` overrides (the
sweep passes them as pyinfra ``--data specfleet='{"plan": {...}}'``, which the settings merge
over the inventory's), its readiness gate, then the smoke benchmark of the server it started.

The sweep passes ``specfleet_sweep`` (``allow_serving``) and ``specfleet_bench`` (as
``deploys/bench_kimi.py`` takes it) in the host data.
"""

from pyinfra import host, inventory

from operations import bench, preflight
from operations.kimi_k26 import kimi_k26
from operations.venvs import effective_settings
from specfleet.core.settings import settings_for_all_hosts

settings = settings_for_all_hosts(inventory)[host.name]
sweep = host.data.get("specfleet_sweep") or {}
opts = host.data.get("specfleet_bench") or {}
bench.not_serving(name="Not serving (a sweep restarts the server)", settings=settings,
                  allow=bool(sweep.get("allow_serving")))
kimi_k26(settings=settings)
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
bench.smoke(
    name="Smoke benchmark",
    settings=effective_settings(settings),
    concurrency=opts.get("concurrency", (1, 4)),
    requests=int(opts.get("requests", 0)),
    max_tokens=int(opts.get("max_tokens", 64)),
    result=str(opts.get("result", "sweep")),
    fetch_to=opts.get("fetch_to"),
)
preflight.lock(name="Release the run lock", settings=settings, present=False)
