"""Preflight: every reason a host cannot take the deploy, found before anything changes.

A pure function over the facts of one host; ``operations.preflight.checks`` gathers them and
fails the host with the first problem. Each problem says what is wrong and how to fix it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specfleet.core.plan import SGLANG, PlanError, make_plan
from specfleet.core.plan.group import GroupMember, make_group_plan
from specfleet.core.settings import Settings
from specfleet.core.text import printable
from specfleet.hostside.weights_agent import disk_preflight

GPU_PROCESSES = "facts.gpu.GpuProcesses"
FREE_SPACE = "facts.disk.FreeSpace"
TOKEN = "facts.hf.Token"
PORTS = "facts.net.ListeningPorts"
SERVICE = "facts.serving.ServiceState"
# Whether this member reaches rank 0's rendezvous address and port (facts.net.TcpReach).
REACH = "facts.net.TcpReach"
# The unit files of the server's and its watchdog's names in systemd's folders.
UNIT_FILES = "facts.serving.UnitFiles"
# Where a user other than root could change the code root runs (facts.preflight.WritableByOthers).
UNTRUSTED = "facts.preflight.WritableByOthers"
# The first line of every unit file specfleet writes (templates/*.service.j2).
UNIT_HEADER = "# Managed by specfleet ("


@dataclass(frozen=True)
class Problem:
    check: str
    problem: str
    fix: str

    def render(self) -> str:
        return f"preflight {self.check}: {self.problem}\n  fix: {self.fix}"


@dataclass
class Preflight:
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(
    facts: Mapping[str, Any],
    settings: Settings,
    *,
    control_token: bool = False,
    host_copy: str | None = None,
    missing_weights_bytes: int | None = None,
    wheel_error: str | None = None,
    drafter_config: Mapping[str, Any] | None = None,
    group: Sequence[GroupMember] | None = None,
) -> Preflight:
    """Every preflight check on one host's facts.

    ``facts`` holds the values of ``facts.probe.default_specs`` plus ``facts.serving.ServiceState``
    of the specfleet unit. ``missing_weights_bytes`` is what the weights step would still fetch
    (None: unknown here, checked again by the weights step before any byte moves).
    ``wheel_error`` is pip's answer when asked for the pinned SGLang on this host's interpreter
    (None: a wheel resolves, or SGLang is already installed at that version). ``host_copy``: the
    path of the token copy an earlier run put on the host (``weights.token``), when it is there.
    """
    result = Preflight()
    install = facts.get(SGLANG)
    predicted = install is None

    # GPUs, arch, TP size, memory, DFLASH: the planner knows every way a plan can fail.
    try:
        if group:
            _check_group(group, settings, drafter_config, facts, result)
        else:
            make_plan(facts, settings, drafter_config, predicted=predicted)
            result.passed.append("a launch plan exists for these GPUs and this SGLang")
    except PlanError as exc:
        result.problems.append(Problem("plan", exc.problem, exc.fix or ""))

    _check_unit_files(facts, settings, result)
    _check_trusted(facts, settings, result)
    _check_busy(facts, settings, result)
    _check_disk(facts, settings, missing_weights_bytes, result)
    _check_token(facts, settings, control_token, result, host_copy, missing_weights_bytes)
    if wheel_error:
        result.problems.append(
            Problem(
                "sglang-wheel",
                f"no SGLang {settings.sglang.version} wheel for this host's interpreter: "
                f"{wheel_error.strip()}",
                "use an SGLang version with a wheel for this Python and glibc (sglang.version), "
                "or point sglang.index_url / sglang.find_links at a wheelhouse that has one",
            )
        )
    elif install is None:
        result.passed.append(f"an SGLang {settings.sglang.version} wheel resolves for this host")
    return result


def _check_group(
    group: Sequence[GroupMember],
    settings: Settings,
    drafter_config: Mapping[str, Any] | None,
    facts: Mapping[str, Any],
    result: Preflight,
) -> None:
    """The group's plan from every member's facts, rank 0's rendezvous port, and whether this
    member reaches it. Members whose SGLang is not yet the configured one are planned from the
    version table: the install step brings them there before the unit is written."""
    g = settings.group
    if g is None:
        return
    installs = [(m.facts.get(SGLANG) or {}).get("version") for m in group]
    settled = all(v == m.settings.sglang.version for v, m in zip(installs, group, strict=True))
    members = group if settled else [
        GroupMember(m.host, {k: v for k, v in m.facts.items() if k != SGLANG}, m.settings,
                    m.address)
        for m in group
    ]  # fmt: skip
    plan = make_group_plan(members, drafter_config, predicted=not settled)
    result.passed.append(
        f"serving group {g.name}: one plan for its {len(plan.plans)} members but the rank"
    )
    me = group[0].host
    if me == g.members[0]:
        taken = [p for p in facts.get(PORTS) or [] if p.get("port") == g.rendezvous_port]
        if taken and not _ours_active(facts):
            who = ", ".join(f"{p.get('process') or '?'} (pid {p.get('pid') or '?'})" for p in taken)
            result.problems.append(Problem(
                "rendezvous-port",
                f"serving group {g.name}: rank 0's rendezvous port {g.rendezvous_port} is taken "
                f"by {who}",
                "stop that process, or set group.rendezvous_port to a free port",
            ))  # fmt: skip
        return
    rank0 = next((m for m in group if m.host == g.members[0]), None)
    where = f"{g.addresses.get(g.members[0]) or (rank0.address if rank0 else g.members[0])}:" \
        f"{g.rendezvous_port}"  # fmt: skip
    reach = facts.get(REACH)
    if isinstance(reach, Mapping) and reach.get("result") not in ("open", "refused"):
        result.problems.append(Problem(
            "rendezvous-reach",
            f"serving group {g.name}: {me} cannot reach rank 0 ({g.members[0]}) at {where}: "
            f"{reach.get('result')}",
            f"open TCP {g.rendezvous_port} (and the ports above it, for NCCL) from {me} to "
            f"{g.members[0]}, or set group.addresses to an address it reaches",
        ))  # fmt: skip
    elif isinstance(reach, Mapping):
        result.passed.append(f"reaches rank 0's rendezvous {where}")


def _check_unit_files(facts: Mapping[str, Any], settings: Settings, result: Preflight) -> None:
    """A unit file of the server's (or its watchdog's) name that specfleet did not write: the
    deploy would overwrite it, or shadow the host's own unit of that name (``ssh.service``)."""
    if UNIT_FILES not in facts:
        return
    foreign = []
    for path, first in sorted((facts.get(UNIT_FILES) or {}).items()):
        admin = path.startswith("/etc/systemd/system/")
        if not (admin and first.startswith(UNIT_HEADER)):
            said = f"first line {printable(first, 120)!r}" if first else "empty"
            foreign.append(f"{path} ({said}{'' if admin else ', a unit of the host'})")
    if foreign:
        result.problems.append(Problem(
            "unit-name",
            f"service_name {settings.service_name!r} names a unit specfleet did not write: "
            + "; ".join(foreign),
            "set service_name to a name of specfleet's own (e.g. 'specfleet-sglang'); specfleet "
            "never overwrites or shadows a unit it did not write (remove that file yourself "
            "only if it is a leftover of yours)",
        ))
    else:
        result.passed.append(f"no unit of the host's is named {settings.service_name}")


