"""Rollout step: the readiness gate on each host, then its state kept as the rollback point
(specfleet rollout). A host that fails the gate keeps its earlier point.

A serving group is gated on its rank 0 (its other ranks answer health checks whatever their
state); the others keep their state as the rollback point only once rank 0 passed (pyinfra runs
each operation on every host before the next one)."""

from pyinfra import host, state

from operations import preflight, rollback, serving
from operations.pyinfra_speedups import install as install_speedups
from specfleet.core.settings import settings_for_host

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_for_host(host)
rank0 = settings.group.members[0] if settings.group is not None else host.name
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
if rank0 == host.name:
    serving.ready(name="Readiness gate", settings=settings)
rollback.checkpoint(
    name="Keep the ready state as the rollback point",
    settings=settings,
    _if=lambda: state.inventory.get_host(rank0, default=None) not in state.failed_hosts,
)
preflight.lock(name="Release the run lock", settings=settings, present=False)
