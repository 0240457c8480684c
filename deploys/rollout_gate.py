"""Rollout step: the readiness gate on each host (python -m deploys.rollout)."""

from operations import server

server.ready(name="Readiness gate")
