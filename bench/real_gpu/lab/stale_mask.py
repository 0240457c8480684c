#!/usr/bin/env python3
"""A CPU emulation of SGLang 0.5.11's stale verify mask on the lab pair (issue 49): for which
prompts, alone and batched, the PR#20547 port without its mask fix (DFLASH v2, triton, CUDA
graphs, --cuda-graph-max-bs 8) gives other tokens or another acceptance.

    /tmp/labenv/bin/python bench/real_gpu/lab/stale_mask.py

What 0.5.11 does (read from its wheel, not copied):
- ``layers/attention/triton_backend.py``: ``cuda_graph_custom_mask`` is a zeroed uint8 buffer of
  max_num_tokens * max_context_len bytes. Capturing TARGET_VERIFY copies the capture batch's
  ``spec_info.custom_mask`` into its head; ``model_executor/cuda_graph_runner.py`` captures with
  seq_lens filled with 1 and an all-ones mask of (bs * 1 + bs * B) * B bytes, so after capture
  the first (max_bs + max_bs * B) * B bytes are ones and the rest zeros (576 at max_bs 8, B 8).
  The v2 DFLASH verify builds no custom mask, so replay never writes the buffer; replay does
  rewrite ``mask_indptr`` = cumsum(B * (seq_len_i + B)).
- ``triton_ops/extend_attention.py`` (``skip_prefix_custom_mask=True``): the cached prefix is
  always visible; in the block, query row r of request i sees block column c where
  buffer[mask_indptr[i] + r * (seq_len_i + B) + seq_len_i + c] is 1. So a row sees every block
  token (the drafts after it too), a prefix of them, or none, not even itself.
- The block's K/V stay in the cache for the committed tokens (``keep_mask``) and their hidden
  states feed the drafter: a wrong mask also changes what later steps read.
- Requests of a batch verify together in arrival order; a finished request leaves the batch.
- The drafter runs on its own backend (fa3 in the plan's SM90 set): its attention is correct.

The model is the training code's (transformers' DeepseekV3ForCausalLM, fp32 from the bf16
files) with a 4-D boolean mask per verify; the drafter is z-lab's DFlashDraftModel. Writes
stale_mask_prediction.json beside this file: per drafter and layout (alone, batches of 6 and of
8 in the order given), each prompt's tokens and acceptance length (completion / verify steps)
with the stale mask, and whether they differ from the causal (fixed) verify.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import labcommon as lc  # noqa: E402
import reference as rf  # noqa: E402

MAX_BS = 8
B = lc.BLOCK
ONES = (MAX_BS + MAX_BS * B) * B


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def block_mask(offset: int, seq_len: int, stale: bool) -> torch.Tensor:
    """[1, 1, B, seq_len + B] bool: the prefix always; the block causally, or as the stale
    buffer says."""
    m = torch.ones(B, seq_len + B, dtype=torch.bool)
    r = torch.arange(B)[:, None]
    c = torch.arange(B)[None, :]
    if stale:
        idx = offset + r * (seq_len + B) + seq_len + c
        m[:, seq_len:] = idx < ONES
    else:
        m[:, seq_len:] = c <= r
    return m[None, None]


def run(prompts, layout, target, drafter, layer_ids, stale, max_new):
    """layout: lists of prompt indices served together (in that order)."""
    res = {}
    for group in layout:
        reqs = {i: lc.DFlashRequest(prompts[i], target, layer_ids) for i in group}
        while True:
            active = [reqs[i] for i in group if not reqs[i].done(max_new)]
            if not active:
                break
            lc.verify_step(active, target, drafter, layer_ids, max_new,
                           lambda offset, s: block_mask(offset, s, stale))
        for i in group:
            q = reqs[i]
            res[i] = {"output": q.committed[len(q.prompt):],
                      "spec_accept_length": round(max_new / len(q.steps), 4),
                      "verify_steps": len(q.steps)}
    return res


def probe_prediction(target, layer_ids) -> dict:
    """The gate's probe (probe.json) on the build without the mask fix: its questions sent at
    once (one batch, in order), max_tokens tokens each; answers against their regexes and the
    mean acceptance against min_accept_length, as specfleet/hostside/readiness_gate.py judges."""
    import re
    probe = json.loads((HERE / "probe.json").read_text())
    prompts = [[lc.BOS] + [lc.TOK[ch] for ch in q["prompt"]] for q in probe["questions"]]
    n, group = probe["max_tokens"], [list(range(len(prompts)))]
    out = {}
    for name in ("lab-drafter", "lab-drafter-weak"):
        drafter = rf.load_drafter(name)
        res = {}
        for label, stale in (("fixed", False), ("stale", True)):
            r = run(prompts, group, target, drafter, layer_ids, stale, n)
            answers = ["".join(lc.VOCAB[t] for t in r[i]["output"]) for i in range(len(prompts))]
            right = [bool(re.search(q["answer"], a, re.I | re.S))
                     for q, a in zip(probe["questions"], answers, strict=True)]
            mean = sum(r[i]["spec_accept_length"] for i in r) / len(r)
            res[label] = {"answers_right": right, "mean_spec_accept_length": round(mean, 4),
                          "per_question_accept_length": [r[i]["spec_accept_length"]
                                                         for i in range(len(prompts))],
                          "gate_passes": sum(right) >= probe["min_correct"]
                          and mean >= probe["min_accept_length"]}
        out[name] = res
        log(f"probe, {name}: fixed {res['fixed']['gate_passes']}, stale "
            f"{res['stale']['gate_passes']} ({res['stale']['answers_right']})")
    return out


def main() -> int:
    torch.set_num_threads(1)
    if sys.argv[1:] == ["--probe-only"]:
        path = HERE / "stale_mask_prediction.json"
        pred = json.loads(path.read_text())
        layer_ids = json.loads((rf.MODELS / "lab-drafter" / "config.json").read_text())[
            "dflash_config"]["target_layer_ids"]
        pred["probe"] = probe_prediction(rf.load_target(), layer_ids)
        path.write_text(json.dumps(pred, indent=1) + "\n")
        return 0
    ref = json.loads((HERE / "reference.json").read_text())
    prompts = [p["input_ids"] for p in ref["prompts"]]
    max_new = ref["max_new_tokens"]
    n = len(prompts)
    layouts = {
        "alone": [[i] for i in range(n)],
        "batch6": [list(range(k, min(k + 6, n))) for k in range(0, n, 6)],
        "batch8": [list(range(k, min(k + 8, n))) for k in range(0, n, 8)],
    }
    target = rf.load_target()
    layer_ids = json.loads((rf.MODELS / "lab-drafter" / "config.json").read_text())[
        "dflash_config"]["target_layer_ids"]
    out = {"about": __doc__.split("\n\n")[0].strip().replace("\n", " "),
           "ones_bytes": ONES, "cuda_graph_max_bs": MAX_BS, "block_size": B,
           "max_new_tokens": max_new, "layouts": layouts, "drafters": {}}
    for name in ("lab-drafter", "lab-drafter-weak"):
        drafter = rf.load_drafter(name)
        per = {}
        for lname, layout in layouts.items():
            good = run(prompts, layout, target, drafter, layer_ids, False, max_new)
            bad = run(prompts, layout, target, drafter, layer_ids, True, max_new)
            rows = []
            for i in range(n):
                exp = ref["prompts"][i]["expected_output"]
                # the causal verify here is reference.py's fp32 loop (its bf16 one: issue 50)
                r = ref["prompts"][i]["drafters"][name]
                ref_acc = r.get("fp32_loop", r)["spec_accept_length"]
                if good[i]["output"] != exp or abs(good[i]["spec_accept_length"] - ref_acc) > 1e-9:
                    raise SystemExit(f"{name} {lname} prompt {i}: the causal verify does not "
                                     "reproduce reference.json: the emulation is wrong")
                rows.append({
                    "prompt": i,
                    "tokens_differ": bad[i]["output"] != exp,
                    "first_differing_position": next(
                        (k for k, (a, b) in enumerate(zip(bad[i]["output"], exp, strict=True))
                         if a != b), None),
                    "stale_output": bad[i]["output"],
                    "stale_spec_accept_length": bad[i]["spec_accept_length"],
                    "fixed_spec_accept_length": good[i]["spec_accept_length"],
                    "acceptance_differs": abs(bad[i]["spec_accept_length"]
                                              - good[i]["spec_accept_length"]) > 1e-9,
                })
            per[lname] = {
                "prompts_with_other_tokens": [r["prompt"] for r in rows if r["tokens_differ"]],
                "prompts_with_other_acceptance": [r["prompt"] for r in rows
                                                  if r["acceptance_differs"]],
                "rows": rows,
            }
            log(f"{name} {lname}: other tokens {per[lname]['prompts_with_other_tokens']}, "
                f"other acceptance {per[lname]['prompts_with_other_acceptance']}")
        out["drafters"][name] = per
    out["probe"] = probe_prediction(target, layer_ids)
    (HERE / "stale_mask_prediction.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
