"""PLACEHOLDERS of the lab pair's files (issue 49), for the CPU rehearsal of ``lab_run.sh`` only
(``rehearse.sh``), while the pair is not in the checkout: the same layout and formats
``lab_run.py`` reads (configs, a WordLevel ``tokenizer.json`` of the lab's 64 tokens, a
reference, a stale-mask prediction, a probe), with made-up values and no weights. Never a
result: a server cannot start on them (no safetensors), and the rehearsal stops before any.

    python bench/real_gpu/lab_placeholders.py OUTDIR   # writes OUTDIR/models/lab-*, OUTDIR/lab/
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|MASK|>", "<|user|>", "<|assistant|>",
            "<|system|>", "<|eot|>", "<|unk|>"]
VOCAB = SPECIALS + list("abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRS")
BOS, MASK, EOT = 1, 3, 7


def target_config() -> dict:
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "vocab_size": 64, "hidden_size": 256, "intermediate_size": 512,
            "moe_intermediate_size": 128, "num_hidden_layers": 3, "first_k_dense_replace": 1,
            "num_attention_heads": 8, "num_key_value_heads": 8, "n_routed_experts": 4,
            "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
            "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128, "v_head_dim": 128, "max_position_embeddings": 256,
            "rope_theta": 10000.0, "bos_token_id": BOS, "eos_token_id": EOT,
            "torch_dtype": "bfloat16", "placeholder": True}


def drafter_config(rope: float) -> dict:
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 64,
            "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1,
            "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64,
            "max_position_embeddings": 256, "rope_theta": rope, "block_size": 8,
            "num_target_layers": 3,
            "dflash_config": {"block_size": 8, "target_layer_ids": [0, 1],
                              "num_target_layers": 3, "mask_token_id": MASK},
            "torch_dtype": "bfloat16", "placeholder": True}


def main(out: str) -> None:
    root = Path(out)
    models, lab = root / "models", root / "lab"
    (models / "lab-target").mkdir(parents=True, exist_ok=True)
    (models / "lab-target" / "config.json").write_text(json.dumps(target_config(), indent=1))
    tok = {"model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(VOCAB)},
                     "unk_token": "<|unk|>"},
           "added_tokens": [{"id": i, "content": t, "special": True}
                            for i, t in enumerate(SPECIALS)]}
    (models / "lab-target" / "tokenizer.json").write_text(json.dumps(tok))
    for name, rope in (("lab-drafter", 1e6), ("lab-drafter-weak", 1e6),
                       ("lab-drafter-rope50k", 50000.0)):
        (models / name).mkdir(parents=True, exist_ok=True)
        (models / name / "config.json").write_text(json.dumps(drafter_config(rope), indent=1))
    lab.mkdir(parents=True, exist_ok=True)
    prompts = []
    for i in range(16):
        seg = [9 + (i * 5 + j * 3) % 55 for j in range(4 + i % 8)]
        ids = [BOS] + [seg[k % len(seg)] for k in range(2 * len(seg) + 1)]
        exp = [seg[(2 * len(seg) + 1 + k) % len(seg)] for k in range(48)]
        prompts.append({"index": i, "kind": "raw", "input_ids": ids, "expected_output": exp,
                        "drafters": {"lab-drafter": {"spec_accept_length": 7.9},
                                     "lab-drafter-weak": {"spec_accept_length": 5.3},
                                     "lab-drafter-rope50k": {"spec_accept_length": 7.8}}})
    (lab / "reference.json").write_text(json.dumps({
        "placeholder": True, "max_new_tokens": 48, "prompts": prompts,
        "mean_spec_accept_length": {"lab-drafter": 7.9, "lab-drafter-weak": 5.3,
                                    "lab-drafter-rope50k": 7.8}}, indent=1))
    layouts = {"alone": [[i] for i in range(16)],
               "batch6": [list(range(k, min(k + 6, 16))) for k in range(0, 16, 6)],
               "batch8": [list(range(k, min(k + 8, 16))) for k in range(0, 16, 8)]}
    other = {"alone": [], "batch6": [1, 2, 8, 13], "batch8": [3, 9, 10]}
    (lab / "stale_mask_prediction.json").write_text(json.dumps({
        "placeholder": True, "layouts": layouts, "drafters": {"lab-drafter": {
            k: {"prompts_with_other_tokens": v, "prompts_with_other_acceptance": v}
            for k, v in other.items()}}}, indent=1))
    (lab / "probe.json").write_text(json.dumps({
        "placeholder": True,
        "questions": [{"prompt": "abcdabcd", "answer": "abcd"}], "max_tokens": 40,
        "timeout_s": 60, "min_correct": 1, "concurrency": 1, "min_accept_length": 4.0}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
