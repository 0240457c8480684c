"""Roll a deploy across a fleet: canary, batches, a failure budget, readiness gates, rollback.

    specfleet rollout INVENTORY DEPLOY [--canary HOST] [--order h1,h2,...]
        [--batch-size N | --batch-percent P] [--max-fail-percent P]
        [--no-prefetch] [--no-fanout] [--prefetch-deploy FILE] [--report FILE.json]
        [--limit HOST|GROUP ...] [--dry] [--json] [--pre-hook CMD] [--post-hook CMD]
        [pyinfra's --ssh-user, --key, --port, --sudo, --data, --config, -v ...]

pyinfra runs hosts in lock-step, or one by one in no set order, and its fail percentage is global.
This drives pyinfra's Python API in this process (``specfleet.fleet.pyinfra_run.Session``: one
State for the rollout, each host connected once), one step per deploy file and batch, with the
hosts of one batch in parallel:

0. the run lock of every host in play (``deploys/rollout_lock.py``), taken once and held to the
   end; a host another run holds is "not started: busy" and never touched;
1. prefetch: the weights on every host before anything restarts: by default the fan-out of
   ``specfleet/fleet/fanout.py`` (once from upstream, then host to host), else a weights-only
   deploy;
2. per batch (the canary alone first, then batches of ``batch_size`` or ``batch_percent``): the
   pre-hook, snapshot (``deploys/rollout_snapshot.py``: a rollback point where there is none),
   the deploy, the readiness gate (``deploys/rollout_gate.py``, which keeps the state that
   passed as the rollback point), for each host that failed the deploy or the gate the rollback
   (``deploys/rollout_restore.py``), itself gated, then the post-hook;
3. after each batch, its failures against the budget: any failure of the canary, or more than
   ``max_fail_percent`` of a batch's hosts, stops the rollout; later batches are never touched.

The batching and the budget are pure functions (``make_batches``, ``over_budget``). Each host's
result and reason are read from pyinfra's objects (``pyinfra_run``). Defaults come from the
``rollout`` section of the hosts' settings; flags override them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specfleet.core.errors import PLAN_ATTR, SpecfleetError
from specfleet.core.runlock import controller_run_id
from specfleet.core.settings import RolloutOptions, settings_for_host
from specfleet.core.text import printable
from specfleet.fleet import bench
from specfleet.fleet.fanout import Interrupted, run_prefetch
from specfleet.fleet.progress import progress_view
from specfleet.fleet.pyinfra_run import (
    FAILED,
    NOT_STARTED,
    OK,
    ROLLED_BACK,
    HostStep,
    PyinfraOptions,
    Session,
    StepRun,
    deploy_path,
    say,
)

SNAPSHOT_DEPLOY = "rollout_snapshot.py"
GATE_DEPLOY = "rollout_gate.py"
# With the speed gate: the readiness gate without the rollback point, then the point once the
# host kept its speed.
GATE_HELD_DEPLOY = "rollout_gate_held.py"
CHECKPOINT_DEPLOY = "rollout_checkpoint.py"
RESTORE_DEPLOY = "rollout_restore.py"
DEFAULT_PREFETCH = "weights_only.py"
STEPS = ("prefetch", "snapshot", "deploy", "gate", "rollback")


# --------------------------------------------------------------------------------------------------
# Pure: options, batches, budget
# --------------------------------------------------------------------------------------------------


# The options are the settings' own rollout section (one place for their names and defaults).
Options = RolloutOptions


def resolve_options(per_host: Mapping[str, Any], cli: Mapping[str, Any]) -> Options:
    """The rollout options from every host's ``rollout`` settings, then the CLI's flags.

    The rollout is one for the fleet: hosts that disagree on an option (set it in group ``all``)
    are an error, unless the flag is given.
    """
    names = ("canary", "order", "batch_size", "batch_percent", "max_fail_percent",
             "prefetch_weights", "fanout", "speed_gate")  # fmt: skip  (fanout_site: per host)
    values: dict[str, Any] = {}
    for name in names:
        if cli.get(name) is not None:
            values[name] = cli[name]
            continue
        seen: dict[str, list[str]] = {}
        for host, opts in per_host.items():
            seen.setdefault(json.dumps(getattr(opts, name)), []).append(host)
        if len(seen) > 1:
            detail = "; ".join(f"{v} on {', '.join(h)}" for v, h in seen.items())
            raise SpecfleetError(
                f"hosts disagree on rollout.{name}: {detail}",
                fix=f"set specfleet['rollout']['{name}'] once, in group data for all hosts, "
                f"or pass --{name.replace('_', '-')}",
            )
        if seen:
            values[name] = json.loads(next(iter(seen)))
    # The hosts' values were checked with their settings; the flags' are checked below.
    opts = Options.model_construct(**values)
    if opts.batch_size is not None and opts.batch_percent is not None:
        raise SpecfleetError(
            "both rollout.batch_size and rollout.batch_percent are set",
            fix="set one of them (flags: --batch-size or --batch-percent)",
        )
    if opts.batch_size is not None and opts.batch_size < 1:
        raise SpecfleetError(f"rollout.batch_size is {opts.batch_size}", fix="use 1 or more")
    if opts.batch_percent is not None and not 0 < opts.batch_percent <= 100:
        raise SpecfleetError(
            f"rollout.batch_percent is {opts.batch_percent}", fix="use a number in (0, 100]"
        )
    if not 0 <= opts.max_fail_percent <= 100:
        raise SpecfleetError(
            f"rollout.max_fail_percent is {opts.max_fail_percent}", fix="use a number in [0, 100]"
        )
    if opts.speed_gate is not None and not 0 < opts.speed_gate <= 1:
        raise SpecfleetError(f"rollout.speed_gate is {opts.speed_gate}",
                             fix="use a fraction in (0, 1], e.g. 0.85 (--speed-gate 0.85)")
    return opts


def make_batches(
    hosts: Sequence[str],
    order: Sequence[str] | None = None,
    canary: str | None = None,
    batch_size: int | None = None,
    batch_percent: float | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> list[list[str]]:
    """The batches, in order: ``[[canary], batch, batch, ...]``.

    ``order`` lists hosts first (the others follow in inventory order); the canary defaults to the
    first host and goes alone. The rest go ``batch_size`` at a time, or ``batch_percent`` of the
    whole fleet at a time (rounded down, at least 1, as Ansible's ``serial: "30%"``), or one at a
    time when neither is set.

    ``groups`` maps each member of a serving group to its members in rank order: a group is one
    unit, never split across batches (its members restart as one), in rank order; the canary's
    group is the canary. A group larger than the batch size is a batch of its own.
    """
    hosts = list(hosts)
    if not hosts:
        raise SpecfleetError("the inventory has no hosts", fix="give an inventory with hosts")
    known = set(hosts)
    order = list(order or [])
    unknown = [h for h in order if h not in known]
    if unknown:
        raise SpecfleetError(
            f"--order names hosts not in the inventory: {', '.join(unknown)}",
            fix=f"use host names of the inventory: {', '.join(hosts)}",
        )
    dupes = sorted({h for h in order if order.count(h) > 1})
    if dupes:
        raise SpecfleetError(
            f"--order names {', '.join(dupes)} more than once", fix="name each host once"
        )
    ordered = order + [h for h in hosts if h not in order]
    if canary is not None:
        if canary not in known:
            raise SpecfleetError(
                f"the canary {canary!r} is not in the inventory",
                fix=f"use one of: {', '.join(hosts)}",
            )
        ordered.remove(canary)
        ordered.insert(0, canary)
    size = batch_size_for(len(hosts), batch_size, batch_percent)
    units: list[list[str]] = []
    placed: set[str] = set()
    for h in ordered:
        if h in placed:
            continue
        unit = [m for m in (groups or {}).get(h, [h]) if m in known] or [h]
        placed.update(unit)
        units.append(unit)
    batches = [units[0]]
    for unit in units[1:]:
        if len(batches) > 1 and len(batches[-1]) + len(unit) <= size:
            batches[-1] = batches[-1] + unit
        else:
            batches.append(list(unit))
    return batches


def batch_size_for(total: int, batch_size: int | None, batch_percent: float | None) -> int:
    if batch_size is not None and batch_percent is not None:
        raise SpecfleetError("both a batch size and a batch percent", fix="give one of them")
    if batch_percent is not None:
        return max(1, math.floor(total * batch_percent / 100 + 1e-9))
    return max(1, batch_size or 1)


def over_budget(failed: int, batch: int, max_fail_percent: float, canary: bool = False) -> bool:
    """Whether a batch's failures stop the rollout: any on the canary, else more than
    ``max_fail_percent`` of the batch (Ansible's ``max_fail_percentage``: strictly more)."""
    if failed <= 0:
        return False
    if canary:
        return True
    return failed * 100.0 / batch > max_fail_percent + 1e-9


# --------------------------------------------------------------------------------------------------
# Pure: reading one pyinfra run
# --------------------------------------------------------------------------------------------------


@dataclass
class HostReport:
    host: str
    batch: int
    status: str = NOT_STARTED
    why: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    changed_ops: list[str] = field(default_factory=list)
    # Dry: what changes only if its condition holds at run time, with the condition.
    conditional_ops: list[str] = field(default_factory=list)
    unreachable: bool = False
    busy: bool = False
    hook_failed: bool = False
    launch_plan: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in (FAILED, ROLLED_BACK)


def dry_status(res: Any) -> str:
    """A host's result in a dry run, as pyinfra's ``--dry`` tells it: "would change" for an
    unconditional change, "conditional" where only conditional operations would run (each
    with its condition), else ok or what failed (pure)."""
    if not res.passed:
        return res.status
    if res.changed_ops:
        return "would change"
    return "conditional" if res.conditional_ops else OK


def _changes(r: HostReport) -> str:
    parts = [", ".join(r.changed_ops)] if r.changed_ops else []
    parts += [f"conditional: {c}" for c in r.conditional_ops]
    return "; ".join(parts)


def summary_table(reports: Iterable[HostReport]) -> str:
    rows = [["host", "batch", "result", *STEPS, "why"]]
    for r in reports:
        times = [f"{r.seconds[s]:.1f}s" if s in r.seconds else "-" for s in STEPS]
        why = "; ".join(r.why) if r.why else _changes(r)
        label = "canary" if r.batch == 0 else str(r.batch)
        rows.append([r.host, label, r.status, *times, why])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)]
        out.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# Hooks: commands around each host's change (drain it from a load balancer, put it back)
