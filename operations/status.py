"""A read-only look at each host as it is: software, weights, the unit against the plan, health.

``deploys/status.py`` runs ``report`` on every host and prints a table at the end. Nothing here
changes a host: every host reports "No changes".
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from pyinfra import host, logger
from pyinfra.api import operation

from facts.preflight import RunLock
from facts.probe import gather
from facts.sglang import PatchState
from facts.status import Health
from facts.weights import WeightsState
from operations.server_facts import group_peers, host_address, host_specs
from operations.serving import server_texts
from operations.venvs import effective_settings
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import lock_path, model_root, serve_path, server_paths
from specfleet.core.runlock import lock_status
from specfleet.core.settings import Settings
from specfleet.core.sglang.pr20547.portdata import PORTED_RELEASES
from specfleet.core.text import printable
from specfleet.core.unit import (
    SERVICE,
    Peer,
    has_api_key,
    plan_from_facts,
    sha1_text,
)

SGLANG = "facts.sglang.SGLangInstall"
PATCH = "status_patch"
HEALTH = "status_health"
LOCK = "status_lock"


def _weights(name: str) -> str:
    return f"status_weights_{name}"


def _short(rev: str | None) -> str:
    return rev[:10] if rev else "-"


@dataclass
class HostStatus:
    """One host as it is, in words, and every way it differs from what a deploy would make."""

    host: str
    sglang: str = "-"
    patch: str = "-"
    target: str = "-"
    drafter: str = "-"
    unit: str = "-"
    health: str = "-"
    lock: str = "-"
    # "NAME rank R/N" for a member of a serving group.
    group: str = "-"
    drift: list[str] = field(default_factory=list)
    healthy: bool = False

    @property
    def verdict(self) -> str:
        state = "healthy" if self.healthy else self.health
        if not self.drift:
            return f"in sync, {state}"
        return f"drift: {', '.join(self.drift)}; {state}"


def sglang_status(
    settings: Settings,
    install: dict | None,
    patch: dict | None,
    st: HostStatus,
    configured_venv: str | None = None,
):
    """The SGLang version and the PR#20547 state, against the settings (pure). ``settings.venv``
    is the venv the deploy uses (``operations.venvs``); ``configured_venv`` the one in the
    inventory, when a new release goes beside it."""
    want = settings.sglang.version
    if not install:
        st.sglang = "not installed"
        if configured_venv and configured_venv != settings.venv:
            st.drift.append(f"SGLang {want} not installed yet in {settings.venv} (beside "
                            f"{configured_venv}, which holds another release)")  # fmt: skip
        else:
            st.drift.append(f"SGLang not installed in {settings.venv}")
        return
    have = install.get("version") or "?"
    st.sglang = have
    if settings.sglang.kind == "index" and have != want:
        st.sglang = f"{have} (want {want})"
        st.drift.append(f"SGLang {have}, want {want}")
    features = install.get("features") or {}
    opted_in = bool(settings.patch.sha256)
    marker = patch if patch and (patch.get("sha256") or patch.get("partial")) else None
    if marker:
        sha = (marker.get("sha256") or "")[:12]
        if marker.get("partial"):
            st.patch = "PR#20547 half-applied"
            st.drift.append("PR#20547 half-applied")
        elif marker.get("intact"):
            st.patch = f"PR#20547 port applied ({sha})"
            if not opted_in:
                st.drift.append("PR#20547 port applied, the settings do not opt in")
        else:
            st.patch = f"PR#20547 marker stale ({sha})"
            st.drift.append("PR#20547 marker no longer matches the files")
    elif features.get("dflash_pr20547"):
        st.patch = "PR#20547 built in"
    elif features.get("dflash") == "v2":
        st.patch = "DFLASH v2 built in"
    elif (patch or {}).get("rejected"):
        st.patch = "none: the port failed a readiness gate here (DFLASH v1)"
    elif opted_in and have in PORTED_RELEASES:
        st.patch = "none (DFLASH v1)"
        st.drift.append("PR#20547 port not applied")
    else:
        st.patch = f"none (DFLASH {features.get('dflash') or 'absent'})"


def weights_status(settings: Settings, name: str, state: dict | None, st: HostStatus) -> str:
    """One model's revision on the host and its manifest state, against the settings (pure)."""
    src = getattr(settings, name)
    state = state or {}
    current = state.get("current")
    want = src.revision if src.revision and not src.follow_branch else None
    if not current:
        st.drift.append(f"{name} weights absent")
        return "absent"
    rev = (state.get("revisions") or {}).get(current) or {}
    words = _short(current)
    if not rev.get("complete"):
        words += " incomplete"
        st.drift.append(f"{name} weights incomplete")
    elif rev.get("changed") or rev.get("missing"):
        n = len(rev.get("changed") or []) + len(rev.get("missing") or [])
        words += f" {n} files changed"
        st.drift.append(f"{name} weights: {n} files changed or missing since verified")
    else:
        words += f" ok ({rev.get('files', 0)} files)"
    if want and current != want:
        words += f" (want {_short(want)})"
        st.drift.append(f"{name} weights at {_short(current)}, want {_short(want)}")
    return words


