"""Helpers shared by specfleet's operations."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand
from pyinfra.api.util import get_template
from pyinfra.context import ctx_host
from pyinfra.operations.util import any_changed

from specfleet.core.errors import (
    CHECK_ATTR,
    CONDITION_ATTR,
    ERROR_ATTR,
    PLANNED_ERROR_ATTR,
    SpecfleetError,
)
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
        if not set(h.state.active_hosts) - {h}:
            # The last host in play: pyinfra would stop with "No hosts remaining!" after this
            # message; raised, its message (host, keys, fix) is the last word and the exit is 1.
            raise exc.for_host(h.name) from None
        logger.error(exc.for_host(h.name).render())
        # As pyinfra fails a host it cannot connect to; the others go on.
        h.state.fail_hosts({h})
        return None


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


def changed_if(what: str, *metas: Any) -> Callable[[], bool] | None:
    """An ``_if`` for an operation that runs only when one of ``metas`` changes (pyinfra's
    ``any_changed``), said in words (``CONDITION_ATTR``: "if the software or weights change")
    so that a ``--dry`` report gives the condition, not just "conditional".

    None where planning (``--dry``, or pyinfra's change detection before it asks) already knows
    that none of them will change: the facts decide it, and the caller adds no operation, so a
    converged host shows no change instead of a conditional one. A real run computes the same
    plan from the same facts, so it skips the same operation.
    """
    if host.state.should_check_for_changes() and not any(m.will_change for m in metas):
        return None
    condition = any_changed(*metas)
    setattr(condition, CONDITION_ATTR, f"if {what} change")
    return condition


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


def systemctl(*args: str) -> StringCommand:
    return StringCommand("systemctl", *[QuoteString(a) for a in args])


def unit_removal(unit_name: str, st: dict[str, Any], files: list[str],
                 folders: list[str]) -> list[StringCommand]:
    """Take a unit off the host, from its ``ServiceState``: stop it, disable it, clear a failed
    state, delete its ``files`` and ``folders``, reload systemd."""
    commands = []
    if st["active_state"] in ("active", "activating", "reloading", "deactivating"):
        commands.append(systemctl("stop", unit_name))
    if st["unit_file_state"] in ("enabled", "enabled-runtime", "linked"):
        commands.append(systemctl("disable", unit_name))
    if st["active_state"] == "failed":
        commands.append(systemctl("reset-failed", unit_name))
    commands.append(StringCommand("rm", "-f", *[QuoteString(p) for p in files]))
    commands.append(StringCommand("rm", "-rf", *[QuoteString(p) for p in folders]))
    commands.append(systemctl("daemon-reload"))
    return commands


def check_command(function: Any, args: tuple, kwargs: dict | None = None) -> FunctionCommand:
    """A Python command that checks the host rather than changes it (``CHECK_ATTR``)."""
    command = FunctionCommand(function, args, kwargs or {})
    setattr(command, CHECK_ATTR, True)
    return command


# The planned failures already said for a host, so that each is said once (several operations
# that need systemd would otherwise each say it lacks).
_SAID_ATTR = "specfleet_planned_said"


def say_planned_failure(error: SpecfleetError, verb: str = "would fail") -> None:
    """While planning (``--dry``): say once per host why a step would fail, and keep the first
    such reason on the Host (``PLANNED_ERROR_ATTR``: where the run would stop) for a controller's
    dry report and for ``fail_planned_host``."""
    said = SpecfleetError(error.problem, fix=error.fix).render()
    where = ctx_host.get() or host
    if not getattr(where, PLANNED_ERROR_ATTR, None):
        setattr(where, PLANNED_ERROR_ATTR, said)
    seen = getattr(where, _SAID_ATTR, None)
    if seen is None:
        seen = set()
        setattr(where, _SAID_ATTR, seen)
    if said in seen:
        return
    seen.add(said)
    host.log_styled(f"{verb}: {said}", fg="red", log_func=logger.warning)


def fail_planned_host() -> None:
    """At the end of a deploy, while planning: a host whose plan would fail (said above, with the
    whole plan shown) is a failed host, so that ``pyinfra --dry`` exits 1 after its report
    instead of 0. Executing, the failing step itself fails the host."""
    h = ctx_host.get() or host
    if not h.state.is_executing and getattr(h, PLANNED_ERROR_ATTR, None):
        h.state.failed_hosts.add(h)


def fails_host(func=None, *, raise_while_planning: bool = False, all_or_nothing: bool = False):
    """The one per-host error helper: a ``SpecfleetError`` raised by an operation body fails
    this one host (``fail_this_host``), not the whole run; the other hosts go on.

    While executing, the host fails at that step. While planning (``--dry``) the problem is said
    once and the host shows a change that fails; with ``raise_while_planning`` it is raised
    instead, so that ``--dry`` itself exits non-zero. With ``all_or_nothing`` the body runs to its
    end before any of its commands is given: a body that fails gives none of them, only the
    failing step. Use as ``@fails_host`` or ``@fails_host(...)`` under ``@operation()``.
    """
    if func is None:
        return functools.partial(fails_host, raise_while_planning=raise_while_planning,
                                 all_or_nothing=all_or_nothing)

    @functools.wraps(func)
    def body(*args: Any, **kwargs: Any):
        try:
            if not all_or_nothing:
                yield from func(*args, **kwargs)
                return
            commands = list(func(*args, **kwargs))
        except SpecfleetError as exc:
            yield fail_this_host(exc.for_host(host.name), "will fail", raise_while_planning)
            return
        yield from commands

    return body


def fail_this_host(error: SpecfleetError, verb: str = "would fail",
                   raise_while_planning: bool = False) -> FunctionCommand:
    """The one way an operation fails one host: while planning, the problem said once
    (``say_planned_failure``; raised instead with ``raise_while_planning``, so that ``--dry``
    itself stops); the step that fails the host while executing (``fail_step``). The other
    hosts go on: pyinfra would stop every host on an exception raised in an operation."""
    if not host.state.is_executing:
        if raise_while_planning:
            raise error
        say_planned_failure(error, verb)
    return fail_step(error)


def say(message: str) -> None:
    """Why an operation changes something: "would ..." while preparing, as-is while executing."""
    prefix = "" if host.state.is_executing else "would: "
    logger.info(f"{host.print_prefix}{prefix}{message}")


def warn(message: str) -> None:
    """A warning in this host's lines."""
    logger.warning(f"{host.print_prefix}{message}")


def check_venv_path(venv: str) -> None:
    """Fails the host unless ``venv`` is an absolute path."""
    if not venv.startswith("/"):
        raise SpecfleetError(
            f"venv path {venv!r} is not absolute",
            host=host.name,
            fix="set venv to an absolute path such as /opt/specfleet/sglang",
        )