def untrusted_problem(what: str, path: str, where: str) -> tuple[str, str]:
    """(problem, fix) of a venv or source tree (``what``: the settings key) that a user other
    than root can change at ``where`` (``facts.preflight.WritableByOthers``' value)."""
    place = printable(where.split(" (")[0])
    return (f"{what} {path} can be changed by a user other than root: {printable(where)}; root "
            "would run code from it (pip's build backend, a .pth file)",
            f"make it root's alone (chown root:root, chmod go-w on {place} and what is in it), "
            f"or set {what} to a root-owned folder")


def _check_trusted(facts: Mapping[str, Any], settings: Settings, result: Preflight) -> None:
    """The venv and an SGLang source tree root runs code from (a build backend, a ``.pth``
    file): only root may write them, or any folder above them."""
    if UNTRUSTED not in facts:
        return
    found = facts.get(UNTRUSTED) or {}
    for path, where in sorted(found.items()):
        what = ("sglang.source_path" if path == settings.sglang.source_path else "venv")
        result.problems.append(Problem("untrusted-path", *untrusted_problem(what, path, where)))
    if not found:
        result.passed.append("the venv and the source tree are root's alone")


def _our_pids(facts: Mapping[str, Any]) -> set[int]:
    service = facts.get(SERVICE) or {}
    pid = service.get("main_pid") or 0
    return {int(pid)} if pid else set()


