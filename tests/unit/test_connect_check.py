"""A settings mistake shows before pyinfra connects anywhere (issue 56): the README's own command,
``pyinfra inventories/first_host.py deploys/kimi_k26.py --dry``, on the unfilled example and on an
inventory with a typo in a key. The host's address is a TCP listener of this test: a connection
attempt (an SSH handshake begun) would reach it, and the test fails if one does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# They start processes (pyinfra, specfleet, the stand-in hub): the full suite, not the fast lane.
pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
PYINFRA = [sys.executable, "-m", "pyinfra"]


@pytest.fixture
def listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        s.settimeout(0.5)
        yield s


def connections(s: socket.socket) -> int:
    n = 0
    try:
        while True:
            conn, _ = s.accept()
            conn.close()
            n += 1
    except OSError:
        return n


def pyinfra(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECFLEET_")}
    return subprocess.run([*PYINFRA, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env)


def test_the_unfilled_example_names_its_placeholders_and_connects_nowhere(listener):
    port = listener.getsockname()[1]
    res = pyinfra("inventories/first_host.py", "deploys/kimi_k26.py", "--dry",
                  "--ssh-port", str(port))
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "'ssh_hostname' is still the placeholder '<address of the GPU host>'" in out, out
    assert "'target.revision' is still the placeholder" in out
    assert "Could not resolve hostname" not in out and "Traceback" not in out
    assert connections(listener) == 0


def test_a_typo_in_a_key_shows_before_any_connection(listener, tmp_path):
    port = listener.getsockname()[1]
    inventory = tmp_path / "typo.py"
    inventory.write_text(textwrap.dedent(f"""
        hosts = [("box", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port},
                           "specfleet": {{"sglang": {{"verison": "0.5.11"}}}}}})]
    """))
    res = pyinfra(str(inventory), "deploys/kimi_k26.py", "--dry")
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "sglang.verison" in out and "version" in out, out
    assert "No hosts remaining" not in out and "Traceback" not in out
    assert connections(listener) == 0, "pyinfra connected to a host whose settings are bad"


def test_a_good_host_next_to_a_bad_one_is_still_connected_to(listener, tmp_path):
    """The check refuses the bad host alone (as the deploy's own check did): the good one is
    connected to (its SSH handshake reaches the listener, then fails: no sshd there)."""
    port = listener.getsockname()[1]
    inventory = tmp_path / "two.py"
    inventory.write_text(textwrap.dedent(f"""
        hosts = [("bad", {{"ssh_hostname": "<address>"}}),
                 ("good", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port},
                            "ssh_connect_retries": 0}})]
    """))
    res = pyinfra(str(inventory), "exec", "--", "true")
    out = res.stdout + res.stderr
    assert "[bad]" in out and "'ssh_hostname' is still the placeholder '<address>'" in out, out
    assert connections(listener) >= 1


@pytest.mark.parametrize("deploy", ["kimi_k26.py", "status.py", "weights_only.py"])
def test_pyinfra_outside_the_checkout_says_where_to_run_it(tmp_path, deploy):
    """pyinfra finds operations/ only in the current directory: run from elsewhere, a deploy says
    so and names the checkout, instead of ``ModuleNotFoundError: operations``."""
    res = subprocess.run([*PYINFRA, "@local", str(REPO / "deploys" / deploy), "--dry"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert f"fix: cd {REPO} and run pyinfra from there" in out, out
    assert "ModuleNotFoundError" not in out and "Traceback" not in out


def test_the_config_file_loads_where_no_state_is_in_context():
    """specfleet's own runs (rollout, bench, sweep) exec the checkout's config.py too, with no
    pyinfra state in context: it must load there (they check the settings themselves)."""
    res = subprocess.run([sys.executable, "-c", "import runpy; runpy.run_path('config.py')"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
