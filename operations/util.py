"""Helpers shared by specfleet's operations."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand
from pyinfra.api.util import get_template
from pyinfra.context import ctx_host

from specfleet.core.errors import CHECK_ATTR, ERROR_ATTR, PLANNED_ERROR_ATTR, SpecfleetError
from specfleet.core.settings import Settings, SettingsError, settings_for_host

# How the unit's templates are rendered (``files.template``'s jinja2 arguments).
JINJA = {"trim_blocks": True, "lstrip_blocks": True}


def render(template: Path, context: dict[str, Any]) -> str:
    """Render a template exactly as ``files.template`` does."""
    return get_template(str(template), dict(JINJA)).render(context)


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


def host_settings(settings: Settings | None) -> Settings:
    """``settings`` as given, or those of the host being deployed (an operation called as the
    README shows, with no settings; a deploy resolves its venv once and passes them in)."""
    return settings if settings is not None else settings_for_host(host)


def read_secret_file(path: str, setting: str, what: str, unset: str = "") -> str:
    """The secret in ``path``, a file on the control machine that ``setting`` names, read now (at
    deploy time, never when the inventory loads); surrounding whitespace dropped. A file that
    cannot be read, is not text or is empty is an error naming the setting; the secret is never
    quoted back. ``what``: "the token", "the key"; ``unset``: what unsetting it means."""
    try:
        text = Path(os.path.expanduser(path)).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise SpecfleetError(
            f"{setting} {path} cannot be read on the control machine ({e.strerror})",
            fix=f"point {setting} at a file holding {what}, or unset it",
        ) from None
    except UnicodeDecodeError:
        raise SpecfleetError(f"{setting} {path} is not UTF-8 text",
                             fix=f"write {what} into it (one line)") from None
    if not text:
        raise SpecfleetError(f"{setting} {path} is empty",
                             fix=f"write {what} into it (one line){unset}")
    return text


def fail_step(error: SpecfleetError) -> FunctionCommand:
    """A command that fails this one host with ``error``'s problem and fix, and no traceback.

    pyinfra fails a host whose ``FunctionCommand`` returns False, and goes on with the others;
    an exception raised in an operation body would instead abort the whole run.
    """
    message = SpecfleetError(error.problem, fix=error.fix).render()
    return FunctionCommand(_report_failure, (message,), {})


def _report_failure(state: Any, host: Any, message: str) -> bool:
    return record_failure(state, host, message, styled=True)


def record_failure(state: Any, host: Any, message: str, styled: bool = False) -> bool:
    """Say why ``host`` fails the operation it is executing: in the log, and on the operation's
    ``OperationMeta`` (``ERROR_ATTR``), where the fleet controllers read it. Returns False (a
    Python command's failure)."""
    op_hash = (getattr(host, "nested_executing_op_hash", None)
               or getattr(host, "executing_op_hash", None))
    if op_hash:
        try:
            meta = state.get_op_data_for_host(host, op_hash).operation_meta
            setattr(meta, ERROR_ATTR, message)
        except (KeyError, AttributeError, TypeError):  # not in an operation: the log says it
            pass
    if styled:
        host.log_styled(message, fg="red", log_func=logger.error)
    else:
        logger.error(message)
    return False


def check_command(function: Any, args: tuple, kwargs: dict | None = None) -> FunctionCommand:
    """A Python command that checks the host rather than changes it (``CHECK_ATTR``)."""
    command = FunctionCommand(function, args, kwargs or {})
    setattr(command, CHECK_ATTR, True)
    return command


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
                said = SpecfleetError(exc.problem, fix=exc.fix).render()
                # Kept on the Host for a controller's --dry (the first one: where it would stop).
                where = ctx_host.get() or host
                if not getattr(where, PLANNED_ERROR_ATTR, None):
                    setattr(where, PLANNED_ERROR_ATTR, said)
                host.log_styled(
                    f"would fail: {said}",
                    fg="red",
                    log_func=logger.warning,
                )
            yield fail_step(exc)

    return body


def per_host(body: Iterator[Any]) -> Iterator[Any]:
    """An op body whose ``SpecfleetError`` fails this one host, not the whole run.

    pyinfra 3.10 turns an ``OperationError`` raised in an op (at prepare or execute time) into
    "Operation error" and stops every host. Here the error becomes a command that logs it and
    fails, so the other hosts go on and ``--fail-percent`` decides; ``--dry`` shows it too.
    """
    try:
        commands = list(body)
    except SpecfleetError as exc:
        error = exc.for_host(host.name)
        if not state.is_executing:
            host.log_styled(f"will fail: {error.problem}", fg="red", log_func=logger.warning)
        yield FunctionCommand(_report_host_error, (error.render(),), {})
        return
    yield from commands


def _report_host_error(state, host, text: str) -> bool:
    logger.error(f"{host.print_prefix}{text}" if not text.startswith(f"[{host.name}]") else text)
    return False
