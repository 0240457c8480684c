"""The stand-in server's multi-node start-up, on the loopback (it must behave as SGLang does for
the group tests to mean anything): rank 0 serves HTTP only once every rank joined its rendezvous;
a rank >= 1 serves only SGLang's dummy health server; a rank that cannot join, and a rank 0 whose
ranks never come, exit 1 at the distributed timeout with torch's message."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

STANDIN = Path(__file__).parents[1] / "harness" / "standin_sglang_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(rank: int, nnodes: int, http: int, rdv: int, timeout: int = 5) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(STANDIN), "--model-path", "/m", "--port", str(http),
         "--nnodes", str(nnodes), "--node-rank", str(rank),
         "--dist-init-addr", f"127.0.0.1:{rdv}", "--dist-timeout", str(timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait_for(port: int, path: str, seconds: float = 10) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        code = status(port, path)
        if code is not None:
            return code
        time.sleep(0.1)
    return None


@pytest.mark.local
def test_rank0_serves_only_after_every_rank_joined_and_rank1_is_a_dummy():
    h0, h1, rdv = free_port(), free_port(), free_port()
    r0 = start(0, 2, h0, rdv, timeout=20)
    try:
        time.sleep(1.0)
        assert r0.poll() is None
        assert status(h0, "/health") is None  # no HTTP before the group is complete
        r1 = start(1, 2, h1, rdv, timeout=20)
        try:
            assert wait_for(h0, "/get_model_info") == 200
            assert wait_for(h1, "/health_generate") == 200
            assert status(h1, "/get_model_info") == 404
            # A lost rank ends rank 0, as an NCCL error would.
            r1.kill()
            r0.wait(timeout=10)
            assert r0.returncode == 1
            assert "a peer's connection ended" in r0.stdout.read()
        finally:
            r1.kill()
    finally:
        r0.kill()


@pytest.mark.local
def test_rank0_times_out_naming_the_missing_ranks():
    r0 = start(0, 3, free_port(), free_port(), timeout=2)
    out, _ = r0.communicate(timeout=15)
    assert r0.returncode == 1
    assert ("Timed out after 2 seconds waiting for clients. 1/3 clients joined. "
            "(missing node ranks: [1, 2])") in out  # fmt: skip


@pytest.mark.local
def test_rank_that_cannot_reach_rank0_exits_at_the_timeout():
    rdv = free_port()
    r1 = start(1, 2, free_port(), rdv, timeout=2)
    out, _ = r1.communicate(timeout=15)
    assert r1.returncode == 1
    assert (f"DistNetworkError: The client socket has timed out after 2s while trying to connect "
            f"to (127.0.0.1, {rdv})") in out  # fmt: skip
