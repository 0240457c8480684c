"""The facts the SGLang server's unit is made from, read on the host in one probe: the unit's
state, the GPUs, the installed SGLang, the drafter's config, the weights' revisions, and the
facts of the other members of a serving group. ``specfleet.core.unit`` turns them into the plan.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host, logger, state
from pyinfra.context import ctx_host

from facts.cache import cached_fact
from facts.cache import cached_gather as gather
from facts.gpu import Gpus, GpuTopology
from facts.net import NetworkInterfaces, RdmaPorts
from facts.preflight import trust_args as trust_fact_args
from facts.serving import FileText, FirstJson, ServiceState
from facts.sglang import SGLangInstall
from facts.weights import WeightsState
from operations.util import say_planned_failure
from specfleet.core.errors import PLAN_ATTR, SpecfleetError
from specfleet.core.layout import (
    ServerPaths,
    join,
    model_file,
    model_root,
    patch_state_dir,
    server_paths,
    sglang_python,
    watchdog_paths,
)
from specfleet.core.plan import GPUS, SGLANG, TOPOLOGY
from specfleet.core.plan.group import NET, RDMA
from specfleet.core.settings import Settings, settings_for_host
from specfleet.core.unit import (
    DRAFTER_CONFIG,
    PATCH_SHA,
    SERVICE,
    CurrentPlan,
    Peer,
    plan_from_facts,
    weights_key,
)


def service_state_args(settings: Settings) -> dict[str, Any]:
    paths = server_paths(settings)
    return {"service": paths.unit_name, "paths": paths.unit_files(), "marker": paths.marker}


def unit_files_args(settings: Settings) -> dict[str, Any]:
    """``facts.serving.UnitFiles``' arguments: the server's and its watchdog's unit names."""
    return {"names": [server_paths(settings).unit_name, watchdog_paths(settings).unit_name]}


def trust_args(settings: Settings) -> dict[str, Any]:
    """``facts.preflight.WritableByOthers``' arguments: the venv this run uses, with its top
    levels (``bin/``, ``pyvenv.cfg``, site-packages and its ``.pth`` files), and an SGLang source
    tree with all that is in it; each with the folders above it."""
    sg = settings.sglang
    return trust_fact_args(settings.venv, sg.source_path if sg.kind == "source" else None)


def host_specs(settings: Settings, files_: list[str]) -> dict[str, Any]:
    """The facts the unit needs, for one ``facts.probe.Probe`` command (one SSH round trip)."""
    paths = server_paths(settings)
    specs: dict[str, Any] = {
        SERVICE: (ServiceState, {"service": paths.unit_name, "paths": files_,
                                 "marker": paths.marker}),
        GPUS: (Gpus, {}),
        TOPOLOGY: (GpuTopology, {}),
        SGLANG: (SGLangInstall, {"python": sglang_python(settings)}),
        DRAFTER_CONFIG: (
            FirstJson,
            {"paths": [model_file(settings, "drafter", "config.json"),
                       model_file(settings, "drafter", "current", "config.json")]},
        ),
    }  # fmt: skip
    if settings.group is not None:
        # A serving group's plan needs the interfaces the peers reach this member on.
        specs[NET] = (NetworkInterfaces, {})
        specs[RDMA] = (RdmaPorts, {})
    # The applied PR#20547 patch's sha256 (written by operations.sglang), for the build info.
    specs[PATCH_SHA] = (FileText, {"path": join(patch_state_dir(settings.venv), "sha256")})
    for name in ("target", "drafter"):
        src = getattr(settings, name)
        if src.revision is None or src.follow_branch:
            # Not pinned in the settings: the revision the weights step left on the host.
            specs[weights_key(name)] = (WeightsState, {"path": model_root(settings, name)})
    return specs


def current_plan(settings: Settings) -> CurrentPlan:
    """The plan for this host from its facts as they are now (call it inside an operation)."""
    return plan_from_facts(
        settings, unit_facts(settings, []), host.name, group_peers(settings), host_address(host)
    )


def host_address(h: Any) -> str:
    """The address the inventory reaches ``h`` on (its peers reach it there too, by default)."""
    return str(h.data.get("ssh_hostname") or h.name)


def group_peers(settings: Settings) -> dict[str, Peer] | None:
    """The other members of this host's serving group, their facts read now (one probe each).

    Every member must be in this run: a group's plan is made from all of its members' facts.
    """
    g = settings.group
    if g is None:
        return None
    peers: dict[str, Peer] = {}
    for name in g.members:
        if name == host.name:
            continue
        peer = state.inventory.get_host(name, default=None)
        if peer is None or peer not in state.activated_hosts:
            raise SpecfleetError(
                f"serving group {g.name}: member {name} is "
                + ("not in the inventory" if peer is None else "not in this run (--limit?)"),
                host=host.name,
                fix=f"deploy the whole group together: add {name} to the inventory and to "
                "--limit (a group's plan needs every member's facts)",
            )
        if peer not in state.active_hosts:
            raise SpecfleetError(
                f"serving group {g.name}: member {name} failed earlier in this run",
                host=host.name,
                fix=f"fix {name} (its error is above) and run again; the group starts as one",
            )
        peer_settings = settings_for_host(peer)
        peers[name] = Peer(
            peer_settings, gather(peer, host_specs(peer_settings, [])), host_address(peer)
        )
    return peers


def unit_facts(settings: Settings, files_: list[str]) -> dict[str, Any]:
    """The facts of ``host_specs`` for this host, read now (one probe)."""
    facts = gather(host, host_specs(settings, files_))
    if facts.get(SERVICE) is None and not state.is_executing:
        _show_plan(settings, facts)  # the plan needs no systemd: show it, then why it fails
    _need_systemd(facts.get(SERVICE))
    return facts


def _show_plan(settings: Settings, facts: dict[str, Any]) -> None:
    """Planning on a host that cannot run the unit: the launch plan all the same (kept for a
    controller's dry report, and printed), so ``--dry`` always shows it."""
    try:
        current = plan_from_facts(settings, facts, host.name, group_peers(settings),
                                  host_address(host))
    except SpecfleetError as exc:  # the plan itself fails: said as the planned failure
        say_planned_failure(exc, "would fail")
        return
    say_plan(current)


def say_plan(current: CurrentPlan) -> None:
    """While planning: the host's launch plan, printed once (several operations read it) and
    kept on the Host (``PLAN_ATTR``) for a controller's dry report."""
    where = ctx_host.get() or host
    if getattr(where, PLAN_ATTR, None) == current.rendered:
        return
    setattr(where, PLAN_ATTR, current.rendered)
    note = f"\n  (predicted: {current.predicted_because})" if current.predicted_because else ""
    host.log(f"{current.rendered}{note}", logger.info)


def service_state(paths: ServerPaths) -> dict[str, Any]:
    """The server unit's ``ServiceState`` on this host, with every file of the unit."""
    files_ = paths.unit_files()
    return _need_systemd(
        cached_fact(host, ServiceState, service=paths.unit_name, paths=files_, marker=paths.marker)
    )


def _need_systemd(st: dict[str, Any] | None) -> dict[str, Any]:
    if st is None:
        raise SpecfleetError(
            "systemctl is not on this host: the SGLang server runs as a systemd unit",
            host=host.name,
            fix="run specfleet on a host booted with systemd",
        )
    return st
