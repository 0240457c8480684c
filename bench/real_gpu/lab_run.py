#!/usr/bin/env python3
"""The lab pair on the GPU (issue 50), on the borrowed H200 machine; ``lab_run.sh`` sets the venvs
up and calls it. Each server goes through the project's own path as run 4's ``drive.py`` (whose
pieces this reuses): live facts (``pyinfra @local fact``), ``python -m specfleet.plan`` with a
settings file of ``bench/real_gpu/settings/lab-*.json``, the unit and environment file rendered by
``operations.serving``, the server started from the unit's ExecStart + EnvironmentFile (a stand-in
``systemctl``, named as one, where there is no systemd), the repository's readiness gate. Then the
checks each server serves (one server start serves several checks).

The trained pair (issue 49): ``models/lab-target`` (DeepseekV3, MLA + MoE, the real tokenizer:
no ``--skip-tokenizer-init``), drafters ``models/lab-drafter`` (main), ``lab-drafter-weak``,
``lab-drafter-rope50k``; ``lab/reference.json``, ``lab/stale_mask_prediction.json``,
``lab/probe.json``. The plan's model paths (``/srv/models/<repo>/current``) are links that
``lab_run.sh`` and this script point at the pair (the drafter's link is set before each server).

Servers, in order of value (CUDA graphs on, ``--cuda-graph-max-bs 8``, ``--sampling-backend
pytorch``, greedy; each prompt alone and the batches of 6-8):

  S1 stock 0.5.11 plain fa3 ........ 1 power check; reference of 2; stop-string reference
  S2 stock DFLASH v1 fa3, main ..... 2 identical to S1, SGLang's acceptance vs the reference's
  S3 stock DFLASH v1 fa3, weak ..... 2 the same for the weak drafter
  S4 port fixed, plain triton ...... 3 the port's reference; stop-string reference
  S5 port stale-mask DFLASH triton . 3 differs from S4 where predicted; 4 gate (probe) fails
  S6 port fixed DFLASH triton ...... 3 identical to S4; 4 gate (probe) passes; 5 stop string
  S7 port fixed, graphs off ........ 3 identical to S4; 5 cap at --context-length 128, idle, log
  S8 stock DFLASH v1, rope50k ...... 6 acceptance lost
  S9 the RoPE patch, rope50k ....... 6 acceptance back (stock + the patched models/dflash.py
                                     where the port build has it, else the fixed port)
  S10 port unfixed (before #29) .... informational, only with RG_ALL=1 or RG_ONLY=S10

Everything goes to ``$RG_WORK/record.json`` as it happens, and ``$RG_WORK/summary.json`` (the
verdicts, recomputed from the record at each save); a second call on the warm machine resumes
(a server with outputs is kept). ``RG_DRY=1``: facts, plans and units only (no server), a
rehearsal where no GPU is. ``RG_ONLY=S9,S2``: only those servers, in that order.
``RG_RECORD``: the record's file name under ``$RG_WORK`` (``bench/real_gpu/ddtree/lab_ddtree.py``,
which drives its servers through ``serve`` here, keeps ``ddtree-record.json``).

reference.json (bench/real_gpu/lab/reference.py): ``max_new_tokens``, ``prompts[i].input_ids``,
``.expected_output``, ``.drafters[NAME].spec_accept_length``, ``mean_spec_accept_length[NAME]``;
stale_mask_prediction.json (lab/stale_mask.py): ``layouts`` (``batch6``, ``batch8``: lists of
prompt indices) and ``drafters["lab-drafter"][LAYOUT].prompts_with_other_tokens``; probe.json:
the readiness gate's ``--probe``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import drive  # noqa: E402  (bench/real_gpu/drive.py: run 4's pieces)
from drive import HERE, OUT, STANDIN_DIR, log

RUN = os.environ.get("RG_RUN", "run5")
LAB = Path(os.environ.get("RG_LAB_DIR", HERE / "lab"))
MODELS = Path(os.environ.get("RG_LAB_MODELS", HERE / "models"))
# The plan's model paths (the settings' defaults); the rehearsal puts the links elsewhere.
LINK_ROOT = Path(os.environ.get("RG_LINK_ROOT", "/srv/models"))
TARGET_LINK = LINK_ROOT / "moonshotai--Kimi-K2.6" / "current"
DRAFTER_LINK = LINK_ROOT / "z-lab--Kimi-K2.6-DFlash" / "current"
BUDGET_S = float(os.environ.get("REAL_GPU_BUDGET_S", "540"))
T0 = time.monotonic()
ACCEPT_TOL = 0.05
# Seconds a server is estimated to need, start to stop, with its checks (run 4: ready after 72 s
# plain and 146 s DFLASH with graphs to bs 48; bs 8 captures fewer graphs): one is started only
# where the call's budget has that much left, so that no call ends with a server half done.
NEED_S = 170
CTX_SMALL = 128
GRAPHS_OFF = {"--disable-cuda-graph": True}
RECORD_FILE = OUT / os.environ.get("RG_RECORD", "record.json")
RECORD: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "servers": {}}
if RECORD_FILE.is_file():
    RECORD = json.loads(RECORD_FILE.read_text())
    RECORD.setdefault("servers", {})
    RECORD.setdefault("resumed", []).append(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def left() -> float:
    return BUDGET_S - (time.monotonic() - T0)


# --------------------------------------------------------------------------------------------------
# The lab's files
# --------------------------------------------------------------------------------------------------


def _first(d: dict, *keys, default=None):
    for k in keys:
        if k in d:
            return d[k]
    return default


def load_lab() -> dict:
    """reference.json, stale_mask_prediction.json and probe.json as bench/real_gpu/lab writes
    them (reference.py, stale_mask.py)."""
    ref = json.loads((LAB / "reference.json").read_text())
    max_new = int(ref.get("max_new_tokens", 48))
    prompts = []
    for i, p in enumerate(ref["prompts"]):
        if "input_ids" not in p or "expected_output" not in p:
            raise SystemExit(f"{LAB}/reference.json prompt {i}: no input_ids / expected_output")
        prompts.append({"input_ids": p["input_ids"], "expected": p["expected_output"],
                        "kind": p.get("kind"), "max_new_tokens": max_new, "ignore_eos": True})
    acc = {}
    for name, mean in (ref.get("mean_spec_accept_length") or {}).items():
        acc[name] = {"mean": mean, "per_prompt": [
            ((p.get("drafters") or {}).get(name) or {}).get("spec_accept_length")
            for p in ref["prompts"]]}
    pred_file = LAB / "stale_mask_prediction.json"
    pred = json.loads(pred_file.read_text()) if pred_file.is_file() else {}
    main_pred = (pred.get("drafters") or {}).get("lab-drafter") or {}
    layouts, predicted = [], []
    lay = pred.get("layouts") or {
        "batch6": [list(range(k, min(k + 6, len(prompts)))) for k in range(0, len(prompts), 6)],
        "batch8": [list(range(k, min(k + 8, len(prompts)))) for k in range(0, len(prompts), 8)]}
    for lname in ("batch6", "batch8"):
        other = set((main_pred.get(lname) or {}).get("prompts_with_other_tokens", []))
        for layout in lay.get(lname, []):
            layouts.append(list(layout))
            predicted.append([j for j, i in enumerate(layout) if i in other]
                             if lname in main_pred else None)
    alone = main_pred.get("alone") or {}
    probe = json.loads((LAB / "probe.json").read_text())
    return {"prompts": prompts, "acceptance": acc, "layouts": layouts, "predicted": predicted,
            "alone_predicted": sorted(alone.get("prompts_with_other_tokens", [])),
            "alone_predicted_acceptance": sorted(alone.get("prompts_with_other_acceptance", [])),
            "prediction_file": pred_file.is_file(), "probe": probe, "vocab": vocab()}


def vocab() -> dict[int, str]:
    tok = json.loads((MODELS / "lab-target" / "tokenizer.json").read_text())
    words = {v: k for k, v in tok.get("model", {}).get("vocab", {}).items()}
    for a in tok.get("added_tokens", []):
        words[a["id"]] = a["content"]
    return words


def stop_case(lab: dict) -> dict | None:
    """A one-token stop string that falls inside the first accepted block: the output token at
    position 4 (the prefill gives position 0, the first verify the next 8), a symbol that does
    not occur earlier in that output."""
    for i, p in enumerate(lab["prompts"]):
        exp = p["expected"]
        for k in (4, 5, 3, 6):
            if k < len(exp) and exp[k] not in exp[:k]:
                word = lab["vocab"].get(exp[k], "")
                if len(word) == 1 and not word.isspace():
                    return {"prompt": i, "position": k, "token": exp[k], "stop": word}
    return None


# --------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------


def _one(res: dict | list) -> dict:
    if not isinstance(res, dict):
        return {"error": f"unexpected answer {str(res)[:200]}"}
    meta = res.get("meta_info") or {}
    keep = ("completion_tokens", "prompt_tokens", "spec_verify_ct", "spec_accept_length",
            "spec_accepted_drafts", "spec_accept_rate", "finish_reason", "spec_accept_histogram")
    return {"output_ids": res.get("output_ids"), "text": res.get("text"),
            "meta": {k: meta[k] for k in keep if k in meta}, "error": res.get("error")}


def sp(p: dict, **kw) -> dict:
    out = {"temperature": 0, "max_new_tokens": p["max_new_tokens"], "ignore_eos": p["ignore_eos"]}
    out.update(kw)
    return {k: v for k, v in out.items() if v is not None}


def generate(lab: dict, only_fitting: int | None = None) -> dict:
    """Every prompt alone, then each batch layout as one request."""
    prompts = lab["prompts"]

    def fits(p):
        return only_fitting is None or len(p["input_ids"]) + p["max_new_tokens"] < only_fitting

    out: dict = {"single": [], "batches": [], "batch_seconds": []}
    for p in prompts:
        if not fits(p):
            out["single"].append({"skipped": f"does not fit --context-length {only_fitting}"})
            continue
        t = time.perf_counter()
        res = drive.post("/generate", {"input_ids": p["input_ids"], "sampling_params": sp(p)})
        out["single"].append({**_one(res), "seconds": round(time.perf_counter() - t, 4)})
    for layout in lab["layouts"]:
        ps = [prompts[i] for i in layout]
        if not all(fits(p) for p in ps):
            out["batches"].append([{"skipped": "does not fit"}] * len(ps))
            out["batch_seconds"].append(None)
            continue
        t = time.perf_counter()
        res = drive.post("/generate", {"input_ids": [p["input_ids"] for p in ps],
                                       "sampling_params": [sp(p) for p in ps]})
        out["batch_seconds"].append(round(time.perf_counter() - t, 4))  # the request, wall
        out["batches"].append([_one(r) for r in res] if isinstance(res, list)
                              else [{"error": str(res)[:500]}] * len(ps))
    out["acceptance_length"] = acceptance(out["single"])
    return out


def acceptance(rows: list[dict]) -> float | None:
    """SGLang's own ``meta_info`` spec_accept_length (completion_tokens / spec_verify_ct) of each
    prompt alone, averaged over the prompts as reference.json's mean_spec_accept_length is."""
    vals = []
    for r in rows:
        m = r.get("meta") or {}
        if m.get("spec_verify_ct"):
            vals.append(m.get("spec_accept_length") or m["completion_tokens"] / m["spec_verify_ct"])
    return round(sum(vals) / len(vals), 4) if vals else None


