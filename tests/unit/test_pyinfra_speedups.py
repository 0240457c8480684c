"""operations.pyinfra_speedups: each replacement answers exactly what pyinfra's own function does.

The comparisons run against the pyinfra installed here, whichever it is: where its functions are
the ones the speedups were written against they must be installed; where they are not, they must
be left alone, and the replacements must still agree with pyinfra's (or this test says so).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api import State
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import StateStage

from operations import pyinfra_speedups as speedups

util = importlib.import_module("pyinfra.api.util")
operation_module = importlib.import_module("pyinfra.api.operation")
arguments = importlib.import_module("pyinfra.api.arguments")
facts_module = importlib.import_module("pyinfra.api.facts")
ROOT = Path(__file__).resolve().parents[2]

ORIGINAL_ORDER = speedups._ORIGINALS.get(
    "get_operation_order_from_stack", util.get_operation_order_from_stack)
ORIGINAL_HINTS = speedups._ORIGINALS.get("all_global_arguments", arguments.all_global_arguments)


def test_installed_exactly_where_pyinfra_is_the_one_replaced():
    matches = (
        speedups.source_sha256(ORIGINAL_ORDER) == speedups.REPLACED["get_operation_order_from_stack"]
        and speedups.source_sha256(ORIGINAL_HINTS) == speedups.REPLACED["all_global_arguments"]
    )
    assert speedups.install() is matches  # the deploy files call it (test below)
    if matches:
        # Replaced in every module that holds its own reference, not just where defined.
        assert operation_module.get_operation_order_from_stack is speedups.operation_order_from_frames
        assert util.get_operation_order_from_stack is speedups.operation_order_from_frames
        assert arguments.all_global_arguments is speedups.global_arguments_once
        assert facts_module.all_global_arguments is speedups.global_arguments_once


def test_another_pyinfra_keeps_its_own(monkeypatch):
    monkeypatch.setattr(speedups, "_ORIGINALS", {})
    monkeypatch.setitem(speedups.REPLACED, "get_operation_order_from_stack", "0" * 64)
    before = (util.get_operation_order_from_stack, operation_module.get_operation_order_from_stack,
              arguments.all_global_arguments, facts_module.all_global_arguments)
    monkeypatch.setattr(util, "get_operation_order_from_stack", ORIGINAL_ORDER)
    monkeypatch.setattr(operation_module, "get_operation_order_from_stack", ORIGINAL_ORDER)
    monkeypatch.setattr(arguments, "all_global_arguments", ORIGINAL_HINTS)
    monkeypatch.setattr(facts_module, "all_global_arguments", ORIGINAL_HINTS)
    assert speedups.install() is False
    assert operation_module.get_operation_order_from_stack is ORIGINAL_ORDER
    assert arguments.all_global_arguments is ORIGINAL_HINTS
    assert before  # restored by monkeypatch


def both_orders(state) -> tuple[list[int], list[int]]:
    """Both functions, called from one frame (as ``solve_operation_consistency`` calls them)."""
    return ORIGINAL_ORDER(state), speedups.operation_order_from_frames(state)


def nested(depth: int, state):
    if depth:
        return nested(depth - 1, state)
    return both_orders(state)


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_file", [None, __file__, "/nowhere/deploy.py"])
@pytest.mark.parametrize("depth", [0, 3])
def test_operation_order_matches_pyinfra(monkeypatch, is_cli, deploy_file, depth):
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=7)
    call_line = sys._getframe().f_lineno + 1
    original, fast = nested(depth, state)
    assert fast == original
    # Not vacuous: from the deploy file's frame (or, with none, the outermost), this frame's line
    # is in it; a deploy file not on the stack leaves only pyinfra's own (skipped) frame.
    if deploy_file == "/nowhere/deploy.py":
        assert fast == ([7] if is_cli else [])
    else:
        assert call_line in fast
        assert (fast[0] == 7) is is_cli


def test_operation_order_of_real_operation_calls_matches(monkeypatch):
    """In a real (API-mode) pyinfra state, an operation call's order and hash come out the same
    with either function (CLI mode on, so that the stack is what is read)."""
    from pyinfra.operations import server

    orders = {}
    for name, func in (("pyinfra", ORIGINAL_ORDER), ("speedups", speedups.operation_order_from_frames)):
        state = State(Inventory((["h1"], {})))
        state.current_deploy_filename = __file__
        state.current_op_file_number = 0
        state.current_stage = StateStage.Prepare
        monkeypatch.setattr(operation_module, "get_operation_order_from_stack", func)
        monkeypatch.setattr(pyinfra, "is_cli", True)
        host = state.inventory.get_host("h1")
        from pyinfra.context import ctx_host, ctx_state

        with ctx_state.use(state), ctx_host.use(host):
            host.init(state)
            for _ in range(2):
                server.shell(name="a step", commands=["true"])  # the same line twice: a loop
        monkeypatch.setattr(pyinfra, "is_cli", False)
        orders[name] = [meta.op_order for meta in state.op_meta.values()]
    assert orders["speedups"] == orders["pyinfra"]
    assert len(orders["pyinfra"]) == 2


def test_global_arguments_match_pyinfra():
    assert speedups.global_arguments_once() == ORIGINAL_HINTS()
    # A copy each time: a caller may change its list.
    first = speedups.global_arguments_once()
    first.clear()
    assert speedups.global_arguments_once() == ORIGINAL_HINTS()


# Run as pyinfra runs (gevent's monkey-patching first): a real paramiko client connected to a real
# paramiko server over a socket pair, quieted, then closed while its reader waits in a read.
IDLE_SCRIPT = """
from gevent import monkey
monkey.patch_all()

