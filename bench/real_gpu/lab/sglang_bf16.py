"""SGLang 0.5.11's greedy DFLASH in bf16 on the CPU (issue 50): the target and the drafter with
bf16 activations rounded where 0.5.11's GPU kernels write their outputs, fp32 inside each kernel.
Runs only in the lab's own environment (see README.md here).

Why: the fp32 loop (labcommon.verify_step, bf16 weights and fp32 activations) disagreed with the
GPU (runs 5 and 6) on one prompt per drafter. The drafter's top-1/top-2 margins are often below
one bf16 step of its logits (0.03 to 0.06 here), so which draft wins depends on the bits of the
target's features, and those are bf16 on the GPU, rounded at every kernel of three layers. Rounding
the fp32 features to bf16 only at the end does not reproduce the GPU (30 stochastic roundings:
the main drafter's prompt 7 stays at 10 verify steps), and neither does transformers' bf16 model
(another set of rounding points); rounding where SGLang's kernels do does.

The rounding points, read from 0.5.11's sources (models/deepseek_v2.py with the absorbed MLA,
models/dflash.py, layers/layernorm.py, layers/rotary_embedding/base.py,
speculative/dflash_worker.py):
- every GEMM (linear, bmm) accumulates in fp32 and writes bf16;
- RMSNorm (and the fused add+RMSNorm, whose residual is kept in bf16) computes in fp32, one
  rounding;
- RoPE: fp32 cos/sin cache on CUDA, fp32 math, one rounding (the target GPT-J pairs, the drafter
  NeoX halves);
- attention (fa3/triton): scores and softmax in fp32, the probabilities rounded to bf16 before
  P @ V, the output bf16; MLA absorbed (q_nope @ w_kc against the normed latent, the output
  latent @ w_vc);
- MoE: the sigmoid noaux_tc router in fp32; per expert w13 -> silu*mul -> w2 and its weighted
  output (bf16 each), their sum rounded, times routed_scaling_factor, plus the shared expert;
- the drafter's logits: bf16 hidden @ bf16 lm_head, bf16 logits, argmax (ties: first index);
  SiluAndMul in fp32, one rounding.
The target's features are the residual stream entering layers 1 and 2 (0.5.11 captures the input
of layer id + 1).
"""

from __future__ import annotations

import json

import labcommon as lc
import replay_load as rl
import torch
import torch.nn.functional as F

BF = torch.bfloat16


def _r(x):
    """One kernel output: rounded to bf16 (kept as fp32 values for the next op)."""
    return x.to(BF).float()


def _lin(x, w):
    return _r(x @ w.T)


def _rms(x, w, eps):
    return _r(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)


def _rope_neox(x, pos, theta):
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
    ang = pos.float()[:, None] * inv[None]
    c, s = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return _r(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1))


