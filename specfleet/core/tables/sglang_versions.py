"""THE one table of what each SGLang version has.

Everything specfleet knows about SGLang versions ahead of installing them lives here: which DFLASH
worker ships, which attention backends the registry holds, which speculative algorithms exist, what
the draft-window flag is called, which flags DFLASH rejects, and which compressed-tensors to pair
with it. The planner uses it to predict a plan on a fresh host (``--dry`` before install); the
software operation uses the compressed-tensors specifier. On a host where SGLang is installed, the
facts read from the installed files win over this table.

Rows are keyed by ``packaging`` specifiers and looked up with ``packaging`` versions, never by
string comparison. Bounds are written as ``X.dev0`` so that pre-releases, dev builds and git
installs of a release (``0.5.14rc1``, ``0.5.14.dev12+g1234``) fall in that release's row: a plain
``<0.5.14`` would leave them out of the row below and ``>=0.5.14`` out of the row above.

Sources: the released wheels, unpacked and read (see the comments on each row; the checks are
tests/unit/test_plan_versions.py), and /work/shared/reference/sglang.md sections 2 and 4.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# The newest release whose wheel was read for this table (tests/harness/wheelhouse.py downloads
# it; tests/unit/test_settings_ready.py holds the two together). A newer version matches the last
# row's open specifier, but nothing of it was read: `specfleet settings` refuses it.
NEWEST_READ = "0.5.23"

# The draft-window flag and the default specfleet passes (the DFLASH default in 0.5.11 too).
DRAFT_WINDOW_FLAG_V1 = "--speculative-dflash-draft-window-size"
DRAFT_WINDOW_FLAG = "--speculative-draft-window-size"


def parse_version(version: str | Version) -> Version:
    """A ``packaging`` Version; raises ValueError with the offending text."""
    if isinstance(version, Version):
        return version
    try:
        return Version(str(version).strip())
    except InvalidVersion as exc:
        raise ValueError(f"not a version: {version!r}") from exc


# --------------------------------------------------------------------------------------------------
# compressed-tensors
# --------------------------------------------------------------------------------------------------
# Why these bounds:
# - < 0.10 lacks CompressionFormat.nvfp4_pack_quantized, which sglang >= 0.5.11 reads while loading
#   any compressed-tensors checkpoint (Kimi K2.6 INT4 is one): AttributeError at model load.
# - 0.14.0 / 0.14.0.1 require transformers<5; sglang >= 0.5.11 pins transformers 5.x.
# - >= 0.16 needs torch >= 2.10; sglang 0.5.11-0.5.15 pin torch 2.11, so that is fine.
# - sglang <= 0.5.15 leaves compressed-tensors unpinned; 0.15.0.1 was current when 0.5.11 came out
#   and 0.18.0 is what sglang pinned later, so the window is >=0.15.0.1,<0.19.
# - sglang 0.5.19 and later pin ==0.18.0 themselves; asking for anything else would fail the
#   resolver. 0.5.16-0.5.18 leave it unpinned (torch 2.11 through 0.5.17, 2.13 from 0.5.18, both
#   >= 2.10, and transformers 5.12.1: the 0.5.11 window holds).
# Checked in the wheels METADATA: 0.5.11-0.5.18 "Requires-Dist: compressed-tensors" (unpinned;
# transformers==5.6.0 / 5.8.1 / 5.12.1), 0.5.19-0.5.23 "compressed-tensors==0.18.0"; 0.5.11
# compressed_tensors/utils.py reads CompressionFormat.nvfp4_pack_quantized.
_CT_AVOID = "!=0.14.*"


@dataclass(frozen=True)
class CTRow:
    sglang: SpecifierSet
    compressed_tensors: SpecifierSet
    why: str


COMPRESSED_TENSORS: tuple[CTRow, ...] = (
    CTRow(
        SpecifierSet(">=0.5.19.dev0"),
        SpecifierSet("==0.18.0"),
        "sglang 0.5.19 and later pin compressed-tensors==0.18.0 in their own requirements",
    ),
    CTRow(
        SpecifierSet(">=0.5.11.dev0,<0.5.19.dev0"),
        SpecifierSet(f">=0.15.0.1,<0.19,{_CT_AVOID}"),
        "sglang 0.5.11-0.5.18 leave compressed-tensors unpinned; >=0.10 has "
        "nvfp4_pack_quantized, 0.14.x needs transformers<5, 0.15.0.1 was current at 0.5.11's "
        "release, 0.18.0 is what sglang pinned from 0.5.19",
    ),
    CTRow(
        SpecifierSet("<0.5.11.dev0"),
        SpecifierSet(f">=0.10,<0.19,{_CT_AVOID}"),
        "pre-DFLASH sglang; only the nvfp4_pack_quantized floor and the 0.14.x conflict are known",
    ),
)


def compressed_tensors_row(sglang_version: str | Version) -> CTRow:
    v = parse_version(sglang_version)
    for row in COMPRESSED_TENSORS:
        if row.sglang.contains(v, prereleases=True):
            return row
    # Unreachable: the rows cover every version. Kept explicit rather than asserted.
    raise LookupError(f"no compressed-tensors row for sglang {v}")


def compressed_tensors_specifier(sglang_version: str | Version) -> SpecifierSet:
    """The compressed-tensors versions to install next to ``sglang_version``.

    >>> str(compressed_tensors_specifier("0.5.23"))
    '==0.18.0'
    >>> "0.14.0.1" in compressed_tensors_specifier("0.5.11")
    False
    """
    return compressed_tensors_row(sglang_version).compressed_tensors


# --------------------------------------------------------------------------------------------------
# Features, attention backends, speculative algorithms and flags
# --------------------------------------------------------------------------------------------------

# attention_registry.py's @register_attention_backend("...") names, listed by grepping the
# decorators in each wheel (importing the module would pull in torch). Written out per release
# rather than derived, so a diff against a new wheel is a plain set difference. The CLI's
# ATTENTION_BACKEND_CHOICES is a different list; what the planner may choose is the registry.
_BACKENDS_0_5_11 = frozenset(
    {
        "aiter", "ascend", "cutlass_mla", "dual_chunk_flash_attn", "fa3", "fa4", "flashinfer",
        "flashmla", "flex_attention", "intel_amx", "intel_xpu", "nsa", "torch_native", "triton",
        "trtllm_mha", "trtllm_mla", "wave",
    }
)  # fmt: skip
_BACKENDS_0_5_12 = _BACKENDS_0_5_11 | {"dsv4", "tokenspeed_mla"}
# 0.5.13 and 0.5.14 (cutedsl_mla and dsa join).
_BACKENDS_0_5_14 = frozenset(
    {
        "aiter", "ascend", "cutedsl_mla", "cutlass_mla", "dsa", "dsv4", "dual_chunk_flash_attn",
        "fa3", "fa4", "flashinfer", "flashmla", "flex_attention", "intel_amx", "intel_xpu", "nsa",
        "tokenspeed_mla", "torch_native", "triton", "trtllm_mha", "trtllm_mla", "wave",
    }
)  # fmt: skip
# Each release between 0.5.14 and 0.5.23, read from its wheel (0.5.15 and 0.5.16 as 0.5.14):
# 0.5.17 adds hpc_ops; 0.5.19 minicpm_flashattn / minicpm_flashinfer; 0.5.20 drops cutlass_mla and
# dual_chunk_flash_attn and adds qsa; 0.5.22 adds llada2_cfg_flashinfer; 0.5.23 drops
# tokenspeed_mla (sglang.md lists only the cutlass_mla / tokenspeed_mla removals).
_BACKENDS_0_5_17 = _BACKENDS_0_5_14 | {"hpc_ops"}
_BACKENDS_0_5_19 = _BACKENDS_0_5_17 | {"minicpm_flashattn", "minicpm_flashinfer"}
_BACKENDS_0_5_20 = (_BACKENDS_0_5_19 - {"cutlass_mla", "dual_chunk_flash_attn"}) | {"qsa"}
_BACKENDS_0_5_22 = _BACKENDS_0_5_20 | {"llada2_cfg_flashinfer"}
_BACKENDS_0_5_23 = frozenset(
    {
        "aiter", "ascend", "cutedsl_mla", "dsa", "dsv4", "fa3", "fa4", "flashinfer", "flashmla",
        "flex_attention", "hpc_ops", "intel_amx", "intel_xpu", "llada2_cfg_flashinfer",
        "minicpm_flashattn", "minicpm_flashinfer", "nsa", "qsa", "torch_native", "triton",
        "trtllm_mha", "trtllm_mla", "wave",
    }
)  # fmt: skip

# SpeculativeAlgorithm enum members in srt/speculative/spec_info.py, in declaration order.
_ALGOS_0_5_11 = ("DFLASH", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NONE")
_ALGOS_0_5_12 = ("DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE")
# 0.5.16 adds DSPARK, 0.5.20 UNO.
_ALGOS_0_5_16 = (
    "DFLASH", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE",
)  # fmt: skip
_ALGOS_0_5_23 = (
    "DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE",
)  # fmt: skip

# Flags never to render with DFLASH. 0.5.11 server_args.py and 0.5.14 arg_groups/speculative_hook.py
# (_handle_dflash) raise "DFLASH speculative decoding does not support dp attention", so the
# brief's "<=0.5.13" really extends to 0.5.15. Both force num_steps/eagle_topk to 1 with a warning.
# 0.5.16-0.5.19 raise the same; 0.5.20-0.5.22 raise "... does not support dp attention on non-NPU
# devices" (speculative_hook.py _handle_dflash): refused on CUDA through 0.5.22.
# 0.5.23's _handle_dflash accepts dp attention (needs --enable-dp-lm-head; --enable-dp-attention
# is a deprecated alias of --attn-dp-size there) and still forces num_steps/eagle_topk to 1.
_DFLASH_FORBIDDEN_0_5_11 = (
    "--enable-dp-attention",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
)
_DFLASH_FORBIDDEN_0_5_23 = ("--speculative-num-steps", "--speculative-eagle-topk")

# Draft backends DFLASH accepts. 0.5.11 dflash_worker.py: supported_draft_backends =
# ("flashinfer", "fa3", "fa4", "triton"); 0.5.14 dflash_worker_v2.py adds "ascend"; 0.5.23
# resolves through draft_worker_common.py against arg_groups/choices.py
# DRAFT_ATTENTION_BACKEND_CHOICES. Anything else silently falls back to flashinfer, so the planner
# checks it rather than let the server substitute.
_DRAFT_0_5_11 = ("flashinfer", "fa3", "fa4", "triton")
_DRAFT_0_5_14 = ("flashinfer", "fa3", "fa4", "triton", "ascend")
# 0.5.17-0.5.19 speculative_hook.py _resolve_dflash_draft_attention_backend: its own
# supported_draft_backends adds "trtllm_mha" (0.5.19 already has DRAFT_ATTENTION_BACKEND_CHOICES in
# server_args.py, but DFLASH checks its own tuple); 0.5.20 on resolve through choices.py.
_DRAFT_0_5_17 = ("flashinfer", "fa3", "fa4", "triton", "trtllm_mha", "ascend")
_DRAFT_0_5_23 = ("flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha", "intel_xpu")


# Read from the wheels: 0.5.11 server_args.py __post_init__'s DFLASH block ("Currently DFLASH
# speculative decoding only supports pp_size == 1.") and check_server_args ("tp_size must be
# divisible by number of nodes", "multi-node data parallel is not supported unless dp
# attention!"); 0.5.14 moved the DFLASH checks to arg_groups/speculative_hook.py _handle_dflash;
# 0.5.23 checks the node split in arg_groups/validation_hook.py check_server_args.
MULTINODE_SOURCE_0_5_11 = (
    "sglang/srt/server_args.py: ServerArgs.__post_init__ (DFLASH: pp_size == 1) and "
    "check_server_args ((tp_size * pp_size) % nnodes == 0; no dp_size > 1 across nodes)"
)
MULTINODE_SOURCE_0_5_14 = (
    "sglang/srt/arg_groups/speculative_hook.py _handle_dflash (pp_size == 1) and "
    "sglang/srt/server_args.py check_server_args ((tp_size * pp_size) % nnodes == 0; no "
    "dp_size > 1 across nodes)"
)
# 0.5.19 on (validation_hook.py appears with the resolution pipeline in 0.5.19).
MULTINODE_SOURCE_0_5_23 = (
    "sglang/srt/arg_groups/speculative_hook.py (DFLASH: pp_size == 1) and "
    "sglang/srt/arg_groups/validation_hook.py check_server_args ((tp_size * pp_size) % nnodes "
    "== 0; no dp_size > 1 across nodes)"
)


# --------------------------------------------------------------------------------------------------
# SGLang's own memory rule: the mem_fraction_static it chooses when the flag is left to it
# --------------------------------------------------------------------------------------------------
# What every release read does (0.5.11-0.5.14 ServerArgs._handle_gpu_memory_settings in
# server_args.py; 0.5.23 handle_gpu_memory_settings in arg_groups/memory_hook.py), all in MiB of
# one GPU's memory as get_device_memory_capacity gives it:
#   chunked_prefill_size and the decode CUDA graph max batch by GPU memory (the tiers below;
#   0.5.23 raised the 20-35 GiB tier);
#   reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + decode_max_bs * 2
#              + tp_size * pp_size / 8 * 1024
#              + decode_max_bs * attn_dp_size * 3 (+ * 1.5 more above 300) with dp attention
#              + 1.5 * 1024 for an MLA model while the piecewise/prefill CUDA graph is on;
#   reserved = max(reserved, 10 * 1024) on a GPU above 60 GiB;
#   reserved += 4 * 1024 for a speculative draft model (EAGLE/DFLASH; 0.5.11-0.5.13 only);
#   mem_fraction_static = round((gpu_mem - reserved) / gpu_mem, 3);
#   then, for a multimodal model, adjust_mem_fraction_for_vlm multiplies by
#   0.95 * clamp(1 - 0.1 * (vit_layers * vit_hidden^2 / (24 * 1024^2) - 1), 0.8, 1.05).
# tests/harness/sglang_rules.py executes these methods from each wheel and the matrix tests compare.


@dataclass(frozen=True)
class MemoryRule:
    """How one range of releases chooses mem_fraction_static."""

    source: str
    # Reserve for a speculative draft model and its CUDA graphs (not NGRAM; STANDALONE 6 GiB).
    draft_reserve_mib: int
    # Multimodal architectures that keep the piecewise (prefill) CUDA graph, so its MLA reserve
    # counts (model_config.py's multimodal_*_cuda_graph_supported_model_archs as the rule reads).
    multimodal_prefill_graph_archs: frozenset[str] = frozenset()
    # chunked_prefill_size and the decode CUDA graph max batch by GPU memory (MEMORY_TIERS).
    tiers: tuple[tuple[float, int, int, int], ...] = ()
    # Whether a text-only MLA model keeps the prefill CUDA graph (so its MLA reserve counts):
    # 0.5.16-0.5.17 make the breakable graph the default and turn it off for MLA attention.
    text_mla_prefill_graph: bool = True


# (upper bound of GPU MiB, chunked_prefill_size, decode max bs at tp < 4, at tp >= 4), first match.
MEMORY_TIERS = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 24, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (float("inf"), 16384, 512, 512),
)
# 0.5.23 memory_hook.py: 20-35 GiB GPUs (A10, 4090, 5090) get chunked prefill 4k and a decode
# graph to 48 (160 at tp >= 4), "the previous cap forced eager decode at bs>=32".
MEMORY_TIERS_0_5_23 = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 4096, 48, 160),
    *MEMORY_TIERS[2:],
)
MLA_PREFILL_GRAPH_RESERVE_MIB = 1536
DP_ATTENTION_LARGE_BS = 300
LARGE_GPU_MIB = 60 * 1024
LARGE_GPU_MIN_RESERVE_MIB = 10 * 1024

MEMORY_0_5_11 = MemoryRule(
    source="sglang/srt/server_args.py ServerArgs._handle_gpu_memory_settings (+4 GiB for a "
    "draft model), adjust_mem_fraction_for_vlm",
    draft_reserve_mib=4 * 1024,
)
MEMORY_0_5_14 = MemoryRule(
    source="sglang/srt/server_args.py ServerArgs._handle_gpu_memory_settings (no draft-model "
    "reserve since 0.5.14), adjust_mem_fraction_for_vlm",
    draft_reserve_mib=0,
)
# 0.5.15: the breakable prefill CUDA graph becomes the default, and _disable_breakable_cudagraph_
# if_incompatible turns it off for MLA attention and for a multimodal model: no MLA reserve for
# DeepseekV3 or Kimi K2.5/K2.6.
MEMORY_0_5_15 = MemoryRule(
    source="sglang/srt/server_args.py ServerArgs._handle_gpu_memory_settings (no draft-model "
    "reserve), adjust_mem_fraction_for_vlm; the breakable prefill CUDA graph is off for MLA "
    "attention (_disable_breakable_cudagraph_if_incompatible)",
    draft_reserve_mib=0,
    text_mla_prefill_graph=False,
)
# 0.5.16-0.5.18: server_args.py still. 0.5.16 makes the breakable prefill CUDA graph the default;
# Kimi K2.5 is in multimodal_piecewise_cuda_graph_supported_model_archs, so
# _apply_cuda_graph_compatibility switches it to tc_piecewise and its MLA reserve counts, while a
# text-only MLA model (DeepseekV3) stays breakable, which _disable_breakable_cudagraph_if_
# incompatible turns off ("MLA attention"; 0.5.17: "MLA attention (non-DSA)"): no reserve.
# 0.5.18 drops that rule and puts Kimi K2.5 in the breakable list too: both keep the graph.
MEMORY_0_5_16 = MemoryRule(
    source="sglang/srt/server_args.py ServerArgs._handle_gpu_memory_settings (no draft-model "
    "reserve), adjust_mem_fraction_for_vlm; Kimi K2.5/K2.6 keep the prefill CUDA graph "
    "(_apply_cuda_graph_compatibility, model_config.py multimodal_piecewise_cuda_graph_supported_"
    "model_archs), a text-only MLA model does not (_disable_breakable_cudagraph_if_incompatible)",
    draft_reserve_mib=0,
    multimodal_prefill_graph_archs=frozenset({"KimiK25ForConditionalGeneration"}),
    text_mla_prefill_graph=False,
)
MEMORY_0_5_18 = MemoryRule(
    source="sglang/srt/server_args.py ServerArgs._handle_gpu_memory_settings (no draft-model "
    "reserve), adjust_mem_fraction_for_vlm; Kimi K2.5/K2.6 keep the prefill CUDA graph "
    "(model_config.py multimodal_breakable_cuda_graph_supported_model_archs)",
    draft_reserve_mib=0,
    multimodal_prefill_graph_archs=frozenset({"KimiK25ForConditionalGeneration"}),
)
# 0.5.19: the rule moves to arg_groups/memory_hook.py with the tiers of 0.5.11-0.5.18.
MEMORY_0_5_19 = MemoryRule(
    source="sglang/srt/arg_groups/memory_hook.py handle_gpu_memory_settings and "
    "adjust_mem_fraction_for_vlm (no draft-model reserve; Kimi K2.5/K2.6 keep the prefill CUDA "
    "graph: cuda_graph_hook.py, model_config.py multimodal_breakable_cuda_graph_supported_model_"
    "archs)",
    draft_reserve_mib=0,
    multimodal_prefill_graph_archs=frozenset({"KimiK25ForConditionalGeneration"}),
)
# 0.5.20 on: the 20-35 GiB tier raised (MEMORY_TIERS_0_5_23).
MEMORY_0_5_23 = MemoryRule(
    source="sglang/srt/arg_groups/memory_hook.py handle_gpu_memory_settings and "
    "adjust_mem_fraction_for_vlm (no draft-model reserve; Kimi K2.5/K2.6 keep the prefill CUDA "
    "graph: cuda_graph_hook.py, model_config.py multimodal_breakable_cuda_graph_supported_model_"
    "archs)",
    draft_reserve_mib=0,
    multimodal_prefill_graph_archs=frozenset({"KimiK25ForConditionalGeneration"}),
    tiers=MEMORY_TIERS_0_5_23,
)


def sglang_mem_fraction(
    rule: MemoryRule,
    gpu_mib: int,
    tp: int,
    *,
    speculative: bool,
    mla: bool,
    architecture: str,
    vision: tuple[int, int] | None,
    attn_dp_size: int = 1,
) -> tuple[float, float]:
    """(mem_fraction_static SGLang chooses, the reserve in MiB before the vision adjustment).

    ``vision``: (num_hidden_layers, hidden_size) of a multimodal model's vision tower, else None.
    ``attn_dp_size``: the attention data-parallel width (1: no dp attention).

    >>> round(sglang_mem_fraction(MEMORY_0_5_11, 143771, 8, speculative=True, mla=True,
    ...     architecture="DeepseekV3ForCausalLM", vision=None)[0], 3)
    0.858
    """
    _, chunk, bs_small, bs_large = next(t for t in rule.tiers or MEMORY_TIERS if gpu_mib < t[0])
    max_bs = bs_small if tp < 4 else bs_large
    reserved = 512 + max(chunk, 2048) * 1.5 + max_bs * 2 + tp / 8 * 1024
    if attn_dp_size > 1:
        # "DP attention needs more padding", and more for a large decode graph (0.5.11
        # _handle_gpu_memory_settings, 0.5.23 memory_hook.py reserve_for_graph_mb).
        reserved += max_bs * attn_dp_size * (4.5 if max_bs > DP_ATTENTION_LARGE_BS else 3)
    if vision is None:
        prefill_graph = rule.text_mla_prefill_graph or not mla
    else:
        prefill_graph = architecture in rule.multimodal_prefill_graph_archs
    if prefill_graph and mla:
        reserved += MLA_PREFILL_GRAPH_RESERVE_MIB
    if gpu_mib > LARGE_GPU_MIB:
        reserved = max(reserved, LARGE_GPU_MIN_RESERVE_MIB)
    if speculative:
        reserved += rule.draft_reserve_mib
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    if vision is not None:
        fraction *= vlm_factor(*vision)
    return fraction, reserved


def vlm_factor(vit_layers: int, vit_hidden: int) -> float:
    """adjust_mem_fraction_for_vlm's factor for a vision tower of this size."""
    ratio = vit_layers * vit_hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


