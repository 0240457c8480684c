"""Rollout step: a rollback point on each host before it is changed (specfleet rollout)."""

from operations import rollback

rollback.checkpoint(name="Keep a rollback point")