class Target:
    """The lab target as 0.5.11 loads it (replay_load), forward in bf16 at its kernel outputs."""

    def __init__(self, models, layer_ids):
        from safetensors.torch import load_file
        tdir = models / "lab-target"
        self.cfg = json.loads((tdir / "config.json").read_text())
        ckpt = {k: v.float() for k, v in load_file(str(tdir / "model.safetensors")).items()}
        self.p, problems = rl.load_like_sglang(ckpt, self.cfg)
        if problems:
            raise SystemExit("\n".join(problems))
        rl.post_load(self.p, self.cfg)
        self.layer_ids = list(layer_ids)

    @torch.no_grad()
    def forward(self, ids: list[int]):
        """Logits [T, V] (fp32 from the bf16 final norm) and the drafter's features [T, 2H] of
        one causal sequence. Row-wise kernels and causal attention make a position's values
        independent of the positions after it, so one pass over committed + block is the
        prefill or the verify with the cache of the committed tokens."""
        P, cfg = self.p, self.cfg
        eps, H, nope, rdim, v, qr, R, base, scale = rl.mla_dims(cfg)
        T = len(ids)
        pos = torch.arange(T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        x = P["model.embed_tokens.weight"][torch.tensor(ids)]
        residual, feats = None, []
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            residual = x if residual is None else _r(x + residual)
            if i - 1 in self.layer_ids:
                feats.append(residual)
            h = _rms(residual, P[p + "input_layernorm.weight"], eps)
            a = p + "self_attn."
            q_c, latent, k_pe = _lin(h, P[a + "fused_qkv_a_proj_with_mqa.weight"]).split(
                [qr, R, rdim], dim=-1)
            q = _lin(_rms(q_c, P[a + "q_a_layernorm.weight"], eps), P[a + "q_b_proj.weight"])
            q_nope, q_pe = q.view(T, H, nope + rdim).split([nope, rdim], dim=-1)
            latent = _rms(latent, P[a + "kv_a_layernorm.weight"], eps)
            q_lat = _r(torch.einsum("thn,hnr->thr", q_nope, P[a + "w_kc"]))
            q_pe = _r(rl.rope_gptj(q_pe, pos, base))
            k_pe = _r(rl.rope_gptj(k_pe[:, None, :], pos, base)[:, 0])
            s = (torch.einsum("thr,sr->hts", q_lat, latent)
                 + torch.einsum("thd,sd->hts", q_pe, k_pe)) * scale
            probs = _r(s.masked_fill(~causal, float("-inf")).softmax(-1))
            o_lat = _r(torch.einsum("hts,sr->thr", probs, latent))
            o = _r(torch.einsum("thr,hrv->thv", o_lat, P[a + "w_vc"])).reshape(T, H * v)
            residual = _r(_lin(o, P[a + "o_proj.weight"]) + residual)
            h = _rms(residual, P[p + "post_attention_layernorm.weight"], eps)
            m = p + "mlp."
            if m + "gate_up_proj.weight" in P:
                g, u = _lin(h, P[m + "gate_up_proj.weight"]).chunk(2, dim=-1)
                x = _lin(_r(F.silu(g) * u), P[m + "down_proj.weight"])
                continue
            scores = (h @ P[m + "gate.weight"].T).sigmoid()
            choice = (scores + P[m + "gate.e_score_correction_bias"]).topk(
                cfg["num_experts_per_tok"], dim=-1).indices
            wts = scores.gather(-1, choice)
            if cfg["norm_topk_prob"]:
                wts = wts / wts.sum(-1, keepdim=True)
            routed = torch.zeros_like(residual)
            for t in range(T):
                for k in range(choice.shape[1]):
                    e = int(choice[t, k])
                    g, u = _r(P[m + "experts.w13_weight"][e] @ h[t]).chunk(2)
                    routed[t] += _r(wts[t, k] * (P[m + "experts.w2_weight"][e]
                                                 @ _r(F.silu(g) * u)))
            routed = _r(_r(routed) * cfg["routed_scaling_factor"])
            g, u = _lin(h, P[m + "shared_experts.gate_up_proj.weight"]).chunk(2, dim=-1)
            x = _r(routed + _lin(_r(F.silu(g) * u), P[m + "shared_experts.down_proj.weight"]))
        residual = _r(x + residual)
        hn = _rms(residual, P["model.norm.weight"], eps)
        return hn @ P["lm_head.weight"].T, torch.cat(feats, -1)


class Drafter:
    """models/dflash.py's DFlashDraftModel (z-lab's weights), bf16 at its kernel outputs."""

    def __init__(self, hf_drafter, rope_theta: float):
        self.sd = {k: v.detach().to(BF).float() for k, v in hf_drafter.state_dict().items()}
        self.theta = rope_theta
        self.layers = hf_drafter.config.num_hidden_layers
        self.heads = hf_drafter.config.num_attention_heads
        self.hd = hf_drafter.config.head_dim
        self.eps = hf_drafter.config.rms_norm_eps

    @torch.no_grad()
    def hidden(self, embeds, pos_blk, feats, pos_ctx):
        """The block's final hidden states [8, H]: the block attends to every context position
        (the committed ones) and to itself, non-causally (ENCODER_ONLY)."""
        sd, H, hd, eps = self.sd, self.heads, self.hd, self.eps
        ctx = _rms(_lin(feats, sd["fc.weight"]), sd["hidden_norm.weight"], eps)
        x, residual = embeds, None
        for i in range(self.layers):
            p, a, m = f"layers.{i}.", f"layers.{i}.self_attn.", f"layers.{i}.mlp."
            residual = x if residual is None else _r(x + residual)
            h = _rms(residual, sd[p + "input_layernorm.weight"], eps)
            q = _rms(_lin(h, sd[a + "q_proj.weight"]).view(-1, H, hd), sd[a + "q_norm.weight"], eps)
            k = _rms(_lin(h, sd[a + "k_proj.weight"]).view(-1, H, hd), sd[a + "k_norm.weight"], eps)
            v = _lin(h, sd[a + "v_proj.weight"]).view(-1, H, hd)
            q, k = _rope_neox(q, pos_blk, self.theta), _rope_neox(k, pos_blk, self.theta)
            kc = _rms(_lin(ctx, sd[a + "k_proj.weight"]).view(-1, H, hd), sd[a + "k_norm.weight"],
                      eps)
            kc = _rope_neox(kc, pos_ctx, self.theta)
            vc = _lin(ctx, sd[a + "v_proj.weight"]).view(-1, H, hd)
            K, V = torch.cat([kc, k]), torch.cat([vc, v])
            probs = _r(torch.einsum("qhd,khd->hqk", q, K).mul(hd ** -0.5).softmax(-1))
            o = _r(torch.einsum("hqk,khd->qhd", probs, V)).reshape(-1, H * hd)
            residual = _r(_lin(o, sd[a + "o_proj.weight"]) + residual)
            h = _rms(residual, sd[p + "post_attention_layernorm.weight"], eps)
            g, u = _lin(h, sd[m + "gate_proj.weight"]), _lin(h, sd[m + "up_proj.weight"])
            x = _lin(_r(F.silu(g) * u), sd[m + "down_proj.weight"])
        return _rms(_r(x + residual), sd["norm.weight"], eps)


@torch.no_grad()
def dflash_loop(target: Target, drafter: Drafter, prompt: list[int], max_new: int) -> dict:
    """One request alone, as reference.dflash_loop, with both models in SGLang's bf16."""
    W = target.p["lm_head.weight"].to(BF)
    E = target.p["model.embed_tokens.weight"]
    logits, feats = target.forward(prompt)
    committed = list(prompt) + [int(logits[-1].argmax())]
    produced, steps, margins = 1, [], []
    while produced < max_new:
        s = len(committed) - 1
        blk = torch.full((lc.BLOCK,), lc.MASK, dtype=torch.long)
        blk[0] = committed[s]
        h = drafter.hidden(E[blk], torch.arange(s, s + lc.BLOCK), feats[:s], torch.arange(s))
        dl = (h.to(BF) @ W.T)[1:].float()             # bf16 logits, as 0.5.11's greedy head
        top = torch.topk(dl, 2).values
        margins.append(round(float((top[:, 0] - top[:, 1]).min()), 4))
        block = [committed[s]] + [int(t) for t in dl.argmax(-1)]
        logits, f = target.forward(committed[:s] + block)
        pred = [int(t) for t in logits[s:].argmax(-1)]
        acc = 0
        while acc < lc.BLOCK - 1 and block[acc + 1] == pred[acc]:
            acc += 1
        appended = 0
        for t in block[1:acc + 1] + [pred[acc]]:
            committed.append(t)
            produced += 1
            appended += 1
            if produced >= max_new:
                break
        feats = torch.cat([feats[:s], f[s:s + appended]])
        steps.append(appended)
    return {"output": committed[len(prompt):], "verify_steps": len(steps),
            "accepted_per_verify": steps, "spec_accept_length": round(max_new / len(steps), 4),
            "min_draft_margin_per_verify": margins}
