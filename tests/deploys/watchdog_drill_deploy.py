"""bench/drills/hostile.py (relay-flood): the drills' deploy (tests/deploys/rollout_deploy.py) and
the server's health watchdog with its /metrics relay, as deploys/kimi_k26.py adds it."""

from pyinfra import local

from operations import watchdog

local.include("tests/deploys/rollout_deploy.py")
watchdog.service(name="Health watchdog and metrics relay")
