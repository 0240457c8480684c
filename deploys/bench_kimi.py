"""The smoke benchmark on every host of an inventory, from the host against its own server.

    pyinfra -y INVENTORY deploys/bench_kimi.py [--data specfleet_bench='{"fetch_to": "/abs/dir"}']
    specfleet bench INVENTORY            (the same, then the fleet's table, slow hosts flagged)

Under the run lock like any run that changes a host (it restarts nothing, but a benchmark during
a deploy measures a server that is restarting). Options, all optional, in the host data key
``specfleet_bench``: ``concurrency`` (list), ``requests``, ``max_tokens``, ``result`` (name
under ``<state_dir>/bench``), ``fetch_to`` (a folder on the control machine for ``<host>.json``).
"""

from pyinfra import host

from operations import bench
from operations.pyinfra_speedups import install as install_speedups
from operations.util import settings_in_play

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_in_play()
if settings is not None:
    bench.locked_smoke(settings, host.data.get("specfleet_bench"), result="latest")
