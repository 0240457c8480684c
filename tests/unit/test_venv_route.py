"""The ``venv`` setting's route from the loaded settings to the unit's ``ExecStart``: every
function it passes through, traced (one that reads ``settings.venv``, or is handed the venv's
path as an argument). One home per piece of knowledge keeps the route short: at most 5.
"""

from __future__ import annotations

import sys

from specfleet.core import unit
from specfleet.core.settings import settings_from_dict
from tests.unit.test_server_render import _facts

VENV = "/opt/venv-route-sentinel"
PROJECT = ("specfleet", "operations", "facts")


def route(data: dict) -> list[str]:
    """The project functions ``VENV`` passes through from the loaded settings to the unit's
    ``ExecStart``."""
    seen: list[str] = []

    def note(frame, event, _arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PROJECT):
            return
        code = frame.f_code
        args = [frame.f_locals.get(n) for n in code.co_varnames[: code.co_argcount]]
        name = f"{module}.{code.co_qualname}"
        reads = any(getattr(a, "venv", None) == VENV for a in args if a is not None
                    and type(a).__name__ == "Settings") and "venv" in code.co_names  # fmt: skip
        if (reads or VENV in [a for a in args if isinstance(a, str)]) and name not in seen:
            seen.append(name)

    s = settings_from_dict(data)  # loaded (and checked) before the route starts
    sys.setprofile(note)
    try:
        facts = {**_facts(), unit.DRAFTER_CONFIG: {"block_size": 8}}
        current = unit.plan_from_facts(s, facts, "h1")
        ctx = unit.unit_context(current.argv, current.env, s, current.build)
    finally:
        sys.setprofile(None)
    assert ctx["exec_start"].startswith(f"{VENV}/bin/python ")
    return seen


def test_the_venv_reaches_execstart_through_at_most_five_functions():
    data = {"venv": VENV, "target": {"repo_id": "tests/tiny-target", "revision": "a" * 40},
            "drafter": {"repo_id": "z-lab/Kimi-K2.6-DFlash", "revision": "a" * 40}}
    found = route(data)
    print("\n".join(found))
    assert found, "the trace saw nothing: it cannot be measuring the route"
    assert "specfleet.core.layout.venv_python" in found
    assert len(found) <= 5, found