# SGLang's max_running_requests when left unset with DFLASH (every release read: 0.5.11
# server_args.py, 0.5.13+ arg_groups/speculative_hook.py "Max running requests is reset to 48 for
# speculative decoding"); seen on a real GPU with 0.5.11.
DFLASH_MAX_RUNNING_REQUESTS = 48


# --------------------------------------------------------------------------------------------------
# Requests a DFLASH server refuses, the draft counts it reports, the port it needs
# --------------------------------------------------------------------------------------------------
# A request DFLASH cannot serve is aborted by the scheduler with validate_dflash_request's message
# (0.5.11-0.5.12 srt/managers/scheduler.py; from 0.5.13 srt/speculative/dflash_utils.py): the
# client gets an error (HTTP 400), not an answer. What each refusal covers, by the request fields
# that set it (0.5.11 entrypoints/openai/protocol.py to_sampling_params and serving_chat.py
# _process_messages: with tools and a tool-call parser, tool_choice "required", a named tool, or
# tool_choice "auto" with a tool marked strict becomes a structural_tag; without a parser
# "required" / a named tool becomes a json_schema).
DFLASH_REFUSAL_WHAT = {
    "logprobs": "log probabilities (logprobs / top_logprobs on the OpenAI APIs, return_logprob "
    "on /generate)",
    "grammar": "constrained output (response_format json_object / json_schema / structural_tag, "
    "regex, ebnf; on the chat API tool_choice \"required\", a named tool_choice or a strict "
    "tool, which SGLang turns into a grammar)",
    "hidden_states": "return_hidden_states (refused with the overlap worker)",
}
DFLASH_REFUSALS_SOURCE_0_5_11 = "srt/managers/scheduler.py validate_dflash_request"
DFLASH_REFUSALS_SOURCE = "srt/speculative/dflash_utils.py validate_dflash_request"

