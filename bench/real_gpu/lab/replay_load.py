#!/usr/bin/env python3
"""A CPU replay of SGLang 0.5.11's loading of the lab target (issue 49), compared with the
training code's logits.

    /tmp/labenv/bin/python bench/real_gpu/lab/replay_load.py

SGLang's loaders never check that every weight arrived (a missing tensor keeps its dummy or
uninitialised values), so this is the guard before a GPU run. Written here from reading 0.5.11's
sources (not copied): ``models/deepseek_common/deepseek_weight_loader.py`` (``do_load_weights``:
``gate_proj``/``up_proj`` -> ``gate_up_proj`` shards 0/1; per-expert names through
``FusedMoE.make_expert_params_mapping`` -> ``experts.w13_weight`` [E, 2I, H] (w1 = gate first, w3
= up second) and ``experts.w2_weight``; ``q_a_proj`` and ``kv_a_proj_with_mqa`` cached and
concatenated on dim 0 into ``fused_qkv_a_proj_with_mqa``; ``post_load_weights``: ``kv_b_proj``
unflattened to [H, nope + v, kv_lora] and split into ``w_kc`` [H, nope, kv_lora] and ``w_vc``
[H, kv_lora, v]); ``models/deepseek_v2.py`` (the absorbed MLA forward: q_nope @ w_kc against
the normed latent, plus q_pe . k_pe, scale 1/sqrt(qk_nope + qk_rope), the attention's latent
output @ w_vc; ``is_neox_style = not rope_interleave``: GPT-J pairs (2i, 2i+1); the noaux_tc
sigmoid router with e_score_correction_bias used for the choice only, renormalised,
x routed_scaling_factor; the shared expert added).

It checks that every SGLang parameter of this config gets exactly one source tensor and no
checkpoint tensor is left over, then runs the forward in fp32 from the bf16 files and compares
the logits with transformers' DeepseekV3ForCausalLM (the training code) on the prompts. Writes
replay.json beside this file.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "models"


def sglang_params(cfg: dict) -> set[str]:
    """The parameters 0.5.11's DeepseekV3ForCausalLM has for this config (no quantisation, no
    fused shared expert: that needs n_routed_experts == 256)."""
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names |= {p + n for n in (
            "input_layernorm.weight", "post_attention_layernorm.weight",
            "self_attn.fused_qkv_a_proj_with_mqa.weight", "self_attn.q_a_layernorm.weight",
            "self_attn.q_b_proj.weight", "self_attn.kv_a_layernorm.weight",
            "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight")}
        moe = i >= cfg["first_k_dense_replace"] and i % cfg.get("moe_layer_freq", 1) == 0
        if moe:
            names |= {p + n for n in (
                "mlp.gate.weight", "mlp.gate.e_score_correction_bias",
                "mlp.experts.w13_weight", "mlp.experts.w2_weight",
                "mlp.shared_experts.gate_up_proj.weight", "mlp.shared_experts.down_proj.weight")}
        else:
            names |= {p + "mlp.gate_up_proj.weight", p + "mlp.down_proj.weight"}
    return names


def load_like_sglang(ckpt: dict, cfg: dict) -> tuple[dict, list[str]]:
    """(SGLang's parameters filled from the checkpoint, problems)."""
    params: dict = {}
    shards: dict = {}
    used = set()
    problems = []
    E = cfg["n_routed_experts"]
    for name, w in ckpt.items():
        if "rotary_emb.inv_freq" in name:
            used.add(name)
            continue
        if ".mlp.experts." in name:
            # experts.{e}.{gate,up,down}_proj.weight -> experts.w13_weight[e] (w1|w3), w2_weight[e]
            head, rest = name.split(".mlp.experts.")
            e, proj = rest.split(".")[0], rest.split(".")[1]
            e = int(e)
            if e >= E:
                problems.append(f"{name}: expert {e} >= n_routed_experts {E}")
                continue
            key = (head + ".mlp.experts.w2_weight") if proj == "down_proj" else (
                head + ".mlp.experts.w13_weight")
            shards.setdefault(key, {})[(e, proj)] = w
            used.add(name)
            continue
        if name.endswith(("q_a_proj.weight", "kv_a_proj_with_mqa.weight")):
            key = name.rsplit(".", 2)[0] + ".fused_qkv_a_proj_with_mqa.weight"
            part = "q" if "q_a_proj" in name else "kv"
            shards.setdefault(key, {})[part] = w
            used.add(name)
            continue
        if name.endswith(("gate_proj.weight", "up_proj.weight")):
            key = name.rsplit(".", 2)[0] + ".gate_up_proj.weight"
            shards.setdefault(key, {})["gate" if "gate_proj" in name else "up"] = w
            used.add(name)
            continue
        params[name] = w
        used.add(name)
    for key, parts in shards.items():
        if key.endswith("fused_qkv_a_proj_with_mqa.weight"):
            if set(parts) != {"q", "kv"}:
                problems.append(f"{key}: only {sorted(parts)}")
                continue
            params[key] = torch.cat([parts["q"], parts["kv"]], dim=0)
        elif key.endswith("w13_weight"):
            rows = []
            for e in range(E):
                if (e, "gate_proj") not in parts or (e, "up_proj") not in parts:
                    problems.append(f"{key}: expert {e} lacks gate_proj or up_proj")
                    break
                rows.append(torch.cat([parts[(e, "gate_proj")], parts[(e, "up_proj")]], dim=0))
            else:
                params[key] = torch.stack(rows)
        elif key.endswith("w2_weight"):
            if any((e, "down_proj") not in parts for e in range(E)):
                problems.append(f"{key}: an expert lacks down_proj")
                continue
            params[key] = torch.stack([parts[(e, "down_proj")] for e in range(E)])
        else:
            if set(parts) != {"gate", "up"}:
                problems.append(f"{key}: only {sorted(parts)}")
                continue
            params[key] = torch.cat([parts["gate"], parts["up"]], dim=0)
    want = sglang_params(cfg)
    missing = sorted(want - set(params))
    extra = sorted(set(params) - want)
    if missing:
        problems.append(f"SGLang parameters with no checkpoint tensor: {missing}")
    if extra:
        problems.append(f"checkpoint tensors SGLang has no parameter for: {extra}")
    leftover = sorted(set(ckpt) - used)
    if leftover:
        problems.append(f"checkpoint tensors not consumed: {leftover}")
    return params, problems


def post_load(params: dict, cfg: dict) -> None:
    """post_load_weights: w_kc [H, nope, R] and w_vc [H, R, v] from kv_b_proj."""
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        w = params[p + "kv_b_proj.weight"]
        w_kc, w_vc = w.unflatten(0, (-1, nope + v)).split([nope, v], dim=1)
        params[p + "w_kc"] = w_kc
        params[p + "w_vc"] = w_vc.transpose(1, 2)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_gptj(x, pos, base):
    """is_neox_style False: rotate pairs (2i, 2i+1) by pos * base^(-2i/d)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * inv[None]
    cos, sin = ang.cos().float()[:, None], ang.sin().float()[:, None]    # x: [T, heads, d]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out


def mla_dims(cfg: dict) -> tuple:
    """The target config's numbers the absorbed-MLA forward uses: (rms eps, heads, nope, rope,
    v head dims, q lora rank, kv lora rank, RoPE base, attention scale); one reading for the
    fp32 replay here and the bf16 one (sglang_bf16.py)."""
    nope, rdim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    return (cfg["rms_norm_eps"], cfg["num_attention_heads"], nope, rdim, cfg["v_head_dim"],
            cfg["q_lora_rank"], cfg["kv_lora_rank"],
            cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"],
            1.0 / math.sqrt(nope + rdim))


def forward(params: dict, cfg: dict, ids: list[int]) -> torch.Tensor:
    """SGLang 0.5.11's DeepseekV3 forward (absorbed MLA, one causal sequence), fp32."""
    eps, H, nope, rdim, v, qr, R, base, scale = mla_dims(cfg)
    T = len(ids)
    pos = torch.arange(T)
    x = params["model.embed_tokens.weight"][torch.tensor(ids)]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, params[p + "input_layernorm.weight"], eps)
        a = p + "self_attn."
        fused = h @ params[a + "fused_qkv_a_proj_with_mqa.weight"].T
        q_c, latent, k_pe = fused.split([qr, R, rdim], dim=-1)
        q = rms(q_c, params[a + "q_a_layernorm.weight"], eps) @ params[a + "q_b_proj.weight"].T
        q = q.view(T, H, nope + rdim)
        q_nope, q_pe = q.split([nope, rdim], dim=-1)
        latent = rms(latent, params[a + "kv_a_layernorm.weight"], eps)      # [T, R]
        q_lat = torch.einsum("thn,hnr->thr", q_nope, params[a + "w_kc"])      # [T, H, R]
        q_pe = rope_gptj(q_pe, pos, base)
        k_pe = rope_gptj(k_pe[:, None, :], pos, base)[:, 0]                  # [T, rope]
        s = (torch.einsum("thr,sr->hts", q_lat, latent)
             + torch.einsum("thd,sd->hts", q_pe, k_pe)) * scale
        s = s.masked_fill(~causal, float("-inf")).softmax(-1)
        o_lat = torch.einsum("hts,sr->thr", s, latent)                       # [T, H, R]
        o = torch.einsum("thr,hrv->thv", o_lat, params[a + "w_vc"]).reshape(T, H * v)
        x = x + o @ params[a + "o_proj.weight"].T
        h = rms(x, params[p + "post_attention_layernorm.weight"], eps)
        m = p + "mlp."
        if m + "gate_up_proj.weight" in params:
            g, u = (h @ params[m + "gate_up_proj.weight"].T).chunk(2, dim=-1)
            x = x + (F.silu(g) * u) @ params[m + "down_proj.weight"].T
            continue
        scores = (h @ params[m + "gate.weight"].T).sigmoid()                 # [T, E]
        choice = (scores + params[m + "gate.e_score_correction_bias"]).topk(
            cfg["num_experts_per_tok"], dim=-1).indices
        wts = scores.gather(-1, choice)
        if cfg["norm_topk_prob"]:
            wts = wts / wts.sum(-1, keepdim=True)
        wts = wts * cfg["routed_scaling_factor"]
        routed = torch.zeros_like(x)
        for t in range(T):
            for k in range(choice.shape[1]):
                e = int(choice[t, k])
                g, u = (params[m + "experts.w13_weight"][e] @ h[t]).chunk(2)
                routed[t] += wts[t, k] * (params[m + "experts.w2_weight"][e] @ (F.silu(g) * u))
        g, u = (h @ params[m + "shared_experts.gate_up_proj.weight"].T).chunk(2, dim=-1)
        shared = (F.silu(g) * u) @ params[m + "shared_experts.down_proj.weight"].T
        x = x + routed + shared
    x = rms(x, params["model.norm.weight"], eps)
    return x @ params["lm_head.weight"].T


