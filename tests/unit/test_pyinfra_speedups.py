"""operations.pyinfra_speedups: each replacement answers exactly what pyinfra's own function does.

The comparisons run against the pyinfra installed here, whichever it is: where its functions are
the ones the speedups were written against they must be installed; where they are not, they must
be left alone, and the replacements must still agree with pyinfra's (or this test says so).
"""

from __future__ import annotations

import importlib
import sys
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

ORIGINAL_ORDER = speedups._ORIGINALS.get(
    "get_operation_order_from_stack", util.get_operation_order_from_stack)
ORIGINAL_HINTS = speedups._ORIGINALS.get("all_global_arguments", arguments.all_global_arguments)


def test_installed_exactly_where_pyinfra_is_the_one_replaced():
    matches = (
        speedups.source_sha256(ORIGINAL_ORDER) == speedups.REPLACED["get_operation_order_from_stack"]
        and speedups.source_sha256(ORIGINAL_HINTS) == speedups.REPLACED["all_global_arguments"]
    )
    # `import operations` installed them (operations/__init__.py).
    assert speedups.install() is matches
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
