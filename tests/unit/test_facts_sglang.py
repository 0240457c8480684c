"""facts.sglang.SGLangInstall against real SGLang wheels, the PR#20547 head and authored trees.

The wheels come from PyPI into the one wheel cache (tests.harness.sources); only the files the
fact reads are unpacked, into a temporary directory. The PR#20547 head (modal-labs/sglang
e67a0d488) is read from ../shared/fixtures/sglang-pr20547/.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from pyinfra.api import StringCommand
from pyinfra_testing.util import get_command_string

from facts import sglang
from specfleet.core.tables import ddtree_designs
from specfleet.core.tables import sglang_versions as versions
from tests.harness.sources import (
    DDTREE_FORK_VERSION,
    ddtree_fork_site,
    pr20547_files,
    sglang_wheel,
)
from tests.harness.wheelhouse import DOWNLOADS

# Every release wheel of the wheelhouse (the version table's releases).
RELEASES = [r.split("==")[1] for reqs, _ in DOWNLOADS for r in reqs if r.startswith("sglang==")]

ROOT = Path(__file__).resolve().parents[2]
PR20547_COMMIT = "e67a0d488"
PLAN_FIXTURES = ROOT / "tests" / "fixtures" / "sglang"

# Expected values, from ../shared/reference/sglang.md section 2, re-checked against the wheels.
REGISTRY_0511 = [
    "aiter", "ascend", "cutlass_mla", "dual_chunk_flash_attn", "fa3", "fa4", "flashinfer",
    "flashmla", "flex_attention", "intel_amx", "intel_xpu", "nsa", "torch_native", "triton",
    "trtllm_mha", "trtllm_mla", "wave",
]  # fmt: skip
EXPECTED = {
    "0.5.11": {
        "features": {
            "dflash": "v1",
            "dflash_pr20547": False,
            "ddtree": False,
            "kimi_k25_model": True,
            "deepseek_v3_model": True,
            "compressed_tensors_quant": True,
        },
        "speculative_algorithms": ["DFLASH", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NONE"],
        "attention_backends": REGISTRY_0511,
    },
    "0.5.14": {
        "features": {
            "dflash": "v2",
            "dflash_pr20547": False,
            "ddtree": False,
            "kimi_k25_model": True,
            "deepseek_v3_model": True,
            "compressed_tensors_quant": True,
        },
        "speculative_algorithms": [
            "DFLASH",
            "EAGLE",
            "EAGLE3",
            "FROZEN_KV_MTP",
            "STANDALONE",
            "NGRAM",
            "NONE",
        ],  # fmt: skip
        # 0.5.11's 17 plus tokenspeed_mla, cutedsl_mla, dsa, dsv4.
        "attention_backends": sorted(
            REGISTRY_0511 + ["tokenspeed_mla", "cutedsl_mla", "dsa", "dsv4"]
        ),
    },
    "0.5.23": {
        "features": {
            "dflash": "v2",
            "dflash_pr20547": False,
            "ddtree": False,
            "kimi_k25_model": True,
            "deepseek_v3_model": True,
            "compressed_tensors_quant": True,
        },
        "speculative_algorithms": [
            "DFLASH",
            "UNO",
            "DSPARK",
            "EAGLE",
            "EAGLE3",
            "FROZEN_KV_MTP",
            "STANDALONE",
            "NGRAM",
            "NONE",
        ],  # fmt: skip
        # 0.5.14's minus cutlass_mla, tokenspeed_mla and (not in sglang.md) dual_chunk_flash_attn,
        # plus llada2_cfg_flashinfer, qsa, hpc_ops and the two minicpm_* backends.
        "attention_backends": sorted(
            set(REGISTRY_0511 + ["cutedsl_mla", "dsa", "dsv4"])
            - {"cutlass_mla", "dual_chunk_flash_attn"}
            | {"llada2_cfg_flashinfer", "qsa", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer"}
        ),
    },
}

# The whole package: the v2 wiring check resolves imports across the tree.
NEEDED_PREFIXES = ("sglang/",)


def collect(tree: Path, python: str = sys.executable) -> dict | None:
    """Run the real collector with ``tree`` searched first; return the parsed fact value."""
    done = subprocess.run(
        [python, "-I", "-c", sglang.COLLECT, sglang.collect_request(), str(tree)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return sglang.SGLangInstall().process(done.stdout.splitlines())


def wheel_path(version: str) -> Path:
    return sglang_wheel(version)


class _WheelTrees(dict):
    """{version: the release's package unpacked}, each wheel unpacked on first use and then
    shared by the module's tests (the collector only reads the tree)."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self._tmp = tmp_path_factory

    def __missing__(self, version: str) -> Path:
        tree = self._tmp.mktemp(f"sglang-{version}")
        with zipfile.ZipFile(wheel_path(version)) as wheel:
            members = [
                n
                for n in wheel.namelist()
                if n.startswith(NEEDED_PREFIXES) or n.split("/")[0].endswith(".dist-info")
            ]
            wheel.extractall(tree, members)
        self[version] = tree
        return tree


@pytest.fixture(scope="module")
def wheel_trees(tmp_path_factory) -> dict[str, Path]:
    return _WheelTrees(tmp_path_factory)


@pytest.mark.local
@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_real_wheels(version, wheel_trees):
    value = collect(wheel_trees[version])
    assert value["version"] == version
    assert value["location"] == str(wheel_trees[version] / "sglang")
    for key, expected in EXPECTED[version].items():
        assert value[key] == expected, key
    # The plan tests use fixtures made by their own reader: the two readers must agree.
    plan_fixture = PLAN_FIXTURES / f"{version}.json"
    if plan_fixture.exists():
        fact = json.loads(plan_fixture.read_text())["fact"]
        assert {k: v for k, v in value.items() if k != "location"} == {
            k: v for k, v in fact.items() if k != "location"
        }


@pytest.mark.local
def test_pr20547_head_from_the_fixture_tarball(tmp_path):
    """The PR head's package (../shared/fixtures/sglang-pr20547/, e67a0d488): its v2 worker is
    wired in (compiles, imports resolve, routed under the PR's switch, overlap allowed)."""
    for name, data in pr20547_files().items():
        if name.startswith(NEEDED_PREFIXES):
            (tmp_path / "python" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "python" / name).write_bytes(data)
    value = collect(tmp_path / "python")
    assert value["version"] is None  # a source tree: setuptools-scm writes _version.py on build
    assert value["features"] == {
        "dflash": "v2",
        "dflash_pr20547": True,
        "ddtree": False,
        "kimi_k25_model": True,
        "deepseek_v3_model": True,
        "compressed_tensors_quant": True,
    }
    assert value["speculative_algorithms"] == EXPECTED["0.5.11"]["speculative_algorithms"]
    assert value["attention_backends"] == REGISTRY_0511


# --- test-authored trees --------------------------------------------------------------------


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "sglang" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


POISON = 'raise RuntimeError("sglang was imported; the fact must only read files")\n'


SPEC_INFO_ROUTED = (
    "from enum import Enum, auto\n\n"
    "class SpeculativeAlgorithm(Enum):\n"
    "    DFLASH = auto()\n    DDTREE = auto()\n    NONE = auto()\n\n"
    "    def create_worker(self):\n"
    "        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2\n"
    "        return DFlashWorkerV2\n"
)


@pytest.mark.local
def test_ddtree_tree_without_importing(tmp_path):
    tree = write_tree(
        tmp_path,
        {
            "__init__.py": POISON,
            "_version.py": "__version__ = version = '0.6.0.dev1+gddtree'\n",
            "srt/__init__.py": "",
            "srt/speculative/__init__.py": "",
            "srt/speculative/spec_info.py": SPEC_INFO_ROUTED,
            "srt/speculative/dflash_worker_v2.py": "class DFlashWorkerV2: ...\n",
            "srt/speculative/ddtree_worker.py": "class DDTreeWorker: ...\n",
            "srt/layers/attention/attention_registry.py": (
                "ATTENTION_BACKENDS = {}\n"
                "@register_attention_backend('triton')\ndef a(r): ...\n"
                '@register_attention_backend( "flashinfer" )\ndef b(r): ...\n'
            ),
        },
    )
    value = collect(tree)
    assert value["version"] == "0.6.0.dev1+gddtree"
    assert value["features"]["ddtree"] is True
    assert value["features"]["dflash"] == "v2"  # routed with no switch: built in, as 0.5.14
    assert value["features"]["dflash_pr20547"] is False
    assert value["features"]["kimi_k25_model"] is False
    assert value["speculative_algorithms"] == ["DFLASH", "DDTREE", "NONE"]
    assert value["attention_backends"] == ["flashinfer", "triton"]


@pytest.mark.local
def test_ddtree_worker_file_alone(tmp_path):
    tree = write_tree(tmp_path, {"__init__.py": "", "srt/speculative/ddtree_worker.py": ""})
    assert collect(tree)["features"]["ddtree"] is True


ENVIRON = (
    "class Envs:\n"
    "    SGLANG_ENABLE_SPEC_V2 = EnvBool(False)\n"
    "    SGLANG_ENABLE_DFLASH_SPEC_V2 = EnvBool(False)\n"
)
SPEC_INFO_GATED = (
    "from sglang.srt.environ import envs\n\n"
    "def create_worker():\n"
    "    if envs.SGLANG_ENABLE_DFLASH_SPEC_V2.get():\n"
    "        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2\n"
    "        return DFlashWorkerV2\n"
    "    from sglang.srt.speculative.dflash_worker import DFlashWorker\n"
    "    return DFlashWorker\n"
)
SERVER_ARGS_GATED = (
    "from sglang.srt.environ import envs\n"
    "def f(self):\n"
    "    if envs.SGLANG_ENABLE_DFLASH_SPEC_V2.get():\n"
    "        self.disable_overlap_schedule = False\n"
)
V2_WORKER = (
    "from sglang.srt.speculative.dflash_utils import helper, other_helper\n"
    "from sglang.srt.speculative.dflash_worker import DFlashWorker\n\n"
    "class DFlashWorkerV2(DFlashWorker): ...\n"
)
PR_LIKE = {
    "__init__.py": POISON,
    "srt/__init__.py": "",
    "srt/speculative/__init__.py": "",
    "srt/speculative/dflash_worker.py": "class DFlashWorker: ...\n",
    "srt/speculative/dflash_utils.py": "def helper(): ...\n\ntry:\n    other_helper = 1\nexcept Exception:\n    pass\n",
    "srt/speculative/dflash_worker_v2.py": V2_WORKER,
    "srt/speculative/spec_info.py": SPEC_INFO_GATED,
    "srt/environ.py": ENVIRON,
    "srt/server_args.py": SERVER_ARGS_GATED,
    "srt/models/kimi_k25.py": "class KimiK25ForConditionalGeneration(nn.Module): ...\n",
    "srt/models/deepseek_v2.py": "class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):\n",
    "srt/layers/quantization/compressed_tensors/__init__.py": "",
}


@pytest.mark.local
def test_pr20547_like_tree(tmp_path):
    value = collect(write_tree(tmp_path, PR_LIKE))
    assert value["version"] is None
    assert value["features"] == {
        "dflash": "v2",
        "dflash_pr20547": True,
        "ddtree": False,
        "kimi_k25_model": True,
        "deepseek_v3_model": True,
        "compressed_tensors_quant": True,
    }


@pytest.mark.local
@pytest.mark.parametrize(
    "change,missing",
    [
        # The six clean files of the PR on 0.5.11: a v2 worker that nothing calls.
        ({"srt/speculative/spec_info.py": "class SpeculativeAlgorithm: ...\n"},
         "spec_info.py does not route DFLASH to DFlashWorkerV2 (v1 runs)"),
        ({"srt/speculative/dflash_utils.py": "def helper(): ...\n"},
         "srt/speculative/dflash_worker_v2.py imports "
         "sglang.srt.speculative.dflash_utils.other_helper, which this SGLang does not define"),
        ({"srt/server_args.py": "def f(self):\n    self.disable_overlap_schedule = True\n"},
         "server_args.py still turns the overlap scheduler off for DFLASH"),
        ({"srt/environ.py": "class Envs: ...\n"},
         "environ.py does not define SGLANG_ENABLE_DFLASH_SPEC_V2"),
        # A hand-patched tree where model_runner.py does not compile.
        ({"srt/model_executor/model_runner.py": "def broken(:\n"},
         "srt/model_executor/model_runner.py does not compile: invalid syntax (line 1)"),
    ],
)  # fmt: skip
def test_v2_worker_not_wired_in_is_v1(tmp_path, change, missing):
    value = collect(write_tree(tmp_path, {**PR_LIKE, **change}))
    assert value["features"]["dflash"] == "v1"
    assert value["features"]["dflash_pr20547"] is False
    assert value["features"]["dflash_v2_missing"] == [missing]


@pytest.mark.local
def test_v1_files_alone_have_no_wiring_report(tmp_path):
    tree = {k: v for k, v in PR_LIKE.items() if "dflash_worker_v2" not in k}
    features = collect(write_tree(tmp_path, tree))["features"]
    assert features["dflash"] == "v1" and "dflash_v2_missing" not in features


@pytest.mark.local
def test_not_installed(tmp_path):
    assert collect(tmp_path) is None


# --- the fact's real command, through sh, in a real venv ------------------------------------


@pytest.mark.local
def test_command_in_a_venv_and_absent_interpreter(tmp_path, wheel_trees):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    fact = sglang.SGLangInstall()
    cmd = get_command_string(StringCommand(fact.command(python=str(python))))

    def run(command: str) -> dict | None:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        out = done.stdout.splitlines()
        return fact.process(out) if out else fact.default()

    assert run(cmd) is None  # a venv without SGLang
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    (site / "sglang-under-test.pth").write_text(str(wheel_trees["0.5.11"]) + "\n")
    value = run(cmd)
    assert value["version"] == "0.5.11"
    assert value["features"]["dflash"] == "v1"
    missing = get_command_string(StringCommand(fact.command(python=str(tmp_path / "no" / "py"))))
    assert run(missing) is None


@pytest.mark.local
def test_the_venv_facts_run_no_pth_code_and_read_the_same(tmp_path, wheel_trees):
    """Issue 55: the facts ran the venv's Python with -I only, which runs its .pth files' import
    lines, as root, at --dry and in `specfleet status`. Run with -I -S, none runs; the site
    folders, a .pth path line's folder and an editable install's finder (its MAPPING, read, not
    run) find SGLang as before."""
    from facts.python import Packages

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    ran = tmp_path / "pth-code-ran"
    (site / "aaa-user.pth").write_text(f"import os; open({str(ran)!r}, 'a').write('pth ')\n")
    tree = wheel_trees["0.5.11"]
    (site / "sglang-under-test.pth").write_text(f"# a comment\n\n{tree}\n")

    def run(fact, **kwargs):
        cmd = get_command_string(StringCommand(fact.command(**kwargs)))
        done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return fact.process(done.stdout.splitlines())

    version = ".".join(map(str, sys.version_info[:3]))
    value = run(sglang.SGLangInstall(), python=python)
    assert value["version"] == "0.5.11" and value["location"] == str(tree / "sglang")
    packages = run(Packages(), python=python, names=["sglang"])
    assert packages["sglang"] == "0.5.11" and packages["python_version"] == version
    assert run(sglang.Venv(), path=str(env_dir)) == {"python": version}
    assert not ran.exists()
    # The same venv's Python with its site, as before: the .pth line is code, and it runs.
    subprocess.run([python, "-I", "-c", "pass"], check=True)
    assert ran.read_text().startswith("pth ")  # (a venv's site runs its .pth files twice)
    ran.unlink()
    # An editable install (pip install -e): a .pth import line and setuptools' finder module.
    (site / "sglang-under-test.pth").unlink()
    finder = "__editable___sglang_0_5_11_finder"
    (site / "__editable__.sglang-0.5.11.pth").write_text(f"import {finder}; {finder}.install()")
    (site / f"{finder}.py").write_text(
        f"open({str(ran)!r}, 'a').write('finder ')\n"
        f"MAPPING: dict[str, str] = {{'sglang': {str(tree / 'sglang')!r}}}\n"
        "NAMESPACES: dict[str, list[str]] = {}\n"
        "def install():\n    pass\n")
    value = run(sglang.SGLangInstall(), python=python)
    assert value["version"] == "0.5.11" and value["location"] == str(tree / "sglang")
    assert not ran.exists()


# --- DDTree: the fork's real tree, every release wheel, authored designs ----------------------


@pytest.mark.local
def test_ddtree_fork_tree_from_the_shared_tarball():
    """The fork's whole tree (DB-Guo/sglang-ddtree-dev 514ea1f3e), laid in as a source install:
    DDTree, its design, its exact flags, and a placeholder version mapped by its files."""
    site = ddtree_fork_site()
    value = collect(site)
    assert value["version"] == DDTREE_FORK_VERSION
    assert value["features"]["ddtree"] is True
    assert value["features"]["dflash"] == "v1"  # "DFLASH does not support overlap scheduling"
    ddtree = value["ddtree"]
    assert ddtree["design"] == ddtree_designs.FORK_DFLASH_SWITCH.name
    assert ddtree["declared"] == [
        "field:speculative_dflash_enable_ddtree", "flag:--speculative-dflash-enable-ddtree",
    ]  # fmt: skip
    assert ddtree["flags"] == {
        "algorithm": "DFLASH",
        "switch": "--speculative-dflash-enable-ddtree",
        "budget": "--speculative-num-draft-tokens",
    }
    assert "srt/arg_groups/speculative_hook.py" in ddtree["mentions"]
    # The flag the design row names is the tree's own add_argument string.
    server_args = (site / "sglang" / "srt" / "server_args.py").read_text()
    assert f'"{ddtree["flags"]["switch"]}"' in server_args
    assert value["layout_release"] == {
        "release": "0.5.13", "marker": "srt/arg_groups/speculative_hook.py",
    }  # fmt: skip
    assert ddtree_designs.describe(ddtree).startswith("DDTree, design dflash-switch")


@pytest.mark.local
@pytest.mark.parametrize("version", RELEASES)
def test_no_release_in_the_version_table_has_ddtree(version, wheel_trees):
    value = collect(wheel_trees[version])
    assert value["version"] == version
    assert value["features"]["ddtree"] is False
    assert "ddtree" not in value and "layout_release" not in value
    assert ddtree_designs.describe(value.get("ddtree")) == "no DDTree"


@pytest.mark.local
def test_each_release_maps_to_its_own_row_by_its_files(tmp_path):
    """The placeholder mapping, checked on the real wheels: each release's files pick its row."""
    for version in RELEASES:
        with zipfile.ZipFile(wheel_path(version)) as wheel:
            names = {n[len("sglang/"):] for n in wheel.namelist() if n.startswith("sglang/")}
        folders = {n.rsplit("/", 1)[0] + "/" for n in names if "/" in n}
        found = versions.release_by_layout(lambda rel, names=names, folders=folders: (
            rel in folders if rel.endswith("/") else rel in names))  # fmt: skip
        assert versions.version_row(found[0]) is versions.version_row(version), version


@pytest.mark.local
def test_pr29907_design_authored(tmp_path):
    """PR#29907 (code not available: authored from its description) in a 0.5.23-style tree."""
    tree = write_tree(tmp_path, {
        "__init__.py": POISON,
        "srt/speculative/spec_info.py": (
            "from enum import Enum, auto\nclass SpeculativeAlgorithm(Enum):\n"
            "    DFLASH = auto()\n    DDTREE = auto()\n    NONE = auto()\n"
        ),
        "srt/arg_groups/fields/spec.py": (
            "@dataclass\nclass SpecArgs:\n    speculative_ddtree_budget: Optional[int] = None\n"
        ),
        "srt/environ.py": "class Envs:\n    SGLANG_DDTREE_MAX_TOPK = EnvInt(8)\n",
    })  # fmt: skip
    ddtree = collect(tree)["ddtree"]
    assert ddtree["design"] == ddtree_designs.PR29907_ALGORITHM.name
    assert ddtree["flags"]["budget"] == "--speculative-ddtree-budget"
    assert "env:SGLANG_DDTREE_MAX_TOPK" in ddtree["declared"]
    assert ddtree["env"] == [
        "SGLANG_DDTREE_DEPTH_BONUS", "SGLANG_DDTREE_MAX_TOPK", "SGLANG_DDTREE_RANK_PROBE",
    ]  # fmt: skip


@pytest.mark.local
def test_ddtree_unknown_design(tmp_path):
    tree = write_tree(tmp_path, {
        "__init__.py": "",
        "srt/server_args.py": (
            "class ServerArgs:\n    speculative_tree_ddtree_mode: str = 'off'\n"
            "def add(parser):\n    parser.add_argument('--speculative-tree-ddtree-mode')\n"
        ),
    })  # fmt: skip
    ddtree = collect(tree)["ddtree"]
    assert ddtree["design"] == ddtree_designs.UNKNOWN and "flags" not in ddtree
    assert ddtree_designs.describe(ddtree) == (
        "DDTree present, unknown design (field:speculative_tree_ddtree_mode, "
        "flag:--speculative-tree-ddtree-mode)"
    )
