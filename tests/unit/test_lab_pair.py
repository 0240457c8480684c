"""The lab's trained pair (issue 49) as committed, without torch: every file against SHA256SUMS
and bench/real_gpu/models/lab-manifest.json, every tensor's dtype and shape from the safetensors
headers, and the names SGLang 0.5.11's loaders take for each config (a name they do not find
leaves a dummy weight on the GPU, silently). The checks live in bench/real_gpu/lab/pairfiles.py
(stdlib only); these tests run them on the committed files and on broken copies of them.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
_spec = importlib.util.spec_from_file_location("pairfiles",
                                               ROOT / "bench/real_gpu/lab/pairfiles.py")
pairfiles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pairfiles)


def test_the_committed_pair_is_as_recorded():
    assert pairfiles.check() == []


def test_the_target_has_what_0511_loads_and_splits_at_tp8():
    cfg = json.loads((pairfiles.MODELS / "lab-target" / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"],
            cfg["v_head_dim"], cfg["hidden_size"]) == (512, 64, 128, 128, 256)
    assert cfg["num_attention_heads"] in (8, 16)
    header = pairfiles.read_header(pairfiles.MODELS / "lab-target" / "model.safetensors")
    experts = [n for n in header if ".mlp.experts." in n]
    # transformers 5 fuses experts in memory; what it saved must be per expert for 0.5.11
    assert experts and all(n.split(".mlp.experts.")[1].split(".")[0].isdigit() for n in experts)
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in header


def test_drafters_point_at_the_tokenizers_mask_and_layers_0511_captures():
    for m in ("lab-drafter", "lab-drafter-weak", "lab-drafter-rope50k"):
        cfg = json.loads((pairfiles.MODELS / m / "config.json").read_text())
        assert cfg["architectures"] == ["DFlashDraftModel"]
        assert cfg["dflash_config"]["block_size"] == 8
        assert max(cfg["dflash_config"]["target_layer_ids"]) <= cfg["num_target_layers"] - 2
    rope = json.loads((pairfiles.MODELS / "lab-drafter-rope50k" / "config.json").read_text())
    assert rope["rope_theta"] == 50000.0


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "models"
    for m in pairfiles.PAIR:
        shutil.copytree(pairfiles.MODELS / m, dst / m)
    shutil.copy(pairfiles.MANIFEST, dst / pairfiles.MANIFEST.name)
    shutil.copy(pairfiles.SUMS, dst / pairfiles.SUMS.name)
    return dst


def _point_at(monkeypatch, models: Path) -> None:
    monkeypatch.setattr(pairfiles, "MODELS", models)
    monkeypatch.setattr(pairfiles, "MANIFEST", models / pairfiles.MANIFEST.name)
    monkeypatch.setattr(pairfiles, "SUMS", models / pairfiles.SUMS.name)


def _rename_tensor(path: Path, old: str, new: str) -> None:
    """Rewrite a safetensors header with one tensor renamed (same data, same offsets)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header[new] = header.pop(old)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def test_a_renamed_expert_is_named_as_a_dummy_weight(tmp_path, monkeypatch):
    models = _copy(tmp_path)
    _point_at(monkeypatch, models)
    st = models / "lab-target" / "model.safetensors"
    # the shape transformers 5 keeps in memory: 0.5.11 finds no parameter for it
    _rename_tensor(st, "model.layers.1.mlp.experts.0.gate_proj.weight",
                   "model.layers.1.mlp.experts.gate_up_proj")
    problems = pairfiles.check()
    assert any("experts.0.gate_proj.weight missing" in p for p in problems)
    assert any("experts.gate_up_proj is a tensor 0.5.11 does not load" in p for p in problems)
    assert any("sha256" in p and "lab-target/model.safetensors" in p for p in problems)


def test_a_changed_byte_and_a_wrong_mask_id_are_caught(tmp_path, monkeypatch):
    models = _copy(tmp_path)
    _point_at(monkeypatch, models)
    st = models / "lab-drafter" / "model.safetensors"
    raw = bytearray(st.read_bytes())
    raw[-1] ^= 1
    st.write_bytes(bytes(raw))
    cfg_path = models / "lab-drafter-weak" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dflash_config"]["mask_token_id"] = 0
    cfg["dflash_config"]["target_layer_ids"] = [0, 2]
    cfg_path.write_text(json.dumps(cfg))
    problems = pairfiles.check()
    assert any(p.startswith("lab-drafter/model.safetensors: sha256") for p in problems)
    assert any("mask_token_id 0 is not the tokenizer's <|MASK|> id" in p for p in problems)
    assert any("go past L-2" in p for p in problems)


@pytest.mark.parametrize("name", ["lab-target", "lab-drafter"])
def test_headers_parse_to_bf16_tensors_that_fill_the_file(name):
    path = pairfiles.MODELS / name / "model.safetensors"
    header = pairfiles.read_header(path)
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    end = max(v["data_offsets"][1] for v in header.values())
    assert 8 + n + end == path.stat().st_size
    for v in header.values():
        count = 1
        for d in v["shape"]:
            count *= d
        assert v["dtype"] == "BF16"
        assert v["data_offsets"][1] - v["data_offsets"][0] == 2 * count