# meta_info's per-request draft counts, (accepted, proposed) name pairs in the order a release
# writes them (srt/managers/tokenizer_manager.py _calculate_spec_decoding_metrics): 0.5.11 the old
# pair; 0.5.12 added spec_num_correct_drafts / spec_num_proposed_drafts, keeping the old as
# "backward-compat aliases"; 0.5.21 dropped the old (read in the 0.5.11-0.5.23 wheels).
DRAFT_COUNTS_OLD = ("spec_accepted_drafts", "spec_proposed_drafts")
DRAFT_COUNTS_NEW = ("spec_num_correct_drafts", "spec_num_proposed_drafts")

# The port rule: 0.5.11-0.5.15 set grpc_port to SGLANG_GRPC_PORT or else --port + 10000, and
# refuse at start ("SGLANG_GRPC_PORT (N) must be between 1 and 65535") when it is above 65535,
# gRPC used or not (server_args.py ServerArgs._handle_deprecated_args; seen on a real server).
# From 0.5.16 the port + 10000 default applies only in the legacy gRPC modes, which specfleet
# never starts.
GRPC_PORT_OFFSET = 10000
MAX_PORT = 65535

# How a DFLASH server counts its drafter in the KV pool (model_executor/pool_configurator.py,
# DefaultPoolConfigurator): "layers" (0.5.11-0.5.17, dflash_utils.py
# scale_kv_cell_size_per_token_for_dflash without a draft cell): the target's bytes per token
# scaled by (target layers + draft layers) / target layers, rounded up; "own" (0.5.18 on,
# _dflash_draft_cell_size): the target's plus the drafter's own cell. The pool holds
# available bytes // that many tokens, and no request may hold more (managers/tp_worker.py
# max_req_len = min(context_len - 1, max_token_pool_size - 1)).
DRAFT_KV_BY_LAYERS = "layers"
DRAFT_KV_OWN_CELL = "own"


