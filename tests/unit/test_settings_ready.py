"""`specfleet settings` refuses what would stop the deploy, with no connection to any host (issue
56): no pinned revision, an SGLang release the version table was not read from, a secret file
that is not there, an inventory with no hosts; and with --check-access the Hub's own answer for
a gated drafter, before any download (huggingface_hub's auth_check against the stand-in hub,
tests/harness/standin_hub.py, which gates as the Hub does: 401/403 with X-Error-Code GatedRepo)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet.core.tables import sglang_versions as table
from tests.harness.weights_support import StandinHub, make_repo

# They start processes (pyinfra, specfleet, the stand-in hub): the full suite, not the fast lane.
pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
PIN = "0123456789abcdef0123456789abcdef01234567"


def settings_cli(tmp_path: Path, specfleet: dict, *args: str, env: dict | None = None,
                 hosts: str | None = None) -> subprocess.CompletedProcess:
    inventory = tmp_path / "inv.py"
    inventory.write_text(hosts if hosts is not None else
                         f"hosts = [('box', {{'ssh_hostname': '10.0.0.1', 'specfleet': "
                         f"{specfleet!r}}})]\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SPECFLEET_"))}
    return subprocess.run([sys.executable, "-m", "specfleet.cli", "settings", str(inventory),
                           *args], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**base, **(env or {})})


def pinned(**more) -> dict:
    return {"target": {"revision": PIN}, "drafter": {"revision": PIN}, **more}


def test_good_settings_pass(tmp_path):
    res = settings_cli(tmp_path, pinned(sglang={"version": "0.5.11"}))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("data,said", [
    ({"drafter": {"revision": PIN}}, "target.revision is not set"),
    (pinned(sglang={"version": "0.5.99"}),
     "sglang.version 0.5.99 is newer than any release the version table was read from (0.5.23)"),
    (pinned(sglang={"version": "0.5.10"}), "sglang.version 0.5.10 has no DFLASH"),
    (pinned(weights={"token_file": "/nonexistent/hf-token"}),
     "weights.token_file /nonexistent/hf-token does not exist on this machine"),
    (pinned(api_key_file="~/no-such-key-file"), "api_key_file ~/no-such-key-file does not exist"),
])
def test_what_would_stop_the_deploy_is_refused(tmp_path, data, said):
    res = settings_cli(tmp_path, data)
    assert res.returncode == 3 and said in res.stderr, res.stderr
    assert "fix:" in res.stderr and "Traceback" not in res.stderr


def test_every_problem_at_once(tmp_path):
    res = settings_cli(tmp_path, {"sglang": {"version": "0.6.0"}})
    assert res.returncode == 3
    assert "3 problems" in res.stderr and "drafter.revision" in res.stderr


def test_an_inventory_with_no_hosts_is_refused(tmp_path):
    res = settings_cli(tmp_path, {}, hosts="hosts = []\n")
    assert res.returncode == 3 and "has no host" in res.stderr, res.stderr


def test_the_newest_read_release_is_the_newest_the_wheelhouse_downloads():
    from packaging.version import Version

    from tests.harness.releases import WHEELHOUSE

    assert str(max(map(Version, WHEELHOUSE))) == table.NEWEST_READ


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    work = tmp_path_factory.mktemp("hub")
    mirrors = work / "mirrors"
    make_repo(mirrors, "testorg/target", {"config.json": b"{}"})
    make_repo(mirrors, "testorg/drafter", {"config.json": b"{}"})
    h = StandinHub(mirrors, "127.0.0.1", work)
    allowed = hashlib.sha256(b"hf_allowed").hexdigest()
    h.configure(gated={"testorg/drafter": [allowed]})
    h.wait("testorg/target")
    yield h
    h.stop()


def gated(hub) -> dict:
    return pinned(target={"repo_id": "testorg/target", "revision": PIN},
                  drafter={"repo_id": "testorg/drafter", "revision": PIN},
                  weights={"hf_endpoint": hub.url})


def test_check_access_passes_with_a_token_the_hub_lets_in(hub, tmp_path):
    res = settings_cli(tmp_path, gated(hub), "--check-access", env={"HF_TOKEN": "hf_allowed"})
    assert res.returncode == 0, res.stderr
    assert any(re.match(r"GET /api/models/testorg/drafter/auth-check 200 auth", line)
               for line in hub.log_lines())


def test_check_access_says_the_hubs_refusal_before_any_download(hub, tmp_path):
    res = settings_cli(tmp_path, gated(hub), "--check-access", env={"HF_TOKEN": "hf_other"})
    assert res.returncode == 3, res.stderr
    assert "drafter testorg/drafter is gated and the Hub" in res.stderr
    assert "not in the authorized list" in res.stderr  # the Hub's own message
    assert "request access on" in res.stderr
    assert not any("/resolve/" in line for line in hub.log_lines())
    res = settings_cli(tmp_path, gated(hub), "--check-access")
    assert res.returncode == 3 and "give a token" in res.stderr, res.stderr
    # Without --check-access nothing asks the Hub.
    before = len(hub.log_lines())
    assert settings_cli(tmp_path, gated(hub), env={"HF_TOKEN": "hf_other"}).returncode == 0
    assert len(hub.log_lines()) == before
