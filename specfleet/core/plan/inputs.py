"""Facts as the plan takes them: one host's {fact name: value}."""

from __future__ import annotations

from typing import Any

from specfleet.core.errors import SpecfleetError
from specfleet.core.plan.context import GPUS, SGLANG, TOPOLOGY


class FactsInputError(SpecfleetError):
    """A facts file the plan cannot read, with what is wrong."""


# A key every value of these facts has: tells a fact's own value from pyinfra's {host: value}.
_VALUE_KEYS = {GPUS: "gpus", TOPOLOGY: "links", SGLANG: "features"}


def one_host_facts(facts: dict[str, Any], host: str | None = None) -> dict[str, Any]:
    """``facts`` as {fact: value} for one host.

    Takes either that shape or the one ``pyinfra INVENTORY fact NAME... --json`` prints,
    {fact: {host: value}}; from the latter it picks ``host``, or the only host there is.
    """
    per_host = {
        name: value
        for name, value in facts.items()
        if name.startswith("facts.")
        and isinstance(value, dict)
        and (name not in _VALUE_KEYS or _VALUE_KEYS[name] not in value)
        and all(v is None or isinstance(v, (dict, list)) for v in value.values())
    }
    if not per_host or (set(per_host) != {k for k in facts if k.startswith("facts.")}):
        return facts
    hosts = sorted({h for value in per_host.values() for h in value})
    if host is None:
        if len(hosts) != 1:
            raise FactsInputError(
                f"the facts file holds facts of {len(hosts)} hosts ({', '.join(hosts)}): "
                "choose one with --host"
            )
        host = hosts[0]
    if host not in hosts:
        raise FactsInputError(f"the facts file has no host {host!r} (it has: {', '.join(hosts)})")
    out = {k: v for k, v in facts.items() if k not in per_host}
    for name, value in per_host.items():
        if host in value:
            out[name] = value[host]
    return out
