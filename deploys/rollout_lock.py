"""Rollout step, first of all: each host's run lock, taken once and kept until the rollout ends
(specfleet rollout). Its later steps re-enter it; a host another run holds fails here, "busy",
and the rollout never touches it."""

from pyinfra import host

from operations import preflight
from specfleet.core.settings import settings_for_host

preflight.lock(name="Hold the run lock for the whole rollout", settings=settings_for_host(host),
               probe=False, keep=True)
