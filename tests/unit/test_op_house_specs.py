"""operations.serving (``unit``, ``service``), ``preflight.lock``, ``rollback.checkpoint`` and
``rollback.rope``, ``rollback.patch`` against pyinfra-testing fixtures (tests/specs/op_house/<op>/*.yaml): each op's
branches, commands and no-op messages from given fact values, in ms, no host.

These operations take the deploy's ``Settings``: a spec gives them as the settings' own data
(``settings: {}`` is the defaults), made into ``Settings`` as the deploy makes them
(``settings_from_dict``). Two stand-ins, named as such: pyinfra-testing's ``FakeHost`` has no
``log``/``log_styled`` (pyinfra's ``Host`` prints a line with them; here they print nothing), and
the run id and time zone are fixed (``SPECFLEET_RUN_ID``, ``TZ=UTC``) so the commands and
messages that carry them are the same on every machine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pyinfra_testing.operations as pyinfra_testing_ops
from pyinfra_testing.operations import make_operation_tests
from pyinfra_testing.util import FakeHost

from specfleet.core.runlock import RUN_ID_ENV
from specfleet.core.settings import settings_from_dict

SPECS = Path(__file__).parents[1] / "specs" / "op_house"
RUN_ID = "spec-run-0001"
_coerce = pyinfra_testing_ops.coerce_operation_arguments


def _with_settings(op: Any, args: list, kwargs: dict) -> tuple[list, dict]:
    args, kwargs = _coerce(op, args, kwargs)
    if isinstance(kwargs.get("settings"), dict):
        kwargs = {**kwargs, "settings": settings_from_dict(kwargs["settings"], host="testhost")}
    return args, kwargs


def _specs(op_path: str) -> type:
    cls = make_operation_tests("operations", op_path, SPECS / op_path)
    patches = [
        mock.patch.object(pyinfra_testing_ops, "coerce_operation_arguments", _with_settings),
        mock.patch.object(FakeHost, "log", lambda self, *a, **k: None, create=True),
        mock.patch.object(FakeHost, "log_styled", lambda self, *a, **k: None, create=True),
        mock.patch.dict(os.environ, {RUN_ID_ENV: RUN_ID, "TZ": "UTC"}),
    ]

    def set_up(self: Any) -> None:
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        time.tzset()
        self.addCleanup(time.tzset)  # after the environment is back (cleanups run last first)

    cls.setUp = set_up
    return cls


TestServingUnit = _specs("serving.unit")
TestServingService = _specs("serving.service")
TestPreflightLock = _specs("preflight.lock")
TestRollbackCheckpoint = _specs("rollback.checkpoint")
TestRollbackRope = _specs("rollback.rope")
TestRollbackPatch = _specs("rollback.patch")
