"""The table of models specfleet knows: sizes, the drafter's block size, parsers."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class ModelRow:
    # A substring of the target repo id (lower case) that selects this row.
    match: str
    # target + drafter safetensors, for the GPU-memory check when no size is given.
    weights_bytes: int | None
    # The drafter's config.json block_size, assumed until the real file is read.
    block_size: int
    # --reasoning-parser / --tool-call-parser.
    parser: str | None
    parser_why: str
    # What SGLang's memory rule reads from the config.json: the architecture, MLA, and the vision
    # tower (num_hidden_layers, hidden_size) of a multimodal model.
    architecture: str = ""
    mla: bool = False
    vision: tuple[int, int] | None = None
    # KV cache bytes per token on each GPU: the target's (MLA keeps one latent per layer on every
    # rank) and the drafter's per KV head (its heads shard over tensor parallel ranks).
    kv_bytes_per_token: int = 0
    draft_kv_bytes_per_token_per_head: int = 0
    draft_kv_heads: int = 0
    # The target's and the drafter's layers (SGLang's KV accounting scales by them) and the
    # target's context length (config.json max_position_embeddings).
    num_layers: int = 0
    draft_num_layers: int = 0
    context_length: int = 0


# moonshotai/Kimi-K2.6 safetensors (554.30 GiB) + z-lab/Kimi-K2.6-DFlash (6.48 GiB), sglang.md s3.
KIMI_K26_WEIGHTS_BYTES = int(554.3 * GIB) + int(6.5 * GIB)
KIMI_K26_TARGET = "moonshotai/Kimi-K2.6"
# Kimi-K2.6-DFlash's config.json block_size (sglang.md s3), used until the real file is read.
DEFAULT_BLOCK_SIZE = 8

# Kimi K2.6 config.json: KimiK25ForConditionalGeneration (DeepseekV3 text model + MoonViT);
# text_config kv_lora_rank 512 + qk_rope_head_dim 64 per layer, 61 layers, bf16 KV cache;
# vision_config as sglang's configs/kimi_k25.py KimiK25VisionConfig (27 layers, 1152 wide).
KIMI_K26_KV_BYTES_PER_TOKEN = (512 + 64) * 61 * 2
# Kimi-K2.6-DFlash (sglang.md s3): 6 layers, 8 KV heads of head_dim 128, K and V, bf16.
KIMI_K26_DFLASH_KV_BYTES_PER_HEAD = 6 * 2 * 128 * 2

KIMI_K26 = ModelRow(
    match="kimi",
    weights_bytes=None,
    block_size=DEFAULT_BLOCK_SIZE,
    parser="kimi_k2",
    parser_why="Kimi K2.x reasoning and tool-call formats",
    architecture="KimiK25ForConditionalGeneration",
    mla=True,
    vision=(27, 1152),
    kv_bytes_per_token=KIMI_K26_KV_BYTES_PER_TOKEN,
    draft_kv_bytes_per_token_per_head=KIMI_K26_DFLASH_KV_BYTES_PER_HEAD,
    draft_kv_heads=8,
    num_layers=61,
    draft_num_layers=6,
    # text_config max_position_embeddings.
    context_length=262144,
)
# Exact repo ids whose size is known.
WEIGHTS_BYTES: dict[str, int] = {KIMI_K26_TARGET: KIMI_K26_WEIGHTS_BYTES}


def model_row(repo_id: str) -> ModelRow | None:
    return KIMI_K26 if KIMI_K26.match in repo_id.lower() else None


def known_weights_bytes(repo_id: str) -> int | None:
    return WEIGHTS_BYTES.get(repo_id)
