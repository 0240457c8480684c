"""Rollout step: the readiness gate on each host, then its state kept as the rollback point
(python -m specfleet.fleet.rollout). A host that fails the gate keeps its earlier point."""

from operations import rollback, serving

serving.ready(name="Readiness gate")
rollback.checkpoint(name="Keep the ready state as the rollback point")
