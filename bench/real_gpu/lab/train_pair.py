#!/usr/bin/env python3
"""Train the lab pair (issue 49) on the CPU: a DeepseekV3ForCausalLM target (MLA + MoE, 8 heads)
that learns induction ("a random segment, then that segment repeated"), and DFlashDraftModel
drafters (z-lab's dflash 0.1.0 class, block 8) trained on the target's own greedy continuations.

Run in the lab's own environment, never in CI (see README.md here):
    /tmp/labenv/bin/python bench/real_gpu/lab/train_pair.py [--stage target|drafters|all]
It writes bench/real_gpu/models/lab-{target,drafter,drafter-weak,drafter-rope50k}/. Fixed seeds;
bit-for-bit reruns are not promised (CPU kernels and thread counts vary), the recipe is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labcommon as lc  # noqa: E402

HERE = Path(__file__).resolve().parent
MODELS = Path(os.environ.get("LAB_MODELS", HERE.parent / "models"))
TARGET_LAYER_IDS = [0, 1]   # at most L-2 = 1: 0.5.11 captures the input of layer id+1


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# The target is trained in a narrow DeepseekV3 (MLA latent and per-head nope/v widths SMALL; the
# CPU is shared and the full widths cost 8x the arithmetic) and then widened, exactly, to the
# shapes the GPU run needs (kv_lora 512, nope 128, v 128): the narrow weights are zero-padded and
# turned by random orthogonal matrices, so every weight of the saved model is dense and a loader
# that mixes up a column block gets other logits (``widen``; checked against the narrow model).
FULL = {"q_lora_rank": 128, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "v_head_dim": 128}
SMALL = {"q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "v_head_dim": 32}


def target_config(widths=FULL):
    from transformers import DeepseekV3Config
    return DeepseekV3Config(
        vocab_size=len(lc.VOCAB), hidden_size=256, intermediate_size=256,
        moe_intermediate_size=64, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=8, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
        routed_scaling_factor=1.0, n_group=1, topk_group=1, first_k_dense_replace=1,
        norm_topk_prob=True, qk_rope_head_dim=64, hidden_act="silu",
        max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
        rope_interleave=True, attention_bias=False, tie_word_embeddings=False,
        bos_token_id=lc.BOS, eos_token_id=lc.EOT, pad_token_id=lc.PAD,
        initializer_range=0.02, use_cache=True, **widths,
    )


def _orth(n: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


@torch.no_grad()
def widen(small, seed: int = 4949):
    """The narrow model's function in the full shapes (fp32). Per layer: the q and kv latents
    (after their RMSNorm, whose weights fold into q_b / kv_b and become ones, with the norm's
    sqrt(width) factor) turn by R_q / R_kv; each head's nope rows (q_b and kv_b) by P_h and its v
    rows (kv_b, and o_proj's columns) by S_h; q's rows scale by sqrt(192 / small qk_head_dim) so
    the softmax scale 1/sqrt(qk_head_dim) stays the same. RoPE dims and the rest are untouched."""
    from transformers import DeepseekV3ForCausalLM
    sc, fc = small.config, target_config()
    big = DeepseekV3ForCausalLM(fc)
    gen = torch.Generator().manual_seed(seed)
    sd = {k: v.float() for k, v in small.state_dict().items()}
    out = dict(sd)
    H, rope = fc.num_attention_heads, fc.qk_rope_head_dim
    dn, dv, rq, rk = sc.qk_nope_head_dim, sc.v_head_dim, sc.q_lora_rank, sc.kv_lora_rank
    Dn, Dv, Rq, Rk = fc.qk_nope_head_dim, fc.v_head_dim, fc.q_lora_rank, fc.kv_lora_rank
    qscale = math.sqrt((Dn + rope) / (dn + rope))
    for i in range(fc.num_hidden_layers):
        p = f"model.layers.{i}.self_attn."
        Rqm, Rkm = _orth(Rq, gen), _orth(Rk, gen)
        # q_a: rows into the wide latent, turned
        qa = torch.zeros(Rq, fc.hidden_size)
        qa[:rq] = sd[p + "q_a_proj.weight"]
        out[p + "q_a_proj.weight"] = Rqm @ qa
        gq = sd[p + "q_a_layernorm.weight"]
        out[p + "q_a_layernorm.weight"] = torch.ones(Rq)
        qb = sd[p + "q_b_proj.weight"].view(H, dn + rope, rq) * gq * math.sqrt(rq / Rq)
        qb_w = torch.zeros(H, Dn + rope, Rq)
        kvb = sd[p + "kv_b_proj.weight"].view(H, dn + dv, rk)
        gk = sd[p + "kv_a_layernorm.weight"]
        kvb = kvb * gk * math.sqrt(rk / Rk)
        kvb_w = torch.zeros(H, Dn + Dv, Rk)
        o = sd[p + "o_proj.weight"].view(fc.hidden_size, H, dv)
        o_w = torch.zeros(fc.hidden_size, H, Dv)
        for h in range(H):
            P, S = _orth(Dn, gen), _orth(Dv, gen)
            nope = torch.zeros(Dn, Rq)
            nope[:dn, :rq] = qb[h, :dn]
            qb_w[h, :Dn] = P @ nope @ Rqm.T
            qb_w[h, Dn:, :rq] = qb[h, dn:]
            qb_w[h, Dn:] = qb_w[h, Dn:] @ Rqm.T
            knope = torch.zeros(Dn, Rk)
            knope[:dn, :rk] = kvb[h, :dn]
            kvb_w[h, :Dn] = P @ knope @ Rkm.T
            v = torch.zeros(Dv, Rk)
            v[:dv, :rk] = kvb[h, dn:]
            kvb_w[h, Dn:] = S @ v @ Rkm.T
            ow = torch.zeros(fc.hidden_size, Dv)
            ow[:, :dv] = o[:, h]
            o_w[:, h] = ow @ S.T
        out[p + "q_b_proj.weight"] = (qb_w * qscale).reshape(H * (Dn + rope), Rq)
        out[p + "kv_b_proj.weight"] = kvb_w.reshape(H * (Dn + Dv), Rk)
        out[p + "o_proj.weight"] = o_w.reshape(fc.hidden_size, H * Dv)
        kva = sd[p + "kv_a_proj_with_mqa.weight"]
        kva_w = torch.zeros(Rk + rope, fc.hidden_size)
        kva_w[:rk] = kva[:rk]
        kva_w[:Rk] = Rkm @ kva_w[:Rk]
        kva_w[Rk:] = kva[rk:]
        out[p + "kv_a_proj_with_mqa.weight"] = kva_w
        out[p + "kv_a_layernorm.weight"] = torch.ones(Rk)
    missing, unexpected = big.load_state_dict(out, strict=False)
    if missing or unexpected:
        raise SystemExit(f"widen: missing {missing}, unexpected {unexpected}")
    big.eval()
    return big


def batch(rng, n, length=lc.SEQ_LEN):
    xs, ms = zip(*(lc.training_example(rng, length) for _ in range(n)), strict=True)
    return torch.tensor(xs), torch.tensor(ms, dtype=torch.bool)


def accuracy(model, rng, n=256):
    model.eval()
    with torch.no_grad():
        x, m = batch(rng, n)
        logits = model(input_ids=x).logits
        pred = logits[:, :-1].argmax(-1)
        ok = (pred == x[:, 1:]) & m[:, :-1]
        acc = ok.sum().item() / m[:, :-1].sum().item()
    model.train()
    return acc


def train_target(steps: int, bs: int, lr: float, resume: bool, run: str = "narrow-target",
                 seed: int = 49) -> None:
    """Train the narrow target from scratch (seed 49), or on from work/narrow-target (a run that
    stopped short of the accuracy; seed 50 for its batches)."""
    from transformers import DeepseekV3ForCausalLM
    torch.manual_seed(seed + 1 if resume else seed)
    rng = random.Random(seed + 1 if resume else seed)
    if resume:
        model = DeepseekV3ForCausalLM.from_pretrained(HERE / "work" / run, dtype=torch.float32)
    else:
        model = DeepseekV3ForCausalLM(target_config(SMALL))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = 50
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm)
        * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    t0 = time.time()
    for step in range(steps):
        x, m = batch(rng, bs)
        logits = model(input_ids=x).logits[:, :-1]
        loss = F.cross_entropy(logits[m[:, :-1]], x[:, 1:][m[:, :-1]])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == steps - 1:
            log(f"target step {step} loss {loss.item():.4f} ({time.time() - t0:.0f} s)")
        if step % 50 == 49 and step >= 99:
            model.save_pretrained(HERE / "work" / run, safe_serialization=True)
            acc = accuracy(model, random.Random(99), 64)
            log(f"target step {step} accuracy {acc:.4f}")
            if acc >= 0.999:
                log("accurate enough: stopping early")
                steps = step + 1
                break
    model.eval()
    model.save_pretrained(HERE / "work" / run, safe_serialization=True)
    if run != "narrow-target":
        return
    save_target(model, {"steps": steps, "batch": bs, "lr": lr, "resumed": resume,
                        "cpu_seconds": round(time.time() - t0)})


def save_target(model, stats: dict) -> None:
    """Widen the narrow model, check it, save it in bf16 with its tokenizer and stats."""
    acc = accuracy(model, random.Random(4949), 512)
    log(f"target held-out next-token accuracy {acc:.4f}")
    out = MODELS / "lab-target"
    big = widen(model)
    x, _ = batch(random.Random(5), 16)
    with torch.no_grad():
        a, b = big(input_ids=x).logits, model(input_ids=x).logits
    d = (a - b).abs().max().item()
    log(f"widened target: max |logit difference| against the narrow model {d:.2e} "
        f"(logits up to {b.abs().max().item():.1f})")
    if d > 1e-4 * b.abs().max().item() or not torch.equal(a.argmax(-1), b.argmax(-1)):
        raise SystemExit("widen does not preserve the function")
    big = big.to(torch.bfloat16)
    big.save_pretrained(out, safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    # what SGLang 0.5.11's deepseek_v2 reads besides HF's fields (HF's DeepseekV3 is this router)
    cfg.update({"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1,
                "rope_theta": 10000.0, "rope_scaling": None, "torch_dtype": "bfloat16"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    lc.build_tokenizer(out)
    stats.update({"heldout_accuracy_fp32_narrow": acc, "widen_max_abs_logit_diff": d})
    (out / "train_stats.json").write_text(json.dumps(stats, indent=1) + "\n")


def load_target():
    """The narrow target (the same function as lab-target, 8x cheaper on the CPU)."""
    from transformers import DeepseekV3ForCausalLM
    model = DeepseekV3ForCausalLM.from_pretrained(HERE / "work" / "narrow-target",
                                                  dtype=torch.float32)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@torch.no_grad()
def greedy(model, prompts: torch.Tensor, total: int) -> torch.Tensor:
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                         max_new_tokens=total - prompts.shape[1], do_sample=False,
                         min_new_tokens=total - prompts.shape[1], pad_token_id=lc.PAD,
                         eos_token_id=None)
    return out[:, :total]


def continuation_data(target, n_batches: int, per_batch: int, seed: int):
    """Prompts (raw and chat; >= 2 periods) continued greedily by the target to SEQ_LEN tokens,
    with the target's context features. Rows of one batch share a prompt length."""
    rng = random.Random(seed)
    data = []
    for b in range(n_batches):
        chat = b % 3 == 2
        plen = rng.randint(28, 48)
        rows = []
        for _ in range(per_batch):
            L = rng.randint(lc.MIN_SEG, lc.MAX_SEG)
            seg = lc.segment(rng, L)
            rows.append(lc.chat_prompt(seg, plen - 4) if chat else lc.raw_prompt(seg, plen - 1))
        prompts = torch.tensor(rows)
        seqs = greedy(target, prompts, lc.SEQ_LEN)
        hs = target(input_ids=seqs, output_hidden_states=True).hidden_states
        feats = lc.target_features(hs, TARGET_LAYER_IDS)
        data.append((seqs, feats, plen))
    return data


def train_drafter(name: str, target, data, steps: int, rope_theta: float, seed: int) -> None:
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config
    cfg_dict = lc.drafter_config(rope_theta, target.config.num_hidden_layers, TARGET_LAYER_IDS)
    cfg = Qwen3Config(**{k: v for k, v in cfg_dict.items() if k not in ("architectures",)})
    cfg.architectures = ["DFlashDraftModel"]
    torch.manual_seed(seed)
    rng = random.Random(seed)
    drafter = DFlashDraftModel(cfg)
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 30) * max(0.05, 1 - s / max(steps, 1)))
    nb = 6
    t0 = time.time()
    for step in range(steps):
        seqs, feats, plen = data[rng.randrange(len(data))]
        starts = [sorted(rng.sample(range(plen - 1, lc.SEQ_LEN - lc.BLOCK), nb))
                  for _ in range(seqs.shape[0])]
        logits = lc.draft_blocks(drafter, target, feats, seqs, starts)   # [B, nb, 7, V]
        st = torch.tensor(starts)
        idx = st[:, :, None] + torch.arange(1, lc.BLOCK)[None, None, :]
        labels = torch.gather(seqs, 1, idx.view(seqs.shape[0], -1)).view_as(idx)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == steps - 1:
            log(f"{name} step {step} loss {loss.item():.4f} ({time.time() - t0:.0f} s)")
    out = MODELS / name
    drafter = drafter.to(torch.bfloat16)
    drafter.save_pretrained(out, safe_serialization=True)
    # the config as 0.5.11 and z-lab read it (transformers 5 writes rope_parameters only)
    saved = json.loads((out / "config.json").read_text())
    saved.update({k: cfg_dict[k] for k in ("rope_theta", "dflash_config", "block_size",
                                            "num_target_layers", "architectures")})
    (out / "config.json").write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(MODELS / "lab-target" / f, out / f)
    (out / "train_stats.json").write_text(json.dumps(
        {"steps": steps, "rope_theta_trained": rope_theta, "seed": seed,
         "cpu_seconds": round(time.time() - t0)}, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=["target", "widen", "drafters", "all"], default="all",
                    help="widen: save work/narrow-target (a finished run's) widened, again")
    ap.add_argument("--target-steps", type=int, default=600)
    ap.add_argument("--target-batch", type=int, default=16)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--run", default="narrow-target", help="work/RUN holds the narrow model")
    ap.add_argument("--seed", type=int, default=49)
    ap.add_argument("--resume", action="store_true",
                    help="train the target on from work/narrow-target")
    ap.add_argument("--drafter-steps", type=int, default=300)
    ap.add_argument("--weak-steps", type=int, default=100)
    ap.add_argument("--only", nargs="*", help="drafters to train (default all)")
    ap.add_argument("--max-seg", type=int, default=lc.MAX_SEG,
                    help="the longest segment (period) of the task")
    ap.add_argument("--threads", type=int, default=1,
                    help="1: on a shared 2-core machine two OpenMP threads spin and run 4x slower")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lc.MAX_SEG = a.max_seg
    if a.stage in ("target", "all"):
        train_target(a.target_steps, a.target_batch, a.target_lr, a.resume, a.run, a.seed)
    if a.stage == "widen":
        from transformers import DeepseekV3ForCausalLM
        narrow = DeepseekV3ForCausalLM.from_pretrained(HERE / "work" / "narrow-target",
                                                       dtype=torch.float32)
        narrow.eval()
        save_target(narrow, json.loads((MODELS / "lab-target" / "train_stats.json").read_text())
                    if (MODELS / "lab-target" / "train_stats.json").exists() else {})
    if a.stage in ("drafters", "all"):
        target = load_target()
        cache = HERE / "work" / "continuations.pt"
        if cache.exists():
            data = torch.load(cache)
        else:
            log("generating the target's greedy continuations")
            data = continuation_data(target, n_batches=24, per_batch=16, seed=7)
            torch.save(data, cache)
            log("done")
        todo = {"lab-drafter": (a.drafter_steps, 1e6, 11),
                "lab-drafter-weak": (a.weak_steps, 1e6, 12),
                "lab-drafter-rope50k": (a.drafter_steps, 50000.0, 11)}
        for name, (steps, theta, seed) in todo.items():
            if a.only and name not in a.only:
                continue
            train_drafter(name, target, data, steps, theta, seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