def kv_cell_bytes(scheme: str, target_cell: int, target_layers: int, draft_layers: int,
                  draft_cell: int) -> int:
    """SGLang's bytes per token of KV pool on one GPU, drafter included.

    >>> kv_cell_bytes("layers", (512 + 64) * 61 * 2, 61, 6, 3072)
    77184
    >>> kv_cell_bytes("own", (512 + 64) * 61 * 2, 61, 6, 3072)
    73344
    """
    if scheme == DRAFT_KV_OWN_CELL:
        return target_cell + draft_cell
    if target_layers <= 0 or draft_layers <= 0:
        return target_cell
    return (target_cell * (target_layers + draft_layers) + target_layers - 1) // target_layers


@dataclass(frozen=True)
class VersionRow:
    """What one range of SGLang releases has."""

    sglang: SpecifierSet
    # None: no DFLASH. "v1": dflash_worker.py only. "v2": dflash_worker_v2.py (overlap worker).
    dflash: str | None
    attention_backends: frozenset[str]
    speculative_algorithms: tuple[str, ...]
    # The draft-window flag name, None where DFLASH is absent.
    draft_window_flag: str | None
    # Flags that DFLASH rejects or overrides on this version: never render them with DFLASH.
    dflash_forbidden_flags: tuple[str, ...] = ()
    # Draft attention backends DFLASH accepts (others fall back to flashinfer).
    dflash_draft_backends: tuple[str, ...] = ()
    # Flags DFLASH needs beside dp attention, where it accepts dp attention at all.
    dflash_dp_attention_needs: tuple[str, ...] = ()
    kimi_k25_model: bool = True
    deepseek_v3_model: bool = True
    compressed_tensors_quant: bool = True
    ddtree: bool = False
    dflash_pr20547: bool = False
    # Where this release checks what a DFLASH server across hosts may be (cited when a serving
    # group is refused): pp_size must be 1 with DFLASH, (tp_size * pp_size) % nnodes == 0, and no
    # dp_size > 1 across nodes.
    multinode_source: str = MULTINODE_SOURCE_0_5_11
    # The flag that turns on SGLang's Prometheus /metrics (server_args.py add_argument in 0.5.11,
    # the observability.py field enable_metrics in 0.5.23); None where a release lacks it.
    metrics_flag: str | None = "--enable-metrics"
    # How this release chooses mem_fraction_static.
    memory: MemoryRule = MEMORY_0_5_11
    # The requests a DFLASH server of this release refuses (keys of DFLASH_REFUSAL_WHAT), and
    # where it decides.
    dflash_refused_requests: tuple[str, ...] = ("logprobs", "grammar")
    dflash_refusals_source: str = DFLASH_REFUSALS_SOURCE_0_5_11
    # The per-request draft counts meta_info carries: (accepted, proposed) name pairs.
    meta_draft_counts: tuple[tuple[str, str], ...] = (DRAFT_COUNTS_OLD,)
    # The port rule: the gRPC port this release derives from --port (--port + this) and refuses
    # above 65535 unless SGLANG_GRPC_PORT is set; None where an HTTP-only server has no such rule.
    grpc_port_offset: int | None = GRPC_PORT_OFFSET
    # How the drafter counts in the KV pool (DRAFT_KV_BY_LAYERS / DRAFT_KV_OWN_CELL).
    dflash_draft_kv: str = DRAFT_KV_BY_LAYERS
    notes: tuple[str, ...] = field(default_factory=tuple)

    def features(self) -> dict:
        """The shape of facts.sglang.SGLangInstall's ``features``."""
        return {
            "dflash": self.dflash,
            "dflash_pr20547": self.dflash_pr20547,
            "ddtree": self.ddtree,
            "kimi_k25_model": self.kimi_k25_model,
            "deepseek_v3_model": self.deepseek_v3_model,
            "compressed_tensors_quant": self.compressed_tensors_quant,
        }


