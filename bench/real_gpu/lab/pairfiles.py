#!/usr/bin/env python3
"""The lab pair's files without torch (Python 3 stdlib only): safetensors headers, sha256, and
the tensor names SGLang 0.5.11's loaders consume for each config (issue 49).

    python3 bench/real_gpu/lab/pairfiles.py write    # models/lab-manifest.json + SHA256SUMS
    python3 bench/real_gpu/lab/pairfiles.py check    # what tests/unit/test_lab_pair.py checks

The names: 0.5.11's ``deepseek_weight_loader.do_load_weights`` takes, for a DeepseekV3 without
quantisation, per-expert ``mlp.experts.E.{gate,up,down}_proj.weight`` (through
``FusedMoE.make_expert_params_mapping``; a fused ``experts.gate_up_proj`` of transformers 5 finds
no parameter and is dropped with a warning), ``q_a_proj`` and ``kv_a_proj_with_mqa`` (both
needed: they are fused only once both arrived), ``kv_b_proj`` (split into w_kc/w_vc after
loading) and the rest one to one. ``models/dflash.py``'s ``load_weights`` takes
``layers.N.self_attn.{q,k,v,o}_proj``, ``q_norm``/``k_norm``, the MLP, the layer norms, ``fc``,
``hidden_norm`` and ``norm`` (``model.`` prefix optional), ignoring anything else. Neither checks
that every parameter got a tensor, so a missing name here is a silent dummy weight there.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "models"
PAIR = ("lab-target", "lab-drafter", "lab-drafter-weak", "lab-drafter-rope50k")
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
MANIFEST = MODELS / "lab-manifest.json"
SUMS = MODELS / "SHA256SUMS"


def read_header(path: Path) -> dict:
    """The safetensors header: {name: {"dtype", "shape", "data_offsets"}} (no __metadata__)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise ValueError(f"{path}: header length {n} is not plausible")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def target_names(cfg: dict) -> dict[str, list[int]]:
    """Every checkpoint tensor 0.5.11 needs for a DeepseekV3 config, with its shape."""
    hsz, H, V = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qr, kr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    E, mi, di = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"]
    names = {"model.embed_tokens.weight": [V, hsz], "model.norm.weight": [hsz],
             "lm_head.weight": [V, hsz]}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names.update({
            p + "input_layernorm.weight": [hsz], p + "post_attention_layernorm.weight": [hsz],
            p + "self_attn.q_a_proj.weight": [qr, hsz],
            p + "self_attn.q_a_layernorm.weight": [qr],
            p + "self_attn.q_b_proj.weight": [H * (nope + rope), qr],
            p + "self_attn.kv_a_proj_with_mqa.weight": [kr + rope, hsz],
            p + "self_attn.kv_a_layernorm.weight": [kr],
            p + "self_attn.kv_b_proj.weight": [H * (nope + v), kr],
            p + "self_attn.o_proj.weight": [hsz, H * v],
        })
        if i >= cfg["first_k_dense_replace"] and i % cfg.get("moe_layer_freq", 1) == 0:
            names[p + "mlp.gate.weight"] = [E, hsz]
            names[p + "mlp.gate.e_score_correction_bias"] = [E]
            for e in range(E):
                names[p + f"mlp.experts.{e}.gate_proj.weight"] = [mi, hsz]
                names[p + f"mlp.experts.{e}.up_proj.weight"] = [mi, hsz]
                names[p + f"mlp.experts.{e}.down_proj.weight"] = [hsz, mi]
            si = mi * cfg["n_shared_experts"]
            names[p + "mlp.shared_experts.gate_proj.weight"] = [si, hsz]
            names[p + "mlp.shared_experts.up_proj.weight"] = [si, hsz]
            names[p + "mlp.shared_experts.down_proj.weight"] = [hsz, si]
        else:
            names[p + "mlp.gate_proj.weight"] = [di, hsz]
            names[p + "mlp.up_proj.weight"] = [di, hsz]
            names[p + "mlp.down_proj.weight"] = [hsz, di]
    return names


def drafter_names(cfg: dict) -> dict[str, list[int]]:
    """Every tensor 0.5.11's DFlashDraftModel needs for a drafter config, with its shape."""
    hsz, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, inter = cfg["head_dim"], cfg["intermediate_size"]
    k = len(cfg["dflash_config"]["target_layer_ids"])
    names = {"fc.weight": [hsz, k * hsz], "hidden_norm.weight": [hsz], "norm.weight": [hsz]}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        names.update({
            p + "input_layernorm.weight": [hsz], p + "post_attention_layernorm.weight": [hsz],
            p + "self_attn.q_proj.weight": [H * hd, hsz],
            p + "self_attn.k_proj.weight": [KV * hd, hsz],
            p + "self_attn.v_proj.weight": [KV * hd, hsz],
            p + "self_attn.o_proj.weight": [hsz, H * hd],
            p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
            p + "mlp.gate_proj.weight": [inter, hsz], p + "mlp.up_proj.weight": [inter, hsz],
            p + "mlp.down_proj.weight": [hsz, inter],
        })
    return names