def stop_check(lab: dict) -> dict:
    case = stop_case(lab)
    if case is None:
        return {"skipped": "no prompt has a one-token symbol at positions 3-6 not seen before it"}
    p = lab["prompts"][case["prompt"]]
    res = drive.post("/generate", {"input_ids": p["input_ids"],
                                   "sampling_params": sp(p, ignore_eos=None, stop=[case["stop"]])})
    return {**case, **_one(res)}


def cap_check(lab: dict, server: drive.Server) -> dict:
    """Prompts run to the cap of --context-length 128 (no max_new_tokens: SGLang's scheduler
    stops them at the context), alone and 8 at once; then idle (0.5.11 checks for leaked KV
    slots when idle and raises), then the server must still answer."""
    prompts = lab["prompts"]
    out: dict = {"context_length": CTX_SMALL}
    p = prompts[0]
    out["alone"] = _one(drive.post("/generate", {
        "input_ids": p["input_ids"], "sampling_params": {"temperature": 0, "ignore_eos": True}}))
    batch = [q["input_ids"] for q in prompts[:8]]
    res = drive.post("/generate", {"input_ids": batch,
                                   "sampling_params": {"temperature": 0, "ignore_eos": True}})
    out["batch"] = [_one(r) for r in res] if isinstance(res, list) else [{"error": str(res)[:500]}]
    time.sleep(15)  # idle: the scheduler's idle self-check runs
    out["alive_after_idle"] = server.proc is None or server.proc.poll() is None
    out["health_after_idle"] = drive.wait_healthy(20, server)
    after = drive.post("/generate", {"input_ids": p["input_ids"],
                                     "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    out["answers_after_idle"] = bool(after.get("output_ids")) if isinstance(after, dict) else False
    text = server.journal()
    out["leak_lines"] = [ln for ln in text.splitlines() if "memory leak detected" in ln][:20]
    out["lengths"] = [len(p["input_ids"]) + len(out["alone"].get("output_ids") or [])]
    return out


# --------------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------------


def point_links(drafter: str | None) -> None:
    for link, target in ((TARGET_LINK, MODELS / "lab-target"),
                         (DRAFTER_LINK, MODELS / (drafter or "lab-drafter"))):
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target.resolve())


def weights_bytes(drafter: str | None) -> int:
    total = 0
    for d in ("lab-target", drafter or "lab-drafter"):
        total += sum(f.stat().st_size for f in (MODELS / d).glob("*.safetensors"))
    return max(total, 64 * 1024**2)


def settings_for(spec: dict) -> Path:
    """The settings file the plan reads: ``settings/<spec.settings>.json`` (or ``spec.settings``
    itself, a dict), ``spec.plan`` merged into its ``plan``, ``spec.extra`` into its extra_args."""
    settings = spec["settings"]
    data = (json.loads(json.dumps(settings)) if isinstance(settings, dict)
            else json.loads((HERE / "settings" / f"{settings}.json").read_text()))
    data.setdefault("plan", {}).update(spec.get("plan", {}))
    data["plan"].setdefault("extra_args", {}).update(spec.get("extra", {}))
    path = OUT / "plans" / f"{spec['tag']}-settings-in.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def serve(spec: dict, lab: dict, venvs: dict) -> dict | None:
    tag = spec["tag"]
    done = RECORD["servers"].get(tag) or {}
    if done.get("checks_done"):
        log(f"{tag}: done in an earlier call")
        return done
    venv = venvs.get(spec["venv"])
    entry: dict = {"what": spec["what"], "venv": spec["venv"], "drafter": spec.get("drafter"),
                   "settings_file": (f"bench/real_gpu/settings/{spec['settings']}.json"
                                     if isinstance(spec["settings"], str) else None),
                   "extra_args": spec.get("extra", {}), "checks": spec["checks"]}
    if spec.get("plan"):
        entry["plan_overrides"] = spec["plan"]
    if spec.get("experiment"):
        entry["experiment"] = spec["experiment"]
    RECORD["servers"][tag] = entry
    if venv is None or not Path(venv).exists() and not os.environ.get("RG_DRY"):
        entry["skipped"] = (spec["what"] if spec["venv"] == "none"
                            else f"no venv for {spec['venv']} ({venv})")
        save()
        return None
    need = spec.get("need_s", NEED_S)
    ready_s = min(spec.get("ready_s", 200), left() - 20)
    if left() < need and not os.environ.get("RG_DRY"):
        entry["skipped"] = (f"out of time: {left():.0f} s left of the call's budget, about "
                            f"{need} s needed (the next call runs it)")
        log(f"{tag}: {entry['skipped']}")
        save()
        return None
    log(f"{tag}: facts, plan, unit ({spec['what']})")
    point_links(spec.get("drafter"))
    facts, raw = drive.live_facts(f"{venv}/bin/python")
    entry["facts"] = facts
    (OUT / "plans" / f"{tag}-facts-raw.txt").write_text(raw)
    drafter_cfg = MODELS / (spec.get("drafter") or "lab-drafter") / "config.json"
    plan = drive.make_plan(settings_for(spec), venv, facts, tag, drafter_config=drafter_cfg,
                           weights_bytes=weights_bytes(spec.get("drafter")))
    plan["install"] = facts.get("facts.sglang.SGLangInstall")
    entry["plan"] = {k: plan.get(k) for k in ("argv", "env", "reasons", "error", "command")}
    save()
    if "argv" not in plan:
        entry["refused"] = str(plan.get("error") or "no plan")[-2000:]
        log(f"{tag}: no plan: {plan.get('error')}")
        save()
        return entry
    if spec.get("experiment"):  # flags the plan does not give, put over its argv: not a plan
        plan["argv"] = override_argv(plan["argv"], spec["experiment"])
        entry["plan"]["argv_run"] = plan["argv"]
    rendered = drive.render_unit(plan)
    entry["unit"], entry["env_file"] = rendered["unit"], rendered["env"]
    if os.environ.get("RG_DRY"):
        entry["dry"] = True
        save()
        return entry
    server = drive.Server(rendered, tag)
    t = time.monotonic()
    server.start()
    entry["started_how"] = server.how
    log(f"{tag}: {server.how}")
    gate_file = drive.ROOT / "specfleet" / "hostside" / "readiness_gate.py"
    entry["gates"] = {"health": drive.gate(rendered["unit_name"], ready_s, gate_file)}
    entry["ready_s"] = round(time.monotonic() - t, 1)
    log(f"{tag}: gate (health) rc {entry['gates']['health']['rc']} after {entry['ready_s']} s")
    entry["main_pid_cmdline"] = drive.main_pid_cmdline(rendered["unit_name"])
    healthy = drive.wait_healthy(max(5.0, ready_s - (time.monotonic() - t)), server)
    entry["healthy"] = healthy
    save()
    try:
        if healthy:
            run_checks(spec, entry, lab, server, rendered)
            entry["checks_done"] = True
    finally:
        server.stop()
        text = server.journal()
        entry["log_lines_about_changes"] = drive.changed_lines(text)
        entry["leak_lines"] = [ln for ln in text.splitlines() if "memory leak detected" in ln][:20]
        entry["log_tail"] = text[-4000:]
        entry["server_s"] = round(time.monotonic() - t, 1)
        save()
    return entry


def override_argv(argv: list[str], words: list[str]) -> list[str]:
    """``argv`` with each ``--flag [value]`` of ``words`` put in place of the same flag's."""
    out, i = list(argv), 0
    while i < len(words):
        flag = words[i]
        n = 2 if i + 1 < len(words) and not words[i + 1].startswith("--") else 1
        if flag in out:
            j = out.index(flag)
            k = j + 2 if j + 1 < len(out) and not out[j + 1].startswith("--") else j + 1
            del out[j:k]
        out += words[i:i + n]
        i += n
    return out


# More checks by name (``spec.checks``), each ``fn(spec, entry, lab, server)``, run after the
# ones below, in the order the spec names them: lab_ddtree.py adds its timed requests.
EXTRA_CHECKS: dict = {}


def run_checks(spec: dict, entry: dict, lab: dict, server: drive.Server, rendered: dict) -> None:
    tag = spec["tag"]
    checks = spec["checks"]
    if "probe" in checks:
        gate_file = drive.ROOT / "specfleet" / "hostside" / "readiness_gate.py"
        entry["gates"]["probe"] = drive.gate(rendered["unit_name"], 120, gate_file, lab["probe"])
        log(f"{tag}: gate (probe) rc {entry['gates']['probe']['rc']}")
        save()
    if "gen" in checks:
        entry["generate"] = generate(lab, CTX_SMALL if "--context-length" in spec.get("extra", {})
                                     else None)
        log(f"{tag}: generated; SGLang's acceptance {entry['generate']['acceptance_length']}")
        save()
    if "stop" in checks:
        entry["stop"] = stop_check(lab)
        log(f"{tag}: stop string {entry['stop'].get('stop')!r}: {entry['stop'].get('output_ids')}")
        save()
    if "cap" in checks:
        entry["cap"] = cap_check(lab, server)
        log(f"{tag}: cap: alive {entry['cap']['alive_after_idle']}, "
            f"leak lines {len(entry['cap']['leak_lines'])}")
        save()
    for name in checks:
        if name in EXTRA_CHECKS:
            EXTRA_CHECKS[name](spec, entry, lab, server)
            save()


# --------------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------------


def outputs(tag: str) -> dict | None:
    return (RECORD["servers"].get(tag) or {}).get("generate")


def compare(a: str, b: str) -> dict:
    ga, gb = outputs(a), outputs(b)
    res: dict = {"servers": [a, b]}
    if not ga or not gb:
        res["identical"] = None
        res["not_compared"] = "a server has no outputs"
        return res
    rows = []
    pairs = [("alone", i, x, y) for i, (x, y) in enumerate(zip(ga["single"], gb["single"],
                                                                strict=False))]
    for li, (ba, bb) in enumerate(zip(ga["batches"], gb["batches"], strict=False)):
        pairs += [(f"batch{li}", j, x, y) for j, (x, y) in enumerate(zip(ba, bb, strict=False))]
    for kind, pos, x, y in pairs:
        if x.get("skipped") or y.get("skipped"):
            continue
        xo, yo = x.get("output_ids") or [], y.get("output_ids") or []
        first = next((j for j, (p, q) in enumerate(zip(xo, yo, strict=False)) if p != q), None)
        if first is None and len(xo) != len(yo):
            first = min(len(xo), len(yo))
        rows.append({"where": kind, "position": pos, "identical": bool(xo) and xo == yo,
                     "first_difference": first})
    res["rows"] = len(rows)
    res["identical"] = bool(rows) and all(r["identical"] for r in rows)
    res["differing"] = [r for r in rows if not r["identical"]]
    res["acceptance_length"] = {a: ga.get("acceptance_length"), b: gb.get("acceptance_length")}
    return res


def power(lab: dict) -> dict:
    g = outputs("S1")
    if not g:
        return {"verdict": "not run"}
    match, total = 0, 0
    nexts: dict[int, set] = {}
    transitions = 0
    for p, r in zip(lab["prompts"], g["single"], strict=False):
        got = r.get("output_ids") or []
        total += 1
        match += got == p["expected"]
        seq = p["input_ids"][-1:] + got
        for a, b in zip(seq, seq[1:], strict=False):
            nexts.setdefault(a, set()).add(b)
            transitions += 1
    conflicts = sum(1 for s in nexts.values() if len(s) > 1)
    batched = [(r.get("output_ids") == lab["prompts"][i]["expected"])
               for layout, rows in zip(lab["layouts"], g["batches"], strict=False)
               for i, r in zip(layout, rows, strict=False)]
    ok = total > 0 and match == total and conflicts > 0
    why = []
    if match != total:
        why.append(f"{total - match} of {total} outputs differ from reference.json's")
    if conflicts == 0:
        why.append("the next token is a function of the previous token alone (0 conflicts)")
    return {"verdict": "power" if ok else "no power", "why_not": why,
            "outputs_as_reference": f"{match}/{total}",
            "batched_outputs_as_reference": f"{sum(batched)}/{len(batched)}",
            "transitions": transitions,
            "conflicts": conflicts, "previous_tokens_seen": len(nexts)}


def acceptance_vs_reference(tag: str, drafter: str, lab: dict) -> dict:
    g = outputs(tag)
    ref = (lab["acceptance"].get(drafter) or {}).get("mean")
    got = g.get("acceptance_length") if g else None
    out = {"server": tag, "drafter": drafter, "sglang": got, "reference": ref}
    if got is None or ref is None:
        out["within_0.05"] = None
    else:
        out["difference"] = round(got - ref, 4)
        out["within_0.05"] = abs(got - ref) <= ACCEPT_TOL
    if g:
        got_pp = [(r.get("meta") or {}).get("spec_accept_length") for r in g["single"]]
        ref_pp = (lab["acceptance"].get(drafter) or {}).get("per_prompt") or []
        out["per_prompt_sglang"] = got_pp
        out["per_prompt_reference"] = ref_pp
        out["prompts_equal_to_reference"] = sum(
            1 for x, y in zip(got_pp, ref_pp, strict=False)
            if x is not None and y is not None and abs(x - y) < 1e-3)
    return out


def stale_vs_prediction(lab: dict) -> dict:
    cmp = compare("S4", "S5")
    if cmp.get("identical") is None:
        return {"verdict": "not run", **cmp}
    seen: dict[str, set] = {}
    for r in cmp["differing"]:
        seen.setdefault(r["where"], set()).add(r["position"])
    rows = []
    for li, (layout, pred) in enumerate(zip(lab["layouts"], lab["predicted"], strict=False)):
        got = sorted(seen.get(f"batch{li}", set()))
        rows.append({"batch": layout, "predicted_differ": pred, "differ": got,
                     "as_predicted": None if pred is None else got == pred})
    alone = sorted(seen.get("alone", set()))
    checked = [r["as_predicted"] for r in rows if r["as_predicted"] is not None]
    verdict = ("as predicted" if checked and all(checked) and alone == lab["alone_predicted"]
               else "NOT as predicted" if checked else "no prediction to check")
    acc = {t: (outputs(t) or {}).get("acceptance_length") for t in ("S5", "S6")}
    return {"verdict": verdict, "batches": rows, "alone_differ": alone,
            "alone_predicted": lab["alone_predicted"], "acceptance_alone": acc,
            "servers": cmp["servers"], "identical": cmp["identical"]}


def stop_verdict(ref: str, tag: str) -> dict:
    a = (RECORD["servers"].get(ref) or {}).get("stop")
    b = (RECORD["servers"].get(tag) or {}).get("stop")
    if not a or not b or a.get("skipped") or b.get("skipped"):
        return {"servers": [ref, tag], "verdict": "not run"}
    same = a.get("output_ids") == b.get("output_ids") and a.get("text") == b.get("text")
    return {"servers": [ref, tag], "stop": a.get("stop"), "position": a.get("position"),
            "plain": {"output_ids": a.get("output_ids"), "text": a.get("text")},
            "speculative": {"output_ids": b.get("output_ids"), "text": b.get("text"),
                            "meta": b.get("meta")},
            "verdict": "stops where plain stops" if same else "DIFFERENT"}


def gate_probe_verdict() -> dict:
    """The gate's --probe on S5 (should fail) against S6 and S2 (should pass). A failing S5 is
    evidence only while the builds that should pass do pass: run 5's gate failed all three on
    the answers (the target's chat template), which says nothing about the stale mask."""
    gates: dict = {}
    for tag, want in (("S5", "fail"), ("S6", "pass"), ("S2", "pass")):
        g = ((RECORD["servers"].get(tag) or {}).get("gates") or {}).get("probe")
        if g:
            got = "pass" if g["rc"] == 0 else "fail"
            why = next((ln.strip() for ln in (g.get("output") or "").splitlines()
                        if "FAILED" in ln), None)
            gates[tag] = {"rc": g["rc"], "expected": want, "got": got,
                          "as_expected": got == want, "why": why[:400] if why else None}
    should_pass = [v for v in gates.values() if v["expected"] == "pass"]
    should_fail = [v for v in gates.values() if v["expected"] == "fail"]
    if not should_pass or not should_fail:
        verdict = "not run"
    elif any(v["got"] == "fail" for v in should_pass):
        verdict = ("INCONCLUSIVE: the gate failed builds that should pass, so its failing the "
                   "stale build shows nothing")
    elif all(v["as_expected"] for v in gates.values()):
        verdict = "passes the fixed builds, fails the stale one"
    else:
        verdict = "NOT as expected: the gate passed the stale build"
    return {"verdict": verdict, **gates}


def rope_verdict(lab: dict) -> dict:
    """S8: the rope50k drafter on stock 0.5.11, which runs it at base 1e6: its acceptance should
    fall from the reference at the trained base (50000) to the reference at 1e6 (where
    reference.json has ``lab-drafter-rope50k@1e6``); S9 (the patch) should bring it back."""
    lost = acceptance_vs_reference("S8", "lab-drafter-rope50k", lab)
    at_1e6 = (acceptance_vs_reference("S8", "lab-drafter-rope50k@1e6", lab)
              if "lab-drafter-rope50k@1e6" in lab["acceptance"] else None)
    back = acceptance_vs_reference("S9", "lab-drafter-rope50k", lab)
    lost_ok = lost.get("within_0.05") is False and (at_1e6 is None or at_1e6.get("within_0.05"))
    if lost["sglang"] is None:
        verdict = "not run"
    elif back["sglang"] is None:
        verdict = ("lost on stock as the reference at 1e6 says; the patched server not run"
                   if lost_ok else "stock NOT as expected; the patched server not run")
    else:
        verdict = ("lost on stock, back with the patch"
                   if lost_ok and back.get("within_0.05") else "NOT as expected")
    return {"stock": lost, "stock_vs_reference_at_1e6": at_1e6, "patched": back,
            "patched_how": (RECORD["servers"].get("S9") or {}).get("what"), "verdict": verdict}


def summary(lab: dict) -> dict:
    s: dict = {"run": RUN, "commit": RECORD.get("commit"), "dry": bool(os.environ.get("RG_DRY")),
               "power": power(lab)}
    s["comparisons"] = {
        "stock DFLASH main vs plain (fa3)": compare("S1", "S2"),
        "stock DFLASH weak vs plain (fa3)": compare("S1", "S3"),
        "port fixed vs plain triton, graphs on": compare("S4", "S6"),
        "port fixed vs plain triton, graphs off": compare("S4", "S7"),
        "port unfixed (before #29) vs plain triton": compare("S4", "S10"),
    }
    for c in s["comparisons"].values():
        c.pop("differing", None) if c.get("identical") else None
    s["acceptance"] = [acceptance_vs_reference("S2", "lab-drafter", lab),
                       acceptance_vs_reference("S3", "lab-drafter-weak", lab)]
    s["stale_mask"] = stale_vs_prediction(lab)
    s["gate_probe"] = gate_probe_verdict()
    s["stop_string"] = {"port": stop_verdict("S4", "S6"), "stock": stop_verdict("S1", "S2")}
    cap = (RECORD["servers"].get("S7") or {}).get("cap")
    if cap:
        s["cap"] = {"server": "S7", "alive_after_idle": cap["alive_after_idle"],
                    "health_after_idle": cap["health_after_idle"],
                    "answers_after_idle": cap["answers_after_idle"],
                    "memory_leak_lines": cap["leak_lines"],
                    "alone_tokens": len(cap["alone"].get("output_ids") or []),
                    "alone_finish": (cap["alone"].get("meta") or {}).get("finish_reason"),
                    "verdict": "alive, no leak" if cap["alive_after_idle"] and
                    cap["health_after_idle"] and not cap["leak_lines"] else "FAILED"}
    else:
        s["cap"] = {"verdict": "not run"}
    s["rope"] = rope_verdict(lab)
    s["servers"] = {t: {k: e.get(k) for k in ("what", "ready_s", "server_s", "healthy",
                                              "skipped", "checks_done")}
                    for t, e in RECORD["servers"].items()}
    s["not_run"] = [f"{t}: " + (e.get("skipped") or ("dry rehearsal: stopped before the server"
                                                    if e.get("dry") else e.get("error")
                                                    or "no outputs (the server never answered)"))
                    for t, e in RECORD["servers"].items() if not e.get("checks_done")]
    s["not_run"] += [f"{t}: not reached" for t in [x["tag"] for x in SERVERS]
                     if t not in RECORD["servers"]]
    return s


LAB_DATA: dict = {}


def save() -> None:
    RECORD["elapsed_s"] = round(time.monotonic() - T0, 1)
    tmp = RECORD_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(RECORD, indent=1))
    os.replace(tmp, RECORD_FILE)  # a call cut mid-write keeps the record before it
    if LAB_DATA:
        (OUT / "summary.json").write_text(json.dumps(summary(LAB_DATA), indent=1))


