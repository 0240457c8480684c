"""Rollout step: a rollback point on each host before it is changed (specfleet rollout)."""

from pyinfra import host

from operations import preflight, rollback
from operations.pyinfra_speedups import install as install_speedups
from specfleet.core.settings import settings_for_host

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_for_host(host)
# The run lock, as every run that changes a host holds it (the rollout's run id: its steps are
# one owner).
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
# Only where there is none yet: a point is replaced only by a state that passed its gate
# (deploys/rollout_gate.py), so an interrupted rollout never loses the last known-good one.
rollback.checkpoint(name="Keep a rollback point", settings=settings, replace=False)
preflight.lock(name="Release the run lock", settings=settings, present=False)
