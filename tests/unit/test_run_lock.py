"""operations.preflight.lock through pyinfra's own API on ``@local`` (no root, seconds): the take
is one command with the probe and the release one more; every exit path releases the lock; the
lease is renewed while the run lives; and the host-side compare-and-swap lets one of many
concurrent takers win.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gevent
import pytest
from pyinfra.api import Config, FunctionCommand, Inventory, State, StringCommand, operation
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from operations import preflight
from specfleet.core.resources import hostside_path
from specfleet.core.settings import settings_from_dict

SCRIPT = str(hostside_path("run_lock.py"))


@operation()
def fail_here():
    yield StringCommand("echo failing on purpose; exit 3")


@operation()
def blow_up():
    def boom(state, host):
        raise KeyboardInterrupt  # as Ctrl-C, or any error that ends the run

    yield FunctionCommand(boom, (), {})


@operation()
def wait_a_while(seconds: float):
    def wait(state, host):
        gevent.sleep(seconds)
        return True

    yield FunctionCommand(wait, (), {})


@pytest.fixture
def local(tmp_path, monkeypatch):
    """``make(*ops)``: a State on @local whose lock lives under ``tmp_path``; returns
    ``(state, host, settings, commands)`` (``commands``: every shell command run, in order)."""
    states = []
    monkeypatch.delenv("SPECFLEET_RUN_ID", raising=False)

    def make():
        inventory = Inventory((["@local"], {}))
        # As `pyinfra -y`: no change detection before the run.
        state = State(inventory=inventory, config=Config(), check_for_changes=False)
        connect_all(state)
        states.append(state)
        host = state.inventory.get_host("@local")
        commands: list[str] = []
        original = host.connector.run_shell_command

        def counting(command, *args, **kwargs):
            commands.append(str(command))
            return original(command, *args, **kwargs)

        host.connector.run_shell_command = counting
        settings = settings_from_dict({"state_dir": str(tmp_path / "state"),
                                       "models_root": str(tmp_path / "models")}, host="local")
        return state, host, settings, commands

    yield make
    for state in states:
        disconnect_all(state)


def lock_file(settings) -> Path:
    return Path(preflight.lock_path(settings))


@pytest.mark.local
def test_converged_run_takes_and_releases_in_two_commands(local):
    state, host, s, commands = local()
    add_op(state, preflight.lock, settings=s)
    add_op(state, preflight.lock, settings=s, present=False)
    run_ops(state)
    assert len(commands) == 2, commands
    assert not lock_file(s).exists()
    disconnect_all(state)
    assert len(commands) == 2  # nothing left to release at exit


@pytest.mark.local
def test_a_host_failing_after_the_take_releases_its_lock(local):
    state, host, s, commands = local()
    add_op(state, preflight.lock, settings=s)
    add_op(state, fail_here)
    add_op(state, preflight.lock, settings=s, present=False)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        run_ops(state)
    assert not lock_file(s).exists()


@pytest.mark.local
def test_a_run_that_ends_in_an_error_releases_its_lock_when_it_disconnects(local):
    state, host, s, commands = local()
    add_op(state, preflight.lock, settings=s)
    add_op(state, blow_up)
    add_op(state, preflight.lock, settings=s, present=False)
    with pytest.raises(KeyboardInterrupt):
        run_ops(state)
    assert lock_file(s).exists()  # the run has not ended yet
    disconnect_all(state)  # what pyinfra's CLI does in a finally
    assert not lock_file(s).exists()


@pytest.mark.local
def test_the_lease_is_renewed_while_the_run_lives(local, monkeypatch):
    monkeypatch.setenv("SPECFLEET_LOCK_LEASE_S", "1")
    state, host, s, commands = local()
    add_op(state, preflight.lock, settings=s)
    add_op(state, wait_a_while, seconds=3)
    seen: list[dict] = []

    @operation()
    def look():
        def read(state, host):
            seen.append({**json.loads(lock_file(s).read_text()), "read_at": time.time()})
            return True

        yield FunctionCommand(read, (), {})

    add_op(state, look)
    add_op(state, preflight.lock, settings=s, present=False)
    run_ops(state)
    (held,) = seen
    # Renewed: a 1 s lease, taken 3 s before it was read, still runs.
    assert held["expires_at"] > held["read_at"] > held["taken_at"] + 2.5
    assert held["renewed_at"] > held["taken_at"] + 2.0
    assert sum(" renew " in c for c in commands) >= 3
    assert held["pid"] == os.getpid() and held["run_id"] == preflight.run_id()
    assert not lock_file(s).exists()


def take(path: Path, owner: dict, lease: float = 60, replace: str = "") -> tuple[str, dict]:
    done = subprocess.run([sys.executable, "-I", "-S", SCRIPT, "take", str(path), str(lease),
                           json.dumps(owner), *([replace] if replace else [])],
                          capture_output=True, text=True, check=True)
    return preflight.parse_lock_output(done.stdout.splitlines())


@pytest.mark.local
def test_of_many_takers_of_a_stale_lock_exactly_one_wins(tmp_path):
    """Each taker judged the same lock dead and asks to replace exactly those bytes: the host's
    compare-and-swap (flock of the folder) lets one through, the others see the winner."""
    path = tmp_path / "state" / "run.lock"
    for round_ in range(5):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"owner": "dead", "pid": 1, "expires_at": time.time() + 60}))
        status, value = take(path, {"run_id": "probe"}, replace="")
        assert status == "held"
        seen = value["fingerprint"]
        procs = [subprocess.Popen(
            [sys.executable, "-I", "-S", SCRIPT, "take", str(path), "60",
             json.dumps({"run_id": f"r{round_}-{i}", "token": str(i)}), seen],
            stdout=subprocess.PIPE, text=True) for i in range(8)]
        results = [preflight.parse_lock_output(p.communicate()[0].splitlines()) for p in procs]
        winners = [v["mine"]["run_id"] for st, v in results if st == "taken"]
        assert len(winners) == 1, results
        assert json.loads(path.read_text())["run_id"] == winners[0]
        assert all(v["held"]["run_id"] == winners[0] for st, v in results if st == "held")
        path.unlink()


@pytest.mark.local
def test_renew_and_release_act_only_on_the_holders_token(tmp_path):
    path = tmp_path / "run.lock"
    status, value = take(path, {"run_id": "a", "token": "ta"}, lease=30)
    assert status == "taken" and value["why"] == "free"
    assert take(path, {"run_id": "b", "token": "tb"})[0] == "held"
    assert take(path, {"run_id": "a", "token": "ta"})[1]["why"] == "ours"  # its holder again

    def call(mode, token):
        done = subprocess.run([sys.executable, "-I", "-S", SCRIPT, mode, str(path), "30", token],
                              capture_output=True, text=True, check=True)
        return preflight.parse_lock_output(done.stdout.splitlines())[0]

    assert call("renew", "tb") == "lost"
    assert call("release", "tb") == "other" and path.exists()
    assert call("renew", "ta") == "renewed"
    assert call("release", "ta") == "released" and not path.exists()
    assert call("release", "ta") == "free"


@pytest.mark.local
def test_another_process_of_the_same_run_joins_and_keeps_the_holders_token(tmp_path):
    """A rollout hook or ``specfleet fanout`` under a rollout shares SPECFLEET_RUN_ID: it joins
    the lock as it is (the holder's token stays), so its release cannot end the holder's lock."""
    path = tmp_path / "run.lock"
    assert take(path, {"run_id": "a", "token": "ta", "pid": 1}, lease=30)[0] == "taken"
    status, value = take(path, {"run_id": "a", "token": "ta2", "pid": 2})
    assert status == "joined", (status, value)
    assert value["mine"]["token"] == "ta" and value["mine"]["pid"] == 1
    assert json.loads(path.read_text())["token"] == "ta"

    def call(mode, token):
        done = subprocess.run([sys.executable, "-I", "-S", SCRIPT, mode, str(path), "30", token],
                              capture_output=True, text=True, check=True)
        return preflight.parse_lock_output(done.stdout.splitlines())[0]

    assert call("release", "ta2") == "other" and path.exists()


@pytest.mark.local
def test_a_joining_run_renews_the_holders_lock_but_never_releases_it(local, monkeypatch):
    """Through pyinfra: a second process with the holder's run id goes on under the holder's
    lock, and at its end leaves it, token and all, to the holder."""
    monkeypatch.setenv("SPECFLEET_RUN_ID", "the-rollout")
    state, host, s, commands = local()
    path = lock_file(s)
    path.parent.mkdir(parents=True, exist_ok=True)
    now = time.time()
    holder = {"owner": "ops@ctl", "run_id": "the-rollout", "token": "the-holders-token",
              "pid": 1, "expires_at": now + 60, "taken_at": now}
    path.write_text(json.dumps(holder))
    add_op(state, preflight.lock, settings=s)
    add_op(state, preflight.lock, settings=s, present=False)
    run_ops(state)
    disconnect_all(state)
    held = json.loads(path.read_text())
    assert held["token"] == "the-holders-token" and held["pid"] == 1


@pytest.mark.local
def test_a_run_that_lost_its_lease_stops_changing_the_host_and_fails_it(local, monkeypatch,
                                                                          tmp_path, caplog):
    """Another run took the host after this run's lease ran out: the next renewal finds it, and
    this run changes nothing more there; the host fails with a message saying so."""
    monkeypatch.setenv("SPECFLEET_LOCK_LEASE_S", "1")
    state, host, s, commands = local()
    marker = tmp_path / "changed-after-losing-the-lock"
    other = {"owner": "alice@box", "run_id": "alices-run", "token": "alices-token", "pid": 7,
             "expires_at": time.time() + 600}

    @operation()
    def another_run_takes_the_host():
        def steal(state, host):
            lock_file(s).write_text(json.dumps(other))
            gevent.sleep(1.0)  # several renewals fall due meanwhile
            return True

        yield FunctionCommand(steal, (), {})

    @operation()
    def change_the_host():
        yield StringCommand(f"touch {marker}")

    add_op(state, preflight.lock, settings=s)
    add_op(state, another_run_takes_the_host)
    add_op(state, change_the_host)
    add_op(state, preflight.lock, settings=s, present=False)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        run_ops(state)
    disconnect_all(state)
    assert not marker.exists()
    assert json.loads(lock_file(s).read_text()) == other  # the other run's lock, untouched
    assert "this run lost the run lock" in caplog.text
    assert "changes nothing more on this host" in caplog.text and "alice@box" in caplog.text