# --------------------------------------------------------------------------------------------------

MAIN, WEAK, ROPE = "lab-drafter", "lab-drafter-weak", "lab-drafter-rope50k"
SERVERS = [
    {"tag": "S1", "what": "stock 0.5.11 plain fa3", "settings": "lab-plain", "venv": "stock",
     "checks": ["gen", "stop"], "ready_s": 160, "need_s": 120},
    {"tag": "S2", "what": "stock 0.5.11 DFLASH v1 fa3, main drafter", "settings": "lab-dflash",
     "venv": "stock", "drafter": MAIN, "checks": ["probe", "gen", "stop"]},
    {"tag": "S3", "what": "stock 0.5.11 DFLASH v1 fa3, weak drafter", "settings": "lab-dflash",
     "venv": "stock", "drafter": WEAK, "checks": ["gen"]},
    {"tag": "S4", "what": "port fixed, plain triton", "settings": "lab-plain-triton",
     "venv": "fixed", "checks": ["gen", "stop"], "ready_s": 160, "need_s": 120},
    {"tag": "S5", "what": "port stale-mask (no mask fix), DFLASH v2 triton, graphs on",
     "settings": "lab-dflash-triton", "venv": "stale-mask", "drafter": MAIN,
     "checks": ["probe", "gen"]},
    {"tag": "S6", "what": "port fixed, DFLASH v2 triton, graphs on",
     "settings": "lab-dflash-triton", "venv": "fixed", "drafter": MAIN,
     "checks": ["probe", "gen", "stop"]},
    {"tag": "S7", "what": f"port fixed, DFLASH v2 triton, graphs off, --context-length {CTX_SMALL}",
     "settings": "lab-dflash-triton", "venv": "fixed", "drafter": MAIN,
     "extra": {**GRAPHS_OFF, "--context-length": str(CTX_SMALL)}, "checks": ["gen", "cap"],
     "need_s": 130},
    {"tag": "S8", "what": "stock 0.5.11 DFLASH v1 fa3, rope50k drafter", "settings": "lab-dflash",
     "venv": "stock", "drafter": ROPE, "checks": ["gen"]},
    {"tag": "S9", "what": "the RoPE patch, rope50k drafter", "settings": "lab-dflash",
     "venv": "rope", "drafter": ROPE, "checks": ["gen"]},
    {"tag": "S10", "what": "port unfixed (before #29), DFLASH v2 triton, graphs on",
     "settings": "lab-dflash-triton", "venv": "unfixed", "drafter": MAIN, "checks": ["gen"]},
]


