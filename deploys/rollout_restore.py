"""Rollout step: return a host to its rollback point, restart onto it, and gate it.

A host that had no server unit when the point was taken goes back to having none. Weights are
never rolled back: the old revision may not fit beside the new one.
"""

from pyinfra import host
from pyinfra.operations.util import any_changed

from operations import preflight, rollback, serving
from operations.pyinfra_speedups import install as install_speedups
from specfleet.core.settings import settings_for_host

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_for_host(host)
# The point does not change during the rollback, so reading it while preparing is safe.
kept = rollback.rollback_state(settings)["saved"]

preflight.lock(name="Hold the run lock", settings=settings, probe=False)
pins = rollback.pins(name="Rollback: package pins", settings=settings)
patch = rollback.patch(name="Rollback: PR#20547 patch state", settings=settings)
rope = rollback.rope(name="Rollback: drafter RoPE patch state", settings=settings)
if kept is not None and kept["unit"] is None:
    serving.unit(name="Rollback: no server unit before, none now", settings=settings,
                present=False)
else:
    rollback.files(name="Rollback: unit, env and secret files", settings=settings)
    serving.restart_pending(
        name="Rollback: restart for the old software",
        settings=settings,
        reason="the rollback",
        _if=any_changed(pins, patch, rope),
    )
    serving.service(name="Rollback: restart onto the kept unit", settings=settings,
                   running=True, enabled=True)
    serving.ready(name="Readiness gate after the rollback", settings=settings)
preflight.lock(name="Release the run lock", settings=settings, present=False)
