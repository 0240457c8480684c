"""``specfleet bench INVENTORY``: the smoke benchmark on every host, then the fleet's table.

    specfleet bench INVENTORY [--limit HOST ...] [--concurrency 1,4] [--requests N]
        [--max-tokens M] [--out DIR] [--slow-fraction 0.7]

Runs ``deploys/bench_kimi.py`` (under each host's run lock), downloads each host's result to
``DIR/<host>.json``, writes ``DIR/summary.json`` and prints one row per host: output tokens/s per
concurrency, time to first token, the acceptance length the server reports, and a verdict; a
host below ``--slow-fraction`` of its arch's median is flagged SLOW. Exit 0 when every host has
a result and none is flagged, 1 otherwise, 3 on bad input.

The rollout's speed gate is ``speed_gate_step`` here: benchmark a batch, then
``specfleet.core.bench.speed_gate`` on each host's new result against its previous one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specfleet.core import bench as core
from specfleet.core.errors import SpecfleetError
from specfleet.core.runlock import controller_run_id
from specfleet.fleet.fleet_checks import unreachable_line
from specfleet.fleet.pyinfra_run import (
    HostStep,
    PyinfraOptions,
    deploy_path,
    load_inventory,
    run_pyinfra,
    select_hosts,
)

BENCH_DEPLOY = "bench_kimi.py"


def say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


@dataclass
class DataRun:
    rc: int
    seconds: float
    results: dict[str, HostStep]
    log: str


def run_with_data(inventory: str, deploy: str, hosts: Sequence[str],
                  data: Mapping[str, Any], log_path: Path | None = None,
                  connection: PyinfraOptions | None = None) -> DataRun:
    """One deploy file on ``hosts`` in this process (pyinfra's API, ``pyinfra_run``), with
    ``data`` as pyinfra's own ``--data`` override layer: ``settings_for_host`` merges it over the
    inventory's data key by key, so ``{"specfleet": {"plan": {...}}}`` changes only the plan.
    Each host's result and failure reason come from pyinfra's objects; ``log_path`` gets them as
    lines (pyinfra's own log goes to stderr)."""
    # pyinfra's --data takes a Python literal (JSON's true/false/null would stay a string).
    base = connection or PyinfraOptions()
    options = dataclasses.replace(
        base, data=[*base.data, *(f"{key}={value!r}" for key, value in data.items())])
    start = time.monotonic()
    step = run_pyinfra(inventory, deploy, list(hosts), Path(deploy).stem, options)
    seconds = time.monotonic() - start
    log = "\n".join(
        f"{h}: {r.status}" + "".join(f"\n  {line}" for line in r.why)
        for h, r in step.results.items()
    )
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(log + "\n")
    rc = 0 if all(r.passed for r in step.results.values()) else 1
    return DataRun(rc, seconds, dict(step.results), log)


def load_result(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def speed_gate_for(new: Path, fraction: float = core.GATE_FRACTION) -> core.GateVerdict:
    """The speed gate on one host's fetched result: its figures against the host's result before
    it, which the client copied into it as ``previous`` (None on a first benchmark: passes)."""
    result = load_result(new)
    return core.speed_gate(result, (result or {}).get("previous"), fraction)


def benchmark(inventory: str, hosts: Sequence[str], out: Path,
              data: Mapping[str, Any] | None = None,
              runner=run_with_data) -> dict[str, dict[str, Any] | None]:
    """Benchmark ``hosts`` (under their run locks, ``deploys/bench_kimi.py``): each host's result
    fetched to ``out/<host>.json``; a host whose benchmark failed gets ``{"error": why}``."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for h in hosts:
        (out / f"{h}.json").unlink(missing_ok=True)
    opts = {**dict((data or {}).get("specfleet_bench") or {}), "fetch_to": str(out),
            "result": "latest"}
    run = runner(inventory, str(deploy_path(BENCH_DEPLOY)), list(hosts),
                 {"specfleet_bench": opts}, out / "pyinfra.log")
    results: dict[str, dict[str, Any] | None] = {}
    for h in hosts:
        step = run.results.get(h)
        if step is not None and not step.passed:
            results[h] = {"error": "benchmark failed: " + "; ".join(step.why), "levels": []}
        else:
            results[h] = load_result(out / f"{h}.json")
    return results


def speed_gate_step(inventory: str, hosts: Sequence[str], out: Path,
                    fraction: float = core.GATE_FRACTION,
                    data: Mapping[str, Any] | None = None,
                    runner=run_with_data,
                    before: Mapping[str, Mapping[str, Any] | None] | None = None,
                    ) -> dict[str, core.GateVerdict]:
    """THE ROLLOUT'S SPEED GATE (``rollout --speed-gate F``): after a batch's readiness gate,
    benchmark its hosts and keep each host's figures within ``fraction`` of ``before`` (the
    same benchmark, taken by the rollout before it changed the batch); without ``before``, of the
    host's previous result (``previous`` in its result file). A host with nothing to compare
    with passes, saying so. ``data``: ``specfleet_bench`` options (concurrency...)."""
    results = benchmark(inventory, hosts, out, data, runner)
    verdicts = {}
    for h in hosts:
        new = results.get(h)
        if before is not None:
            earlier = before.get(h)
            if earlier is None or earlier.get("error"):
                why = (earlier or {}).get("error") or "no result"
                verdict = core.speed_gate(new, None, fraction)
                verdicts[h] = core.GateVerdict(verdict.passed, verdict.why + (
                    f" (the benchmark before the change gave nothing to compare: {why})"))
                continue
        else:
            earlier = (new or {}).get("previous")
        verdicts[h] = core.speed_gate(new, earlier, fraction)
    return verdicts


def list_hosts(inventory: str, connection: PyinfraOptions | None = None) -> list[str]:
    """The hosts in play: the inventory's, or those ``--limit`` names."""
    connection = connection or PyinfraOptions()
    inv = load_inventory(inventory, connection.override_data())
    groups = {name: [h.name for h in members] for name, members in inv.groups.items()}
    return select_hosts([h.name for h in inv], groups, connection.limit)


@dataclass
class BenchFlags:
    """``specfleet bench``'s own options: declared once, with their defaults and help, in
    ``specfleet.cli`` (``cli.flags("bench", argv)`` gives them from a command line)."""

    inventory: str
    concurrency: str
    requests: int
    max_tokens: int
    out: str
    slow_fraction: float
    connection: PyinfraOptions = dataclasses.field(default_factory=PyinfraOptions)


def main(args: BenchFlags) -> int:
    """``specfleet bench``: its options, pyinfra's connection options among them."""
    connection = args.connection
    try:
        concurrency = core.parse_axis(args.concurrency, integer=True)
        if not concurrency or min(concurrency) < 1:
            raise SpecfleetError(f"--concurrency {args.concurrency!r} needs levels >= 1",
                                 fix="pass e.g. --concurrency 1,4")
        if not 0 < args.slow_fraction < 1:
            raise SpecfleetError(f"--slow-fraction {args.slow_fraction} is not in (0, 1)",
                                 fix="pass e.g. --slow-fraction 0.7")
        hosts = list_hosts(args.inventory, connection)
    except SpecfleetError as exc:
        print(exc.render(), file=sys.stderr)
        return 3
    # Every host answers before the first benchmark, or nothing runs: one line, exit 1.
    unreachable = unreachable_line("bench", args.inventory, connection, hosts)
    if unreachable:
        print(unreachable, file=sys.stderr)
        return 1
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for h in hosts:  # a host that gives no result this time must not show an old one
        (out / f"{h}.json").unlink(missing_ok=True)
    controller_run_id(os.environ)
    say(f"{len(hosts)} hosts: concurrency {','.join(map(str, concurrency))}, results in {out}")
    data = {"specfleet_bench": {"concurrency": concurrency, "requests": args.requests,
                                "max_tokens": args.max_tokens, "fetch_to": str(out)}}
    run = run_with_data(args.inventory, str(deploy_path(BENCH_DEPLOY)), hosts, data,
                        out / "pyinfra.log", connection)
    results = {h: load_result(out / f"{h}.json") for h in hosts}
    for h, step in run.results.items():
        if not step.passed and results.get(h) is None:
            results[h] = {"error": "; ".join(step.why) or step.status, "levels": []}
    rows = core.fleet_rows(results, args.slow_fraction)
    (out / "summary.json").write_text(json.dumps(
        {"results": results, "rows": [r.__dict__ for r in rows]}, indent=1, default=str))
    print(core.fleet_table(rows), flush=True)
    bad = [r.host for r in rows if r.error or r.flag]
    if bad:
        say(f"{len(bad)} of {len(rows)} hosts need a look: {', '.join(bad)}")
        return 1
    return 0
