#!/usr/bin/env python3
"""The DDTree budget sweep on the borrowed GPU (issue 51): the fork (DB-Guo/sglang-ddtree-dev at
514ea1f3e) with the lab pair of issue 49, budgets swept with SGLang's own acceptance.
``lab_ddtree.sh`` sets the fork's venv up from the parts (``build_parts.py`` here) and calls this
with that venv's Python.

Each server goes through ``bench/real_gpu/lab_run.py``'s ``serve`` (imported, not copied), the
project's own path: live facts (``pyinfra @local fact``), ``python -m specfleet.plan`` with the
point's settings (SGLang 0.5.13's set, ``plan`` overrides, the lab's ``extra_args``), the unit
and environment file rendered by ``operations.serving``, the server started from the unit's
ExecStart (a stand-in ``systemctl``, named as one: the machine has no systemd), the readiness
gate, the server stopped after its checks; a call's budget guard (``NEED_S``: a server is started
only where the call has that much left, so no call ends with one half done); the servers an
earlier call left running ended first (``lab_run.reap_leftovers``). Its check here
(``ddtree_check``): a warm-up, then greedy ``/generate`` of the lab prompts
(``bench/real_gpu/lab/reference.json``) each alone and the 8 in one batch, ``REPEATS`` times
(timed: output tokens/s at batch 1 and 8, the median), SGLang's acceptance length (``meta_info``
spec_accept_length of the prompts alone, as lab_run reads it, and ``/server_info``'s
``avg_spec_accept_length`` through ``specfleet/hostside/bench_client.py``), and the outputs
compared with P0's (``lab_run.compare``, alone and batched).

The servers, in order of value (a run cut short still has the lossless checks first):

  P0  plain (no speculation), triton ........... the reference output
  T4, T16 of the main drafter (triton) ........ lossless at a budget <= 7 and one above 8
  F4, F16  DDTree with fa3 ..................... what fa3 does with the tree: the planner refuses
                                                 it (plan.extra_args included), so the plan is
                                                 DFLASH on fa3 and the DDTree flags are put over
                                                 its argv (``experiment``), recorded as such
  D0  DFLASH without DDTree, triton, main ...... the baseline (block 8)
  the sweep, weak drafter then main ............ DDTree at each of BUDGETS, triton (the main
                                                 drafter's T4 and T16 already done above)

The sweep is ``specfleet sweep``'s own (``specfleet/fleet/sweep.py``), one per drafter: its grid
(``grid_from_args`` of ``--ddtree-budgets`` and ``--attention-backends triton``), its point keys
and ``plan`` overrides (``core.point_key``, ``core.point_overrides``: the plan of each point is
what the sweep would deploy on a host), its resumable state (``State``, ``$RG_WORK/sweep-<drafter>/
state.json``, copied into the record), its point loop (``Sweep.run``: resume, the
``--max-minutes`` deadline, here the call's budget less ``NEED_S``; the best point; the table)
and its outcomes (``done``; ``dropped`` where the plan refuses the budget with
``DDTREE_REFUSED``). Its ``run_point`` (a pyinfra deploy of ``sweep_point.py`` over SSH, then
``bench_client.py`` on the host) and ``restore`` are replaced (``LabSweep``): there is no host
to deploy here, so each point is a ``serve`` as above, its result written in the bench client's
form (``levels`` at concurrency 1 and 8, ``accept_length``), and nothing is restored (each
point's server is stopped after it). The sweep's report (``specfleet.fleet.report``) is left to
``plot_ddtree.py`` here, from the record.

Everything goes to ``$RG_WORK/ddtree-record.json``: ``servers`` (lab_run's entries: plan, unit,
gate, outputs, timings, log tail; ``refused`` where the plan refused the point), ``sweeps``
(each drafter's sweep state) and ``summary`` (recomputed at each save). A second call resumes
(a server with outputs is kept; a sweep point done is not run again). ``RG_ONLY=P0,T4-lab-drafter``
limits the servers.

``RG_DRY=1`` with no venv (``VENV_STOCK`` unset; the CPU rehearsal here): the fork's tree laid in
from the shared tarball (tests/harness/sources.py), its fact read by the real collector, the H200
capture of ``tests/fixtures/nvidia/h200x2`` as the GPU facts, every point planned in this process,
the plans in ``$RG_WORK/ddtree-plans.json``, and the same point loop and record with each server
stopped before it starts. ``RG_DRY=1`` under ``lab_ddtree.sh`` (``bench/real_gpu/rehearse.sh``):
lab_run's own dry path (live facts from the venv, plan, rendered unit, no server).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench" / "real_gpu"
for _p in (ROOT, BENCH):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
RECORD_NAME = "ddtree-record.json"
os.environ["RG_RECORD"] = RECORD_NAME  # lab_run's RECORD is this file (read at its import)

import lab_run  # noqa: E402  (bench/real_gpu/lab_run.py: serve, compare, generate)
from drive import OUT, log  # noqa: E402  (bench/real_gpu/drive.py)

from specfleet.core import bench as core  # noqa: E402
from specfleet.core.errors import SpecfleetError  # noqa: E402
from specfleet.core.tables.ddtree_designs import DDTREE_REFUSED, FORK_DFLASH_SWITCH  # noqa: E402
from specfleet.fleet import sweep  # noqa: E402
from specfleet.hostside import bench_client  # noqa: E402

RECORD = lab_run.RECORD
RECORD.setdefault("sweeps", {})
# From the smallest the fork accepts (2: a tree of top-k budget - 1 = 1; the settings refuse 1) to
# far above the block size (8), five servers a drafter.
BUDGETS = (2, 4, 8, 16, 64)
LOSSLESS_BUDGETS = (4, 16)  # one at or below 7, one above 8
MAIN, WEAK = "lab-drafter", "lab-drafter-weak"
DRAFTERS = (MAIN, WEAK)
REFERENCE = "P0"
BATCH = 8  # the batch of the lab prompts (all 8 in one request)
REPEATS = 3  # timed passes of every prompt alone and the batch; tokens/s is their median
# The lab's settings (bench/real_gpu/settings/lab-*.json, run 5's findings included: piecewise
# CUDA graphs off, the KV pool bounded), for the fork's set.
# No reasoning parser: the fork (0.5.13's scheduler) refuses to start one whose think_end_token
# is not one token of the tokenizer (constrained/reasoner_grammar_backend.py), and the lab's
# tokenizer has no '</think>' (the first DDTree call, 2026-12-08: every server exited at start).
LAB = {"--random-seed": "1234", "--sampling-backend": "pytorch", "--cuda-graph-max-bs": "8",
       "--disable-piecewise-cuda-graph": True, "--max-total-tokens": "65536",
       "--reasoning-parser": None}
SETTINGS = {"sglang": {"version": "0.5.13"}}
SPEC_FLAGS = ("--speculative-algorithm", "--speculative-draft-model-path",
              "--speculative-num-draft-tokens", "--speculative-draft-attention-backend",
              "--speculative-dflash-draft-window-size")
# Seconds a server needs, start to stop, with this check (run 5 on the H200: 55-125 s start to
# stop; here a warm-up and REPEATS passes, about 15 s more): no server starts with less left.
NEED_S = 150
# The lab pair's size (issue 49: a 4M-parameter pair), rounded up: the plan's weights check.
LAB_WEIGHTS_BYTES = 64 * 1024**2
# A drafter trained at block 8 (issue 49's pair; the plan reads its config.json on the machine).
LAB_DRAFTER_CONFIG = {"dflash_config": {"block_size": 8}, "num_hidden_layers": 1}
SWEEP_HOST = "lab-h200"


def dry() -> bool:
    return bool(os.environ.get("RG_DRY"))


def outline_only() -> bool:
    """The CPU rehearsal without the fork's venv: plans in this process, no live facts."""
    return dry() and not os.environ.get("VENV_STOCK")