# Newest first; the first row whose specifier contains the version wins.
VERSIONS: tuple[VersionRow, ...] = (
    # 0.5.16 to 0.5.23: one row per change of a field, each read from its own wheel (every release
    # of the span was unpacked and read; tests/unit/test_plan_versions.py derives each field from
    # the first release of each row, tests/unit/test_sglang_rules.py runs its rules).
    VersionRow(
        # Read from the 0.5.23 wheel: flags are dataclass fields in srt/arg_groups/fields/ named
        # by arg_utils._field_to_cli_name ("--" + name.replace("_", "-")): spec.py has
        # speculative_draft_window_size, parallel.py tp_size (alias --tensor-parallel-size).
        # tokenspeed_mla leaves the registry; _handle_dflash accepts dp attention on CUDA.
        sglang=SpecifierSet(">=0.5.23.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_23,
        speculative_algorithms=_ALGOS_0_5_23,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_23,
        dflash_draft_backends=_DRAFT_0_5_23,
        # arg_groups/speculative_hook.py _handle_dflash: "DFLASH with dp attention requires
        # --enable-dp-lm-head."
        dflash_dp_attention_needs=("--enable-dp-lm-head",),
        multinode_source=MULTINODE_SOURCE_0_5_23,
        memory=MEMORY_0_5_23,
        # 0.5.23 (read): only return_hidden_states with the overlap worker; the new draft-count
        # names only; no port rule for an HTTP server; the drafter's own KV cell.
        dflash_refused_requests=("hidden_states",),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW,),
        grpc_port_offset=None,
        dflash_draft_kv=DRAFT_KV_OWN_CELL,
    ),
    VersionRow(
        # Read from the 0.5.22 wheel: llada2_cfg_flashinfer joins the registry (torch 2.14.1;
        # --enable-dp-attention becomes an alias of --attn-dp-size, parallel_hook.py
        # handle_deprecated_dp_attention). DFLASH still refuses dp attention off NPU.
        sglang=SpecifierSet(">=0.5.22.dev0,<0.5.23.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_22,
        speculative_algorithms=_ALGOS_0_5_23,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_23,
        multinode_source=MULTINODE_SOURCE_0_5_23,
        memory=MEMORY_0_5_23,
        dflash_refused_requests=("hidden_states",),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW,),
        grpc_port_offset=None,
        dflash_draft_kv=DRAFT_KV_OWN_CELL,
    ),
    VersionRow(
        # Read from the 0.5.20 and 0.5.21 wheels: arg_groups/fields/ and choices.py appear, the
        # old --speculative-dflash-draft-window-size alias is gone, UNO joins the algorithms,
        # cutlass_mla and dual_chunk_flash_attn leave the registry and qsa joins; memory_hook.py
        # raises the 20-35 GiB tier; _handle_dflash: "does not support dp attention on non-NPU
        # devices". 0.5.21 drops the old draft-count names from meta_info (gate53 read it).
        sglang=SpecifierSet(">=0.5.21.dev0,<0.5.22.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_20,
        speculative_algorithms=_ALGOS_0_5_23,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_23,
        multinode_source=MULTINODE_SOURCE_0_5_23,
        memory=MEMORY_0_5_23,
        dflash_refused_requests=("hidden_states",),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW,),
        grpc_port_offset=None,
        dflash_draft_kv=DRAFT_KV_OWN_CELL,
    ),
    VersionRow(
        # Read from the 0.5.20 and 0.5.21 wheels: arg_groups/fields/ and choices.py appear, the
        # old --speculative-dflash-draft-window-size alias is gone, UNO joins the algorithms,
        # cutlass_mla and dual_chunk_flash_attn leave the registry and qsa joins; memory_hook.py
        # raises the 20-35 GiB tier; _handle_dflash: "does not support dp attention on non-NPU
        # devices". meta_info still carries both draft-count name pairs.
        sglang=SpecifierSet(">=0.5.20.dev0,<0.5.21.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_20,
        speculative_algorithms=_ALGOS_0_5_23,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_23,
        multinode_source=MULTINODE_SOURCE_0_5_23,
        memory=MEMORY_0_5_23,
        dflash_refused_requests=("hidden_states",),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW, DRAFT_COUNTS_OLD),
        grpc_port_offset=None,
        dflash_draft_kv=DRAFT_KV_OWN_CELL,
    ),
    VersionRow(
        # Read from the 0.5.19 wheel: ServerArgs resolves through arg_groups/pipeline.py
        # (resolve_once) and memory_hook.py, without fields/ yet; minicpm_flashattn /
        # minicpm_flashinfer join the registry; compressed-tensors pinned ==0.18.0.
        sglang=SpecifierSet(">=0.5.19.dev0,<0.5.20.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_19,
        speculative_algorithms=_ALGOS_0_5_16,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_17,
        multinode_source=MULTINODE_SOURCE_0_5_23,
        memory=MEMORY_0_5_19,
        dflash_refused_requests=("hidden_states",),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW, DRAFT_COUNTS_OLD),
        grpc_port_offset=None,
        dflash_draft_kv=DRAFT_KV_OWN_CELL,
    ),
    VersionRow(
        # Read from the 0.5.18 wheel: torch 2.13; a text-only MLA model keeps the breakable
        # prefill CUDA graph and Kimi K2.5 joins the breakable list (MEMORY_0_5_18).
        sglang=SpecifierSet(">=0.5.18.dev0,<0.5.19.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_17,
        speculative_algorithms=_ALGOS_0_5_16,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_17,
        multinode_source=MULTINODE_SOURCE_0_5_14,
        memory=MEMORY_0_5_18,
        dflash_refused_requests=("hidden_states",),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW, DRAFT_COUNTS_OLD),
        grpc_port_offset=None,
        dflash_draft_kv=DRAFT_KV_OWN_CELL,
    ),
    VersionRow(
        # Read from the 0.5.17 wheel: hpc_ops joins the registry, DFLASH's draft backends add
        # trtllm_mha.
        sglang=SpecifierSet(">=0.5.17.dev0,<0.5.18.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_17,
        speculative_algorithms=_ALGOS_0_5_16,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_17,
        multinode_source=MULTINODE_SOURCE_0_5_14,
        memory=MEMORY_0_5_16,
        dflash_refused_requests=("logprobs", "hidden_states"),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW, DRAFT_COUNTS_OLD),
        grpc_port_offset=None,
    ),
    VersionRow(
        # Read from the 0.5.16 wheel: DSPARK joins the algorithms; Kimi K2.5 joins
        # multimodal_piecewise_cuda_graph_supported_model_archs (MEMORY_0_5_16).
        sglang=SpecifierSet(">=0.5.16.dev0,<0.5.17.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_14,
        speculative_algorithms=_ALGOS_0_5_16,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_14,
        multinode_source=MULTINODE_SOURCE_0_5_14,
        memory=MEMORY_0_5_16,
        dflash_refused_requests=("logprobs", "grammar", "hidden_states"),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW, DRAFT_COUNTS_OLD),
        grpc_port_offset=None,
    ),
    VersionRow(
        # Read from the 0.5.15 wheel: 0.5.14's in every field but the memory rule (the breakable
        # prefill CUDA graph, MEMORY_0_5_15); arg_groups/overrides.py appears.
        sglang=SpecifierSet(">=0.5.15.dev0,<0.5.16.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_14,
        speculative_algorithms=_ALGOS_0_5_12,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_14,
        multinode_source=MULTINODE_SOURCE_0_5_14,
        memory=MEMORY_0_5_15,
        dflash_refused_requests=("logprobs", "grammar", "hidden_states"),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW, DRAFT_COUNTS_OLD),
    ),
    VersionRow(
        # Read from the 0.5.14 wheel: dflash_worker.py is gone (v1 removed, sglang PR #27959),
        # dflash_worker_v2.py present, no SGLANG_ENABLE_DFLASH_SPEC_V2 in environ.py (v2 is the
        # default path). server_args.py declares speculative_draft_window_size as a field and
        # keeps --speculative-dflash-draft-window-size as a hidden DeprecatedAliasStoreAction.
        sglang=SpecifierSet(">=0.5.14.dev0,<0.5.15.dev0"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_14,
        speculative_algorithms=_ALGOS_0_5_12,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_14,
        multinode_source=MULTINODE_SOURCE_0_5_14,
        memory=MEMORY_0_5_14,
        # dflash_utils.py validate_dflash_request: logprobs, hidden states with overlap, grammar.
        dflash_refused_requests=("logprobs", "grammar", "hidden_states"),
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW, DRAFT_COUNTS_OLD),
    ),
    VersionRow(
        # Read from the 0.5.13 wheel (sglang.md section 2 had it as 0.5.11 plus FROZEN_KV_MTP):
        # the 0.5.14 registry already, dflash_worker.py's draft backends add "ascend", and the
        # DFLASH checks move to arg_groups/speculative_hook.py _handle_dflash.
        sglang=SpecifierSet(">=0.5.13.dev0,<0.5.14.dev0"),
        dflash="v1",
        attention_backends=_BACKENDS_0_5_14,
        speculative_algorithms=_ALGOS_0_5_12,
        draft_window_flag=DRAFT_WINDOW_FLAG_V1,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_14,
        multinode_source=MULTINODE_SOURCE_0_5_14,
        dflash_refusals_source=DFLASH_REFUSALS_SOURCE,
        meta_draft_counts=(DRAFT_COUNTS_NEW, DRAFT_COUNTS_OLD),
    ),
    VersionRow(
        # Read from the 0.5.12 wheel: FROZEN_KV_MTP joins the algorithms, dsv4 and
        # tokenspeed_mla the registry; the DFLASH checks are still in server_args.py.
        sglang=SpecifierSet(">=0.5.12.dev0,<0.5.13.dev0"),
        dflash="v1",
        attention_backends=_BACKENDS_0_5_12,
        speculative_algorithms=_ALGOS_0_5_12,
        draft_window_flag=DRAFT_WINDOW_FLAG_V1,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_11,
        # Read: validate_dflash_request (scheduler.py in 0.5.12, dflash_utils.py in 0.5.13)
        # refuses logprobs and grammar; both draft-count name pairs.
        dflash_refusals_source="srt/managers/scheduler.py (0.5.12), "
        "srt/speculative/dflash_utils.py (0.5.13) validate_dflash_request",
        meta_draft_counts=(DRAFT_COUNTS_NEW, DRAFT_COUNTS_OLD),
    ),
    VersionRow(
        # Read from the 0.5.11 wheel: server_args.py add_argument("--speculative-dflash-draft-
        # window-size") and the DFLASH block in __post_init__ that rejects dp attention and
        # forces disable_overlap_schedule ("spec v2 is not supported yet").
        sglang=SpecifierSet(">=0.5.11.dev0,<0.5.12.dev0"),
        dflash="v1",
        attention_backends=_BACKENDS_0_5_11,
        speculative_algorithms=_ALGOS_0_5_11,
        draft_window_flag=DRAFT_WINDOW_FLAG_V1,
        dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
        dflash_draft_backends=_DRAFT_0_5_11,
    ),
    VersionRow(
        # sglang.md: 0.5.10.post1 has no DFLASH; same registry as 0.5.11.
        sglang=SpecifierSet("<0.5.11.dev0"),
        dflash=None,
        attention_backends=_BACKENDS_0_5_11,
        speculative_algorithms=("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NONE"),
        draft_window_flag=None,
    ),
)

