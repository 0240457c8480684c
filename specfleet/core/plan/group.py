"""The launch plan of a serving group: several hosts that run one SGLang server together.

``make_group_plan`` takes every member's facts and settings and gives each member its plan (the
single-host plan plus ``--nnodes/--node-rank/--dist-init-addr`` and the NCCL/Gloo interface),
with the group's own reasons. Pure, like ``make_plan``; it refuses, naming the member and the
numbers, when:

- the members do not agree on the group (name, members, port), or one has no facts;
- their GPUs differ in count (SGLang puts tp_size / nnodes ranks on every node);
- the weights do not fit the group's GPUs (the KV floor, ``plan.min_request_tokens``, is each
  member's plan's, in tokens, as on a single host);
- a member's peers cannot reach it (its address is on none of its interfaces);
- the members' plans differ anywhere but the rank and the local interface, or they run different
  SGLang installs or weights revisions: SGLang does not compare its ranks' arguments itself, and a
  group with mismatched ranks hangs or fails at the first all-reduce.

Layouts: with DFLASH every SGLang release accepts tensor parallel only across hosts (pp_size == 1,
``tables.sglang_versions.VersionRow.multinode_source``), so the one layout is TP over every GPU.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specfleet.core.plan import (
    GIB,
    GPUS,
    MIB,
    SGLANG,
    GroupRole,
    Plan,
    PlanError,
    Reason,
    make_plan,
)
from specfleet.core.settings import ServingGroup, Settings
from specfleet.core.tables.models import known_weights_bytes

NET = "facts.net.NetworkInterfaces"
RDMA = "facts.net.RdmaPorts"

# What may differ between members' plans: the rank, and the local names of the interfaces.
_RANK_FLAG = "--node-rank"
_LOCAL_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA")


class GroupPlanError(PlanError):
    """A serving group that cannot run as one server, naming the member and what is wrong."""


@dataclass(frozen=True)
class GroupMember:
    """One member's inputs: its facts, its settings, and the address the inventory reaches it on."""

    host: str
    facts: Mapping[str, Any]
    settings: Settings
    address: str


@dataclass(frozen=True)
class GroupPlan:
    name: str
    # In rank order.
    plans: dict[str, Plan]
    reasons: list[Reason] = field(default_factory=list)

    @property
    def rank0(self) -> str:
        return next(iter(self.plans))

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.name,
            "reasons": [r.to_dict() for r in self.reasons],
            "members": {host: plan.to_dict() for host, plan in self.plans.items()},
        }

    def render(self) -> str:
        width = max((len(r.topic) for r in self.reasons), default=0)
        lines = [f"serving group {self.name}:"]
        lines += ["  " + r.render(width) for r in self.reasons]
        for rank, (host, plan) in enumerate(self.plans.items()):
            lines.append(f"rank {rank}: {host}")
            lines += ["  " + line for line in plan.render().splitlines()]
        return "\n".join(lines)


def make_group_plan(
    members: Sequence[GroupMember],
    drafter_config: Mapping[str, Any] | None = None,
    predicted: bool = False,
    *,
    weights_bytes: int | None = None,
) -> GroupPlan:
    """Every member's launch plan, in rank order, or a ``GroupPlanError`` (see the module)."""
    group = _agreed_group(members)
    by_host = {m.host: m for m in members}
    missing = [h for h in group.members if h not in by_host]
    if missing:
        raise GroupPlanError(
            f"serving group {group.name}: no facts for member(s) {', '.join(missing)}",
            host=missing[0],
            fix="put every member in the inventory and in play (--limit must name the whole "
            "group), and make sure each is reachable",
        )
    ordered = [by_host[h] for h in group.members]
    reasons: list[Reason] = []
    gpus_per_node, smallest_mib = _gpu_layout(group, ordered)
    nnodes = len(ordered)
    tp = nnodes * gpus_per_node
    group_bytes = smallest_mib * MIB * tp
    size = weights_bytes
    if size is None:
        size = known_weights_bytes(ordered[0].settings.target.repo_id)
    reasons.append(_fit(group, ordered, tp, smallest_mib, size))
    rank0 = ordered[0]
    rendezvous = f"{_bracket(_address(group, rank0))}:{group.rendezvous_port}"
    plans: dict[str, Plan] = {}
    for rank, member in enumerate(ordered):
        interface, why = _interface(group, member)
        rdma = tuple(
            f"{p['device']}:{p['port']}"
            for p in member.facts.get(RDMA) or []
            if isinstance(p, Mapping) and p.get("state") == "ACTIVE"
        )
        role = GroupRole(
            name=group.name,
            nnodes=nnodes,
            node_rank=rank,
            members=tuple(group.members),
            rendezvous=rendezvous,
            gpus_per_node=gpus_per_node,
            group_gpu_bytes=group_bytes,
            interface=interface,
            interface_why=why,
            rdma=rdma,
            dist_timeout_s=group.dist_timeout_s,
        )
        plans[member.host] = make_plan(
            member.facts,
            member.settings,
            drafter_config,
            predicted,
            weights_bytes=weights_bytes,
            host=member.host,
            group=role,
        )
    reasons += _agreement(ordered, plans)
    return GroupPlan(name=group.name, plans=plans, reasons=reasons)


