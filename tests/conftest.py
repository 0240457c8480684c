"""Shared pytest fixtures: a real fleet of Debian hosts (tests.fleet).

- ``fleet`` (session): three booted hosts of different profiles, shared by all tests.
  h1: h200x2 GPUs, 64G models disk; h2: a second GPU profile (593G, CT200's free space);
  h3: no GPU, 8G. Treat it as shared: do not break its hosts; put per-test state under /tmp or a
  per-test directory, or boot your own with ``make_fleet``.
- ``make_fleet(name, specs)``: boots a fleet of your own; all are torn down at session end.

Fleet names get the pytest process id appended, so concurrent pytest runs on one machine never
tear down each other's fleets.
"""

from __future__ import annotations

# The fleet controllers run hosts in gevent greenlets, and their entry point patches the process
# first (``specfleet.cli.gevent_patched``), as pyinfra's own CLI does; importing them patches
# nothing. The tests drive the controllers in this process, so the harness patches it here, once,
# before any test module is imported: the same process for every test, in any order.
from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import freezegun  # noqa: E402
import pytest  # noqa: E402

# pyinfra-testing's fact tests freeze time, and freezegun then reads every attribute of every
# module loaded; transformers (imported by test_dflash_rope.py, as SGLang 0.5.11 reads a config)
# imports torch-only models lazily on such a read, and fails without torch.
freezegun.configure(extend_ignore_list=["transformers"])

from tests.harness import Fleet, HostSpec  # noqa: E402
from tests.harness.core import default_specs  # noqa: E402


def _session_name(name: str) -> str:
    return f"{name[:20]}-{os.getpid()}"


@pytest.fixture(scope="session")
def _fleets() -> Iterator[list[Fleet]]:
    booted: list[Fleet] = []
    yield booted
    for f in booted:
        f.down()


@pytest.fixture(scope="session")
def make_fleet(_fleets):
    """``make_fleet(name, [HostSpec, ...]) -> Fleet``, torn down at the end of the session."""

    def make(name: str, specs: list[HostSpec], **kw) -> Fleet:
        f = Fleet.up(_session_name(name), specs, owner_pid=os.getpid(), **kw)
        _fleets.append(f)
        return f

    return make


@pytest.fixture(scope="session")
def fleet(make_fleet) -> Fleet:
    """Three real hosts: h1 (h200x2, 64G), h2 (another GPU profile, 593G), h3 (nogpu, 8G)."""
    return make_fleet("fleet", default_specs())


def pytest_collection_modifyitems(config, items):
    """Every test under tests/fleet/ boots or uses real hosts: marked ``fleet`` (root needed), so
    ``pytest -m "not fleet"`` runs the rest without root."""
    for item in items:
        if "fleet" in item.path.relative_to(config.rootpath).parts[:2]:
            item.add_marker(pytest.mark.fleet)
