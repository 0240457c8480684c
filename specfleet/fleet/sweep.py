"""``specfleet sweep INVENTORY --host H``: tune DFlash's speculative settings on one host.

    specfleet sweep INVENTORY --host H [--num-draft-tokens 4,8,16 | --ddtree-budgets 8,16,32,64,128]
        [--draft-window 2048,4096]
        [--draft-backends flashinfer,fa3] [--attention-backends triton,flashinfer]
        [--concurrency 1,4] [--requests N] [--max-tokens M] [--max-minutes 60]
        [--out DIR] [--allow-serving] [--write-group-data FILE] [--restore previous]

For each point of the grid: ``deploys/sweep_point.py`` (the normal deploy, ``kimi_k26``, with the
point's ``plan`` overrides given as pyinfra ``--data``: unit rendered from the launch plan,
restart, readiness gate) then the smoke benchmark, recorded in ``DIR/state.json`` keyed by the
point. Then the best point (highest output tokens/s at the top concurrency) is deployed again
through the same path, or with ``--restore previous`` the inventory's own plan.

- **Resumable**: the state file is written after every step; a sweep run again with the same
  grid does only the points not done yet (a point that was running when the sweep died is
  done again), then restores. Every deploy of the host is recorded as ``current`` first, so
  the host is always on a known plan: a grid point, the best point or the inventory's plan.
- **Bounded**: no point starts after ``--max-minutes``; the best so far is restored and the
  sweep says how many points are left for the next run (exit 1).
- **Not on a serving host**: a host whose SGLang unit is up is refused (nothing changes) unless
  ``--allow-serving``; a resumed sweep is allowed (it made the host serve).
- **The winner becomes settings**: prints the ``plan`` overrides for that arch's group data, and
  writes them as a group data file with ``--write-group-data``.
- **DDTree**: ``--ddtree-budgets`` sweeps ``plan.ddtree_budget`` (instead of the draft tokens,
  which the budget sets); a host whose installed SGLang has no DDTree design the table knows
  refuses it before anything changes (exit 3). A budget the host's plan refuses (its verify
  graphs cannot fit there) is dropped from the grid with a line saying so, not run again.
- **Plots**: ``DIR/report.html`` with PNGs (``specfleet.fleet.report``) when matplotlib is there.

Exit 0 (every point done, best restored); 1 (the host does not answer, checked before the first
point; points failed or left; no point could be measured; or the restore failed, said as such) or
3 (bad input, or refused): ``specfleet --help``'s codes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specfleet.core import bench as core
from specfleet.core.errors import SpecfleetError
from specfleet.core.runlock import controller_run_id
from specfleet.core.tables.ddtree_designs import DDTREE_REFUSED
from specfleet.fleet.bench import list_hosts, load_result, run_with_data
from specfleet.fleet.fleet_checks import unreachable_line
from specfleet.fleet.pyinfra_run import (
    PyinfraOptions,
    deploy_path,
)

try:  # matplotlib is optional on the control machine: the sweep runs without its report
    from specfleet.fleet import report
except ImportError as _exc:
    report = None
    NO_REPORT = f"{_exc} (pip install 'specfleet[plots]')"

POINT_DEPLOY = "sweep_point.py"
RESTORE_DEPLOY = "kimi_k26.py"
INVENTORY_PLAN = "inventory"  # ``current`` when the host runs the inventory's own plan
# A point that finds the host's run lock held is retried this often, this far apart.
LOCK_HELD = "another specfleet run holds this host"
LOCK_RETRIES, LOCK_WAIT_S = 3, 5.0


def say(text: str) -> None:
    print(f"sweep: {text}", file=sys.stderr, flush=True)


class State:
    """``DIR/state.json``: the grid, each point's status and result, and the host's plan now."""

    def __init__(self, path: Path, host: str, grid: list[dict[str, Any]]):
        self.path = path
        self.data: dict[str, Any] = {
            "host": host, "grid": grid, "current": None, "best": None, "finished": False,
            "points": {core.point_key(p): {"point": p, "status": "pending"} for p in grid},
        }
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except ValueError as exc:
                raise SpecfleetError(f"the sweep state {path} is not JSON ({exc})",
                                     fix="move it away to start the sweep over") from None
            if old.get("host") != host or old.get("grid") != grid:
                raise SpecfleetError(
                    f"the sweep state {path} holds another sweep (host {old.get('host')}, "
                    f"{len(old.get('grid') or [])} points)",
                    fix="give the same host and grid to resume it, or another --out",
                )
            self.data = old

    @property
    def points(self) -> dict[str, dict[str, Any]]:
        return self.data["points"]

    def resumed(self) -> bool:
        return any(p["status"] != "pending" for p in self.points.values())

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


@dataclass
class SweepFlags:
    """``specfleet sweep``'s own options: declared once, with their defaults and help, in
    ``specfleet.cli`` (``cli.flags("sweep", argv)`` gives them from a command line)."""

    inventory: str
    host: str
    num_draft_tokens: str | None
    ddtree_budgets: str
    draft_window: str
    draft_backends: str
    attention_backends: str
    concurrency: str
    requests: int
    max_tokens: int
    max_minutes: float
    out: str | None
    allow_serving: bool
    restore: str
    write_group_data: str | None
    no_report: bool
    connection: PyinfraOptions = field(default_factory=PyinfraOptions)


def grid_from_args(args: SweepFlags) -> list[dict[str, Any]]:
    spec: dict[str, list[Any]] = {}
    tokens = args.num_draft_tokens
    if tokens is None and not args.ddtree_budgets:
        tokens = "4,8,16"
    if tokens:
        spec["num_draft_tokens"] = core.parse_axis(tokens, integer=True)
    if args.ddtree_budgets:
        spec["ddtree_budget"] = core.parse_axis(args.ddtree_budgets, integer=True)
    if args.draft_window:
        spec["draft_window"] = core.parse_axis(args.draft_window, integer=True)
    if args.draft_backends:
        spec["draft_attention_backend"] = core.parse_axis(args.draft_backends, integer=False)
    if args.attention_backends:
        spec["attention_backend"] = core.parse_axis(args.attention_backends, integer=False)
    return core.parse_grid(spec)


class Sweep:
    def __init__(self, args: SweepFlags, grid: list[dict[str, Any]], out: Path):
        self.args = args
        self.out = out
        self.state = State(out / "state.json", args.host, grid)
        self.bench = {
            "concurrency": core.parse_axis(args.concurrency, integer=True),
            "requests": args.requests, "max_tokens": args.max_tokens,
            "fetch_to": str(out / "results"),
        }

    def deploy(self, deploy: str, plan: dict[str, Any], label: str, extra: dict[str, Any]):
        data: dict[str, Any] = {"specfleet": {"plan": plan}} if plan else {}
        data.update(extra)
        return run_with_data(self.args.inventory, str(deploy_path(deploy)), [self.args.host],
                             data, self.out / "logs" / f"{label}.log",
                             self.args.connection)

    def run_point(self, key: str, n: int, total: int, allow_serving: bool) -> None:
        """One point, recorded; a host that refuses (serving) stops the sweep (SpecfleetError)."""
        rec = self.state.points[key]
        say(f"point {n}/{total}: {key}")
        before = self.state.data["current"]
        rec.update(status="running", started=time.time())
        self.state.data["current"] = key
        self.state.save()
        result_name = "sweep-" + key.replace(",", "_").replace("=", "-")
        for attempt in range(LOCK_RETRIES + 1):
            run = self.deploy(
                POINT_DEPLOY, core.point_overrides(rec["point"]), result_name,
                {"specfleet_sweep": {"allow_serving": allow_serving},
                 "specfleet_bench": {**self.bench, "result": result_name}},
            )
            step = run.results[self.args.host]
            # The lock of a run killed a moment ago (this sweep's own, before a resume) is
            # taken over once its process is gone: not a failure of this point, so wait.
            if step.passed or not any(LOCK_HELD in w for w in step.why):
                break
            if attempt < LOCK_RETRIES:
                say(f"  {key}: the host's run lock is held ({step.why[0][:120]}); retrying")
                time.sleep(LOCK_WAIT_S)
        rec["seconds"] = round(run.seconds, 1)
        fetched = Path(self.bench["fetch_to"]) / f"{self.args.host}.json"
        result = load_result(fetched) if step.passed else None
        fetched.unlink(missing_ok=True)
        if step.passed and result is not None:
            rec.update(status="done", result=result)
            say(f"  {key}: {core.top_tps(result):.1f} tok/s, accept length "
                f"{result.get('accept_length')}")
        else:
            why = "; ".join(step.why) or f"pyinfra exited {run.rc}"
            refused = any("is serving" in w or "cannot be swept here" in w for w in step.why)
            if refused:
                rec.update(status="pending")
                self.state.data["current"] = before  # refused before anything changed
                self.state.save()
                fix = ("install a DDTree build there, or sweep without --ddtree-budgets"
                       if "cannot be swept here" in why
                       else "take the host out of service, or pass --allow-serving")
                raise SpecfleetError(f"{self.args.host}: {why}", fix=fix)
            if DDTREE_REFUSED in why:
                # The host's plan refused this budget before anything changed (its verify
                # graphs cannot fit, or the design cannot run it there): out of the grid.
                rec.update(status="dropped", why=why)
                self.state.data["current"] = before
                say(f"  {key}: dropped from the grid: {why}")
                self.state.save()
                return
            rec.update(status="failed", why=why)
            say(f"  {key}: FAILED: {why}")
        self.state.save()

    def restore(self, key: str | None) -> bool:
        """The host back on ``key``'s plan (None: the inventory's) through the deploy path."""
        plan = core.point_overrides(self.state.points[key]["point"]) if key else {}
        label = key or INVENTORY_PLAN
        say(f"restore: {'best point ' + key if key else 'the inventory plan'}")
        self.state.data["current"] = f"restoring {label}"
        self.state.save()
        run = self.deploy(RESTORE_DEPLOY, plan, "restore", {})
        step = run.results[self.args.host]
        if step.passed:
            self.state.data["current"] = label
        else:
            say(f"restore FAILED: {'; '.join(step.why)}")
        self.state.save()
        return step.passed

    def run(self) -> int:
        st = self.state
        # A resumed sweep made the host serve itself: no refusal for that.
        allow = self.args.allow_serving or st.resumed()
        todo = [k for k, r in st.points.items() if r["status"] not in ("done", "dropped")]
        done_before = len(st.points) - len(todo)
        if done_before:
            say(f"resuming: {done_before} of {len(st.points)} points done; {len(todo)} to go")
        deadline = time.monotonic() + 60 * self.args.max_minutes
        left: list[str] = []
        for i, key in enumerate(todo):
            if time.monotonic() > deadline:
                left = todo[i:]
                say(f"time budget of {self.args.max_minutes:g} min spent: {len(left)} points "
                    "left for the next run")
                break
            self.run_point(key, done_before + i + 1, len(st.points), allow)
            allow = True  # the sweep itself made it serve
        best = core.best_key(st.points)
        st.data["best"] = best
        restore_key = best if self.args.restore == "best" else None
        restored = self.restore(restore_key)
        st.data["finished"] = not left
        st.save()
        self.finish(best)
        failed = [k for k, r in st.points.items() if r["status"] == "failed"]
        label = f"best point {restore_key}" if restore_key else "the inventory plan"
        line, rc = core.sweep_ending(best, restored, label, len(failed), len(left))
        say(line)
        return rc

    def finish(self, best: str | None) -> None:
        rows = []
        for key, rec in self.state.points.items():
            result = rec.get("result")
            rows.append([key, rec["status"], _fmt(core.top_tps(result) if result else None),
                         _fmt((result or {}).get("accept_length"), ".2f"),
                         "BEST" if key == best else ""])
        print(core.text_table(["point", "status", "tok/s", "accept", ""], rows), flush=True)
        if report is None:
            say(f"no report: {NO_REPORT}")
        elif not self.args.no_report:
            say(f"report: {report.write_report(self.state.data, self.out)}")
        if best is None:
            return
        plan = core.point_overrides(self.state.points[best]["point"])
        arch = str((self.state.points[best]["result"].get("meta") or {}).get("arch") or "?")
        print(f"winning plan overrides for {arch} (group data `specfleet`):\n"
              + json.dumps({"plan": plan}, indent=2, sort_keys=True), flush=True)
        if self.args.write_group_data:
            # Its folder made; an existing file keeps all but the plan keys the sweep decides.
            path = Path(self.args.write_group_data)
            path.parent.mkdir(parents=True, exist_ok=True)
            existing = path.read_text() if path.is_file() else None
            path.write_text(core.group_data_merged(existing, arch, plan))
            say(f"{'updated' if existing else 'wrote'} {path}")


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def main(args: SweepFlags) -> int:
    """``specfleet sweep``: its options, pyinfra's connection options among them."""
    try:
        grid = grid_from_args(args)
        if args.max_minutes <= 0:
            raise SpecfleetError(f"--max-minutes {args.max_minutes} is not > 0",
                                 fix="give the sweep a time budget, e.g. --max-minutes 60")
        if args.host not in list_hosts(args.inventory, args.connection):
            raise SpecfleetError(f"no host {args.host} in {args.inventory}",
                                 fix="pass --host with a host name of the inventory")
        out = Path(args.out or f"sweep-{args.host}").resolve()
    except SpecfleetError as exc:
        print(exc.render(), file=sys.stderr)
        return 3
    unreachable = unreachable_line("sweep", args.inventory, args.connection, [args.host])
    if unreachable:  # checked before anything is made or changed: one line, exit 1
        print(unreachable, file=sys.stderr)
        return 1
    try:
        (out / "results").mkdir(parents=True, exist_ok=True)
        sweep = Sweep(args, grid, out)
    except SpecfleetError as exc:
        print(exc.render(), file=sys.stderr)
        return 3
    controller_run_id(os.environ)
    say(f"{args.host}: {len(grid)} points, state in {out / 'state.json'}")
    try:
        return sweep.run()
    except SpecfleetError as exc:
        print(exc.render(), file=sys.stderr)
        return 3
