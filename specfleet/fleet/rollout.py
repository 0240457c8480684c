"""Roll a deploy across a fleet: canary, batches, a failure budget, readiness gates, rollback.

    python -m specfleet.fleet.rollout INVENTORY DEPLOY [--canary HOST] [--order h1,h2,...]
        [--batch-size N | --batch-percent P] [--max-fail-percent P]
        [--no-prefetch] [--no-fanout] [--prefetch-deploy FILE] [--report FILE.json]

pyinfra runs hosts in lock-step, or one by one in no set order, and its fail percentage is global.
This drives pyinfra's own CLI (``pyinfra -y --json INVENTORY FILE --limit ...``) once per step
and batch, with the hosts of one batch in parallel:

1. prefetch: the weights on every host before anything restarts: by default the fan-out of
   ``specfleet/fleet/fanout.py`` (once from upstream, then host to host), else a weights-only
   deploy;
2. per batch (the canary alone first, then batches of ``batch_size`` or ``batch_percent``):
   snapshot (``deploys/rollout_snapshot.py``: a rollback point on each host), the deploy, the
   readiness gate (``deploys/rollout_gate.py``), and for each host that failed the deploy or the
   gate, the rollback (``deploys/rollout_restore.py``), itself gated;
3. after each batch, its failures against the budget: any failure of the canary, or more than
   ``max_fail_percent`` of a batch's hosts, stops the rollout; later batches are never touched.

The batching and the budget are pure functions (``make_batches``, ``over_budget``), as is the
reading of pyinfra's results (``parse_step``). Defaults come from the ``rollout`` section of the
hosts' settings; flags override them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specfleet.core.errors import SpecfleetError
from specfleet.core.runlock import controller_run_id
from specfleet.core.settings import RolloutOptions, settings_for_host
from specfleet.fleet.fanout import Interrupted, run_prefetch
from specfleet.fleet.pyinfra_run import (
    FAILED,
    NOT_STARTED,
    ROLLED_BACK,
    HostStep,
    StepRun,
    deploy_path,
    run_pyinfra,
    say,
)

SNAPSHOT_DEPLOY = "rollout_snapshot.py"
GATE_DEPLOY = "rollout_gate.py"
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
             "prefetch_weights", "fanout")  # fmt: skip  (fanout_site is per host, by design)
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
    opts = Options(**values)
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
    return opts


def make_batches(
    hosts: Sequence[str],
    order: Sequence[str] | None = None,
    canary: str | None = None,
    batch_size: int | None = None,
    batch_percent: float | None = None,
) -> list[list[str]]:
    """The batches, in order: ``[[canary], batch, batch, ...]``.

    ``order`` lists hosts first (the others follow in inventory order); the canary defaults to the
    first host and goes alone. The rest go ``batch_size`` at a time, or ``batch_percent`` of the
    whole fleet at a time (rounded down, at least 1, as Ansible's ``serial: "30%"``), or one at a
    time when neither is set.
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
    first, rest = ordered[0], ordered[1:]
    size = batch_size_for(len(hosts), batch_size, batch_percent)
    return [[first]] + [rest[i : i + size] for i in range(0, len(rest), size)]


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
    unreachable: bool = False

    @property
    def failed(self) -> bool:
        return self.status in (FAILED, ROLLED_BACK)


def summary_table(reports: Iterable[HostReport]) -> str:
    rows = [["host", "batch", "result", *STEPS, "why"]]
    for r in reports:
        times = [f"{r.seconds[s]:.1f}s" if s in r.seconds else "-" for s in STEPS]
        why = "; ".join(r.why) if r.why else (", ".join(r.changed_ops) if r.changed_ops else "")
        label = "canary" if r.batch == 0 else str(r.batch)
        rows.append([r.host, label, r.status, *times, why])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)]
        out.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# I/O: pyinfra runs
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# The controller
# --------------------------------------------------------------------------------------------------