def expected_names(cfg: dict) -> dict[str, list[int]]:
    if cfg.get("architectures") == ["DeepseekV3ForCausalLM"]:
        return target_names(cfg)
    if cfg.get("architectures") == ["DFlashDraftModel"]:
        return drafter_names(cfg)
    raise ValueError(f"no name rules for architectures {cfg.get('architectures')}")


def manifest() -> dict:
    out = {"about": ("the lab pair (bench/real_gpu/lab, issue 49): each file's sha256 and "
                     "size, each tensor's dtype and shape from the safetensors header; "
                     "written by `python3 bench/real_gpu/lab/pairfiles.py write`"),
           "models": {}}
    for m in PAIR:
        d = MODELS / m
        files = {f: {"sha256": sha256(d / f), "bytes": (d / f).stat().st_size}
                 for f in FILES if (d / f).exists()}
        header = read_header(d / "model.safetensors")
        out["models"][m] = {"files": files, "tensors": {
            k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in sorted(header.items())}}
    return out


def check() -> list[str]:
    """Problems with the committed pair: files against SHA256SUMS and the manifest, headers
    against the manifest and against the names and shapes 0.5.11 needs, drafter configs."""
    problems = []
    man = json.loads(MANIFEST.read_text())
    sums = {}
    for line in SUMS.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.lstrip("*")] = digest
    for m in PAIR:
        d = MODELS / m
        entry = man["models"].get(m)
        if entry is None:
            problems.append(f"{m}: not in {MANIFEST.name}")
            continue
        for f in FILES:
            rel = f"{m}/{f}"
            if not (d / f).exists():
                problems.append(f"{rel}: missing")
                continue
            got = sha256(d / f)
            if sums.get(rel) != got:
                problems.append(f"{rel}: sha256 {got[:12]} is not SHA256SUMS's "
                                f"{str(sums.get(rel))[:12]}")
            if entry["files"].get(f, {}).get("sha256") != got:
                problems.append(f"{rel}: sha256 {got[:12]} is not the manifest's")
        cfg = json.loads((d / "config.json").read_text())
        header = read_header(d / "model.safetensors")
        seen = {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in header.items()}
        if seen != entry["tensors"]:
            problems.append(f"{m}: tensors differ from the manifest")
        want = expected_names(cfg)
        for name, shape in want.items():
            if name not in header:
                problems.append(f"{m}: {name} missing (0.5.11 would leave it a dummy weight)")
            elif header[name]["shape"] != shape:
                problems.append(f"{m}: {name} has shape {header[name]['shape']}, 0.5.11 "
                                f"makes {shape}")
        for name in sorted(set(header) - set(want)):
            problems.append(f"{m}: {name} is a tensor 0.5.11 does not load")
        for name, v in header.items():
            if v["dtype"] != "BF16":
                problems.append(f"{m}: {name} is {v['dtype']}, not BF16")
        if cfg.get("architectures") == ["DFlashDraftModel"]:
            dc = cfg.get("dflash_config", {})
            layers = cfg.get("num_target_layers")
            tok = json.loads((d / "tokenizer.json").read_text())
            mask_id = {t["content"]: t["id"] for t in tok["added_tokens"]}.get("<|MASK|>")
            if dc.get("mask_token_id") != mask_id:
                problems.append(f"{m}: mask_token_id {dc.get('mask_token_id')} is not the "
                                f"tokenizer's <|MASK|> id {mask_id}")
            if dc.get("block_size") != 8 or not layers:
                problems.append(f"{m}: block_size {dc.get('block_size')}, num_target_layers "
                                f"{layers}: want 8 and set")
            elif max(dc.get("target_layer_ids", [layers])) > layers - 2:
                problems.append(f"{m}: target_layer_ids {dc.get('target_layer_ids')} go past "
                                f"L-2 = {layers - 2} (0.5.11 captures layer id + 1)")
        elif cfg["num_attention_heads"] % 8:
            problems.append(f"{m}: {cfg['num_attention_heads']} heads do not split at TP 8")
    return problems


def main(argv: list[str]) -> int:
    if argv[1:] == ["write"]:
        man = manifest()
        MANIFEST.write_text(json.dumps(man, indent=1) + "\n")
        lines = [f"{e['files'][f]['sha256']}  {m}/{f}"
                 for m, e in man["models"].items() for f in sorted(e["files"])]
        SUMS.write_text("\n".join(lines) + "\n")
        print(f"wrote {MANIFEST} and {SUMS}")
        return 0
    if argv[1:] == ["check"]:
        problems = check()
        print("\n".join(problems) if problems else "the lab pair's files are as recorded")
        return 1 if problems else 0
    print(__doc__.splitlines()[3:5])
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
