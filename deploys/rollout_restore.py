"""Rollout step: return a host to its rollback point, restart onto it, and gate it.

A host that had no server unit when the point was taken goes back to having none. Weights are
never rolled back: the old revision may not fit beside the new one.
"""

from pyinfra import host
from pyinfra.operations.util import any_changed

from deploys.settings import settings_for_host
from operations import rollback, server

settings = settings_for_host(host)
# The point does not change during the rollback, so reading it while preparing is safe.
kept = rollback.rollback_state(settings)["saved"]

pins = rollback.pins(name="Rollback: package pins", settings=settings)
patch = rollback.patch(name="Rollback: PR#20547 patch state", settings=settings)
if kept is not None and kept["unit"] is None:
    server.unit(name="Rollback: no server unit before, none now", settings=settings,
                present=False)
else:
    rollback.files(name="Rollback: unit, env and secret files", settings=settings)
    server.restart_pending(
        name="Rollback: restart for the old software",
        settings=settings,
        reason="the rollback",
        _if=any_changed(pins, patch),
    )
    server.service(name="Rollback: restart onto the kept unit", settings=settings,
                   running=True, enabled=True)
    server.ready(name="Readiness gate after the rollback", settings=settings)