def _swap_halves(t, dim):
    a, b = t.chunk(2, dim=dim)
    return torch.cat([b, a], dim=dim)


def _fused_kv_first(p, cfg):
    for i in range(cfg["num_hidden_layers"]):
        k = f"model.layers.{i}.self_attn.fused_qkv_a_proj_with_mqa.weight"
        q, kv = p[k].split([cfg["q_lora_rank"], cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]])
        p[k] = torch.cat([kv, q])[: p[k].shape[0]]


def _w13_up_first(p, cfg):
    for k in [k for k in p if k.endswith("w13_weight") or k.endswith("gate_up_proj.weight")]:
        p[k] = _swap_halves(p[k], -2)


def _kc_vc_swapped(p, cfg):
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn."
        p[a + "w_kc"], p[a + "w_vc"] = p[a + "w_vc"].transpose(1, 2), p[a + "w_kc"].transpose(1, 2)


def _one_expert_missing(p, cfg):
    k = "model.layers.1.mlp.experts.w2_weight"
    p[k] = p[k].clone()
    p[k][0] = torch.empty_like(p[k][0]).uniform_(-1e-3, 1e-3)    # SGLang's dummy fill


MUTANTS = {
    "fused q/kv-a in the other order": _fused_kv_first,
    "w13 as [up; gate]": _w13_up_first,
    "w_kc and w_vc swapped": _kc_vc_swapped,
    "expert 0's down_proj left a dummy weight": _one_expert_missing,
}


