"""The deploy tests/fleet/test_lock_fleet.py runs with the pyinfra CLI: the run lock around some
work, as every deploy that changes a host holds it.

Host data ``lock_test`` says what happens while the lock is held: ``{"sleep": seconds}`` (work
that takes a while), ``{"fail": True}`` (an operation after preflight that fails the host),
``{"touch": path}`` (a change the test can see: the file exists only if this run held the lock).
"""

from pyinfra import host
from pyinfra.operations import server

from operations import preflight
from specfleet.core.settings import settings_for_host

settings = settings_for_host(host)
opts = host.data.get("lock_test") or {}

preflight.lock(name="Hold the run lock", settings=settings)
if opts.get("sleep"):
    server.shell(name="Work under the lock", commands=[f"sleep {float(opts['sleep']):g}"])
if opts.get("touch"):
    server.shell(name="Change the host", commands=[f"touch {opts['touch']}"])
if opts.get("fail"):
    server.shell(name="Fail after preflight", commands=["echo failing on purpose; exit 3"])
server.shell(name="Last step", commands=["true"])
preflight.lock(name="Release the run lock", settings=settings, present=False)
