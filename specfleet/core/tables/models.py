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


# moonshotai/Kimi-K2.6 safetensors (554.30 GiB) + z-lab/Kimi-K2.6-DFlash (6.48 GiB), sglang.md s3.
KIMI_K26_WEIGHTS_BYTES = int(554.3 * GIB) + int(6.5 * GIB)
KIMI_K26_TARGET = "moonshotai/Kimi-K2.6"
# Kimi-K2.6-DFlash's config.json block_size (sglang.md s3), used until the real file is read.
DEFAULT_BLOCK_SIZE = 8

KIMI_K26 = ModelRow(
    match="kimi",
    weights_bytes=None,
    block_size=DEFAULT_BLOCK_SIZE,
    parser="kimi_k2",
    parser_why="Kimi K2.x reasoning and tool-call formats",
)
# Exact repo ids whose size is known.
WEIGHTS_BYTES: dict[str, int] = {KIMI_K26_TARGET: KIMI_K26_WEIGHTS_BYTES}


def model_row(repo_id: str) -> ModelRow | None:
    return KIMI_K26 if KIMI_K26.match in repo_id.lower() else None


def known_weights_bytes(repo_id: str) -> int | None:
    return WEIGHTS_BYTES.get(repo_id)
