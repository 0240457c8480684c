"""Three of pyinfra's costs on the control machine, paid for a fraction of the CPU.

A converged run over a fleet is mostly bookkeeping on the control machine: each operation call on
each host costs pyinfra 3.10 two things that do not depend on the host (profile of a converged
32-host run: ``bench/converged/profile.md``):

- ``api.util.get_operation_order_from_stack`` (in CLI mode) builds ``inspect.stack()`` and calls
  ``inspect.getframeinfo`` on every frame twice; each of those reads the frame's source line and
  walks ``sys.modules`` (``inspect.getmodule``) only to get a file name and a line number, which
  the frame already holds (``f_code.co_filename``, ``f_lineno``): about 2/3 of the deploy's
  own CPU per host;
- ``api.arguments.all_global_arguments`` evaluates ``typing.get_type_hints`` of the same class on
  every operation and fact call.

``install()`` swaps in equivalents that read the frames directly and keep the type hints once.
They return exactly what pyinfra's functions return (``tests/unit/test_pyinfra_speedups.py``
compares both on real operation calls); they are installed only when pyinfra's functions are the
ones they were written against (the sha256 of their source), so another pyinfra keeps its own.
The same change, proposed upstream, would make this module unnecessary.

The third cost grows with the run's length, not its operations: each host's SSH connection
(paramiko) wakes ten times a second while it waits. ``install()`` also slows that to once every
``IDLE_CHECK_S`` on the connections the run has open (``quiet_idle_transports``), where a closed
connection still ends at once.
"""

from __future__ import annotations

import hashlib
import importlib
import linecache
import socket
import sys
from typing import Any

import pyinfra
from gevent import monkey
from pyinfra.context import ctx_state

# By module path: ``pyinfra.api`` exports functions under some of these modules' names
# (``pyinfra.api.operation`` is also the ``@operation`` decorator).
pyinfra_arguments = importlib.import_module("pyinfra.api.arguments")
pyinfra_facts = importlib.import_module("pyinfra.api.facts")
pyinfra_operation = importlib.import_module("pyinfra.api.operation")
pyinfra_util = importlib.import_module("pyinfra.api.util")

# sha256 of the source of each function replaced, in the pyinfra it was read from (3.10.0).
REPLACED = {
    "get_operation_order_from_stack":
        "af13fe995eb540e30d4932f270b00eb36f6d7d9a5cce1c035a31fcec842cf7c4",
    "all_global_arguments":
        "e2f365132720e8337b85bcabb6faf43a9ea20c76bc17831b3ace0e10a5df4b7b",
}  # fmt: skip

_ORIGINALS: dict[str, Any] = {}


def source_sha256(func: Any) -> str:
    """sha256 of a module-level function's source: its ``def`` line and the indented lines after
    it (``inspect.getsource`` tokenises the whole block: as costly as what is sped up, per run)."""
    code = func.__code__
    lines = linecache.getlines(code.co_filename)
    block = lines[code.co_firstlineno - 1 : code.co_firstlineno]
    for line in lines[code.co_firstlineno :]:
        if line.strip() and not line[0].isspace():
            break
        block.append(line)
    return hashlib.sha256("".join(block).rstrip().encode()).hexdigest()


def operation_order_from_frames(state: Any) -> list[int]:
    """``pyinfra.api.util.get_operation_order_from_stack(state)``, from the frames themselves."""
    frames = []
    # This frame stands where pyinfra's own is, and is skipped as pyinfra skips its own (from
    # its install dir): with no deploy file on the stack, pyinfra starts from that frame.
    frame = sys._getframe(0)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()

    start = 0
    if state.current_deploy_filename:
        for start, frame in enumerate(frames):  # noqa: B007 - pyinfra keeps the last index too
            if frame.f_code.co_filename == state.current_deploy_filename:
                break

    line_numbers = []
    if pyinfra.is_cli:
        line_numbers.append(state.current_op_file_number)
    me = operation_order_from_frames.__code__
    for frame in frames[start:]:
        if frame.f_code is me or frame.f_code.co_filename.startswith(
                pyinfra_util.PYINFRA_INSTALL_DIR):
            continue
        line_numbers.append(frame.f_lineno)
    return line_numbers


_GLOBAL_ARGUMENTS: list[tuple[str, type]] = []


def global_arguments_once() -> list[tuple[str, type]]:
    """``pyinfra.api.arguments.all_global_arguments()``, its type hints evaluated once."""
    if not _GLOBAL_ARGUMENTS:
        _GLOBAL_ARGUMENTS.extend(_ORIGINALS.get("all_global_arguments",
                                                pyinfra_arguments.all_global_arguments)())
    return list(_GLOBAL_ARGUMENTS)


# paramiko's transport wakes every ``Transport._active_check_timeout`` (0.1 s) from its socket
# read only to look whether it was closed. Under pyinfra's gevent a close wakes it at once (gevent
# fails a read blocked on a socket that another greenlet closes), so over a fleet these wake-ups
# are control CPU spent waiting: 32 idle connections wake 320 times a second, for the whole run.
IDLE_CHECK_S = 5.0


def quiet_idle_transports(hosts: Any) -> int:
    """Raise the read timeout of each connected host's paramiko transport from paramiko's 0.1 s
    to ``IDLE_CHECK_S``, where sockets are gevent's; the number of transports changed."""
    if not monkey.is_module_patched("socket"):
        return 0  # a plain thread blocked in recv would see a close only at its next timeout
    changed = 0
    for h in hosts:
        client = getattr(getattr(h, "connector", None), "client", None)
        transport = client.get_transport() if hasattr(client, "get_transport") else None
        sock = getattr(transport, "sock", None)
        if (isinstance(sock, socket.socket) and getattr(transport, "active", False)
                and sock.gettimeout() == getattr(transport, "_active_check_timeout", None)):
            sock.settimeout(IDLE_CHECK_S)
            changed += 1
    return changed


def install() -> bool:
    """Swap the equivalents in where pyinfra's functions are the ones they replace; True if so."""
    if ctx_state.isset() and getattr(ctx_state.get(), "inventory", None) is not None:
        quiet_idle_transports(ctx_state.get().inventory)
    if _ORIGINALS:
        return True
    order = pyinfra_util.get_operation_order_from_stack
    hints = pyinfra_arguments.all_global_arguments
    if (source_sha256(order) != REPLACED["get_operation_order_from_stack"]
            or source_sha256(hints) != REPLACED["all_global_arguments"]):
        return False
    _ORIGINALS["get_operation_order_from_stack"] = order
    _ORIGINALS["all_global_arguments"] = hints
    # Each module that imported a name keeps its own reference: replace it where it is used.
    pyinfra_util.get_operation_order_from_stack = operation_order_from_frames
    pyinfra_operation.get_operation_order_from_stack = operation_order_from_frames
    pyinfra_arguments.all_global_arguments = global_arguments_once
    pyinfra_facts.all_global_arguments = global_arguments_once
    return True
