"""specfleet.core.tables.sglang_versions: the version table, and (when the wheels are here) the table against them.

The wheel checks read the real PyPI wheels from the one wheel cache (tests.harness.sources:
filled from PyPI by the test command, or on first use).
"""

from __future__ import annotations

import ast
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
from tests.harness.sglang_rules import MEMORY_RULE_MODULE, RELEASES
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
@pytest.mark.parametrize("version", RELEASES)
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


def wheel_draft_backends(zf: zipfile.ZipFile) -> tuple[str, ...]:
    """The draft backends DFLASH checks in this wheel: its own ``supported_draft_backends``
    tuple (dflash_worker*.py to 0.5.16, arg_groups/speculative_hook.py's
    _resolve_dflash_draft_attention_backend 0.5.17-0.5.19), else (0.5.20 on) choices.py's
    DRAFT_ATTENTION_BACKEND_CHOICES, which draft_worker_common.py resolves against."""
    src = _text(zf, "sglang/srt/speculative/") + _text(zf, "sglang/srt/arg_groups/speculative_hook")
    m = re.search(r"supported_draft_backends = \(([^)]*)\)", src) or re.search(
        r"DRAFT_ATTENTION_BACKEND_CHOICES = \[([^\]]*)\]",
        _text(zf, "sglang/srt/arg_groups/choices.py"),
    )
    assert m, "no draft backend list in the wheel"
    return tuple(re.findall(r'"([^"]+)"', m.group(1)))


@pytest.mark.local
@pytest.mark.parametrize("version", RELEASES)
def test_draft_backends_match_wheel(version):
    assert wheel_draft_backends(wheel(version)) == version_row(version).dflash_draft_backends


def wheel_strings(zf: zipfile.ZipFile, prefix: str) -> list[str]:
    """Every string constant of the wheel's modules under ``prefix``, as Python joins them
    (0.5.20 splits its DFLASH dp-attention message over two literals)."""
    out = []
    for name in zf.namelist():
        if name.startswith(prefix) and name.endswith(".py"):
            tree = ast.parse(zf.read(name), name)
            out += [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                    and isinstance(n.value, str)]  # fmt: skip
    return out


def wheel_dflash_dp_attention(zf: zipfile.ZipFile) -> tuple[bool, tuple[str, ...]]:
    """(DFLASH refuses dp attention on CUDA, the flags it needs beside it where it does not):
    read from the messages its DFLASH checks raise."""
    # Where _handle_dflash lives: server_args.py (0.5.11, 0.5.12), speculative_hook.py after.
    strings = wheel_strings(zf, "sglang/srt/server_args.py") + wheel_strings(
        zf, "sglang/srt/arg_groups/speculative_hook.py"
    )
    refuses = any(
        s.startswith("Currently DFLASH speculative decoding does not support dp attention")
        and "on non-NPU devices" in s or s == "Currently DFLASH speculative decoding does not "
        "support dp attention." for s in strings
    )  # fmt: skip
    needs = tuple(
        m.group(1)
        for s in strings
        if (m := re.fullmatch(r"DFLASH with dp attention requires (--[a-z-]+)\.", s))
    )
    return refuses, needs


@pytest.mark.local
@pytest.mark.parametrize("version", RELEASES)
def test_dp_attention_rejection_matches_wheel(version):
    refuses, needs = wheel_dflash_dp_attention(wheel(version))
    assert refuses == ("--enable-dp-attention" in dflash_forbidden_flags(version))
    assert needs == version_row(version).dflash_dp_attention_needs
    # One or the other: a release either refuses dp attention or names what it needs.
    assert refuses != bool(needs)


@pytest.mark.local
@pytest.mark.parametrize("version", RELEASES)
def test_row_features_read_from_wheel(version):
    """The row's DFLASH worker, features, algorithms and attention-backend registry are what the
    wheel's files give (the fixtures' independent reading, test_plan_sglang_fixtures.extract)."""
    from tests.unit.test_plan_sglang_fixtures import extract

    zf = wheel(version)
    names = zf.namelist()

    def read(name):
        return zf.read(name).decode("utf-8") if name in names else None

    got = extract(read, names, None)
    predicted = predicted_install(version)
    assert got["version"] == version
    assert predicted["features"] == got["features"]
    assert predicted["speculative_algorithms"] == got["speculative_algorithms"]
    assert predicted["attention_backends"] == got["attention_backends"]


