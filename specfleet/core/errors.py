"""The error specfleet raises for bad input or host state: the host, the problem, the fix."""

from __future__ import annotations

from pyinfra.api.exceptions import OperationError


class SpecfleetError(OperationError):
    """An error a person can act on: which host, what is wrong, and how to fix it.

    It subclasses pyinfra's ``OperationError``. Raised while a deploy file is loaded (bad
    settings), pyinfra stops before anything changes and prints only this message. Raised while
    an operation *executes*, pyinfra would abort the whole run with a traceback, so operations
    turn it into a failing step of that one host (``operations.util.fails_host``).
    """

    def __init__(self, problem: str, *, host: str | None = None, fix: str | None = None):
        self.problem = problem
        self.host = host
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        where = f"[{self.host}] " if self.host else ""
        text = f"{where}{self.problem}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text

    def for_host(self, host: str) -> SpecfleetError:
        """The same error, naming ``host`` when it did not already."""
        if self.host:
            return self
        return type(self)(self.problem, host=host, fix=self.fix)


class SettingsError(SpecfleetError):
    """Inventory or group data under ``specfleet`` that does not fit the settings schema."""


# How an operation tells a controller (``specfleet.fleet``) about a host, on pyinfra's own
# objects rather than in its log: the reason a host failed an operation, kept on that
# operation's ``OperationMeta``; and a command that checks rather than changes (the readiness
# gate), so that an operation made only of checks does not make its host "changed".
ERROR_ATTR = "specfleet_error"
CHECK_ATTR = "specfleet_check"
# The launch plan a planning (``--dry``) run computed for a host, kept on pyinfra's Host object.
PLAN_ATTR = "specfleet_launch_plan"
# A download's latest progress on a host (``{repo_id: progress}``, the weights agent's progress
# file), kept on pyinfra's Host object while the step runs, for the fleet-wide progress view.
PROGRESS_ATTR = "specfleet_weights_progress"
# Why a planning (``--dry``) run expects a host to fail, kept on pyinfra's Host object.
PLANNED_ERROR_ATTR = "specfleet_planned_error"
# The words of an operation's ``_if`` ("if the software or weights change"), kept on the callable:
# a dry run reports a conditional change with its condition.
CONDITION_ATTR = "specfleet_condition"
