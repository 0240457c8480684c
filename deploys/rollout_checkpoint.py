"""Rollout step with the speed gate on: keep each host's state as its rollback point, once it
passed the readiness gate (``rollout_gate_held.py``) and the speed gate."""

from pyinfra import host

from operations import preflight, rollback
from operations.pyinfra_speedups import install as install_speedups
from specfleet.core.settings import settings_for_host

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_for_host(host)
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
rollback.checkpoint(name="Keep the ready, fast state as the rollback point", settings=settings)
preflight.lock(name="Release the run lock", settings=settings, present=False)