def _agreed_group(members: Sequence[GroupMember]) -> ServingGroup:
    if not members:
        raise GroupPlanError("a serving group with no members", fix="list the group's hosts")
    first = members[0]
    if first.settings.group is None:
        raise GroupPlanError(
            "this host is in no serving group",
            host=first.host,
            fix="plan it alone (make_plan), or set its 'group' settings",
        )
    group = first.settings.group
    for m in members[1:]:
        other = m.settings.group
        if other != group:
            what = "no 'group' settings" if other is None else _differences(group, other)
            raise GroupPlanError(
                f"members of serving group {group.name} disagree: {m.host} has {what} "
                f"(compared with {first.host})",
                host=m.host,
                fix="declare the group once, in the data of an inventory group that holds "
                "exactly its members, so every member reads the same 'group' settings",
            )
    return group


def _differences(a: ServingGroup, b: ServingGroup) -> str:
    keys = [k for k in type(a).model_fields if getattr(a, k) != getattr(b, k)]
    return ", ".join(f"group.{k}={getattr(b, k)!r} (not {getattr(a, k)!r})" for k in keys)


def _gpu_layout(group: ServingGroup, ordered: Sequence[GroupMember]) -> tuple[int, int]:
    """GPUs per member (all equal) and the smallest GPU's memory in MiB."""
    counts: dict[str, int] = {}
    smallest: int | None = None
    for m in ordered:
        gpus = list((m.facts.get(GPUS) or {}).get("gpus") or [])
        counts[m.host] = len(gpus)
        for g in gpus:
            mib = g.get("memory_mib") if isinstance(g, Mapping) else None
            if isinstance(mib, int) and mib > 0:
                smallest = mib if smallest is None else min(smallest, mib)
    if len(set(counts.values())) > 1 or 0 in counts.values():
        listing = ", ".join(f"{h}: {n}" for h, n in counts.items())
        raise GroupPlanError(
            f"serving group {group.name}: members have different GPU counts ({listing}); SGLang "
            "puts tp_size / nnodes ranks on every node",
            host=min(counts, key=lambda h: counts[h]),
            fix="group hosts with the same number of GPUs (restrict a larger host with "
            "CUDA_VISIBLE_DEVICES in plan.extra_env), or make two groups",
        )
    if smallest is None:
        raise GroupPlanError(
            f"serving group {group.name}: GPU memory unknown on every member",
            host=ordered[0].host,
            fix="check nvidia-smi --query-gpu=index,memory.total on the members",
        )
    return counts[ordered[0].host], smallest


