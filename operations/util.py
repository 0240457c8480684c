"""Helpers shared by specfleet's operations."""

from __future__ import annotations

import functools
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand

from specfleet.core.errors import SpecfleetError
from specfleet.core.settings import Settings, SettingsError, settings_for_host


def settings_in_play(h: Any = None) -> Settings | None:
    """The settings of ``h`` (default: the host whose deploy file is loading), checked for this
    host alone: only hosts in play (``--limit``) are ever read. Bad ones fail this one host, with
    its error and fix, and return None (the deploy file then adds nothing for it): the other
    hosts go on, as with any failed host; pyinfra exits non-zero at the end.
    """
    h = h if h is not None else host
    try:
        return settings_for_host(h)
    except SettingsError as exc:
        logger.error(exc.for_host(h.name).render())
        # As pyinfra fails a host it cannot connect to; with none left it stops here, before
        # any operation ("No hosts remaining!").
        h.state.fail_hosts({h})
        return None


def fail_step(error: SpecfleetError) -> FunctionCommand:
    """A command that fails this one host with ``error``'s problem and fix, and no traceback.

    pyinfra fails a host whose ``FunctionCommand`` returns False, and goes on with the others;
    an exception raised in an operation body would instead abort the whole run.
    """
    message = SpecfleetError(error.problem, fix=error.fix).render()
    return FunctionCommand(_report_failure, (message,), {})


def _report_failure(state: Any, host: Any, message: str) -> bool:
    host.log_styled(message, fg="red", log_func=logger.error)
    return False


def fails_host(func=None, *, raise_while_planning: bool = False):
    """Turn a ``SpecfleetError`` raised by an operation body into ``fail_step``.

    While executing, the host fails at that step and the other hosts go on. While planning
    (``--dry``) the problem is printed and the host shows a change that fails; with
    ``raise_while_planning`` it is raised instead, so that ``--dry`` itself exits non-zero.
    Use as ``@fails_host`` or ``@fails_host(raise_while_planning=True)``.
    """
    if func is None:
        return functools.partial(fails_host, raise_while_planning=raise_while_planning)

    @functools.wraps(func)
    def body(*args: Any, **kwargs: Any):
        try:
            yield from func(*args, **kwargs)
        except SpecfleetError as exc:
            if not host.state.is_executing:
                if raise_while_planning:
                    raise
                host.log_styled(
                    f"would fail: {SpecfleetError(exc.problem, fix=exc.fix).render()}",
                    fg="red",
                    log_func=logger.warning,
                )
            yield fail_step(exc)

    return body
