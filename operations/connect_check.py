"""The settings check before pyinfra connects: ``config.py`` (which pyinfra's CLI execs from the
checkout before it loads the inventory) registers it on the run's state.

pyinfra connects to every host before it runs a deploy file, so a settings mistake checked only by
the deploy (``operations.util.settings_in_play``) shows after a connection, and a host whose
address is still ``<address of the GPU host>`` shows only as "Could not resolve hostname". Here,
just before pyinfra connects to a host, that host's settings are checked (every bad key, each
placeholder left in); a host with bad ones is not connected to at all: its connector is replaced
by one that fails with the settings error, so pyinfra reports it as a host it could not connect
to (the others go on, as ``settings_in_play`` promises); when every host in play is bad, the run
ends before connecting with their errors as its last word (exit 1).
"""

from __future__ import annotations

from typing import Any

from pyinfra.api.exceptions import ConnectError
from pyinfra.connectors.base import BaseConnector
from pyinfra.context import ContextObject, ctx_state

from specfleet.core.errors import SettingsError
from specfleet.core.settings import settings_for_host


class RefusedBySettings(BaseConnector):
    """A host's connector once its settings are found bad: connecting fails with their error,
    and nothing is sent anywhere (no name lookup, no socket)."""

    handles_execution = True

    def __init__(self, state: Any, host: Any, error: SettingsError) -> None:
        super().__init__(state, host)
        self.error = error
        self.message = error.render().removeprefix(f"[{host.name}] ")  # pyinfra prefixes it

    @staticmethod
    def make_names_data(name: str) -> Any:  # never used: the host exists already
        yield name, {}, []

    def connect(self) -> None:
        raise ConnectError(self.message)

    def run_shell_command(self, *args: Any, **kwargs: Any) -> Any:  # never reached: not connected
        raise ConnectError(self.message)

    def put_file(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectError(self.message)

    def get_file(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectError(self.message)


def refuse_bad_hosts(state: Any) -> list[str]:
    """Each host in play whose settings are bad gets ``RefusedBySettings`` as its connector; the
    names of those hosts. When every host in play is bad, the run ends here with their errors
    (exit 1: the settings are the last word, not "No hosts remaining!")."""
    in_play = [each for each in state.inventory if state.is_host_in_limit(each)]
    errors: dict[Any, SettingsError] = {}
    for each in in_play:  # --limit: never read another host's data
        try:
            settings_for_host(each)
        except SettingsError as exc:
            errors[each] = exc.for_host(each.name)
    if errors and len(errors) == len(in_play):
        said = [e.render() for e in errors.values()]
        if len(said) > 1:
            said.insert(0, f"{len(said)} hosts have bad settings:")
        # Not an exception pyinfra formats ("Operation error in <file> line <n>": the settings
        # are not specfleet's code): the message alone, exit 1, after pyinfra's own cleanup.
        raise SystemExit("\n".join(said))
    for each, exc in errors.items():
        each.connector = RefusedBySettings(state, each, exc)
    return [each.name for each in errors]


def register(state: Any) -> None:
    """Check the settings of every host in play as soon as pyinfra's CLI has loaded the
    inventory into ``state`` (``State.init``, right before it connects to every host). pyinfra
    has no callback between the two (its state callbacks are made by ``init`` itself), so this
    instance's ``init`` is wrapped, once."""
    if isinstance(state, ContextObject):  # pyinfra's context proxy: the state it holds, if any
        if not ctx_state.isset():
            return  # config.py exec'd with no state (specfleet's own runs check the settings)
        state = ctx_state.get()
    if getattr(state, "_specfleet_checks_settings", False):
        return
    original = state.init

    def init(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        refuse_bad_hosts(state)
        return result

    state.init = init
    state._specfleet_checks_settings = True
