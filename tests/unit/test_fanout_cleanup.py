"""The fan-out runner (specfleet/fleet/fanout.py ``run_prefetch``) cleans the hosts up on every
exit path: an exception, SIGTERM, Ctrl-C; and its keys never touch the control machine's disk.
A fake runner stands in for pyinfra. The fleet test is tests/fleet/test_fanout_fleet.py
(``test_sigterm_to_the_controller_...``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import specfleet.fleet.fanout as ff
from specfleet.core.settings import settings_from_dict
from specfleet.fleet.pyinfra_run import HostStep, StepRun

REPO_ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["h1", "h2", "h3"]
ADDR = {"h1": "10.250.9.11", "h2": "10.250.9.12", "h3": "10.250.9.13"}
SETTINGS = {"target": {"repo_id": "o/m", "revision": "a" * 40},
            "drafter": {"repo_id": "o/d", "revision": "b" * 40}}


@pytest.fixture
def inventory(monkeypatch):
    s = settings_from_dict(SETTINGS)
    monkeypatch.setattr(ff, "load_inventory", lambda inv, only=None: (HOSTS, ADDR, {h: s for h in HOSTS}))
    monkeypatch.chdir(REPO_ROOT)


def step(name: str, hosts, status: str = "changed") -> StepRun:
    return StepRun(name, list(hosts), 0, 0.1, {h: HostStep(status) for h in hosts})


def test_prefetch_cleans_up_when_the_run_raises(inventory):
    calls = []

    def runner(inventory, deploy, hosts, name):
        calls.append(Path(deploy).name)
        if Path(deploy).name == ff.PREFETCH_DEPLOY:
            raise RuntimeError("pyinfra broke")
        return step(name, hosts)

    with pytest.raises(RuntimeError, match="pyinfra broke"):
        ff.run_prefetch("inv.py", HOSTS, runner=runner)
    assert calls == [ff.PREFETCH_DEPLOY, ff.CLEANUP_DEPLOY]
    assert os.environ.get("SPECFLEET_FANOUT_PLAN") is None


def test_prefetch_cleans_up_on_ctrl_c(inventory):
    calls = []

    def runner(inventory, deploy, hosts, name):
        calls.append(Path(deploy).name)
        if Path(deploy).name == ff.PREFETCH_DEPLOY:
            raise KeyboardInterrupt
        return step(name, hosts)

    with pytest.raises(KeyboardInterrupt):
        ff.run_prefetch("inv.py", HOSTS, runner=runner)
    assert calls == [ff.PREFETCH_DEPLOY, ff.CLEANUP_DEPLOY]


def test_prefetch_keys_never_touch_the_disk(inventory, tmp_path, monkeypatch):
    """The plan with its private keys reaches the deploy in an anonymous in-memory file: no file on the control
    machine holds a key at any time (nothing for a kill -9 to leave behind)."""
    from operations.fanout import load_plan

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    seen: dict = {}

    def runner(inventory, deploy, hosts, name):
        if Path(deploy).name == ff.PREFETCH_DEPLOY:
            seen["plan"] = load_plan()
            seen["files"] = [str(p) for p in tmp_path.rglob("*") if p.is_file()]
            seen["keys"] = [p for p in seen["files"] if b"PRIVATE KEY" in Path(p).read_bytes()]
        return step(name, hosts)

    ff.run_prefetch("inv.py", HOSTS, runner=runner)
    assert "PRIVATE KEY" in seen["plan"]["private_key"]
    assert all("PRIVATE KEY" in seen["plan"]["hosts"][h]["host_private_key"] for h in ("h1", "h2"))
    assert seen["keys"] == [] and seen["files"] == []
    assert list(tmp_path.iterdir()) == []


def test_prefetch_plan_reaches_the_deploy_in_process(inventory, tmp_path):
    """The prefetch deploy runs in the controller's process (pyinfra's API) and reads the plan
    from the in-memory file while the step runs."""
    from operations.fanout import load_plan

    seen = {}

    def runner(inventory, deploy, hosts, name):
        if Path(deploy).name == ff.PREFETCH_DEPLOY:
            p = load_plan()
            seen["plan"] = (p["rollout_id"], "PRIVATE KEY" in p["private_key"])
        return step(name, hosts)

    ff.run_prefetch("inv.py", HOSTS, runner=runner)
    assert seen["plan"][1] is True, seen


SIGTERM_SCRIPT = r"""
import os, signal, sys, threading, time
from pathlib import Path
import specfleet.fleet.fanout as ff
from specfleet.core.settings import settings_from_dict
from specfleet.fleet.pyinfra_run import HostStep, StepRun

