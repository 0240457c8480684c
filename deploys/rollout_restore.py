"""Rollout step: return a host to its rollback point, restart onto it, and gate it.

Weights are never rolled back: the old revision may not fit beside the new one.
"""

from pyinfra.operations.util import any_changed

from operations import rollback, server

pins = rollback.pins(name="Rollback: package pins")
patch = rollback.patch(name="Rollback: PR#20547 patch state")
files = rollback.files(name="Rollback: unit, env and secret files")
server.restart_pending(
    name="Rollback: restart for the old software",
    reason="the rollback",
    _if=any_changed(pins, patch),
)
server.service(name="Rollback: restart onto the kept unit", running=True, enabled=True)
server.ready(name="Readiness gate after the rollback")
