"""specfleet.core.tables.sglang_versions: the version table, and (when the wheels are here) the table against them.

The wheel checks read the real PyPI wheels from the one wheel cache (tests.harness.sources:
filled from PyPI by the test command, or on first use).
"""

from __future__ import annotations

import re
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from specfleet.core.tables import sglang_versions as versions
from specfleet.core.tables.sglang_versions import (
    DRAFT_WINDOW_FLAG,
    DRAFT_WINDOW_FLAG_V1,
    compressed_tensors_specifier,
    dflash_forbidden_flags,
    draft_window_flag,
    predicted_install,
    version_row,
)
from tests.harness.releases import EACH_KIND
from tests.harness.sources import sglang_wheel

# compressed-tensors releases on PyPI around these sglang releases (sglang.md section 4).
CT_RELEASES = ["0.9.4", "0.10.0", "0.13.0", "0.14.0", "0.14.0.1", "0.15.0.1", "0.16.0",
               "0.17.1", "0.18.0", "0.19.0", "0.20.1"]  # fmt: skip


@pytest.mark.parametrize(
    "sglang,allowed",
    [
        ("0.5.11", ["0.15.0.1", "0.16.0", "0.17.1", "0.18.0"]),
        ("0.5.14", ["0.15.0.1", "0.16.0", "0.17.1", "0.18.0"]),
        ("0.5.15.post1", ["0.15.0.1", "0.16.0", "0.17.1", "0.18.0"]),
        ("0.5.23", ["0.18.0"]),
        ("0.5.10.post1", ["0.10.0", "0.13.0", "0.15.0.1", "0.16.0", "0.17.1", "0.18.0"]),
    ],
)
def test_compressed_tensors_specifier(sglang, allowed):
    spec = compressed_tensors_specifier(sglang)
    assert isinstance(spec, SpecifierSet)
    assert [v for v in CT_RELEASES if Version(v) in spec] == allowed


def test_compressed_tensors_never_below_010_or_014():
    for sglang in ("0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.20", "0.5.23", "0.6.0"):
        spec = compressed_tensors_specifier(sglang)
        assert "0.9.4" not in spec and "0.14.0" not in spec and "0.14.0.1" not in spec, sglang


@pytest.mark.parametrize(
    "sglang,flag",
    [
        ("0.5.11", DRAFT_WINDOW_FLAG_V1),
        ("0.5.12", DRAFT_WINDOW_FLAG_V1),
        ("0.5.13", DRAFT_WINDOW_FLAG_V1),
        ("0.5.14", DRAFT_WINDOW_FLAG),
        ("0.5.15.post1", DRAFT_WINDOW_FLAG),
        ("0.5.23", DRAFT_WINDOW_FLAG),
        ("0.5.14rc1", DRAFT_WINDOW_FLAG),
        ("0.5.10.post1", None),
    ],
)
def test_draft_window_flag(sglang, flag):
    assert draft_window_flag(sglang) == flag


def test_pr20547_row():
    assert draft_window_flag("0.0.0.dev0", pr20547=True) == DRAFT_WINDOW_FLAG_V1
    assert "triton" not in versions.PR20547.dflash_draft_backends
    assert versions.PR20547.features()["dflash_pr20547"] is True
    assert versions.PR20547_ENV == {
        "SGLANG_ENABLE_SPEC_V2": "1",
        "SGLANG_ENABLE_DFLASH_SPEC_V2": "1",
    }


def test_forbidden_flags():
    assert "--enable-dp-attention" in dflash_forbidden_flags("0.5.11")
    assert "--enable-dp-attention" in dflash_forbidden_flags("0.5.14")
    assert "--enable-dp-attention" not in dflash_forbidden_flags("0.5.23")
    assert "--speculative-num-steps" in dflash_forbidden_flags("0.5.23")


def test_features_per_version():
    assert version_row("0.5.10.post1").dflash is None
    assert version_row("0.5.11").dflash == "v1"
    assert version_row("0.5.13").dflash == "v1"
    assert version_row("0.5.14").dflash == "v2"
    assert "cutlass_mla" not in predicted_install("0.5.23")["attention_backends"]
    assert "cutlass_mla" in predicted_install("0.5.14")["attention_backends"]


def test_bad_version():
    with pytest.raises(ValueError, match="not a version: 'latest'"):
        compressed_tensors_specifier("latest")