# --------------------------------------------------------------------------------------------------
# The points
# --------------------------------------------------------------------------------------------------


def spec(tag: str, what: str, drafter: str | None, plan: dict, extra: dict | None = None,
         experiment: list[str] | None = None) -> dict:
    """A server as ``lab_run.serve`` takes it."""
    out = {"tag": tag, "what": what, "settings": SETTINGS, "venv": "fork", "drafter": drafter,
           "plan": plan, "extra": dict(extra if extra is not None else LAB),
           "checks": ["ddtree"], "need_s": NEED_S}
    if experiment:
        out["experiment"] = experiment
    return out


def sweep_flags(drafter: str, minutes: float) -> sweep.SweepFlags:
    """``specfleet sweep INVENTORY --host lab-h200:<drafter> --ddtree-budgets 2,...,64
    --attention-backends triton --concurrency 1,8``, as its flags."""
    return sweep.SweepFlags(
        inventory="(none: the lab machine, no inventory)", host=f"{SWEEP_HOST}:{drafter}",
        num_draft_tokens=None, ddtree_budgets=",".join(map(str, BUDGETS)), draft_window="",
        draft_backends="", attention_backends="triton", concurrency=f"1,{BATCH}", requests=0,
        max_tokens=48, max_minutes=minutes if minutes > 0 else -1.0,  # <= 0: none starts
        out=str(OUT / f"sweep-{drafter}"), allow_serving=True, restore="best",
        write_group_data=None, no_report=True)