import json, socket, threading, time
from pathlib import Path
from types import SimpleNamespace

import paramiko

from operations import pyinfra_speedups as speedups

class Server(paramiko.ServerInterface):
    def get_allowed_auths(self, username):
        return "password"

    def check_auth_password(self, username, password):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        def answer():
            time.sleep(0.5)  # the client's reader waits in a read meanwhile
            channel.sendall(b"ran " + command + b"\\n")
            channel.send_exit_status(0)
            channel.close()
        threading.Thread(target=answer, daemon=True).start()
        return True

ours, theirs = socket.socketpair()
server = paramiko.Transport(theirs)
server.add_server_key(paramiko.RSAKey.generate(2048))
threading.Thread(target=server.start_server, kwargs={"server": Server()}, daemon=True).start()
client = paramiko.SSHClient()
client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
client.connect("h1", sock=ours, username="u", password="p", look_for_keys=False,
               allow_agent=False)
transport = client.get_transport()
before = transport.sock.gettimeout()
hosts = [SimpleNamespace(name="h1", connector=SimpleNamespace(client=client)),
         SimpleNamespace(name="h2", connector=SimpleNamespace(client=None))]
changed = speedups.quiet_idle_transports(hosts)
again = speedups.quiet_idle_transports(hosts)
after = transport.sock.gettimeout()
asked = time.monotonic()
_, out, _ = client.exec_command("true")
answer = out.read().decode()
answered_in_s = time.monotonic() - asked
time.sleep(0.3)  # the reader now waits in a read with the new timeout
started = time.monotonic()
client.close()
while transport.is_alive() and time.monotonic() - started < 30:
    time.sleep(0.005)
print(json.dumps({"before": before, "after": after, "changed": changed, "again": again,
                  "answer": answer, "answered_in_s": answered_in_s,
                  "closed_in_s": time.monotonic() - started, "alive": transport.is_alive()}))
"""


@pytest.mark.local
def test_idle_connections_wake_rarely_and_still_end_at_once_when_closed(tmp_path):
    script = tmp_path / "idle.py"
    script.write_text(IDLE_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == 0.1  # paramiko's own wake-up, which this replaces
    assert seen["after"] == speedups.IDLE_CHECK_S
    assert (seen["changed"], seen["again"]) == (1, 0)  # a closed or absent one is left alone
    # A command's answer arrives when it is sent, not at the reader's next wake-up.
    assert seen["answer"] == "ran true\n"
    assert 0.5 <= seen["answered_in_s"] < 0.5 + speedups.IDLE_CHECK_S / 5, seen
    # Closed while its reader waits: it ends at once, not at its next wake-up.
    assert not seen["alive"]
    assert seen["closed_in_s"] < speedups.IDLE_CHECK_S / 5, seen


def test_idle_connections_are_left_alone_without_gevent(monkeypatch):
    # A plain thread blocked in a read would see a close only at its next wake-up. (An earlier
    # tests' process is patched with gevent by tests/conftest.py.)
    asked = []
    monkeypatch.setattr(speedups.monkey, "is_module_patched",
                        lambda name: asked.append(name) or False)
    client = SimpleNamespace(get_transport=lambda: pytest.fail("looked at a transport"))
    assert speedups.quiet_idle_transports([SimpleNamespace(connector=SimpleNamespace(
        client=client))]) == 0
    assert asked == ["socket"]


def test_every_deploy_file_installs_them_itself():
    """Importing ``operations`` patches nothing (next test); the deploy files that run
    operations install the speedups, so a ``pyinfra INVENTORY deploys/X.py`` run and the
    controllers' runs of the same files both get them."""
    import ast

    missing = []
    for path in sorted((ROOT / "deploys").glob("*.py")):
        calls = {node.func.id for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        if "install_speedups" not in calls:
            missing.append(path.name)
    assert missing == []


IMPORT_PROBE = """
import importlib, json, pkgutil, socket, sys, threading
before = (socket.socket, threading.Thread, threading.Lock, __import__("time").sleep)
import pyinfra.api.arguments as arguments, pyinfra.api.util as util
funcs = (util.get_operation_order_from_stack, arguments.all_global_arguments)
names = []
for top in ("operations", "specfleet.fleet"):
    pkg = importlib.import_module(top)
    names.append(top)
    for info in pkgutil.iter_modules(pkg.__path__, top + "."):
        if info.name != "specfleet.fleet.report":  # matplotlib's, optional
            importlib.import_module(info.name)
            names.append(info.name)
from gevent import monkey
after = (socket.socket, threading.Thread, threading.Lock, __import__("time").sleep)
print(json.dumps({"modules": names, "same": [a is b for a, b in zip(before, after)],
                  "funcs": [a is b for a, b in zip(funcs, (util.get_operation_order_from_stack,
                                                           arguments.all_global_arguments))],
                  "patched": [m for m in ("socket", "threading", "ssl", "subprocess", "time")
                              if monkey.is_module_patched(m)]}))
"""


@pytest.mark.local
def test_importing_operations_or_the_controllers_patches_nothing():
    """Importing ``operations`` and ``specfleet.fleet`` (every module of both) in a fresh
    process: the standard library is not gevent's and pyinfra's functions are its own. (Before,
    ``operations/__init__.py`` installed the speedups and ``specfleet/fleet/__init__.py`` ran
    gevent's ``patch_all`` on import: test order started to matter.)"""
    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"operations.kimi_k26", "specfleet.fleet.rollout"} <= set(seen["modules"]), seen
    assert seen["same"] == [True] * 4 and seen["funcs"] == [True, True], seen
    assert seen["patched"] == [], seen