# --------------------------------------------------------------------------------------------------
# Against the real wheels
# --------------------------------------------------------------------------------------------------


def wheel(version: str) -> zipfile.ZipFile:
    return zipfile.ZipFile(sglang_wheel(version))


def _text(zf: zipfile.ZipFile, prefix: str) -> str:
    return "\n".join(
        zf.read(n).decode("utf-8", "replace")
        for n in zf.namelist()
        if n.startswith(prefix) and n.endswith(".py")
    )


def declared_flags(zf: zipfile.ZipFile) -> set[str]:
    """Every flag the wheel's parser can know: add_argument("--x") strings, and the dataclass
    fields (`name: A[...]`) that 0.5.14+ turn into --name-with-dashes (arg_utils)."""
    src = _text(zf, "sglang/srt/server_args.py") + _text(zf, "sglang/srt/arg_groups/")
    flags = set(re.findall(r"""["'](--[a-z0-9][a-z0-9-]*)["']""", src))
    fields = re.findall(r"^\s+([a-z][a-z0-9_]*): A\[", src, re.M)
    return flags | {"--" + f.replace("_", "-") for f in fields}


@pytest.mark.local
@pytest.mark.parametrize("version", EACH_KIND)
def test_plan_flags_exist_in_wheel(version):
    flags = declared_flags(wheel(version))
    used = [
        "--model-path", "--trust-remote-code", "--tp-size", "--attention-backend",
        "--speculative-algorithm", "--speculative-draft-model-path",
        "--speculative-num-draft-tokens", "--speculative-draft-attention-backend",
        "--mem-fraction-static", "--disable-custom-all-reduce", "--reasoning-parser",
        "--tool-call-parser", "--host", "--port", draft_window_flag(version),
    ]  # fmt: skip
    assert [f for f in used if f not in flags] == []


@pytest.mark.local
def test_old_window_flag_gone_in_0523():
    assert DRAFT_WINDOW_FLAG_V1 not in declared_flags(wheel("0.5.23"))
    assert DRAFT_WINDOW_FLAG not in declared_flags(wheel("0.5.11"))


@pytest.mark.local
@pytest.mark.parametrize("version", EACH_KIND)
def test_draft_backends_match_wheel(version):
    zf = wheel(version)
    src = _text(zf, "sglang/srt/speculative/") + _text(zf, "sglang/srt/arg_groups/choices.py")
    m = re.search(r"supported_draft_backends = \(([^)]*)\)", src) or re.search(
        r"DRAFT_ATTENTION_BACKEND_CHOICES = \[([^\]]*)\]", src
    )
    assert m, "no draft backend list in the wheel"
    assert tuple(re.findall(r'"([^"]+)"', m.group(1))) == version_row(version).dflash_draft_backends


@pytest.mark.local
@pytest.mark.parametrize("version", EACH_KIND)
def test_dp_attention_rejection_matches_wheel(version):
    src = _text(wheel(version), "sglang/srt/")
    rejects = "DFLASH speculative decoding does not support dp attention" in src
    assert rejects == ("--enable-dp-attention" in dflash_forbidden_flags(version))


@pytest.mark.local
@pytest.mark.parametrize("version", EACH_KIND)
def test_compressed_tensors_specifier_fits_wheel_requirement(version):
    zf = wheel(version)
    meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = [
        Requirement(line.split(":", 1)[1].strip())
        for line in zf.read(meta).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    (ct,) = [r for r in reqs if r.name == "compressed-tensors"]
    ours = compressed_tensors_specifier(version)
    # Every version we allow, the wheel allows too (0.5.23's ==0.18.0 pin included).
    assert [v for v in CT_RELEASES if v in ours and v not in ct.specifier] == []
    assert any(v in ours for v in CT_RELEASES)


@pytest.mark.parametrize(
    "sglang,dflash",
    [
        ("0.5.11+cu128", "v1"),
        ("0.5.11.dev3", "v1"),
        ("0.5.13.post2", "v1"),
        ("0.5.14.dev12+g1234abc", "v2"),
        ("0.5.10.dev1200+ge67a0d488", None),
    ],
)
def test_every_version_has_a_row(sglang, dflash):
    assert version_row(sglang).dflash == dflash
    assert isinstance(compressed_tensors_specifier(sglang), SpecifierSet)
