"""The fan-out plan: which hosts copy which model from whom. Pure.

Hosts that want the same bytes (``swarm_key``) form a swarm; its first host seeds from upstream and
the others copy in a tree of ``degree`` children per host (``plan_fanout``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specfleet.core.errors import SpecfleetError

# The ephemeral sshd's port on serving peers (settings ``rollout``; open it between hosts).
FANOUT_PORT = 22113
PLAN_ENV = "SPECFLEET_FANOUT_PLAN"
DEFAULT_DEGREE = 2
MODELS = ("target", "drafter")




def swarm_key(settings: Any, which: str) -> tuple:
    """Hosts with equal keys want the same bytes from the same place at the same path, at the
    same site (``rollout.fanout_site``: one seed per site)."""
    src = getattr(settings, which)
    return (
        settings.rollout.fanout_site,
        src.repo_id, src.revision, src.follow_branch,
        tuple(src.allow_patterns) if src.allow_patterns is not None else None,
        tuple(src.ignore_patterns) if src.ignore_patterns is not None else None,
        settings.models_root.rstrip("/"), src.dir_name, settings.weights.hf_endpoint,
    )


def tree_sources(index: int, degree: int) -> list[int]:
    """The swarm positions host ``index`` copies from, nearest first, ending at the seed (0)."""
    out = []
    while index > 0:
        index = (index - 1) // degree
        out.append(index)
    return out


def ordered(hosts: Sequence[str], order: Sequence[str] | None) -> list[str]:
    order = [h for h in (order or []) if h in hosts]
    return order + [h for h in hosts if h not in order]


def plan_fanout(
    hosts: Sequence[str],
    addresses: Mapping[str, str],
    keys: Mapping[str, Mapping[str, tuple]],
    order: Sequence[str] | None = None,
    degree: int = DEFAULT_DEGREE,
) -> dict[str, Any]:
    """Who copies what from whom. Pure.

    ``keys[which][host]`` is the host's ``swarm_key`` for that model. Returns::

        {"hosts": {host: {"address": ip, "models": {which: {"role": "seed"|"peer",
                                                              "sources": [{"host","address"}]}},
                          "receivers": [ip, ...],       # whom this host serves (from=)
                          "receiver_hosts": [host, ...],
                          "serves": [which, ...]}},     # the models it serves them
         "swarms": [{"which", "hosts": [...], "seed"}]}
    """
    if degree < 1:
        raise SpecfleetError(f"fan-out degree {degree}", fix="use 1 or more peers per host")
    seq = ordered(list(hosts), order)
    plan: dict[str, Any] = {
        "hosts": {h: {"address": addresses[h], "models": {}, "receivers": [],
                      "receiver_hosts": [], "serves": []} for h in seq},
        "swarms": [],
    }
    for m, which in enumerate(MODELS):
        groups: dict[tuple, list[str]] = {}
        for h in seq:
            groups.setdefault(keys[which][h], []).append(h)
        for members in groups.values():
            shift = m % len(members)
            members = members[shift:] + members[:shift]
            plan["swarms"].append({"which": which, "hosts": members, "seed": members[0]})
            for i, h in enumerate(members):
                srcs = [members[j] for j in tree_sources(i, degree)]
                plan["hosts"][h]["models"][which] = {
                    "role": "seed" if i == 0 else "peer",
                    "sources": [{"host": s, "address": addresses[s]} for s in srcs],
                }
                for s in srcs:
                    if which not in plan["hosts"][s]["serves"]:
                        plan["hosts"][s]["serves"].append(which)
                    rec = plan["hosts"][s]["receivers"]
                    if addresses[h] not in rec:
                        rec.append(addresses[h])
                        plan["hosts"][s]["receiver_hosts"].append(h)
    return plan