def reap_leftovers() -> list[str]:
    """A call cut at its limit leaves the server it had started running (its own session, as a
    unit's main process): end those this script started (their pid files), before the next."""
    ended = []
    for pidfile in STANDIN_DIR.glob("*.pid"):
        try:
            pid = int(pidfile.read_text().strip())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if b"sglang" not in cmd:
            continue
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            time.sleep(5)
        ended.append(f"{pidfile.name}: pid {pid}")
    return ended


def servers_in_order(only: list[str]) -> list[dict]:
    """The servers to run: all, in order of value, or those ``RG_ONLY`` names in its order (a
    call short of time runs the one named first)."""
    if not only:
        return list(SERVERS)
    by_tag = {s["tag"]: s for s in SERVERS}
    unknown = [t for t in only if t not in by_tag]
    if unknown:
        raise SystemExit(f"RG_ONLY names no server {unknown}: the servers are {list(by_tag)}")
    return [by_tag[t] for t in dict.fromkeys(only)]


def prepare() -> None:
    """Before the first server of a call: the servers an earlier call left are ended, the
    stand-in systemctl written, the call's commit and the machine's init recorded."""
    (OUT / "plans").mkdir(parents=True, exist_ok=True)
    left_over = reap_leftovers()
    if left_over:
        RECORD.setdefault("reaped", []).extend(left_over)
        log(f"ended servers an earlier call left running: {left_over}")
    (STANDIN_DIR / "bin").mkdir(parents=True, exist_ok=True)
    sc = STANDIN_DIR / "bin" / "systemctl"
    sc.write_text(drive.STANDIN_SYSTEMCTL)
    sc.chmod(0o755)
    RECORD["commit"] = os.environ.get("RG_COMMIT", "?")
    RECORD["systemd"] = drive.systemd_runs()
    RECORD["pid1"] = Path("/proc/1/comm").read_text().strip()