# --------------------------------------------------------------------------------------------------


@dataclass
class Hooks:
    """``pre``: run before a host is changed (a failure: the host is not started); ``post``: run
    after it passes its gate. ``on``: ``control`` (this machine, ``sh -c``) or ``host`` (over
    the host's own pyinfra connection). Both see ``SPECFLEET_HOST``, ``SPECFLEET_ADDRESS`` and
    ``SPECFLEET_RUN_ID`` in their environment."""

    pre: str | None = None
    post: str | None = None
    on: str = "control"


def hook_env(host: str, address: str, run_id: str) -> dict[str, str]:
    return {"SPECFLEET_HOST": host, "SPECFLEET_ADDRESS": address, "SPECFLEET_RUN_ID": run_id}


# --------------------------------------------------------------------------------------------------
# The controller
# --------------------------------------------------------------------------------------------------

LOCK_DEPLOY = "rollout_lock.py"


def busy_words(why: Sequence[str]) -> str | None:
    """``held by X since T`` from the lock step's reason, when another run holds the host."""
    text = " ".join(why)
    mark = "another specfleet run holds this host: "
    if mark not in text:
        return None
    who = text.split(mark, 1)[1]
    return printable(who.split("; its lease", 1)[0].split(": ", 1)[0], 300) if who else None