# The PR#20547 branch (modal-labs/sglang dflash_v2, per sglang.md section 1; no wheel exists, so
# this row is from the reference, not read here): a pre-0.5.11 sglang with the v1 and v2 DFLASH
# workers, SGLANG_ENABLE_DFLASH_SPEC_V2 in environ.py, the old window flag (the Kimi DFlash model
# cards pass --speculative-dflash-draft-window-size), dp attention rejected, and draft backends
# without triton. Not a release: recognised by the dflash_pr20547 fact, never by version.
PR20547 = VersionRow(
    sglang=SpecifierSet(),
    dflash="v2",
    attention_backends=_BACKENDS_0_5_11,
    speculative_algorithms=_ALGOS_0_5_11,
    draft_window_flag=DRAFT_WINDOW_FLAG_V1,
    dflash_forbidden_flags=_DFLASH_FORBIDDEN_0_5_11,
    dflash_draft_backends=("flashinfer", "fa3", "fa4"),
    dflash_pr20547=True,
    notes=("overlap (v2) worker only with SGLANG_ENABLE_SPEC_V2=1 SGLANG_ENABLE_DFLASH_SPEC_V2=1",),
)
# The environment the PR#20547 overlap worker needs (server_args keeps overlap on only when both
# are true; otherwise it falls back to the v1 worker with overlap off).
PR20547_ENV = {"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_DFLASH_SPEC_V2": "1"}