def sweep_spec(drafter: str, point: dict) -> dict:
    """The server of one sweep point: the sweep's own plan overrides for it."""
    budget = point["ddtree_budget"]
    return spec(f"T{budget}-{drafter}", f"DDTree budget {budget}, {point['attention_backend']}, "
                f"{drafter} (sweep point {core.point_key(point)})", drafter,
                core.point_overrides(point))


def first_specs() -> list[dict]:
    """The servers before the sweep, in order of value."""
    grid = sweep.grid_from_args(sweep_flags(MAIN, 1))
    lossless = [sweep_spec(MAIN, p) for p in grid if p["ddtree_budget"] in LOSSLESS_BUDGETS]
    fa3 = [spec(f"F{b}", f"DDTree budget {b} on fa3 (experiment: the plan refuses it)", MAIN,
                {"attention_backend": "fa3"},
                experiment=[FORK_DFLASH_SWITCH.switch_flag, FORK_DFLASH_SWITCH.budget_flag, str(b)])
           for b in LOSSLESS_BUDGETS]
    return ([spec(REFERENCE, "plain (no speculation), triton: the reference", None,
                  {"attention_backend": "triton"}, {**LAB, **{f: None for f in SPEC_FLAGS}})]
            + lossless + fa3
            + [spec("D0", "DFLASH without DDTree, triton, main drafter (block 8)", MAIN,
                    {"attention_backend": "triton"})])


def all_specs() -> list[dict]:
    out = first_specs()
    seen = {s["tag"] for s in out}
    for drafter in (WEAK, MAIN):
        for point in sweep.grid_from_args(sweep_flags(drafter, 1)):
            s = sweep_spec(drafter, point)
            if s["tag"] not in seen:
                out.append(s)
                seen.add(s["tag"])
    return out


# --------------------------------------------------------------------------------------------------
# The check each server serves, and its result in the sweep's form
# --------------------------------------------------------------------------------------------------


def speeds(g: dict) -> dict:
    """Output tokens/s of one pass: the prompts alone (their tokens over the sum of their request
    times) and the batch of 8 (its tokens over its request's time)."""
    singles = [r for r in g.get("single") or [] if r.get("output_ids") and r.get("seconds")]
    out: dict = {"1": None, str(BATCH): None}
    if singles:
        out["1"] = round(sum(len(r["output_ids"]) for r in singles)
                         / sum(r["seconds"] for r in singles), 3)
    for rows, secs in zip(g.get("batches") or [], g.get("batch_seconds") or [], strict=False):
        if len(rows) == BATCH and secs and all(r.get("output_ids") for r in rows):
            out[str(BATCH)] = round(sum(len(r["output_ids"]) for r in rows) / secs, 3)
    return out


def output_ids(g: dict) -> list:
    return ([r.get("output_ids") for r in g.get("single") or []]
            + [[r.get("output_ids") for r in rows] for rows in g.get("batches") or []])


def ddtree_check(spec: dict, entry: dict, lab: dict, server) -> None:
    """A warm-up (every prompt alone and the batch, 8 tokens: the first requests' compiles are
    not timed), then REPEATS timed passes; SGLang's acceptance as it reports it."""
    warm = lab_run.generate({**lab, "prompts": [{**p, "max_new_tokens": 8}
                                                for p in lab["prompts"]]})
    entry["warmup_errors"] = [r["error"] for r in warm["single"] if r.get("error")][:3]
    runs = [lab_run.generate(lab) for _ in range(REPEATS)]
    entry["generate"] = runs[0]
    entry["timed"] = [speeds(g) for g in runs]
    entry["repeats_identical"] = all(output_ids(g) == output_ids(runs[0]) for g in runs[1:])
    acc, source = bench_client.accept_length("http://127.0.0.1:30000", None)
    entry["server_info"] = {"accept_length": acc, "source": source,
                            "note": "cumulative since start: the warm-up and every pass"}
    log(f"{spec['tag']}: acceptance {runs[0].get('acceptance_length')} (server_info {acc}), "
        f"tok/s {median_speeds(entry)}")