def _ours_active(facts: Mapping[str, Any]) -> bool:
    service = facts.get(SERVICE) or {}
    return service.get("active_state") in ("active", "activating", "reloading")


def _check_busy(facts: Mapping[str, Any], settings: Settings, result: Preflight) -> None:
    processes = (facts.get(GPU_PROCESSES) or {}).get("processes") or []
    ours = _our_pids(facts)
    # While our own server runs, its tensor-parallel workers hold every GPU: that is not "busy".
    foreign = [] if _ours_active(facts) else [p for p in processes if p.get("pid") not in ours]
    if foreign:
        listed = ", ".join(
            f"pid {p.get('pid')} ({p.get('used_memory_mib', '?')} MiB)" for p in foreign[:4]
        )
        result.problems.append(
            Problem(
                "gpus-busy",
                f"the GPUs are already in use by processes outside {settings.service_name}: "
                f"{listed}",
                "stop those processes (nvidia-smi shows them), e.g. a hand-started server, "
                "then run again",
            )
        )
    else:
        result.passed.append("no foreign process holds the GPUs")

    listeners = [p for p in facts.get(PORTS) or [] if p.get("port") == settings.port]
    strangers = [p for p in listeners if p.get("pid") not in ours]
    if strangers and not (_ours_active(facts) and not any(p.get("pid") for p in strangers)):
        who = ", ".join(
            f"{p.get('process') or '?'} (pid {p.get('pid') or '?'}) on {p.get('address')}"
            for p in strangers
        )
        result.problems.append(
            Problem(
                "port-taken",
                f"port {settings.port} is already taken by a process that is not "
                f"{settings.service_name}: {who}",
                "stop that process, or give this host another port (specfleet port = ...)",
            )
        )
    else:
        result.passed.append(f"port {settings.port} is free or ours")


def _check_disk(
    facts: Mapping[str, Any], settings: Settings, missing: int | None, result: Preflight
) -> None:
    space = facts.get(FREE_SPACE) or {}
    if missing is None or space.get("free_bytes") is None:
        result.warnings.append(
            "disk: the bytes still missing are not known yet; the weights step checks them "
            "against the free space before any byte moves"
        )
        return
    verdict = disk_preflight(
        missing,
        int(space["free_bytes"]),
        margin_percent=settings.weights.margin_percent,
        margin_min_gib=settings.weights.margin_min_gib,
        path=settings.models_root,
    )
    result.warnings.extend(verdict["warnings"])
    if verdict["ok"]:
        result.passed.append("the missing weights fit on the models disk")
    else:
        result.problems.append(Problem("disk", verdict["problem"], verdict["fix"]))


def _check_token(
    facts: Mapping[str, Any],
    settings: Settings,
    control_token: bool,
    result: Preflight,
    host_copy: str | None = None,
    missing_weights_bytes: int | None = None,
) -> None:
    gated = [s.repo_id for s in (settings.target, settings.drafter) if s.gated]
    if not gated:
        return
    token = facts.get(TOKEN) or {}
    if control_token or token.get("exists") or host_copy:
        where = (
            "the control machine" if control_token
            else token.get("path") if token.get("exists")
            else f"specfleet's copy on the host, {host_copy}"
        )
        result.passed.append(f"a Hugging Face token for the gated {', '.join(gated)} ({where})")
        return
    if missing_weights_bytes == 0:
        # An optional input here: nothing is left to download, so this run needs no token.
        result.warnings.append(
            f"no Hugging Face token for the gated {', '.join(gated)}: none needed now (every "
            "weights file is on the host); a move to another revision will need one (export "
            "HF_TOKEN or set weights.token_file)")
        return
    result.problems.append(
        Problem(
            "token",
            f"{', '.join(gated)} is gated and there is no Hugging Face token: none at "
            f"{token.get('path') or '~/.cache/huggingface/token'} on the host and none given "
            "on the control machine",
            "export HF_TOKEN (or set weights.token_file) on the control machine, for an account "
            "that was granted access to the repo on its Hugging Face page",
        )
    )
