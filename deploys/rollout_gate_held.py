"""Rollout step with the speed gate on: the readiness gate on each host, WITHOUT keeping its
state as the rollback point yet (specfleet rollout --speed-gate F). The rollout
benchmarks the hosts that pass, then keeps the point with ``rollout_checkpoint.py`` only on those
that kept their speed; a host that lost it rolls back to its earlier point.

A serving group is gated on its rank 0 (its other ranks answer health checks whatever their
state), as in ``rollout_gate.py``."""

from pyinfra import host

from operations import preflight, serving
from operations.pyinfra_speedups import install as install_speedups
from specfleet.core.settings import settings_for_host

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_for_host(host)
rank0 = settings.group.members[0] if settings.group is not None else host.name
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
if rank0 == host.name:
    serving.ready(name="Readiness gate", settings=settings)
preflight.lock(name="Release the run lock", settings=settings, present=False)