lab_run.EXTRA_CHECKS["ddtree"] = ddtree_check


def median_speeds(entry: dict) -> dict:
    timed = entry.get("timed") or []
    out = {}
    for k in ("1", str(BATCH)):
        vals = [t[k] for t in timed if t.get(k)]
        out[k] = round(statistics.median(vals), 3) if vals else None
    return out


def result_of(entry: dict) -> dict:
    """A served point's measurement in the form ``bench_client.py`` writes (what the sweep's
    state, best point and report read)."""
    g = entry.get("generate") or {}
    tps = median_speeds(entry)
    levels = [{"concurrency": int(k), "completed": BATCH if v else 0,
               "output_tokens_per_s": v or 0.0, "repeats": len(entry.get("timed") or [])}
              for k, v in tps.items()]
    return {"client": "bench/real_gpu/ddtree/lab_ddtree.py: greedy /generate of the lab prompts, "
                      f"alone and {BATCH} in one request, median of {REPEATS} passes",
            "meta": {"arch": "sm90", "server": "sglang", "tag": entry.get("tag")},
            "levels": levels, "accept_length": g.get("acceptance_length"),
            "accept_length_source": "meta_info spec_accept_length, the prompts alone",
            "server_info_accept_length": (entry.get("server_info") or {}).get("accept_length")}


def point_status(entry: dict | None) -> dict:
    """The sweep point's record from its server's entry (lab_run's)."""
    entry = entry or {}
    if entry.get("refused"):
        why = entry["refused"].strip().splitlines()
        line = next((ln for ln in why if DDTREE_REFUSED in ln), why[-1] if why else "")
        if DDTREE_REFUSED in entry["refused"]:
            return {"status": "dropped", "why": line[:600]}
        return {"status": "failed", "why": f"refused by the plan: {line[:600]}"}
    if entry.get("checks_done") and entry.get("generate"):
        return {"status": "done", "result": result_of(entry)}
    if entry.get("skipped"):
        return {"status": "pending", "why": entry["skipped"]}
    if entry.get("dry"):
        return {"status": "pending", "why": "dry rehearsal: planned, no server"}
    return {"status": "failed", "why": entry.get("error") or (
        "the server never answered" if entry.get("healthy") is False else "no outputs")}


# --------------------------------------------------------------------------------------------------
# The sweep's loop, on this machine
# --------------------------------------------------------------------------------------------------


class LabSweep(sweep.Sweep):
    """``specfleet sweep`` for one drafter: its grid, State, point loop (``Sweep.run``), best
    point and table; ``run_point`` serves the point here, ``restore`` has nothing to restore."""

    def __init__(self, drafter: str, serve, minutes: float):
        self.drafter, self.serve = drafter, serve
        args = sweep_flags(drafter, minutes)
        out = Path(args.out)
        (out / "results").mkdir(parents=True, exist_ok=True)
        kept = RECORD["sweeps"].get(drafter)
        if kept and not (out / "state.json").is_file():  # the record alone came to this machine
            (out / "state.json").write_text(json.dumps(kept, indent=1))
        super().__init__(args, sweep.grid_from_args(args), out)
        for rec in self.state.points.values():  # served before the sweep (T4, T16 of the main)
            done = point_status(RECORD["servers"].get(sweep_spec(drafter, rec["point"])["tag"]))
            if rec["status"] != "done" and done["status"] == "done":
                rec.update(done, server=sweep_spec(drafter, rec["point"])["tag"])
        self.save()

    def save(self) -> None:
        self.state.save()
        RECORD["sweeps"][self.drafter] = self.state.data
        save()

    def run_point(self, key: str, n: int, total: int, allow_serving: bool) -> None:
        rec = self.state.points[key]
        s = sweep_spec(self.drafter, rec["point"])
        sweep.say(f"point {n}/{total}: {key} ({s['tag']})")
        rec.update(status="running", started=time.time(), server=s["tag"])
        self.state.data["current"] = key
        self.save()
        entry = self.serve(s)
        self.state.data["current"] = None  # its server was stopped (or never started)
        rec.pop("why", None)
        rec.update(point_status(entry))
        rec["seconds"] = (entry or {}).get("server_s")
        if rec["status"] == "done":
            sweep.say(f"  {key}: {core.top_tps(rec['result']):.1f} tok/s at batch {BATCH}, "
                      f"accept length {rec['result'].get('accept_length')}")
        else:
            sweep.say(f"  {key}: {rec['status']}: {rec.get('why')}")
        self.save()

    def restore(self, key: str | None) -> bool:
        sweep.say("restore: nothing to restore here (each point's server was stopped after it)")
        self.state.data["current"] = None
        self.save()
        return True

    def run(self) -> int:
        rc = super().run()
        self.save()
        return rc


