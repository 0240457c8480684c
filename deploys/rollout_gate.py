"""Rollout step: the readiness gate on each host, then its state kept as the rollback point
(python -m specfleet.fleet.rollout). A host that fails the gate keeps its earlier point."""

from pyinfra import host

from operations import preflight, rollback, serving
from specfleet.core.settings import settings_for_host

settings = settings_for_host(host)
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
serving.ready(name="Readiness gate")
rollback.checkpoint(name="Keep the ready state as the rollback point")
preflight.lock(name="Release the run lock", settings=settings, present=False)
