"""After a fan-out prefetch in which some host failed: stop every fan-out sshd and pull, and
remove keys, known_hosts and jobs on every host (specfleet/fleet/fanout.py runs it)."""

from pyinfra import host

from operations import fanout, preflight
from operations.pyinfra_speedups import install as install_speedups
from specfleet.core.settings import settings_for_host

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_for_host(host)
state_dir = settings.state_dir
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
fanout.serve(name="Stop serving weights", present=False, state_dir=state_dir)
fanout.cleanup(name="Remove fan-out keys and jobs", state_dir=state_dir)
preflight.lock(name="Release the run lock", settings=settings, present=False)