# --------------------------------------------------------------------------------------------------
# The record's summary
# --------------------------------------------------------------------------------------------------


def summary() -> dict:
    servers = RECORD.get("servers") or {}
    rows: dict = {}
    for s in all_specs():
        tag = s["tag"]
        e = servers.get(tag)
        st = point_status(e) if e else {"status": "not reached"}
        cmp = lab_run.compare(REFERENCE, tag) if tag != REFERENCE else {}
        rows[tag] = {
            "what": s["what"], "drafter": s["drafter"],
            "budget": s["plan"].get("ddtree_budget") or (int(s["experiment"][-1])
                                                         if s.get("experiment") else None),
            "backend": s["plan"].get("attention_backend"), "experiment": bool(s.get("experiment")),
            "status": "refused" if (e or {}).get("refused") else st["status"],
            "why": st.get("why"),
            "accept_length": ((e or {}).get("generate") or {}).get("acceptance_length"),
            "server_info_accept_length": ((e or {}).get("server_info") or {}).get("accept_length"),
            "tokens_per_s": median_speeds(e or {}),
            "repeats_identical": (e or {}).get("repeats_identical"),
            "identical_to_reference": cmp.get("identical"),
            "differing": len(cmp.get("differing") or []) if cmp.get("identical") is False else 0,
            "first_differences": [(r["where"], r["position"], r["first_difference"])
                                  for r in (cmp.get("differing") or [])][:8],
            "ready_s": (e or {}).get("ready_s"), "server_s": (e or {}).get("server_s")}
    lossless = {t: rows[t]["identical_to_reference"] for t in rows
                if t.startswith("F") or t in {f"T{b}-{MAIN}" for b in LOSSLESS_BUDGETS}}
    sweeps = {d: {"best": st.get("best"), "finished": st.get("finished"),
                  "points": {k: p["status"] for k, p in st["points"].items()}}
              for d, st in (RECORD.get("sweeps") or {}).items()}
    return {"commit": RECORD.get("commit"), "dry": dry(), "reference": REFERENCE,
            "lossless": lossless, "servers": rows, "sweeps": sweeps,
            "not_done": [f"{t}: {r['status']}" + (f" ({r['why']})" if r.get("why") else "")
                         for t, r in rows.items() if r["status"] != "done"]}


def save() -> None:
    RECORD["summary"] = summary()
    lab_run.save()


# --------------------------------------------------------------------------------------------------
# The dry rehearsal without the venv: plans in this process
# --------------------------------------------------------------------------------------------------

FACTS: dict = {}


def dry_facts() -> dict:
    from tests.harness.sources import ddtree_fork_site
    from tests.unit.test_facts_sglang import collect
    from tests.unit.test_plan import host_facts

    return {**host_facts("h200x2", sglang=None),
            "facts.sglang.SGLangInstall": collect(ddtree_fork_site())}


def plan_point(point: dict, facts: dict) -> dict:
    """A point planned in this process (``point["plan"]``: plan overrides, extra_args in it)."""
    from specfleet.core.plan import PlanError, make_plan
    from specfleet.core.settings import settings_from_dict

    settings = settings_from_dict({**SETTINGS, "plan": point["plan"]})
    try:
        plan = make_plan(facts, settings, LAB_DRAFTER_CONFIG, weights_bytes=LAB_WEIGHTS_BYTES)
    except PlanError as exc:
        return {**point, "refused": exc.render()}
    reasons = {r.topic: f"{r.choice}: {r.why}" for r in plan.reasons if r.topic.startswith(
        ("ddtree", "attention-backend"))}
    argv = list(plan.argv)
    if point.get("experiment"):  # not a plan: the flags the experiment forces over its argv
        argv = lab_run.override_argv(argv, point["experiment"])
    return {**point, "argv": argv, "env": plan.env, "reasons": reasons}


