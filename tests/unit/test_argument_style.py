"""One argument style inside the project (issue 36): operations take the deploy's ``settings``
explicitly, never reading them from host data behind the caller's back; the compositions that
turn settings into several operations' arguments are pyinfra ``@deploy`` functions; one helper
fails one host on a ``SpecfleetError``.

Read from the source (ast), so that a new operation that slips back into the old styles fails
here; and the one error helper run through pyinfra's own state on ``@local``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from pyinfra.api import Config, FunctionCommand, Inventory, State, StringCommand
from pyinfra.context import ctx_host, ctx_state

from operations import sglang, util, weights
from specfleet.core.errors import SpecfleetError

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = sorted((ROOT / "operations").glob("*.py"))
# The one module that reads a host's settings from its data: the deploy file's entry point.
READS_HOST_DATA = {"util.py"}
# The only places that turn a SpecfleetError into a failing step of one host.
ERROR_HELPER_NAMES = {"fail_this_host", "fail_step"}


def _is_operation(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Name) and target.id == "operation":
            return True
    return False


def _functions(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text(), str(path))
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def settings_defaults(path: Path) -> list[str]:
    """Operations of ``path`` whose ``settings`` parameter has a default (the old style:
    ``settings=None``, then read from the host's data)."""
    found = []
    for fn in _functions(path):
        if not _is_operation(fn):
            continue
        args = fn.args
        positional = args.posonlyargs + args.args
        with_default = positional[len(positional) - len(args.defaults):]
        defaults = {a.arg: d for a, d in zip(with_default, args.defaults, strict=True)}
        defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                         if d is not None})
        if "settings" in defaults:
            found.append(f"{path.name}:{fn.lineno} {fn.name}")
    return found


def own_settings_reads(path: Path) -> list[str]:
    """Calls that read the settings of the host being deployed from its data:
    ``settings_for_host(host)`` (a peer's, ``settings_for_host(peer)``, is a group's business),
    and the removed ``host_settings``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        name = node.func.id
        own = (name == "settings_for_host" and node.args
               and isinstance(node.args[0], ast.Name) and node.args[0].id == "host")
        if own or name == "host_settings":
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def error_helpers_outside_util(path: Path) -> list[str]:
    """Calls of the host-failing primitives, or helpers of one's own, outside ``util.py``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in ERROR_HELPER_NAMES:
                found.append(f"{path.name}:{node.lineno} {name}")
        elif isinstance(node, ast.FunctionDef) and node.name in ("_fail", "per_host", "_per_host"):
            found.append(f"{path.name}:{node.lineno} def {node.name}")
    return found


def test_operations_take_settings_explicitly():
    found = [hit for path in OPERATIONS for hit in settings_defaults(path)]
    assert not found, found
    reads = [hit for path in OPERATIONS if path.name not in READS_HOST_DATA
             for hit in own_settings_reads(path)]
    assert not reads, reads
    assert not hasattr(util, "host_settings")


def test_one_per_host_error_helper():
    found = [hit for path in OPERATIONS if path.name != "util.py"
             for hit in error_helpers_outside_util(path)]
    assert not found, found


def test_the_checkers_see_the_old_styles(tmp_path):
    bad = tmp_path / "old.py"
    bad.write_text(
        "@operation()\ndef a(settings=None):\n    s = host_settings(settings)\n    yield\n\n"
        "@operation()\ndef b(x, *, settings=None):\n    s = settings_for_host(host)\n    yield\n\n"
        "def c(settings=None):\n    return settings_for_host(peer)\n\n"
        "def _fail(problem):\n    yield fail_this_host(problem)\n"
    )
    assert settings_defaults(bad) == ["old.py:2 a", "old.py:7 b"]
    assert own_settings_reads(bad) == ["old.py:3 host_settings(settings)",
                                       "old.py:8 settings_for_host(host)"]
    assert sorted(error_helpers_outside_util(bad)) == ["old.py:14 def _fail",
                                                       "old.py:15 fail_this_host"]


@pytest.mark.parametrize("composition", [sglang.ensure_software, weights.tools_from_settings,
                                         weights.token_from_settings])
def test_settings_compositions_are_pyinfra_deploys(composition):
    # pyinfra's @deploy keeps the function as _inner with the deploy's name on it.
    inner = getattr(composition, "_inner", None)
    assert inner is not None and getattr(inner, "deploy_name", ""), composition
    assert list(inspect.signature(inner).parameters) == ["settings"]


@pytest.fixture
def local_host():
    inventory = Inventory((["@local"], {}))
    state = State(inventory=inventory, config=Config())
    h = inventory.get_host("@local")
    with ctx_state.use(state), ctx_host.use(h):
        yield h


def _body_failing_after_a_command():
    yield StringCommand("touch", "/tmp/never")
    raise SpecfleetError("only 3 GiB free on /srv/models", fix="free some space")


def test_all_or_nothing_gives_only_the_failing_step(local_host):
    commands = list(util.fails_host(all_or_nothing=True)(_body_failing_after_a_command)())
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand)
    # While planning, the problem is said once and kept as the host's planned failure.
    assert "only 3 GiB free" in getattr(local_host, "specfleet_planned_error", "")


def test_step_by_step_keeps_what_came_before(local_host):
    commands = list(util.fails_host(_body_failing_after_a_command)())
    assert [type(c) for c in commands] == [StringCommand, FunctionCommand]


def test_raise_while_planning_names_the_host(local_host):
    body = util.fails_host(raise_while_planning=True)(_body_failing_after_a_command)
    with pytest.raises(SpecfleetError) as caught:
        list(body())
    assert caught.value.host == "@local" and caught.value.fix == "free some space"
