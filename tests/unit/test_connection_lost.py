"""A link cut under a command (paramiko's EOFError while an operation reads a fact) fails that
host with what happened and the fix, never a traceback: the run lock's host hook turns the
connection errors into ``ConnectionLost``, a ``SpecfleetError`` (``fails_host`` fails the step)
and an ``SSHException`` (pyinfra fails a command that raises one, the readiness gate says it its
own way). Found by the fanout-peer-cut drill (the controller's link to the seed cut mid-copy)."""

from __future__ import annotations

import pytest
from paramiko import SSHException

from operations import preflight
from specfleet.core.errors import SpecfleetError


class _State:
    def __init__(self) -> None:
        self.callback_handlers: list = []

    def add_callback_handler(self, handler) -> None:
        self.callback_handlers.append(handler)


class _Host:
    name = "d2"

    def __init__(self, error: BaseException | None) -> None:
        self.state = _State()
        self.error = error

    def run_shell_command(self, *args, **kwargs):
        if self.error is not None:
            raise self.error
        return True, []

    def put_file(self, *args, **kwargs):
        return True

    def disconnect(self) -> None:
        pass


@pytest.mark.parametrize("error", [EOFError(), SSHException("Unable to open channel."),
                                   ConnectionResetError(104, "Connection reset by peer")])
def test_a_lost_connection_fails_the_host_with_its_fix(error):
    h = _Host(error)
    preflight._hook_host(h)
    with pytest.raises(preflight.ConnectionLost) as lost:
        h.run_shell_command("true")
    assert isinstance(lost.value, SpecfleetError) and isinstance(lost.value, SSHException)
    text = lost.value.render()
    assert text.startswith("[d2] the SSH connection to the host was lost (")
    assert type(error).__name__ in text and "fix: check that the host is reachable" in text


def test_other_errors_and_answers_pass_through():
    assert _Host(None).run_shell_command("true") == (True, [])
    h = _Host(None)
    preflight._hook_host(h)
    assert h.run_shell_command("true") == (True, [])
    # A timeout stays pyinfra's (its _timeout handling), not a lost connection.
    h = _Host(TimeoutError("timed out"))
    preflight._hook_host(h)
    with pytest.raises(TimeoutError):
        h.run_shell_command("true")