@dataclass
class Rollout:
    inventory: str
    deploy: str
    hosts: list[str]
    options: Options
    prefetch_deploy: str | None
    session: Any = None
    run_id: str = ""
    hooks: Hooks = field(default_factory=Hooks)
    dry: bool = False
    reports: dict[str, HostReport] = field(default_factory=dict)
    batches: list[list[str]] = field(default_factory=list)
    stopped: str | None = None
    progress: Any = None
    # How a step runs: ``runner(inventory, deploy, hosts, name) -> StepRun``; by default in the
    # rollout's pyinfra session (tests script it).
    runner: Any = None
    # A serving group's members (host -> members in rank order): one unit in batches and rollback.
    groups: dict[str, list[str]] = field(default_factory=dict)
    # The speed gate's benchmark runs: ``bench_runner(inventory, deploy, hosts, data, log_path)``
    # (``specfleet.fleet.bench.run_with_data``; tests script it), results under ``bench_dir``.
    bench_runner: Any = None
    bench_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.runner is None:
            self.runner = self._session_step

    def _session_step(self, inventory: str, deploy: str, hosts: Sequence[str],
                      name: str) -> StepRun:
        """One step on ``hosts``, in the rollout's pyinfra session (same State, connections)."""
        if self.progress is not None:
            self.progress.step(name, hosts)
        step = self.session.run(deploy, list(hosts), name)
        if self.progress is not None:
            self.progress.done(name, step)
        return step

    def _say_plan(self) -> None:
        o = self.options
        plan = " | ".join(
            ("canary " if i == 0 else "") + ",".join(b) for i, b in enumerate(self.batches)
        )
        say(f"batches: {plan}; max fail {o.max_fail_percent:g}% per batch"
            + (f"; speed gate: keep {o.speed_gate:.0%} of each host's tokens/s and acceptance"
               if o.speed_gate else ""))

    def run(self) -> int:
        o = self.options
        self.batches = make_batches(self.hosts, o.order, o.canary, o.batch_size, o.batch_percent,
                                    self.groups)
        for i, batch in enumerate(self.batches):
            for h in batch:
                self.reports[h] = HostReport(h, i)
        self._say_plan()
        if self.dry:
            return self._dry()
        everyone = [h for b in self.batches for h in b]
        # The run lock of every host, once, before any step; held (and renewed) to the end.
        lock = self.run_deploy(LOCK_DEPLOY, everyone, "run lock")
        for h, res in lock.results.items():
            r = self.reports[h]
            if res.passed:
                continue
            held_by = busy_words(res.why)
            if held_by:
                r.status = NOT_STARTED
                r.why = [f"not started: busy (held by {held_by})"]
                r.busy = True
            else:
                self._fail(r, res, "run lock")
        locked = [h for h in everyone if lock.results[h].passed]
        step = self._prefetch(locked) if locked else None
        for h, res in (step.results if step else {}).items():
            r = self.reports[h]
            r.seconds["prefetch"] = step.seconds
            if not res.passed:
                self._fail(r, res, "prefetch")

        for i, batch in enumerate(self.batches):
            label = "canary" if i == 0 else f"batch {i}/{len(self.batches) - 1}"
            self._batch(batch, label)
            failed = sum(1 for h in batch if self.reports[h].failed)
            if over_budget(failed, len(batch), o.max_fail_percent, canary=i == 0):
                self.stopped = (
                    f"the canary {batch[0]} failed" if i == 0 else
                    f"{failed} of {len(batch)} hosts of {label} failed, over the budget of "
                    f"{o.max_fail_percent:g}%"
                )  # fmt: skip
                later = [h for b in self.batches[i + 1 :] for h in b]
                for h in later:
                    if not self.reports[h].busy:
                        self.reports[h].why = ["not started: the rollout stopped"]
                break
            if failed:
                say(f"{label}: {failed} of {len(batch)} failed, within the budget")
            else:
                say(f"{label}: every host passed the readiness gate")
        return self.exit_code()

    def exit_code(self) -> int:
        failed_hosts = [r.host for r in self.reports.values() if r.failed]
        busy = [r.host for r in self.reports.values() if r.busy or r.hook_failed]
        if self.stopped:
            say(f"STOPPED: {self.stopped}")
            return 2
        if failed_hosts or busy:
            say(f"finished with {len(failed_hosts)} failed and {len(busy)} not started (busy, "
                f"or a pre-hook failed): "
                f"{', '.join(failed_hosts + busy)}")
            return 1
        say("finished: every host passed the readiness gate")
        return 0

    def _dry(self) -> int:
        """What the rollout would do: the batches (said), and per host what the deploy would
        change and its launch plan; nothing runs on any host but pyinfra's reads."""
        everyone = [h for b in self.batches for h in b]
        step = self.runner(self.inventory, self.deploy, everyone, "dry run")
        for h in everyone:
            r, res = self.reports[h], step.results[h]
            r.status = dry_status(res)
            r.changed_ops = res.changed_ops
            r.conditional_ops = res.conditional_ops
            if not res.passed:
                r.why = [f"would fail: {w}" for w in res.why]
            plan = getattr(self.session.host(h), PLAN_ATTR, None) if self.session else None
            if plan:  # printed by the deploy as it planned (operations.serving)
                r.launch_plan = str(plan)
        return 0 if all(step.results[h].passed for h in everyone) else 1

    def _prefetch(self, ordered: list[str]) -> StepRun | None:
        """The weights on every host before anything restarts: the given weights-only deploy, or
        the fan-out (``specfleet.fleet.fanout``: once from upstream, then host to host)."""
        o = self.options
        if not o.prefetch_weights:
            return None
        if self.prefetch_deploy:
            return self.runner(self.inventory, self.prefetch_deploy, ordered, "prefetch")
        if o.fanout:
            return run_prefetch(self.inventory, ordered, order=ordered, runner=self.runner)
        if deploy_path(DEFAULT_PREFETCH).is_file():
            return self.run_deploy(DEFAULT_PREFETCH, ordered, "prefetch")
        say("prefetch: fan-out is off and there is no weights-only deploy; skipped")
        return None

    def run_deploy(self, name: str, hosts: list[str], label: str) -> StepRun:
        """One of the checkout's rollout deploy files (``deploys/<name>``) on ``hosts``."""
        return self.runner(self.inventory, str(deploy_path(name)), hosts, label)

    def _fail(self, r: HostReport, res: HostStep, step: str) -> None:
        r.status = FAILED
        r.unreachable = r.unreachable or res.status == "unreachable"
        r.why.extend(f"{step}: {w}" for w in (res.why or ["failed"]))

    def _hook(self, which: str, hosts: list[str]) -> dict[str, str]:
        """Run the ``which`` hook for each host; returns ``{host: why}`` of those it failed."""
        command = getattr(self.hooks, which)
        if not command:
            return {}
        failed: dict[str, str] = {}
        for h in hosts:
            host = self.session.host(h)
            env = hook_env(h, str(host.data.get("ssh_hostname") or h), self.run_id)
            say(f"{which}-hook on {h} ({self.hooks.on}): {command}")
            if self.hooks.on == "host":
                ok, out = run_on_host(host, command, env)
                tail = (out.stderr_lines or out.stdout_lines)[-1:] if out else []
            else:
                proc = run_on_control(command, env)
                ok = proc.returncode == 0
                tail = [ln for ln in (proc.stderr or proc.stdout or "").splitlines()
                        if ln.strip()][-1:]
            if not ok:
                failed[h] = f"{which}-hook `{command}` failed" + (f": {tail[0]}" if tail else "")
        return failed

    def _batch(self, batch: list[str], label: str) -> None:
        live = [h for h in batch if not self.reports[h].failed and not self.reports[h].busy]
        if not live:
            return
        for h, why in self._hook("pre", live).items():
            r = self.reports[h]
            r.status = NOT_STARTED
            r.hook_failed = True
            r.why.append(f"not started: {why}")
        live = [h for h in live if not self.reports[h].hook_failed]
        if not live:
            return
        snap = self.run_deploy(SNAPSHOT_DEPLOY, live, f"{label} snapshot")
        touched = []
        for h in live:
            r, res = self.reports[h], snap.results[h]
            r.seconds["snapshot"] = snap.seconds
            if res.passed:
                touched.append(h)
            else:
                self._fail(r, res, "snapshot")
        if not touched:
            return
        before = self._benchmark(touched, label, "before") if self.options.speed_gate else None
        dep = self.runner(self.inventory, self.deploy, touched, f"{label} deploy")
        gate_hosts, broken = [], []
        for h in touched:
            r, res = self.reports[h], dep.results[h]
            r.seconds["deploy"] = dep.seconds
            if res.passed:
                r.status = res.status
                r.changed_ops = res.changed_ops
                gate_hosts.append(h)
            else:
                self._fail(r, res, "deploy")
                broken.append(h)
        passed = []
        if gate_hosts:
            held = before is not None
            gate = self.run_deploy(GATE_HELD_DEPLOY if held else GATE_DEPLOY, gate_hosts,
                                   f"{label} gate")
            for h in gate_hosts:
                r, res = self.reports[h], gate.results[h]
                r.seconds["gate"] = gate.seconds
                if not res.passed:
                    self._fail(r, res, "gate")
                    broken.append(h)
                else:
                    passed.append(h)
            if held and passed:
                slow = self._speed_gate(passed, before, label)
                broken += slow
                passed = [h for h in passed if h not in slow]
                if passed:
                    keep = self.run_deploy(CHECKPOINT_DEPLOY, passed, f"{label} checkpoint")
                    for h in list(passed):
                        if not keep.results[h].passed:
                            self._fail(self.reports[h], keep.results[h], "checkpoint")
        for h in list(broken):
            # A serving group fails as one: every member rolls back with the broken one.
            for m in self.groups.get(h, ()):
                if m in touched and m not in broken:
                    broken.append(m)
                    if m in passed:
                        passed.remove(m)
                    r = self.reports[m]
                    r.status = FAILED
                    r.why.append(f"rolled back with its serving group: member {h} failed")
        back = [h for h in broken if not self.reports[h].unreachable]
        if back:
            rb = self.run_deploy(RESTORE_DEPLOY, back, f"{label} rollback")
            for h in back:
                r, res = self.reports[h], rb.results[h]
                r.seconds["rollback"] = rb.seconds
                if res.passed and res.changed_ops:
                    r.status = ROLLED_BACK
                    r.why.append("rolled back to the last known-good unit, pins and patch; "
                                 "ready again")
                    passed.append(h)
                elif res.passed:
                    r.why.append("rollback: nothing had changed; ready")
                    passed.append(h)
                else:
                    r.unreachable = r.unreachable or res.status == "unreachable"
                    r.why.extend(f"rollback FAILED: {w}" for w in (res.why or ["failed"]))
        for h, why in self._hook("post", passed).items():
            r = self.reports[h]
            r.status = FAILED
            r.why.append(why)

    def _bench_folder(self, label: str, when: str) -> Path:
        if self.bench_dir is None:
            self.bench_dir = Path(tempfile.mkdtemp(prefix="specfleet-speed-gate-"))
        return self.bench_dir / label.replace(" ", "-").replace("/", "of") / when

    def _benchmark(self, hosts: list[str], label: str, when: str) -> dict[str, Any]:
        """The smoke benchmark of a batch's serving hosts (a serving group's rank 0 serves for
        the group) before the change; a host that serves nothing yet has nothing to compare."""
        serving = [h for h in hosts if self.groups.get(h, [h])[0] == h]
        say(f"{label}: benchmarking {', '.join(serving)} {when} the change (speed gate)")
        return bench.benchmark(self.inventory, serving, self._bench_folder(label, when),
                               runner=self.bench_runner or bench.run_with_data)

    def _speed_gate(self, passed: list[str], before: Mapping[str, Any], label: str) -> list[str]:
        """Benchmark the hosts that passed the readiness gate again; those below the fraction
        of their figures before the change fail (returned: the rollout rolls them back)."""
        serving = [h for h in passed if self.groups.get(h, [h])[0] == h]
        start = time.monotonic()
        verdicts = bench.speed_gate_step(
            self.inventory, serving, self._bench_folder(label, "after"),
            float(self.options.speed_gate), runner=self.bench_runner or bench.run_with_data,
            before=before)
        slow = []
        for h, verdict in verdicts.items():
            r = self.reports[h]
            r.seconds["speed"] = time.monotonic() - start
            if verdict.passed:
                say(f"{h}: speed gate passed: {verdict.why}")
                continue
            r.status = FAILED
            r.why.append(f"speed gate: {verdict.why}")
            slow.append(h)
        return slow

    def report(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "dry": self.dry,
            "batches": self.batches,
            "options": self.options.model_dump(),
            "stopped": self.stopped,
            "hosts": {h: asdict(r) for h, r in self.reports.items()},
        }


