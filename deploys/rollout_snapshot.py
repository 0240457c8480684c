"""Rollout step: a rollback point on each host before it is changed (specfleet rollout)."""

from pyinfra import host

from operations import preflight, rollback
from specfleet.core.settings import settings_for_host

settings = settings_for_host(host)
# The run lock, as every run that changes a host holds it (the rollout's run id: its steps are
# one owner).
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
rollback.checkpoint(name="Keep a rollback point")
preflight.lock(name="Release the run lock", settings=settings, present=False)
