"""``specfleet sweep`` and ``specfleet bench`` check that every host answers before their first
point (issue 56): against a host that does not answer they stop in seconds with one line naming
it, exit 1 (a host unreachable, as --help says), and neither deploy nor restore anything (before,
a sweep tried every point and a restore, 61 s and 12 tracebacks, and printed "the inventory plan
is back" after "restore FAILED"). The host is 127.0.0.1 on a port nothing listens on: a real
refused connection, through pyinfra's own connector."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# They start processes (pyinfra, specfleet, the stand-in hub): the full suite, not the fast lane.
pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def inventory(tmp_path) -> Path:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: a connection is refused
    inv = tmp_path / "inv.py"
    inv.write_text(f"hosts = [('box', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}}})]\n")
    return inv


def specfleet(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECFLEET_")}
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "specfleet.cli", *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    return res, time.monotonic() - start


def test_sweep_stops_before_its_first_point(inventory, tmp_path):
    out = tmp_path / "sweep"
    res, took = specfleet("sweep", str(inventory), "--host", "box", "--max-minutes", "5",
                          "--out", str(out))
    err = res.stderr
    assert res.returncode == 1, err
    assert "sweep: box is unreachable" in err and "nothing was run or changed" in err, err
    assert "point 1/" not in err and "restore" not in err and "Traceback" not in err
    assert not (out / "state.json").exists()
    assert took < 60


def test_bench_stops_before_it_benchmarks(inventory, tmp_path):
    res, took = specfleet("bench", str(inventory), "--out", str(tmp_path / "bench"))
    err = res.stderr
    assert res.returncode == 1, err
    assert "bench: box is unreachable" in err and "Traceback" not in err, err
    assert not (tmp_path / "bench" / "summary.json").exists()
    assert took < 60
