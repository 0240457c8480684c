"""The fast lane's guard (tests/unit/conftest.py), run on a test file of its own with pytest's
``pytester``: an unmarked test that starts a process or opens a zip fails, with the fix; a test
marked ``local`` may; the lane deselects ``local`` and says how many tests it ran."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
TESTS = '''
import os, subprocess, zipfile
import pytest

def test_spawns():
    subprocess.run(["true"], check=True)

def test_spawn_swallowed():
    try:
        subprocess.run(["true"])
    except BaseException:
        pass

def test_opens_a_zip(tmp_path):
    path = tmp_path / "x.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a", "b")

def test_forks():
    os.system("true")

def test_pure():
    assert sum(range(4)) == 6

@pytest.mark.local
def test_marked_local():
    subprocess.run(["true"], check=True)
'''


@pytest.mark.local  # it runs a pytest whose local test starts a process
def test_the_guard_fails_an_unmarked_test_that_spawns_or_opens_a_zip(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini('[pytest]\nmarkers =\n    local: x\n    fleet: y\n')
    pytester.makepyfile(test_lane=TESTS)
    # The full suite runs every test as it is: the guard is the lane's.
    full = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    full.assert_outcomes(passed=6)
    lane = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-m", "not local and not fleet")
    lane.assert_outcomes(passed=1, failed=4, deselected=1)
    text = lane.stdout.str()
    assert "test_spawns starts a process (subprocess.Popen) outside the `local` mark" in text
    assert "test_spawn_swallowed starts a process" in text  # swallowed, still failed
    assert "test_opens_a_zip opens a wheel or zip file" in text
    assert "test_forks starts a process (os.system)" in text
    assert "mark it @pytest.mark.local" in text
    assert "fast lane: 5 unit tests ran; 1 marked local" in lane.stdout.str()