def version_row(sglang_version: str | Version) -> VersionRow:
    v = parse_version(sglang_version)
    for row in VERSIONS:
        if row.sglang.contains(v, prereleases=True):
            return row
    raise LookupError(f"no version row for sglang {v}")


def row_for_install(version: str | Version | None, pr20547: bool = False) -> VersionRow:
    """The row for an install: the PR#20547 row when the fact says so, else by version."""
    if pr20547:
        return PR20547
    return version_row(version if version is not None else "0")


def predicted_install(sglang_version: str | Version) -> dict:
    """What facts.sglang.SGLangInstall should report once ``sglang_version`` is installed."""
    row = version_row(sglang_version)
    return {
        "version": str(parse_version(sglang_version)),
        "location": None,
        "features": row.features(),
        "speculative_algorithms": list(row.speculative_algorithms),
        "attention_backends": sorted(row.attention_backends),
    }


def draft_window_flag(sglang_version: str | Version, pr20547: bool = False) -> str | None:
    return row_for_install(sglang_version, pr20547).draft_window_flag


def dflash_forbidden_flags(sglang_version: str | Version, pr20547: bool = False) -> tuple[str, ...]:
    return row_for_install(sglang_version, pr20547).dflash_forbidden_flags


# The first release with the DFlash v2 (overlap) worker built in (#23000); before it, only the
# PR#20547 branch has it.
V2_BUILTIN_SINCE = "0.5.14"

