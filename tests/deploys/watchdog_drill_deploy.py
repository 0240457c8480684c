"""bench/drills/hostile.py (relay-flood): the drills' deploy (tests/deploys/rollout_deploy.py) and
the server's health watchdog with its /metrics relay, as deploys/kimi_k26.py adds it."""

from pyinfra import host, local

from operations import watchdog
from specfleet.core.settings import settings_for_host

settings = settings_for_host(host)

local.include("tests/deploys/rollout_deploy.py")
watchdog.service(name="Health watchdog and metrics relay", settings=settings)