log, gevent = Path(sys.argv[1]), sys.argv[2] == "gevent"
s = settings_from_dict({"target": {"repo_id": "o/m", "revision": "a" * 40},
                        "drafter": {"repo_id": "o/d", "revision": "b" * 40}})
hosts = ["h1", "h2", "h3"]

def load_inventory(inv, only=None):
    if gevent:  # as the real one: pyinfra_cli's import monkey-patches everything with gevent
        import pyinfra_cli  # noqa: F401
    return hosts, {h: f"10.0.0.{i}" for i, h in enumerate(hosts)}, {h: s for h in hosts}

ff.load_inventory = load_inventory

def say(text):
    with log.open("a") as f:
        f.write(text + "\n")

def runner(inventory, deploy, hosts, name):
    say(Path(deploy).name)
    if Path(deploy).name == ff.PREFETCH_DEPLOY:
        # As a step in the controller's process: busy when the signal comes.
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        try:
            for _ in range(30):
                time.sleep(0.1)
        except BaseException:  # the signal raised here (plain Python)...
            say("child ended")
            raise
        say("child ended")  # ...or the handler recorded it, and the step returns (gevent)
    else:
        os.kill(os.getpid(), signal.SIGTERM)  # a second one, during the cleanup: it goes on
        time.sleep(0.2)
        say("cleanup finished")
    return StepRun(name, list(hosts), 0, 0.1, {h: HostStep("ok") for h in hosts})

try:
    ff.run_prefetch("inv.py", hosts, runner=runner)
except BaseException as e:
    say(f"raised {type(e).__name__} {getattr(e, 'signum', None)}")
    say(f"default handler back: {signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}")
    sys.exit(7)
"""


@pytest.mark.local
@pytest.mark.parametrize("mode", ["plain", "gevent"])
def test_prefetch_cleans_up_on_sigterm(tmp_path, mode):
    """SIGTERM to the controller while pyinfra runs: the cleanup deploy runs (a second SIGTERM
    does not cut it short), then the run ends with an exception that says which signal, and the
    signal's own handler is put back. Also under pyinfra's gevent monkey-patching, as in the
    real controller."""
    log = tmp_path / "log"
    r = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT, str(log), mode], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120)
    lines = log.read_text().splitlines() if log.exists() else []
    assert r.returncode == 7, (r.returncode, lines, r.stderr[-3000:])
    assert lines == [ff.PREFETCH_DEPLOY, "child ended", ff.CLEANUP_DEPLOY, "cleanup finished",
                     f"raised Interrupted {int(signal.SIGTERM)}", "default handler back: True"]
    assert "cleaning up" in r.stderr


def test_cli_exits_128_plus_the_signal(inventory, monkeypatch, capsys):
    def boom(*a, **kw):
        raise ff.Interrupted(signal.SIGTERM)

    monkeypatch.setattr(ff, "run_prefetch", boom)
    from specfleet.fleet.pyinfra_run import PyinfraOptions

    assert ff.run_fanout("inv.py", PyinfraOptions()) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in capsys.readouterr().err


def test_serve_lifetime_is_short_and_a_setting():
    from operations.fanout import SERVE_MAX_SECONDS
    from specfleet.core.errors import SpecfleetError

    assert SERVE_MAX_SECONDS <= 3 * 3600
    s = settings_from_dict(SETTINGS)
    assert s.rollout.fanout_serve_hours * 3600 == SERVE_MAX_SECONDS
    assert settings_from_dict({**SETTINGS, "rollout": {"fanout_serve_hours": 6}}
                              ).rollout.fanout_serve_hours == 6
    for bad in (0, -1, float("inf")):
        with pytest.raises(SpecfleetError, match="fanout_serve_hours"):
            settings_from_dict({**SETTINGS, "rollout": {"fanout_serve_hours": bad}})