# How the status names each of the server's files (``ServerPaths.files``' keys).
_FILE_WORDS = {"unit": "unit", "env": "env", "secret": "api key",
               "log_config": "logging config", "log_module": "log redaction module"}


def unit_status(settings: Settings, service: dict | None, expected: dict[str, str] | None,
                plan_problem: str | None, st: HostStatus) -> None:
    """The unit files' hashes against what the plan would render now, and the marker (pure).

    ``expected`` maps each file path to the text a deploy would write there now."""
    paths = server_paths(settings)
    files = (service or {}).get("files") or {}
    if paths.unit not in files:
        st.unit = "absent"
        st.drift.append("no unit")
        return
    have = files[paths.unit].get("sha1") or ""
    st.unit = have[:10]
    if plan_problem:
        st.unit += " (no plan)"
        st.drift.append(f"no plan: {plan_problem}")
    elif expected is not None:
        differ = []
        for key, path in paths.files().items():
            what = _FILE_WORDS[key]
            text = expected.get(path)
            info = files.get(path)
            if text is None and info is None:
                continue
            if text is None or info is None or info.get("sha1") != sha1_text(text):
                differ.append(what)
        if differ:
            st.unit += " != plan"
            st.drift.append(" and ".join(differ) + (" differs" if len(differ) == 1 else " differ")
                            + ": the next deploy would restart the server")
    if (service or {}).get("restart_pending"):
        st.drift.append(f"restart pending ({service['restart_pending']})")


def health_status(settings: Settings, service: dict | None, health: dict | None,
                  model_path: str, st: HostStatus) -> None:
    """Whether the server answers, with the right model (pure)."""
    active = (service or {}).get("active_state") or "unknown"
    health = health or {}
    code = health.get("health_code")
    where = f"{settings.listen_host}:{settings.port}"
    if health.get("port_held"):
        st.health = f"not asked: {printable(health['port_held'])}"
    elif code is None:
        st.health = f"down ({active}, nothing on {where})"
    elif code != 200:
        st.health = f"unhealthy (/health_generate {code}, {active})"
    elif health.get("model_path") != model_path:
        st.health = f"wrong model ({health.get('model_path')} on {where})"
    elif active != "active":
        st.health = f"answering, but the unit is {active}"
    else:
        st.health = "healthy"
        st.healthy = True


def status_specs(settings: Settings) -> dict[str, Any]:
    """Every fact the status needs, for one ``facts.probe.Probe`` command."""
    paths = server_paths(settings)
    specs = host_specs(settings, paths.unit_files())
    specs[PATCH] = (PatchState, {"venv": settings.venv})
    for name in ("target", "drafter"):
        specs[_weights(name)] = (WeightsState, {"path": model_root(settings, name)})
    specs[LOCK] = (RunLock, {"path": lock_path(settings)})
    specs[HEALTH] = (Health, {
        "host": settings.listen_host, "port": settings.port,
        "secret_file": paths.secret if has_api_key(settings) else None,
        "unit": paths.unit_name,
    })
    return specs


def host_status(
    settings: Settings,
    facts: dict[str, Any],
    host_name: str = "",
    configured_venv: str = "",
    peers: dict[str, Peer] | None = None,
    address: str = "",
) -> HostStatus:
    """The status of one host from the facts of ``status_specs`` (pure: no I/O, but for reading
    ``api_key_file`` on the control machine where that is how the key is given). A member of a
    serving group is checked against its part of the group's plan (``peers``: the others)."""
    st = HostStatus(host=host_name)
    g = settings.group
    rank = g.members.index(host_name) if g is not None and host_name in g.members else None
    if g is not None:
        st.group = f"{g.name} rank {rank}/{len(g.members)}"
    held = facts.get(LOCK)
    st.lock = lock_status(held, (held or {}).get("host_now"))
    sglang_status(settings, facts.get(SGLANG), facts.get(PATCH), st, configured_venv or None)
    st.target = weights_status(settings, "target", facts.get(_weights("target")), st)
    st.drafter = weights_status(settings, "drafter", facts.get(_weights("drafter")), st)
    expected = None
    problem = None
    try:
        current = plan_from_facts(settings, facts, host_name, peers, address)
        if current.predicted_because:
            problem = current.predicted_because
        else:
            # What the deploy would write into each of the server's files (api_key_file is read
            # here, on the control machine: the only I/O).
            files = server_paths(settings).files()
            expected = {files[k]: text for k, text in server_texts(settings, current).items()
                        if text is not None}
    except (SpecfleetError, ValueError) as exc:
        problem = getattr(exc, "problem", None) or str(exc)
    unit_status(settings, facts.get(SERVICE), expected, problem, st)
    model = serve_path(settings, "target")
    if rank:
        # SGLang's ranks >= 1 run only a dummy health server: their unit is all there is to see.
        active = (facts.get(SERVICE) or {}).get("active_state") or "unknown"
        st.healthy = active == "active"
        st.health = f"rank {rank} {'running' if st.healthy else active} (served by rank 0)"
    else:
        health_status(settings, facts.get(SERVICE), facts.get(HEALTH), model, st)
    return st