def main() -> int:
    prepare()
    lab = load_lab()
    LAB_DATA.update(lab)
    RECORD["lab"] = {"prompts": len(lab["prompts"]), "layouts": lab["layouts"],
                     "prediction_file": lab["prediction_file"], "stop_case": stop_case(lab),
                     "reference_acceptance": lab["acceptance"]}
    venvs = {k: os.environ.get(f"VENV_{k.upper().replace('-', '_')}")
             for k in ("stock", "fixed", "stale-mask", "unfixed", "rope")}
    # S9: stock + the patched models/dflash.py where the port build has it (v1, fa3), else the
    # fixed port (v2, triton); neither: not run, said so.
    s9 = next(s for s in SERVERS if s["tag"] == "S9")
    if venvs.get("rope") and Path(venvs["rope"]).exists():
        s9["what"] = "stock 0.5.11 + the RoPE patch (models/dflash.py of the port build), v1 fa3"
    elif os.environ.get("RG_ROPE_IN_FIXED") == "1":
        s9.update(venv="fixed", settings="lab-dflash-triton",
                  what="port fixed (its models/dflash.py RoPE patch), DFLASH v2 triton")
    else:
        s9["venv"] = "none"
        s9["what"] = "the RoPE patch: not in this commit's port build (no models/dflash.py)"
    save()
    only = list(filter(None, os.environ.get("RG_ONLY", "").split(",")))
    for spec in servers_in_order(only):
        if spec["tag"] == "S10" and not (only or os.environ.get("RG_ALL")):
            RECORD["servers"].setdefault("S10", {"what": spec["what"], "skipped": (
                "informational, not run by default (RG_ALL=1 or RG_ONLY=S10 runs it)")})
            continue
        try:
            serve(spec, lab, venvs)
        except Exception as exc:  # one server's failure is recorded; the next still runs
            RECORD["servers"].setdefault(spec["tag"], {})["error"] = repr(exc)
            log(f"{spec['tag']}: {exc!r}")
            save()
    save()
    s = summary(lab)
    log("summary: " + json.dumps({"power": s["power"]["verdict"],
                                  "stale_mask": s["stale_mask"]["verdict"],
                                  "gate": s["gate_probe"]["verdict"],
                                  "cap": s["cap"]["verdict"], "rope": s["rope"]["verdict"],
                                  "comparisons": {k: v.get("identical")
                                                  for k, v in s["comparisons"].items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