def main() -> int:
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM
    torch.set_num_threads(1)
    tdir = MODELS / "lab-target"
    cfg = json.loads((tdir / "config.json").read_text())
    ckpt = {k: v.float() for k, v in load_file(str(tdir / "model.safetensors")).items()}
    params, problems = load_like_sglang(ckpt, cfg)
    if problems:
        print("\n".join(problems))
        return 1
    post_load(params, cfg)
    hf = DeepseekV3ForCausalLM.from_pretrained(tdir, dtype=torch.float32)
    hf.eval()
    prompts = json.loads((HERE / "prompts.json").read_text())["prompts"]
    ref = json.loads((HERE / "reference.json").read_text())["prompts"]
    worst, rows = 0.0, []
    for p, r in zip(prompts, ref, strict=True):
        ids = p["input_ids"] + r["expected_output"]
        with torch.no_grad():
            a = forward(params, cfg, ids)
            b = hf(input_ids=torch.tensor([ids])).logits[0]
        d = (a - b).abs().max().item()
        same = bool((a.argmax(-1) == b.argmax(-1)).all())
        worst = max(worst, d)
        rows.append({"tokens": len(ids), "max_abs_logit_diff": d, "same_argmax": same})
    # the replay can fail: each of these wrong loads must move the logits far past the match
    ids = prompts[0]["input_ids"] + ref[0]["expected_output"]
    with torch.no_grad():
        base = hf(input_ids=torch.tensor([ids])).logits[0]
    mutants = {}
    for what, change in MUTANTS.items():
        bad = dict(params)
        change(bad, cfg)
        with torch.no_grad():
            mutants[what] = (forward(bad, cfg, ids) - base).abs().max().item()
    sensitive = all(d > 100 * max(worst, 1e-5) for d in mutants.values())
    ok = worst < 1e-3 and all(r["same_argmax"] for r in rows) and sensitive
    out = {"about": __doc__.split("\n\n")[0].strip().replace("\n", " "),
           "sglang_params": len(params), "checkpoint_tensors": len(ckpt),
           "max_abs_logit_diff": worst, "wrong_loads_max_abs_logit_diff": mutants,
           "ok": ok, "per_prompt": rows}
    (HERE / "replay.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"replay: {len(params)} SGLang parameters from {len(ckpt)} tensors; max |logit "
          f"difference| against transformers {worst:.2e} over {len(rows)} prompts: "
          f"{'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
