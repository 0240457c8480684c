"""The drills' deploy under the per-host run lock, as deploys/kimi_k26.py holds it: the lock
(operations.preflight.lock), tests/deploys/rollout_deploy.py's steps, the release. Two controllers
running this on one host at once: one changes it, the other is refused as busy."""

from pyinfra import host, local

from operations import preflight
from specfleet.core.settings import settings_for_host

settings = settings_for_host(host)
preflight.lock(name="Hold the run lock", settings=settings, probe=False)
local.include("tests/deploys/rollout_deploy.py")
preflight.lock(name="Release the run lock", settings=settings, present=False)