def run_on_control(command: str, env: Mapping[str, str]) -> Any:
    """A hook on this machine (gevent's subprocess: the locks' heartbeats go on meanwhile)."""
    from gevent import subprocess as gsubprocess

    return gsubprocess.run(["sh", "-c", command], env={**os.environ, **env},
                           capture_output=True, text=True, check=False)


def run_on_host(host: Any, command: str, env: Mapping[str, str]) -> tuple[bool, Any]:
    """A hook on the host, over its pyinfra connection (with the run's sudo settings)."""
    from pyinfra.api import QuoteString, StringCommand

    return host.run_shell_command(
        StringCommand("sh", "-c", QuoteString(command)), _env=dict(env),
        print_output=True, print_input=False,
    )


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def rollout_settings(sess: Any) -> dict[str, Any]:
    """Each host in play's ``rollout`` settings (only those hosts' settings are validated)."""
    return {h.name: settings_for_host(h).rollout for h in sess.inventory}


def serving_groups(sess: Any) -> dict[str, list[str]]:
    """Each member of a serving group in play -> the group's members in rank order. A group with
    a member outside the rollout is refused: a group deploys and restarts as one."""
    in_play = {h.name for h in sess.inventory}
    out: dict[str, list[str]] = {}
    for h in sess.inventory:
        g = settings_for_host(h).group
        if g is None:
            continue
        missing = [m for m in g.members if m not in in_play]
        if missing:
            raise SpecfleetError(
                f"serving group {g.name}: member(s) {', '.join(missing)} of {h.name}'s group are "
                "not in this rollout",
                host=h.name,
                fix="roll a serving group out whole: put all its members in the inventory and in "
                "--limit",
            )
        out[h.name] = list(g.members)
    return out


