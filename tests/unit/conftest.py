"""The unit tests' fast lane, defined by exclusion: every unit test not marked ``local``.

    .ci/fast        (= pytest tests/unit -m "not local and not fleet")

A unit test that starts a process (``subprocess``, ``os.fork``/``posix_spawn``/``system``,
``multiprocessing``) or opens a wheel or any other zip file is marked ``local``
(``@pytest.mark.local``, or ``pytestmark`` for a file of them): it runs in the full suite
(``.ci/test``), not in the lane. The guard below fails an unmarked test that does either, in its
setup (fixtures included), call or teardown, so the lane stays fast as tests are added: mark the
test ``local``, or test the same thing without the process.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from gevent import monkey

LOCAL = "local"
FIX = ("mark it @pytest.mark.local (it leaves the fast lane), or test the same thing without "
       "the process or the wheel")
_SPAWNERS = [(os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system",
                                     "execv", "execve", "execvp", "execvpe")
             if hasattr(os, name)]


def _popen_classes() -> list[type]:
    """``subprocess.Popen`` as it is now (gevent's, under tests/conftest.py's patching) and the
    standard library's, which modules imported before the patching still hold."""
    classes = [subprocess.Popen, monkey.get_original("subprocess", "Popen")]
    return list(dict.fromkeys(classes))


class _Guard:
    """Refuses processes and zip files while one test (not ``local``) runs."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.seen: list[str] = []
        self.saved: list[tuple[Any, str, Any]] = []

    def refuse(self, what: str) -> Callable[..., Any]:
        def refused(*_a: Any, **_k: Any) -> Any:
            self.seen.append(what)
            pytest.fail(f"{self.nodeid} {what} outside the `local` mark: {FIX}", pytrace=True)

        return refused

    def _swap(self, owner: Any, name: str, value: Any) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def __enter__(self) -> _Guard:
        for cls in _popen_classes():
            self._swap(cls, "__init__", self.refuse("starts a process (subprocess.Popen)"))
        for owner, name in _SPAWNERS:
            self._swap(owner, name, self.refuse(f"starts a process (os.{name})"))
        self._swap(multiprocessing.process.BaseProcess, "start",
                   self.refuse("starts a process (multiprocessing)"))
        self._swap(zipfile.ZipFile, "__init__", self._zip_guard(zipfile.ZipFile.__init__))
        return self

    def _zip_guard(self, original: Callable[..., None]) -> Callable[..., None]:
        refused = self.refuse("opens a wheel or zip file")

        def init(zf: zipfile.ZipFile, file: Any, *a: Any, **k: Any) -> None:
            # importlib.metadata looks for a zip at each sys.path entry (python3XX.zip): a
            # path read that is no file is no wheel, and ZipFile says so as it always does.
            mode = a[0] if a else k.get("mode", "r")
            if mode == "r" and isinstance(file, (str, os.PathLike)) and not os.path.isfile(file):
                return original(zf, file, *a, **k)
            refused()

        return init

    def __exit__(self, *_exc: Any) -> None:
        for owner, name, value in reversed(self.saved):
            setattr(owner, name, value)
        self.saved.clear()


_GUARDS = pytest.StashKey[_Guard]()


def in_fast_lane(config: Any) -> bool:
    return "not local" in (config.getoption("markexpr") or "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # The guard keeps the lane honest where the lane runs (-m "not local ..."): the full suite
    # runs the local tests anyway, so an unmarked one fails the lane, not .ci/test.
    if (item.get_closest_marker(LOCAL) or item.get_closest_marker("fleet")
            or not in_fast_lane(item.config)):
        yield
        return
    with _Guard(item.nodeid) as guard:
        item.stash[_GUARDS] = guard
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A refusal the code under test caught and went on from still fails the test."""
    outcome = yield
    report = outcome.get_result()
    guard = item.stash.get(_GUARDS, None)
    if guard is not None and guard.seen and report.passed and report.when == "call":
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} {guard.seen[0]} outside the `local` mark: {FIX}"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """The lane says how many tests it ran (and how many ``local`` ones it left out)."""
    if not in_fast_lane(config):
        return
    stats = terminalreporter.stats
    ran = sum(len(stats.get(k, [])) for k in ("passed", "failed", "error", "skipped", "xfailed",
                                               "xpassed"))
    left = len(stats.get("deselected", []))
    terminalreporter.write_line(f"fast lane: {ran} unit tests ran; {left} marked local (or "
                                "fleet) left to the full suite")
