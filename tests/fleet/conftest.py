"""Fleet tests run deploys with the test-only settings (``launcher`` for the stand-in server,
``sglang.no_deps`` for SGLang without torch). specfleet refuses them unless
``SPECFLEET_ALLOW_TEST_SETTINGS=1``: set here for the whole fleet session, in this process (the
tests load settings themselves) and so in every pyinfra, rollout and fan-out run they start (they
pass on this process's environment)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from specfleet.core.settings import TEST_SETTINGS_ENV


@pytest.fixture(scope="session", autouse=True)
def _allow_test_settings() -> Iterator[None]:
    old = os.environ.get(TEST_SETTINGS_ENV)
    os.environ[TEST_SETTINGS_ENV] = "1"
    yield
    if old is None:
        os.environ.pop(TEST_SETTINGS_ENV, None)
    else:
        os.environ[TEST_SETTINGS_ENV] = old