@dataclass
class Rollout:
    inventory: str
    deploy: str
    hosts: list[str]
    options: Options
    prefetch_deploy: str | None
    runner: Any = run_pyinfra
    reports: dict[str, HostReport] = field(default_factory=dict)
    batches: list[list[str]] = field(default_factory=list)
    stopped: str | None = None

    def run(self) -> int:
        o = self.options
        self.batches = make_batches(self.hosts, o.order, o.canary, o.batch_size, o.batch_percent)
        for i, batch in enumerate(self.batches):
            for h in batch:
                self.reports[h] = HostReport(h, i)
        plan = " | ".join(
            ("canary " if i == 0 else "") + ",".join(b) for i, b in enumerate(self.batches)
        )
        say(f"batches: {plan}; max fail {o.max_fail_percent:g}% per batch")

        step = self._prefetch([h for b in self.batches for h in b])
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
                    self.reports[h].why = ["not started: the rollout stopped"]
                break
            if failed:
                say(f"{label}: {failed} of {len(batch)} failed, within the budget")
            else:
                say(f"{label}: every host passed the readiness gate")

        print(summary_table(self.reports[h] for b in self.batches for h in b), flush=True)
        failed_hosts = [r.host for r in self.reports.values() if r.failed]
        if self.stopped:
            say(f"STOPPED: {self.stopped}")
            return 2
        if failed_hosts:
            say(f"finished with {len(failed_hosts)} failed within the budget: "
                f"{', '.join(failed_hosts)}")
            return 1
        say("finished: every host passed the readiness gate")
        return 0

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

    def _batch(self, batch: list[str], label: str) -> None:
        live = [h for h in batch if not self.reports[h].failed]
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
        if gate_hosts:
            gate = self.run_deploy(GATE_DEPLOY, gate_hosts, f"{label} gate")
            for h in gate_hosts:
                r, res = self.reports[h], gate.results[h]
                r.seconds["gate"] = gate.seconds
                if not res.passed:
                    self._fail(r, res, "gate")
                    broken.append(h)
        back = [h for h in broken if not self.reports[h].unreachable]
        if not back:
            return
        rb = self.run_deploy(RESTORE_DEPLOY, back, f"{label} rollback")
        for h in back:
            r, res = self.reports[h], rb.results[h]
            r.seconds["rollback"] = rb.seconds
            if res.passed and res.changed_ops:
                r.status = ROLLED_BACK
                r.why.append("rolled back to the kept unit, pins and patch; ready again")
            elif res.passed:
                r.why.append("rollback: nothing had changed; ready")
            else:
                r.unreachable = r.unreachable or res.status == "unreachable"
                r.why.extend(f"rollback FAILED: {w}" for w in (res.why or ["failed"]))

    def report(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "options": asdict(self.options),
            "stopped": self.stopped,
            "hosts": {h: asdict(r) for h, r in self.reports.items()},
        }


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def load_hosts(inventory: str) -> tuple[list[str], dict[str, Any]]:
    """The inventory's host names (in order) and each host's ``rollout`` settings."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory


    ctx_state.set(State())  # inventory files are exec'd as the CLI does, inside a state
    inv = make_inventory(inventory, cwd=os.getcwd())
    hosts, per_host = [], {}
    for host in inv:
        hosts.append(host.name)
        per_host[host.name] = settings_for_host(host).rollout
    return hosts, per_host


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m specfleet.fleet.rollout",
        description="Roll a pyinfra deploy across a fleet: canary, batches, failure budget, "
        "readiness gates, automatic rollback.",
    )
    p.add_argument("inventory")
    p.add_argument("deploy")
    p.add_argument("--canary", help="the host that goes first, alone (default: the first)")
    p.add_argument("--order", help="hosts in this order first, e.g. h3,h1 (others follow)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--batch-size", type=int)
    size.add_argument("--batch-percent", type=float, help="percent of the fleet per batch")
    p.add_argument("--max-fail-percent", type=float,
                   help="failures allowed per batch, in percent (more stops the rollout)")
    p.add_argument("--no-prefetch", action="store_true", help="skip the weights prefetch stage")
    p.add_argument("--no-fanout", action="store_true",
                   help="prefetch with the weights-only deploy on each host, not host to host")
    p.add_argument(
        "--prefetch-deploy",
        help="a weights-only deploy for the prefetch stage (default: the fan-out of "
        "specfleet/fleet/fanout.py; with --no-fanout, deploys/weights_only.py where it exists)",
    )
    p.add_argument("--report", help="write the per-host results as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (args.deploy, args.prefetch_deploy):
        if path and not Path(path).is_file():
            print(SpecfleetError(f"no deploy file {path}", fix="give a path to a pyinfra deploy "
                                 "file").render(), file=sys.stderr)
            return 3
    try:
        hosts, per_host = load_hosts(args.inventory)
        cli = {
            "canary": args.canary,
            "order": [h.strip() for h in args.order.split(",") if h.strip()] or None
            if args.order
            else None,
            "batch_size": args.batch_size,
            "batch_percent": args.batch_percent,
            "max_fail_percent": args.max_fail_percent,
            "prefetch_weights": False if args.no_prefetch else None,
            "fanout": False if args.no_fanout else None,
        }
        options = resolve_options(per_host, cli)
        make_batches(hosts, options.order, options.canary, options.batch_size,
                     options.batch_percent)
    except SpecfleetError as exc:
        print(exc.render(), file=sys.stderr)
        return 3
    except Exception as exc:  # a broken inventory file: pyinfra's own message, no traceback
        print(f"cannot load the inventory {args.inventory}: {exc}\n  fix: check the inventory "
              "file with `pyinfra INVENTORY debug-inventory`", file=sys.stderr)
        return 3
    # Every pyinfra run of this rollout is one owner of the hosts' run locks (SPECFLEET_RUN_ID):
    # a step re-enters a lock an earlier step of it left, instead of waiting for its lease.
    say(f"run id {controller_run_id(os.environ)}")
    rollout = Rollout(args.inventory, args.deploy, hosts, options, args.prefetch_deploy)
    try:
        rc = rollout.run()
    except Interrupted as exc:  # in the fan-out prefetch: its cleanup ran on every host first
        print(f"rollout: stopped by {exc.signal_name} in the prefetch; the fan-out was cleaned "
              "up on every host, no deploy step ran", file=sys.stderr)
        rc = 128 + exc.signum
    if args.report:
        Path(args.report).write_text(json.dumps(rollout.report(), indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