@dataclass
class RolloutFlags:
    """``specfleet rollout``'s own options: declared once, with their defaults and help, in
    ``specfleet.cli`` (``cli.flags("rollout", argv)``); None: the hosts' rollout settings."""

    inventory: str
    deploy: str
    canary: str | None
    order: str | None
    batch_size: int | None
    batch_percent: float | None
    max_fail_percent: float | None
    speed_gate: float | None
    no_prefetch: bool
    no_fanout: bool
    prefetch_deploy: str | None
    dry: bool
    json: bool
    pre_hook: str | None
    post_hook: str | None
    hook_on: str
    report: str | None
    connection: PyinfraOptions = field(default_factory=PyinfraOptions)


def main(args: RolloutFlags) -> int:
    """``specfleet rollout``: its options, pyinfra's connection options among them; the exit
    code (3: bad input, nothing touched)."""
    for path in (args.deploy, args.prefetch_deploy):
        if path and not Path(path).is_file():
            print(SpecfleetError(f"no deploy file {path}", fix="give a path to a pyinfra deploy "
                                 "file").render(), file=sys.stderr)
            return 3
    # Every step of this rollout is one owner of the hosts' run locks (SPECFLEET_RUN_ID).
    run_id = controller_run_id(os.environ)
    try:
        sess = Session(args.inventory, args.connection, dry=args.dry)
    except SpecfleetError as exc:
        print(exc.render(), file=sys.stderr)
        return 3
    except Exception as exc:  # noqa: BLE001 - a broken inventory file: its own words
        print(f"cannot load the inventory {args.inventory}: {type(exc).__name__}: {exc}\n  fix: "
              "check the inventory file with `pyinfra INVENTORY debug-inventory`",
              file=sys.stderr)
        return 3
    try:
        try:
            hosts = sess.in_play
            per_host = rollout_settings(sess)
            cli = {
                "canary": args.canary,
                "order": ([h.strip() for h in args.order.split(",") if h.strip()] or None)
                if args.order else None,
                "batch_size": args.batch_size,
                "batch_percent": args.batch_percent,
                "max_fail_percent": args.max_fail_percent,
                "prefetch_weights": False if args.no_prefetch else None,
                "fanout": False if args.no_fanout else None,
                "speed_gate": args.speed_gate,
            }
            options = resolve_options(per_host, cli)
            groups = serving_groups(sess)
            make_batches(hosts, options.order, options.canary, options.batch_size,
                         options.batch_percent, groups)
        except SpecfleetError as exc:
            print(exc.render(), file=sys.stderr)
            return 3
        say(f"run id {run_id}" + (" (dry: nothing changes)" if args.dry else ""))
        rollout = Rollout(
            args.inventory, os.path.abspath(args.deploy), hosts, options,
            os.path.abspath(args.prefetch_deploy) if args.prefetch_deploy else None,
            session=sess, run_id=run_id,
            hooks=Hooks(args.pre_hook, args.post_hook, args.hook_on), dry=args.dry,
            groups=groups,
        )
        with progress_view(rollout, quiet=args.json) as view:
            rollout.progress = view
            try:
                rc = rollout.run()
            except Interrupted as exc:  # in the fan-out prefetch: its cleanup ran first
                print(f"rollout: stopped by {exc.signal_name} in the prefetch; the fan-out was "
                      "cleaned up on every host, no deploy step ran", file=sys.stderr)
                rc = 128 + exc.signum
    finally:
        sess.close()  # releases every run lock this rollout holds
    table = summary_table(rollout.reports[h] for b in rollout.batches for h in b)
    if args.json:
        print(table, file=sys.stderr, flush=True)
        print(json.dumps({**rollout.report(), "exit_code": rc}, indent=2), flush=True)
    else:
        print(table, flush=True)
    if args.report:
        Path(args.report).write_text(json.dumps(rollout.report(), indent=2))
    return rc
