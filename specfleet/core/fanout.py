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
# The tree's degree when none is given: the smallest that keeps a swarm two hops deep from its
# seed (1 + d + d*d hosts), from 2 up to ``MAX_AUTO_DEGREE``. Each hop adds a lag at the end
# (the last shards are copied and hashed once per hop), so a 16-host swarm is a tree of degree
# 4 (depth 2), not a binary one (depth 4). A serving host sends to its d receivers at once, so
# its LAN must carry d times the upstream rate to keep pace: the cap assumes a LAN 8x faster
# than upstream (beyond 73 hosts the tree gets a third hop instead).
DEFAULT_DEGREE = 2
MAX_AUTO_DEGREE = 8
MODELS = ("target", "drafter")


def auto_degree(swarm_size: int) -> int:
    """The tree's degree for a swarm of ``swarm_size`` hosts: the smallest (at least 2, at most
    ``MAX_AUTO_DEGREE``) whose tree reaches every host within two hops of the seed."""
    d = DEFAULT_DEGREE
    while d < MAX_AUTO_DEGREE and 1 + d + d * d < swarm_size:
        d += 1
    return d


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
    degree: int | None = None,
) -> dict[str, Any]:
    """Who copies what from whom. Pure.

    ``keys[which][host]`` is the host's ``swarm_key`` for that model; ``degree``: the peers each
    host serves, None: ``auto_degree`` of each swarm's size. Returns::

        {"hosts": {host: {"address": ip, "models": {which: {"role": "seed"|"peer",
                                                              "sources": [{"host","address"}]}},
                          "receivers": [ip, ...],       # whom this host serves (from=)
                          "receiver_hosts": [host, ...],
                          "serves": [which, ...]}},     # the models it serves them
         "swarms": [{"which", "hosts": [...], "seed", "degree"}]}
    """
    if degree is not None and degree < 1:
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
            d = degree if degree is not None else auto_degree(len(members))
            plan["swarms"].append({"which": which, "hosts": members, "seed": members[0],
                                   "degree": d})
            for i, h in enumerate(members):
                srcs = [members[j] for j in tree_sources(i, d)]
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