COLUMNS = ("host", "sglang", "patch", "target", "drafter", "unit", "health", "lock")


def group_lines(rows: list[HostStatus]) -> list[str]:
    """One line per serving group: whether it serves, as one server (pure)."""
    groups: dict[str, list[HostStatus]] = {}
    for r in rows:
        if r.group != "-":
            groups.setdefault(r.group.split(" rank ", 1)[0], []).append(r)
    out = []
    for name, members in groups.items():
        members.sort(key=lambda r: r.group)
        size = int(members[0].group.rsplit("/", 1)[1])
        running = sum(r.healthy for r in members)
        rank0 = next((r for r in members if r.group.endswith(f" rank 0/{size}")), None)
        if rank0 is not None and rank0.healthy and running == size:
            verdict = "serving"
        elif rank0 is None:
            verdict = "rank 0 not in this run"
        else:
            down = [r.host for r in members if not r.healthy]
            verdict = "not serving: " + ", ".join(down) + " not running"
        drift = sorted({r.host for r in members if r.drift})
        out.append(
            f"group {name} ({', '.join(r.host for r in members)}): {verdict}, "
            f"{running}/{size} members running"
            + (f"; drift on {', '.join(drift)}" if drift else "")
        )
    return out


def format_table(rows: list[HostStatus]) -> str:
    """A compact table: one line per host, then each host's verdict (pure)."""
    columns = COLUMNS + (("group",) if any(r.group != "-" for r in rows) else ())
    header = [c.upper() for c in columns]
    cells = [[str(getattr(r, c)) for c in columns] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *cells, strict=True)]

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    out = [line(header), *(line(c) for c in cells), ""]
    width = max(len(r.host) for r in rows) if rows else 0
    out += [f"{r.host.ljust(width)}  {r.verdict}" for r in rows]
    groups = group_lines(rows)
    if groups:
        out += ["", *groups]
    return "\n".join(out)


def status_document(rows: list[HostStatus]) -> dict[str, Any]:
    """The machine-readable status (``specfleet status --json``): each host's columns, its drift,
    whether it is healthy and its verdict, as the table shows them (pure)."""
    return {"hosts": {r.host: {**asdict(r), "verdict": r.verdict} for r in rows}}


# Rows of this run, by host, printed once when pyinfra exits.
ROWS: dict[str, HostStatus] = {}
_REGISTERED: list[bool] = []
# A file the status document is written to at exit (``specfleet status --json`` sets it).
JSON_ENV = "SPECFLEET_STATUS_JSON"


def _print_table() -> None:
    rows = [ROWS[name] for name in sorted(ROWS)]
    path = os.environ.get(JSON_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(status_document(rows), out)
    if not rows:
        return
    # With pyinfra's own output, on stderr: stdout stays for pyinfra's --json document alone.
    sys.stderr.write("--> Status:\n" + "\n".join(
        f"    {line}" if line else "" for line in format_table(rows).splitlines()) + "\n")
    sys.stderr.flush()


def _record(st: HostStatus) -> None:
    ROWS[st.host] = st
    if not _REGISTERED:
        _REGISTERED.append(True)
        atexit.register(_print_table)


@operation()
def report(settings: Settings):
    """
    Report this host as it is, changing nothing: the SGLang version and PR#20547 state, each
    model's revision and manifest state, the unit's hash against the one the plan would render
    now, health (``/health_generate`` and ``/get_model_info`` probed from the host), and the
    run lock (free, or who holds it, since when, and when its lease expires).

    + settings: the deploy's ``Settings``

    Prints one line per host while it runs and a table when pyinfra exits.

    **Example:**

    .. code:: python

        status.report(name="Status (read-only)", settings=settings)
    """
    s = effective_settings(settings)
    try:
        facts = gather(host, status_specs(s))
    except SpecfleetError as exc:
        st = HostStatus(host=host.name, health="unknown", drift=[f"facts failed: {exc.problem}"])
    else:
        configured = settings.venv
        try:
            peers = group_peers(s)
        except SpecfleetError as exc:
            peers = None
            host.log(f"status: {exc.problem}", logger.warning)
        st = host_status(s, facts, host.name, configured, peers, host_address(host))
    _record(st)
    host.log(f"status: {st.verdict}", logger.warning if st.drift or not st.healthy
             else logger.info)
    host.noop("status read; nothing changes")
    yield from ()
