"""Rollout step, first of all: each host's run lock, taken once and kept until the rollout ends
(specfleet rollout). Its later steps re-enter it; a host another run holds fails here, "busy",
and the rollout never touches it."""

from pyinfra import host

from operations import preflight
from operations.pyinfra_speedups import install as install_speedups
from specfleet.core.settings import settings_for_host

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

preflight.lock(name="Hold the run lock for the whole rollout", settings=settings_for_host(host),
               probe=False, keep=True)
