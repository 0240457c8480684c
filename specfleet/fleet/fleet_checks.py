"""What ``specfleet sweep`` and ``specfleet bench`` check on every host before their first point:
that it answers (pyinfra's own connection, its options), in seconds and in one line, instead of
trying every point (and a restore) against a host that is not there. Settings are checked before
this, when the inventory loads (``specfleet.cli``); whether the host's SGLang has DDTree, by the
first point's deploy, before it changes anything."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specfleet.fleet.inventory_view import reachable_hosts


def unreachable_line(what: str, inventory: str, options: Any,
                     hosts: Sequence[str]) -> str | None:
    """One line naming every host of ``hosts`` that cannot be reached, and why (None: all
    answer)."""
    bad = reachable_hosts(inventory, options, list(hosts))
    if not bad:
        return None
    said = "; ".join(f"{h} is unreachable ({_first(why)})" for h, why in bad.items())
    return (f"{what}: {said}: nothing was run or changed (check the address and SSH settings, "
            "e.g. ssh to it by hand, then run again)")


def _first(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0][:200] if lines else "no answer"