def dry_serve(s: dict) -> dict:
    """``serve`` for the rehearsal without the venv: the point planned here, no server."""
    if not FACTS:
        FACTS.update(dry_facts())
    p = plan_point({"tag": s["tag"], "plan": {**s["plan"], "extra_args": s["extra"]},
                    "experiment": s.get("experiment")}, FACTS)
    entry = {"what": s["what"], "drafter": s["drafter"], "plan_overrides": s["plan"], "dry": True}
    if s.get("experiment"):
        entry["experiment"] = s["experiment"]
    if "refused" in p:
        entry["refused"] = p["refused"]
    else:
        entry["plan"] = {k: p[k] for k in ("argv", "env", "reasons")}
    RECORD["servers"][s["tag"]] = entry
    save()
    return entry


def describe(entry: dict) -> str:
    if entry.get("refused"):
        return "refused: " + entry["refused"].strip().splitlines()[0][:150]
    argv = (entry.get("plan") or {}).get("argv_run") or (entry.get("plan") or {}).get("argv")
    if not argv:
        return entry.get("skipped") or entry.get("error") or "no plan"
    att = argv[argv.index("--attention-backend") + 1] if "--attention-backend" in argv else "?"
    tree = ("DDTree" if FORK_DFLASH_SWITCH.switch_flag in argv
            else "DFLASH" if "--speculative-algorithm" in argv else "plain")
    return f"{att} {tree}" + (" (experiment, not planned)" if entry.get("experiment") else "")


# --------------------------------------------------------------------------------------------------


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, os.environ.get("RG_ONLY", "").split(",")))
    if outline_only():
        serve_one = dry_serve
        minutes = 1e6
        log("lab_ddtree: RG_DRY without the fork's venv: plans in this process (h200x2 capture, "
            "the fork's tree of the shared tarball), no server")
    else:
        lab_run.prepare()
        lab = lab_run.load_lab()
        # The prompts alone and the 8 in one batch (not the stale-mask layouts of lab_run).
        lab.update(layouts=[list(range(len(lab["prompts"])))[:BATCH]], predicted=[None])
        RECORD["lab"] = {"prompts": len(lab["prompts"]), "layouts": lab["layouts"],
                         "reference_acceptance": lab["acceptance"], "repeats": REPEATS}
        venvs = {"fork": os.environ.get("VENV_STOCK")}  # lab_run.sh's venv: here the fork's

        def serve_one(s: dict) -> dict | None:
            return lab_run.serve(s, lab, venvs)

        minutes = (lab_run.left() - NEED_S) / 60

    def serve_only(s: dict) -> dict | None:
        if only and s["tag"] not in only:
            return {"skipped": "not in RG_ONLY"}
        try:
            return serve_one(s)
        except Exception as exc:  # one server's failure is recorded; the next still runs
            RECORD["servers"].setdefault(s["tag"], {})["error"] = repr(exc)
            log(f"{s['tag']}: {exc!r}")
            return RECORD["servers"][s["tag"]]

    save()
    for s in first_specs():
        serve_only(s)
        save()
    rcs = {}
    for drafter in (WEAK, MAIN):
        if not outline_only():
            minutes = (lab_run.left() - NEED_S) / 60  # the sweep's --max-minutes: the call's
        try:
            rcs[drafter] = LabSweep(drafter, serve_only, minutes).run()
        except SpecfleetError as exc:  # its state holds another grid: said, the other still runs
            RECORD.setdefault("sweep_errors", {})[drafter] = exc.render()
            log(f"sweep {drafter}: {exc.render()}")
            rcs[drafter] = 3
    save()
    if outline_only():
        plans = [{"tag": t, **e.get("plan", {}), **{k: e[k] for k in ("refused", "experiment")
                                                     if k in e}}
                 for t, e in RECORD["servers"].items()]
        (OUT / "ddtree-plans.json").write_text(json.dumps(plans, indent=1))
        for t, e in RECORD["servers"].items():
            print(f"lab_ddtree: {t:<22} {describe(e)}")
        print(f"lab_ddtree: {len(plans)} plans in {OUT / 'ddtree-plans.json'}")
    s = RECORD["summary"]
    log("summary: " + json.dumps({"lossless vs P0": s["lossless"], "sweep rc": rcs,
                                  "not done": len(s["not_done"])}))
    log(f"record: {lab_run.RECORD_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
