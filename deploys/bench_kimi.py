"""The smoke benchmark on every host of an inventory, from the host against its own server.

    pyinfra -y INVENTORY deploys/bench_kimi.py [--data specfleet_bench='{"fetch_to": "/abs/dir"}']
    specfleet bench INVENTORY            (the same, then the fleet's table, slow hosts flagged)

Under the run lock like any run that changes a host (it restarts nothing, but a benchmark during
a deploy measures a server that is restarting). Options, all optional, in the host data key
``specfleet_bench``: ``concurrency`` (list), ``requests``, ``max_tokens``, ``result`` (name
under ``<state_dir>/bench``), ``fetch_to`` (a folder on the control machine for ``<host>.json``).
"""

from pyinfra import host, inventory

from operations import bench, preflight
from operations.venvs import effective_settings
from specfleet.core.settings import settings_for_all_hosts

settings = settings_for_all_hosts(inventory)[host.name]
opts = host.data.get("specfleet_bench") or {}
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
bench.smoke(
    name="Smoke benchmark",
    settings=effective_settings(settings),
    concurrency=opts.get("concurrency", (1, 4)),
    requests=int(opts.get("requests", 0)),
    max_tokens=int(opts.get("max_tokens", 64)),
    result=str(opts.get("result", "latest")),
    fetch_to=opts.get("fetch_to"),
)
preflight.lock(name="Release the run lock", settings=settings, present=False)