# An install whose version cannot be read is planned with the row of a release that has the same
# DFLASH worker.
RELEASE_FOR_WORKER = {"v1": "0.5.11", "v2": "0.5.14"}


# A source build whose version is a placeholder (setuptools-scm's fallback ``0.0.0.dev0``, as in
# the DDTree fork's tree) is planned with the row of the release whose files it has: the first
# marker (a path under the sglang package; a trailing "/" a folder) the tree holds, newest first.
# Read from the wheels: srt/arg_groups/ appears in 0.5.12, speculative_hook.py in 0.5.13,
# arg_utils.py in 0.5.14, overrides.py in 0.5.15, speculative/draft_worker_common.py in 0.5.16,
# kimi_k3_hook.py in 0.5.17, dflash_disaggregation.py in 0.5.18, the resolution pipeline in
# 0.5.19, the fields/ folder in 0.5.20,
# boundary_reduction.py in 0.5.21, kv_shard_hook.py in 0.5.22, dflash_dp.py in 0.5.23 (each
# kept by every later release);
# the fork's arg_groups/ is 0.5.13's file for file, with the v1 DFLASH worker, as 0.5.13.
LAYOUT_MARKERS: tuple[tuple[str, str], ...] = (
    ("srt/speculative/dflash_dp.py", "0.5.23"),
    ("srt/arg_groups/kv_shard_hook.py", "0.5.22"),
    ("srt/arg_groups/boundary_reduction.py", "0.5.21"),
    ("srt/arg_groups/fields/", "0.5.20"),
    ("srt/arg_groups/pipeline.py", "0.5.19"),
    ("srt/speculative/dflash_disaggregation.py", "0.5.18"),
    ("srt/arg_groups/kimi_k3_hook.py", "0.5.17"),
    ("srt/speculative/draft_worker_common.py", "0.5.16"),
    ("srt/arg_groups/overrides.py", "0.5.15"),
    ("srt/arg_groups/arg_utils.py", "0.5.14"),
    ("srt/arg_groups/speculative_hook.py", "0.5.13"),
    ("srt/arg_groups/", "0.5.12"),
    ("srt/speculative/dflash_worker.py", "0.5.11"),
)
# Versions no release has: setuptools-scm's fallback and friends.
PLACEHOLDER_BELOW = Version("0.0.1")


def is_placeholder(version: str | Version | None) -> bool:
    try:
        return version is not None and parse_version(version) < PLACEHOLDER_BELOW
    except ValueError:
        return False


def release_by_layout(has_path) -> tuple[str, str] | None:
    """(release, the marker found) for a tree, ``has_path(rel)`` saying what it holds."""
    return next(((rel, marker) for marker, rel in LAYOUT_MARKERS if has_path(marker)), None)


def row_for_worker(worker: str | None) -> VersionRow:
    """The row for an install known only by its DFLASH worker (``features.dflash``)."""
    return version_row(RELEASE_FOR_WORKER.get(worker or "", "0"))
