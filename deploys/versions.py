"""THE one table of what each SGLang version has.

Everything specfleet knows about SGLang versions ahead of installing them lives here: which DFLASH
worker ships, which attention backends the registry holds, which speculative algorithms exist, what
the draft-window flag is called, which flags DFLASH rejects, and which compressed-tensors to pair
with it. The planner uses it to predict a plan on a fresh host (``--dry`` before install); the
software operation uses the compressed-tensors specifier. On a host where SGLang is installed, the
facts read from the installed files win over this table.

Rows are keyed by ``packaging`` specifiers and looked up with ``packaging`` versions, never by
string comparison. Sources: the released wheels, unpacked and read (see the comments on each
row), and /work/shared/reference/sglang.md sections 2 and 4.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

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
# - sglang 0.5.23 pins ==0.18.0 itself; asking for anything else would fail the resolver.
_CT_AVOID = "!=0.14.*"


@dataclass(frozen=True)
class CTRow:
    sglang: SpecifierSet
    compressed_tensors: SpecifierSet
    why: str


COMPRESSED_TENSORS: tuple[CTRow, ...] = (
    CTRow(
        SpecifierSet(">=0.5.23"),
        SpecifierSet("==0.18.0"),
        "sglang 0.5.23 pins compressed-tensors==0.18.0 in its own requirements",
    ),
    CTRow(
        SpecifierSet(">=0.5.16,<0.5.23"),
        SpecifierSet(f">=0.15.0.1,<0.19,{_CT_AVOID}"),
        "no wheel between 0.5.15 and 0.5.23 was read; the 0.5.11-0.5.15 window is assumed",
    ),
    CTRow(
        SpecifierSet(">=0.5.11,<0.5.16"),
        SpecifierSet(f">=0.15.0.1,<0.19,{_CT_AVOID}"),
        "sglang leaves compressed-tensors unpinned; >=0.10 has nvfp4_pack_quantized, 0.14.x "
        "needs transformers<5, 0.15.0.1 was current at 0.5.11's release, 0.18.0 is what sglang "
        "pinned later",
    ),
    CTRow(
        SpecifierSet("<0.5.11"),
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

# attention_registry.py's @register_attention_backend names, read from the wheels.
_BACKENDS_0_5_11 = frozenset(
    {
        "flashinfer", "trtllm_mla", "aiter", "wave", "ascend", "nsa", "triton", "torch_native",
        "flex_attention", "flashmla", "fa3", "fa4", "cutlass_mla", "trtllm_mha", "intel_amx",
        "dual_chunk_flash_attn", "intel_xpu",
    }
)  # fmt: skip
_BACKENDS_0_5_14 = _BACKENDS_0_5_11 | {"tokenspeed_mla", "cutedsl_mla", "dsa", "dsv4"}
_BACKENDS_0_5_23 = (_BACKENDS_0_5_14 - {"cutlass_mla", "tokenspeed_mla"}) | {
    "llada2_cfg_flashinfer", "qsa", "hpc_ops",
}  # fmt: skip

_ALGOS_0_5_11 = ("DFLASH", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NONE")
_ALGOS_0_5_12 = ("DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE")
_ALGOS_0_5_23 = (
    "DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE",
)  # fmt: skip

# Flags DFLASH rejects (or silently forces) on the v1 worker path.
_DFLASH_V1_FORBIDDEN = (
    "--enable-dp-attention",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
)


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
    kimi_k25_model: bool = True
    deepseek_v3_model: bool = True
    compressed_tensors_quant: bool = True
    ddtree: bool = False
    dflash_pr20547: bool = False
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


VERSIONS: tuple[VersionRow, ...] = (
    VersionRow(
        sglang=SpecifierSet(">=0.5.16"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_23,
        speculative_algorithms=_ALGOS_0_5_23,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_draft_backends=("flashinfer", "fa3", "fa4", "triton"),
        notes=("read from the 0.5.23 wheel; 0.5.16-0.5.22 assumed to match it",),
    ),
    VersionRow(
        sglang=SpecifierSet(">=0.5.14,<0.5.16"),
        dflash="v2",
        attention_backends=_BACKENDS_0_5_14,
        speculative_algorithms=_ALGOS_0_5_12,
        draft_window_flag=DRAFT_WINDOW_FLAG,
        dflash_draft_backends=("flashinfer", "fa3", "fa4", "triton"),
        notes=("v1 worker removed (sglang PR #27959); old window flag kept as deprecated alias",),
    ),
    VersionRow(
        sglang=SpecifierSet(">=0.5.12,<0.5.14"),
        dflash="v1",
        attention_backends=_BACKENDS_0_5_11,
        speculative_algorithms=_ALGOS_0_5_12,
        draft_window_flag=DRAFT_WINDOW_FLAG_V1,
        dflash_forbidden_flags=_DFLASH_V1_FORBIDDEN,
        dflash_draft_backends=("flashinfer", "fa3", "fa4", "triton"),
    ),
    VersionRow(
        sglang=SpecifierSet(">=0.5.11,<0.5.12"),
        dflash="v1",
        attention_backends=_BACKENDS_0_5_11,
        speculative_algorithms=_ALGOS_0_5_11,
        draft_window_flag=DRAFT_WINDOW_FLAG_V1,
        dflash_forbidden_flags=_DFLASH_V1_FORBIDDEN,
        dflash_draft_backends=("flashinfer", "fa3", "fa4", "triton"),
    ),
    VersionRow(
        sglang=SpecifierSet("<0.5.11"),
        dflash=None,
        attention_backends=_BACKENDS_0_5_11,
        speculative_algorithms=("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NONE"),
        draft_window_flag=None,
    ),
)

# The PR#20547 branch (modal-labs/sglang dflash_v2): a pre-0.5.11 sglang with the v1 and v2 DFLASH
# workers, SGLANG_ENABLE_DFLASH_SPEC_V2 in environ.py, the old window flag, and draft backends
# without triton. Not a release: recognised by the dflash_pr20547 fact, not by version.
PR20547 = VersionRow(
    sglang=SpecifierSet(),
    dflash="v2",
    attention_backends=_BACKENDS_0_5_11,
    speculative_algorithms=_ALGOS_0_5_11,
    draft_window_flag=DRAFT_WINDOW_FLAG_V1,
    dflash_forbidden_flags=_DFLASH_V1_FORBIDDEN,
    dflash_draft_backends=("flashinfer", "fa3", "fa4"),
    dflash_pr20547=True,
    notes=("overlap (v2) worker only with SGLANG_ENABLE_SPEC_V2=1 SGLANG_ENABLE_DFLASH_SPEC_V2=1",),
)


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