@pytest.mark.local
@pytest.mark.parametrize("version", RELEASES)
def test_row_sources_are_the_wheels(version):
    """Where the row says a rule lives, the wheel has it there: the memory rule's module (and
    its draft-model reserve), the DFLASH pp check and check_server_args of multinode_source."""
    zf = wheel(version)
    row = version_row(version)
    names = set(zf.namelist())
    assert MEMORY_RULE_MODULE[version] in row.memory.source
    memory = zf.read(MEMORY_RULE_MODULE[version]).decode()
    assert ("reserved_mem += 4 * 1024" in memory) == (row.memory.draft_reserve_mib == 4 * 1024)
    paths = re.findall(r"sglang/srt/[\w/]+\.py", row.multinode_source)
    assert paths and all(p in names for p in paths), (paths, row.multinode_source)
    texts = "\n".join(zf.read(p).decode() for p in paths)
    assert "only supports pp_size == 1." in texts
    assert "tp_size must be divisible by number of nodes" in texts
    assert "def check_server_args" in texts


@pytest.mark.local
@pytest.mark.parametrize("version", RELEASES)
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
    # Every version we allow, the wheel allows too (the ==0.18.0 pin of 0.5.19 on included).
    assert [v for v in CT_RELEASES if v in ours and v not in ct.specifier] == []
    assert any(v in ours for v in CT_RELEASES)
    # Where the wheel pins one version, the row asks for exactly that one.
    if str(ct.specifier).startswith("=="):
        assert ours == ct.specifier
    else:
        # The window's compressed-tensors >= 0.16 need torch >= 2.10: the wheel's torch pin
        # (2.11 to 0.5.17, 2.13 at 0.5.18) has it.
        (torch,) = [r for r in reqs if r.name == "torch"]
        pins = re.findall(r"==([\d.]+)", str(torch.specifier))
        assert pins and all(Version(v) >= Version("2.10") for v in pins), str(torch)


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


# --------------------------------------------------------------------------------------------------
# What a DFLASH server refuses, the draft counts it reports, the port rule, the KV accounting:
# each row against its wheel.
# --------------------------------------------------------------------------------------------------


def _wheel_sources(release: str, *paths: str) -> dict[str, str]:
    with zipfile.ZipFile(sglang_wheel(release)) as zf:
        names = set(zf.namelist())
        return {p: zf.read(f"sglang/{p}").decode() for p in paths if f"sglang/{p}" in names}


def _function(source: str, name: str) -> str:
    """The text of function (or method) ``name``: to the next line indented no deeper."""
    start = source.index(f"def {name}(")
    indent = start - source.rindex("\n", 0, start) - 1
    end = re.compile(rf"\n {{0,{indent}}}[^\s)]").search(source, start)
    return source[start:end.start() if end else None]


@pytest.mark.local
@pytest.mark.parametrize("release", ["0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.23"])
def test_refusals_draft_counts_port_rule_and_kv_accounting_match_the_wheel(release):
    row = version_row(release)
    src = _wheel_sources(release, "srt/managers/scheduler.py", "srt/speculative/dflash_utils.py",
                         "srt/managers/tokenizer_manager.py", "srt/server_args.py",
                         "srt/arg_groups/serving_hook.py",
                         "srt/model_executor/pool_configurator.py")
    where = next(p for p in ("srt/speculative/dflash_utils.py", "srt/managers/scheduler.py")
                 if "def validate_dflash_request(" in src.get(p, ""))
    body = _function(src[where], "validate_dflash_request")
    refused = tuple(name for name, mark in (("logprobs", "req.return_logprob"),
                                            ("grammar", "json_schema is not None"),
                                            ("hidden_states", "req.return_hidden_states"))
                    if mark in body)
    assert row.dflash_refused_requests == refused
    assert where in row.dflash_refusals_source
    written = re.findall(r'meta_info\["(spec_\w+_drafts)"\]',
                         _function(src["srt/managers/tokenizer_manager.py"],
                                   "_calculate_spec_decoding_metrics"))
    assert written == [name for pair in row.meta_draft_counts for name in pair]
    # 0.5.11-0.5.15: the gRPC port is SGLANG_GRPC_PORT or --port + 10000, checked always.
    unconditional = "grpc_port_env if grpc_port_env is not None else self.port + 10000"
    args = src["srt/server_args.py"] + src.get("srt/arg_groups/serving_hook.py", "")
    assert (row.grpc_port_offset == versions.GRPC_PORT_OFFSET) == (unconditional in args)
    assert "must be between 1 and 65535" in args
    # The drafter in the KV pool: scaled by layers, or its own cell added.
    pool = src["srt/model_executor/pool_configurator.py"]
    own = "draft_cell_size_per_token=_dflash_draft_cell_size" in pool
    assert row.dflash_draft_kv == (versions.DRAFT_KV_OWN_CELL if own
                                   else versions.DRAFT_KV_BY_LAYERS)
