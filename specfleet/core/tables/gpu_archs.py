"""The table of GPU architectures specfleet plans for: attention backends and memory fraction.

Adding an architecture is one ``ArchRule`` row in ``ARCHS`` (keyed by compute-capability major)
plus one ``nvidia-smi`` capture under ``tests/fixtures/nvidia/``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Above this, SGLang on SM120 has been seen to OOM with K2.6 (sglang.md s5 field notes).
SM120_MEM_FRACTION = 0.85
# z-lab's Kimi DFlash model card (a B200 recipe) uses 0.9.
SM100_MEM_FRACTION = 0.9


@dataclass(frozen=True)
class ArchRule:
    family: str
    # Target (MLA) backends in preference order; the first the registry has is chosen.
    target: tuple[str, ...]
    target_why: str
    draft: tuple[str, ...]
    draft_why: str
    # Target backends that pass SGLang's argument checks but fail at runtime here.
    target_broken: tuple[str, ...] = ()
    mem_fraction: float | None = None
    mem_fraction_why: str = ""
    # A memory fraction above which this arch has been seen to OOM (a note on overrides).
    mem_fraction_ceiling: float | None = None
    # Whether settings.plan.sm120_target_backend may reorder ``target`` (SM120 only).
    target_choice_setting: bool = False
    # Shown in the "no rule" error: the GPUs this row covers.
    covers: str = ""


SM90 = ArchRule(
    family="SM90",
    target=("fa3",),
    target_why="Hopper: fa3 is SGLang's own MLA default there",
    draft=("fa3", "flashinfer"),
    draft_why="the drafter is GQA; fa3 runs it on Hopper (flashinfer is the alternative)",
    target_broken=("trtllm_mla", "cutlass_mla"),
    mem_fraction=None,
    mem_fraction_why="SM90: left to SGLang's own default",
    covers="SM90 (fa3)",
)
SM100 = ArchRule(
    family="SM100",
    target=("trtllm_mla",),
    target_why="Blackwell datacenter: trtllm_mla is what SGLang picks for DeepseekV3/KimiK25 and "
    "what the Kimi DFlash card uses",
    draft=("fa4",),
    draft_why="the drafter is GQA; fa4 is the Kimi DFlash card's draft backend on B200/B300",
    target_broken=("fa3",),
    mem_fraction=SM100_MEM_FRACTION,
    mem_fraction_why="SM100: 0.9, as the Kimi DFlash model card uses",
    covers="SM100/103 (trtllm_mla)",
)
SM120 = ArchRule(
    family="SM120",
    target=("triton", "flashinfer"),
    target_why="RTX PRO 6000: triton is SGLang's MLA default on SM120 (flashinfer if chosen); "
    "trtllm_mla, cutlass_mla and fa3 fail there at runtime",
    draft=("flashinfer",),
    draft_why="the drafter is GQA; flashinfer drafting is known to work on SM120",
    target_broken=("trtllm_mla", "cutlass_mla", "fa3", "fa4"),
    mem_fraction=SM120_MEM_FRACTION,
    mem_fraction_why="SM120: at most 0.85, more has been seen to OOM with K2.6",
    mem_fraction_ceiling=SM120_MEM_FRACTION,
    target_choice_setting=True,
    covers="SM120 (triton/flashinfer)",
)

# Compute-capability major -> rule. 10: SM100 (B200) and SM103 (B300); 12: SM120 (RTX PRO 6000),
# SM121 (GB10) shares the family.
ARCHS: dict[int, ArchRule] = {9: SM90, 10: SM100, 12: SM120}
# What the "no rule" error suggests.
SUPPORTED_GPUS = "H100/H200, B200/B300 or RTX PRO 6000"


def arch_rule(major: int, minor: int) -> ArchRule | None:
    return ARCHS.get(major)


def covered_archs() -> str:
    """"SM90 (fa3), SM100/103 (trtllm_mla) and SM120 (triton/flashinfer)"."""
    covers = [r.covers for r in ARCHS.values()]
    return ", ".join(covers[:-1]) + " and " + covers[-1] if len(covers) > 1 else covers[0]


def capability(gpu: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) from a ``facts.gpu.Gpus`` entry's compute_capability (or its sm)."""
    cc = gpu.get("compute_capability")
    if cc is not None:
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(cc))
        if m:
            return int(m.group(1)), int(m.group(2))
    sm = gpu.get("sm")
    if sm is not None:
        m = re.search(r"(\d+)", str(sm))
        if m:
            digits = m.group(1)
            return int(digits[:-1] or 0), int(digits[-1])
    return None