def _fit(
    group: ServingGroup,
    ordered: Sequence[GroupMember],
    tp: int,
    smallest_mib: int,
    size: int | None,
) -> Reason:
    gpu_gib = smallest_mib * MIB / GIB
    n = len(ordered)
    if size is None:
        return Reason("group-memory", f"{tp} x {gpu_gib:.0f} GiB", "weights size unknown: not "
                      "checked", "info")  # fmt: skip
    shard_gib = size / GIB / tp
    room = gpu_gib - shard_gib
    if room <= 0:
        per_node = gpu_gib * (tp // n)
        need = math.floor(size / GIB / per_node) + 1 if per_node > 0 else None
        more = (f"{need} such hosts would hold them (then each member's plan checks the KV pool "
                "against plan.min_request_tokens)" if need else "no number of such hosts can")
        raise GroupPlanError(
            f"serving group {group.name}: {n} hosts x {tp // n} GPUs of {gpu_gib:.0f} GiB cannot "
            f"hold {size / GIB:.0f} GiB of weights ({shard_gib:.1f} GiB per GPU); {more}",
            host=ordered[0].host,
            fix="add members to the group, or use GPUs with more memory",
        )
    # The KV floor is each member's plan's (memory.py): the tokens one request may hold after
    # SGLang's memory fraction, plan.min_request_tokens, as on a single host.
    return Reason(
        "group-memory",
        f"{tp} x {gpu_gib:.0f} GiB",
        f"{size / GIB:.0f} GiB of weights as {shard_gib:.1f} GiB per GPU, {room:.1f} GiB per GPU "
        "before SGLang's memory fraction (the KV pool in tokens: kv-cache-room and "
        "request-tokens, at least plan.min_request_tokens)",
    )


def _address(group: ServingGroup, member: GroupMember) -> str:
    return group.addresses.get(member.host) or member.address


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _interface(group: ServingGroup, member: GroupMember) -> tuple[str, str]:
    """The interface NCCL and Gloo use on ``member``, and why."""
    interfaces = [i for i in member.facts.get(NET) or [] if isinstance(i, Mapping)]
    names = [str(i.get("name")) for i in interfaces]
    if group.interface is not None:
        if interfaces and group.interface not in names:
            raise GroupPlanError(
                f"serving group {group.name}: group.interface {group.interface!r} is not an "
                f"interface of {member.host} (it has {', '.join(names)})",
                host=member.host,
                fix="set group.interface to an interface every member has, or unset it to use "
                "the one that holds each member's address",
            )
        return group.interface, "group.interface"
    address = _address(group, member)
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        raise GroupPlanError(
            f"serving group {group.name}: {member.host} is reached as {address!r}, a name: "
            "NCCL needs to know which interface carries it",
            host=member.host,
            fix=f"set group.addresses.{member.host} to the IP address its peers reach it on, or "
            "set group.interface",
        ) from None
    if wanted.is_loopback:
        raise GroupPlanError(
            f"serving group {group.name}: {member.host} is reached on {address}, a loopback "
            "address its peers cannot use",
            host=member.host,
            fix=f"set group.addresses.{member.host} to an address on the hosts' shared network",
        )
    for i in interfaces:
        for a in i.get("addresses") or []:
            try:
                if ipaddress.ip_address(a) == wanted:
                    speed = i.get("speed_mbps")
                    rate = f", {speed / 1000:g} Gbit/s" if isinstance(speed, int) else ""
                    return str(i["name"]), f"holds {address}, the address peers reach "\
                        f"{member.host} on{rate}"  # fmt: skip
            except ValueError:
                continue
    raise GroupPlanError(
        f"serving group {group.name}: no interface of {member.host} holds {address}, the "
        "address its peers reach it on (behind NAT, or the wrong address)",
        host=member.host,
        fix=f"set group.addresses.{member.host} to an address on one of its interfaces, or set "
        "group.interface",
    )


def _comparable(plan: Plan) -> tuple[list[str], dict[str, str]]:
    argv = list(plan.argv)
    if _RANK_FLAG in argv:
        at = argv.index(_RANK_FLAG)
        argv[at + 1 : at + 2] = ["RANK"]
    env = {k: v for k, v in plan.env.items() if k not in _LOCAL_ENV}
    return argv, env


def _install(m: GroupMember) -> str:
    fact = m.facts.get(SGLANG)
    if not isinstance(fact, Mapping) or not fact.get("version"):
        return f"sglang {m.settings.sglang.version} (to be installed)"
    pr = " + PR#20547" if (fact.get("features") or {}).get("dflash_pr20547") else ""
    return f"sglang {fact['version']}{pr}"


def _agreement(ordered: Sequence[GroupMember], plans: Mapping[str, Plan]) -> list[Reason]:
    rank0 = ordered[0]
    argv0, env0 = _comparable(plans[rank0.host])
    checks = {
        "SGLang": _install,
        "target revision": lambda m: str(m.settings.target.revision),
        "drafter revision": lambda m: str(m.settings.drafter.revision),
    }
    for m in ordered[1:]:
        for what, read in checks.items():
            if read(m) != read(rank0):
                raise GroupPlanError(
                    f"member {m.host} runs {what} {read(m)}, rank 0 ({rank0.host}) runs "
                    f"{read(rank0)}",
                    host=m.host,
                    fix="give every member of the group the same settings (declare them in the "
                    "group's data, not per host) and deploy the group together",
                )
        argv, env = _comparable(plans[m.host])
        if argv != argv0 or env != env0:
            raise GroupPlanError(
                f"member {m.host}'s plan differs from rank 0 ({rank0.host}): "
                + _plan_diff(argv0, env0, argv, env),
                host=m.host,
                fix="members must run the same plan but for the rank: give them the same settings "
                "and the same GPUs and SGLang",
            )
    return [
        Reason(
            "group-agreement",
            f"{len(ordered)} members",
            "same SGLang, weights revisions and plan on every member but --node-rank and the "
            "local interface names",
        )
    ]


def _plan_diff(argv0: list[str], env0: dict[str, str], argv: list[str], env: dict[str, str]) -> str:
    parts = []
    a0, a1 = _flags(argv0), _flags(argv)
    for flag in sorted(set(a0) | set(a1)):
        if a0.get(flag) != a1.get(flag):
            parts.append(f"{flag} {a1.get(flag, '(absent)')} (rank 0: {a0.get(flag, '(absent)')})")
    for key in sorted(set(env0) | set(env)):
        if env0.get(key) != env.get(key):
            parts.append(f"{key}={env.get(key, '(unset)')} (rank 0: {env0.get(key, '(unset)')})")
    if not parts:
        parts.append("the command differs")
    return "; ".join(parts)


def _flags(argv: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        if argv[i].startswith("--"):
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
            flags[argv[i]] = value
            i += 2 if value else 1
        else:
            i += 1
    return flags
