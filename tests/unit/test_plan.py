"""specfleet.core.plan: the launch plan over the arch x SGLang x interconnect matrix, errors, overrides.

Facts come from real data only:
- GPUs and topology: the facts helper's parsers (facts.gpu) run on real nvidia-smi captures in
  tests/fixtures/nvidia/<profile>/ (each folder's SOURCE.md says where it came from);
- SGLang: tests/fixtures/sglang/<name>.json, read from the real wheels and the PR#20547 head
  (tests/unit/test_plan_sglang_fixtures.py makes and re-checks them).

The matrix's interconnect axis needs an NVLink and a PCIe-only host per arch. Where no such real
machine was captured (B200 only ships on NVLink HGX boards; RTX PRO 6000 has no NVLink), the case
pairs the arch's real Gpus fact with the real GpuTopology fact of another captured machine with
the same number of GPUs, and says so in its id ("topo-from-<profile>").
"""

from __future__ import annotations

import functools
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from facts.gpu import Gpus, GpuTopology, parse_query_gpu
from specfleet.core.errors import SettingsError, SpecfleetError
from specfleet.core.plan import (
    DEFAULT_BLOCK_SIZE,
    KIMI_K26_WEIGHTS_BYTES,
    PlanError,
    make_plan,
)
from specfleet.core.settings import settings_from_dict
from tests.unit.test_plan_sglang_fixtures import load as load_sglang

ROOT = Path(__file__).resolve().parents[2]
NVIDIA = Path(__file__).parents[1] / "fixtures" / "nvidia"
STANDIN = Path(__file__).parents[1] / "harness" / "standin_nvidia_smi.py"

PY = "/opt/specfleet/sglang/bin/python"
LAUNCH = [PY, "-m", "sglang.launch_server"]
TARGET = "/srv/models/moonshotai--Kimi-K2.6/current"
DRAFTER = "/srv/models/z-lab--Kimi-K2.6-DFlash/current"
BASE_ENV = {"HF_HUB_OFFLINE": "1", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
SPEC_V2_ENV = {"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_DFLASH_SPEC_V2": "1"}
# z-lab/Kimi-K2.6-DFlash config.json fields the plan reads (sglang.md section 3).
DRAFTER_CONFIG = {"architectures": ["DFlashDraftModel"], "block_size": 8}


def profile_exists(profile: str) -> bool:
    return (NVIDIA / profile / "commands.json").is_file()


@functools.cache
def _fact_json(profile: str, fact: str) -> str:
    """The fact's value as the fact itself computes it on a fleet host of this profile: its real
    shell command, run with the nvidia-smi stand-in replaying the profile, then its parser."""
    cls = {"Gpus": Gpus, "GpuTopology": GpuTopology}[fact]
    with tempfile.TemporaryDirectory() as tmp:
        shim = Path(tmp) / "nvidia-smi"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
        shim.chmod(0o755)
        env = {
            **os.environ,
            "PATH": f"{tmp}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "STANDIN_NVIDIA_SMI_PROFILE": str(NVIDIA / profile),
            "STANDIN_NVIDIA_SMI_RUNTIME": str(Path(tmp) / "runtime"),
        }
        out = subprocess.run(
            ["sh", "-c", cls().command()], env=env, capture_output=True, text=True, timeout=60
        )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # pyinfra: a command that prints nothing gives the fact's default().
    return json.dumps(cls().process(lines) if lines else cls.default())


def gpus_fact(profile: str) -> dict:
    return json.loads(_fact_json(profile, "Gpus"))


def topology_fact(profile: str) -> dict:
    return json.loads(_fact_json(profile, "GpuTopology"))


def host_facts(gpus: str, topo: str | None = None, sglang: str | None = "0.5.23") -> dict:
    facts = {
        "facts.gpu.Gpus": gpus_fact(gpus),
        "facts.gpu.GpuTopology": topology_fact(topo or gpus),
    }
    if sglang is not None:
        facts["facts.sglang.SGLangInstall"] = load_sglang(sglang)
    return facts


def settings(**data):
    return settings_from_dict(data)


# --------------------------------------------------------------------------------------------------
# The matrix
# --------------------------------------------------------------------------------------------------

# (arch, interconnect, Gpus capture, GpuTopology capture). Where the two differ, the pairing is
# hypothetical but both facts are real and the GPU counts match: h100x8 has no topology capture
# (an HGX H100 is NVSwitch-connected like the HGX B200 capture); B200 is never PCIe-only and RTX PRO
# 6000 has no NVLink, so those two cells borrow the other 8-GPU host's topology.
HOSTS = [
    ("SM90", "nvlink", "h200x2", "h200x2"),
    ("SM90", "nvlink", "h100x8", "b200x8"),
    ("SM90", "pcie", "h100x8", "rtx6000x8"),
    ("SM100", "nvlink", "b200x8", "b200x8"),
    ("SM100", "pcie", "b200x8", "rtx6000x8"),
    ("SM120", "nvlink", "rtx6000x8", "b200x8"),
    ("SM120", "pcie", "rtx6000x8", "rtx6000x8"),
]

# The rule per arch (issue 4), as literals.
ARCH = {
    "SM90": {"attention": "fa3", "draft": "fa3", "mem": []},
    "SM100": {"attention": "trtllm_mla", "draft": "fa4", "mem": ["--mem-fraction-static", "0.9"]},
    "SM120": {
        "attention": "triton",
        "draft": "flashinfer",
        "mem": ["--mem-fraction-static", "0.85"],
    },
}
# The flag name and env per SGLang build, as literals (checked against the wheels in versions.py).
BUILD = {
    "0.5.11": {"window": "--speculative-dflash-draft-window-size", "env": {}},
    "0.5.14": {"window": "--speculative-draft-window-size", "env": {}},
    "0.5.23": {"window": "--speculative-draft-window-size", "env": {}},
    "pr20547": {"window": "--speculative-dflash-draft-window-size", "env": SPEC_V2_ENV},
}


def matrix():
    for arch, link, gpus, topo in HOSTS:
        where = gpus if topo == gpus else f"{gpus}-topo-from-{topo}"
        for build in BUILD:
            case_id = f"{arch}-{link}-{build}-{where}"
            yield pytest.param(arch, link, gpus, topo, build, id=case_id)


def expected_argv(arch: str, build: str, tp: int, pcie_many: bool) -> list[str]:
    a, v = ARCH[arch], BUILD[build]
    return [
        *LAUNCH,
        "--model-path", TARGET,
        "--trust-remote-code",
        "--tp-size", str(tp),
        "--attention-backend", a["attention"],
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", DRAFTER,
        "--speculative-num-draft-tokens", "8",
        "--speculative-draft-attention-backend", a["draft"],
        v["window"], "4096",
        *a["mem"],
        *(["--disable-custom-all-reduce"] if pcie_many else []),
        "--enable-metrics",
        "--reasoning-parser", "kimi_k2",
        "--tool-call-parser", "kimi_k2",
        "--host", "127.0.0.1",
        "--port", "30000",
    ]  # fmt: skip


@pytest.mark.local
@pytest.mark.parametrize("arch,link,gpus,topo,build", list(matrix()))
def test_matrix(arch, link, gpus, topo, build):
    facts = host_facts(gpus, topo, sglang=build)
    gpu_list = facts["facts.gpu.Gpus"]["gpus"]
    n = len(gpu_list)
    total_bytes = sum(g["memory_mib"] for g in gpu_list) * 1024**2
    nvlink = facts["facts.gpu.GpuTopology"]["nvlink_all_pairs"]
    # The capture really is the arch and interconnect the case claims.
    assert {g["compute_capability"] for g in gpu_list} <= {
        "SM90": {"9.0"},
        "SM100": {"10.0", "10.3"},
        "SM120": {"12.0"},
    }[arch]
    assert nvlink is (link == "nvlink")
    assert len(facts["facts.gpu.GpuTopology"]["gpus"]) == n

    if total_bytes < KIMI_K26_WEIGHTS_BYTES:
        with pytest.raises(PlanError) as err:
            make_plan(facts, settings(), DRAFTER_CONFIG)
        assert f"{n} GPUs hold {total_bytes / 1024**3:.0f} GiB in all, far below the 561 GiB" in (
            err.value.problem
        )
        assert "more GPU memory" in err.value.fix
        return

    if gpus == "h100x8":
        # 561 GiB over 8 GPUs is 70.1 GiB each; SGLang leaves about 56-59 GiB for weights + KV on
        # an H100 80GB (issue 30: its own _handle_gpu_memory_settings, and a real GPU: 0.749 before
        # the vision-model cut): no plan, with the numbers and the fixes.
        with pytest.raises(PlanError) as err:
            make_plan(facts, settings(), DRAFTER_CONFIG, host="h100")
        assert re.search(
            r"^8 GPUs of 79\.6 GiB: mem_fraction_static 0\.[67]\d\d \(what SGLang .+ chooses\)",
            err.value.problem,
        )
        assert "the weights need 70.1 GiB per GPU" in err.value.problem
        assert "no KV pool at all, below plan.min_request_tokens 32,768" in err.value.problem
        assert "Not enough memory" in err.value.problem
        assert "settings 'group'" in err.value.fix
        # 70.1 GiB of weights + 32,768 tokens (2.4 GiB at 0.5.11's 77,184 bytes each, 2.2 GiB at
        # 0.5.23's 73,344) over 79.6 GiB.
        assert re.search(r"plan\.mem_fraction_static to at least 0\.9[01]\d", err.value.fix)
        return

    plan = make_plan(facts, settings(), DRAFTER_CONFIG)
    assert plan.argv == expected_argv(arch, build, n, pcie_many=(not nvlink and n > 2))
    room = plan.reason("kv-cache-room")
    assert room.choice.endswith(" GiB/GPU") and float(room.choice.split()[0]) >= 4
    assert "tokens of KV cache" in room.why
    assert plan.reason("max-running-requests").choice == "48"
    assert plan.env == {**BASE_ENV, **BUILD[build]["env"]}
    assert plan.predicted is False
    topics = [r.topic for r in plan.reasons]
    assert topics.index("attention-backend") < topics.index("draft-attention-backend")
    if build == "pr20547":
        assert "SGLANG_ENABLE_DFLASH_SPEC_V2=1" in plan.reason("dflash-worker").why


# --------------------------------------------------------------------------------------------------
# Cases needing only the h200x2 capture (always present)
# --------------------------------------------------------------------------------------------------


@pytest.mark.local
def test_h200x2_too_small_for_kimi():
    with pytest.raises(PlanError) as err:
        make_plan(host_facts("h200x2"), settings(), DRAFTER_CONFIG, host="h1")
    text = err.value.render()
    assert text.startswith("[h1] 2 GPUs hold 281 GiB in all, far below the 561 GiB of weights")
    assert "fix: use a host with more GPU memory" in text


@pytest.mark.local
def test_h200x2_small_model_full_argv():
    """A weights size that fits: the whole SM90 NVLink plan, literally."""
    plan = make_plan(
        host_facts("h200x2", sglang="0.5.11"), settings(), DRAFTER_CONFIG, weights_bytes=200 * 2**30
    )
    assert plan.argv == [
        PY, "-m", "sglang.launch_server",
        "--model-path", "/srv/models/moonshotai--Kimi-K2.6/current",
        "--trust-remote-code",
        "--tp-size", "2",
        "--attention-backend", "fa3",
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", "/srv/models/z-lab--Kimi-K2.6-DFlash/current",
        "--speculative-num-draft-tokens", "8",
        "--speculative-draft-attention-backend", "fa3",
        "--speculative-dflash-draft-window-size", "4096",
        "--enable-metrics",
        "--reasoning-parser", "kimi_k2",
        "--tool-call-parser", "kimi_k2",
        "--host", "127.0.0.1",
        "--port", "30000",
    ]  # fmt: skip
    assert plan.env == BASE_ENV
    assert plan.reason("mem-fraction-static").choice == "SGLang default"
    assert plan.reason("custom-all-reduce").choice == "SGLang default"


@pytest.mark.parametrize(
    "profile,quoted",
    [
        ("driver-mismatch", "Failed to initialize NVML: Driver/library version mismatch\n"
         "NVML library version: 570.124 (exit status 18)"),
        ("no-devices", "No devices were found (exit status 6)"),
        ("no-driver", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
         "driver. Make sure that the latest NVIDIA driver is installed and running. (exit status 9)"),
    ],
)  # fmt: skip
@pytest.mark.local
def test_no_gpus_quotes_nvidia_smi_error(profile, quoted):
    facts = {
        "facts.gpu.Gpus": gpus_fact(profile),
        "facts.sglang.SGLangInstall": load_sglang("0.5.23"),
    }
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(), DRAFTER_CONFIG, host="h9")
    assert err.value.problem == f"no GPUs: nvidia-smi failed: {quoted}"
    assert err.value.host == "h9"
    assert "working driver" in err.value.fix


@pytest.mark.local
def test_old_driver_without_compute_cap():
    facts = {"facts.gpu.Gpus": gpus_fact("old-driver")}
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(), predicted=True)
    assert err.value.problem.startswith(
        "GPU compute capability unknown (facts.gpu.Gpus has no compute_capability): nvidia-smi "
        'said: Field "compute_cap" is not a valid field to query.'
    )
    assert "driver >= 510" in err.value.fix


def test_no_nvidia_smi():
    # Where there is no nvidia-smi the fact's command prints nothing, so pyinfra gives default().
    facts = {"facts.gpu.Gpus": Gpus.default()}
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(), predicted=True)
    assert err.value.problem == "no GPUs: no nvidia-smi on the host, or it lists none"


def test_missing_gpu_fact_is_unknown():
    with pytest.raises(PlanError, match="no GPUs: the facts carry no facts.gpu.Gpus"):
        make_plan({}, settings(), predicted=True)


@pytest.mark.local
def test_unknown_arch_fails():
    # The real H200 capture, with the compute capability an A100 reports (8.0).
    lines = (NVIDIA / "h200x2" / "query-gpu.csv").read_text().splitlines()
    lines = [ln.replace(", 9.0,", ", 8.0,") for ln in lines]
    facts = {"facts.gpu.Gpus": parse_query_gpu(lines), **{
        k: v for k, v in host_facts("h200x2").items() if k != "facts.gpu.Gpus"
    }}  # fmt: skip
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(), DRAFTER_CONFIG)
    assert err.value.problem.startswith("no usable attention backend for SM80 (NVIDIA H200)")
    assert "plan.attention_backend" in err.value.fix


@pytest.mark.local
def test_sglang_without_dflash():
    # 0.5.10.post1 had no DFLASH (sglang.md section 2): predicted from the version table.
    facts = host_facts("h200x2", sglang=None)
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(sglang={"version": "0.5.10.post1"}), predicted=True)
    assert err.value.problem == "SGLang 0.5.10.post1 has no DFLASH speculative decoding"
    assert "sglang >= 0.5.11" in err.value.fix


@pytest.mark.local
def test_sglang_not_installed_and_not_predicted():
    facts = host_facts("h200x2", sglang=None)
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(), weights_bytes=1)
    assert "SGLang is not installed" in err.value.problem
    assert "--predicted" in err.value.fix


@pytest.mark.local
def test_fewer_gpus_than_tp_size():
    with pytest.raises(PlanError) as err:
        make_plan(host_facts("h200x2"), settings(plan={"tp_size": 8}), DRAFTER_CONFIG)
    assert err.value.problem == "--tp-size 8 needs 8 GPUs, the host has 2"
    assert "at most 2" in err.value.fix


def test_plan_error_is_a_specfleet_error():
    assert issubclass(PlanError, SpecfleetError)


# --------------------------------------------------------------------------------------------------
# Predicted plans, block size, DDTree
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version,window",
    [
        ("0.5.11", "--speculative-dflash-draft-window-size"),
        ("0.5.13", "--speculative-dflash-draft-window-size"),
        ("0.5.14", "--speculative-draft-window-size"),
        ("0.5.23", "--speculative-draft-window-size"),
    ],
)
@pytest.mark.local
def test_predicted_plan_uses_version_table(version, window):
    facts = host_facts("h200x2", sglang=None)
    plan = make_plan(facts, settings(sglang={"version": version}), predicted=True, weights_bytes=1)
    assert plan.predicted is True
    assert window in plan.argv
    assert plan.reason("sglang").kind == "predicted"
    assert plan.reason("attention-backend").kind == "predicted"
    block = plan.reason("block-size")
    assert (block.choice, block.kind) == (str(DEFAULT_BLOCK_SIZE), "assumed")
    assert plan.argv[plan.argv.index("--speculative-num-draft-tokens") + 1] == "8"
    assert plan.render().startswith("plan (predicted: SGLang not installed yet):")


@pytest.mark.local
def test_predicted_matches_installed_for_each_release():
    """A --dry plan before install equals the plan once the real wheel's facts are in."""
    for version in ("0.5.11", "0.5.14", "0.5.23"):
        before = make_plan(
            host_facts("h200x2", sglang=None),
            settings(sglang={"version": version}),
            DRAFTER_CONFIG,
            predicted=True,
            weights_bytes=1,
        )
        after = make_plan(
            host_facts("h200x2", sglang=version), settings(), DRAFTER_CONFIG, weights_bytes=1
        )
        assert (before.argv, before.env) == (after.argv, after.env), version


@pytest.mark.local
def test_predicted_pr20547_git_install():
    s = settings(sglang={
        "kind": "git",
        "git_url": "https://github.com/sgl-project/sglang.git",
        "git_ref": "refs/pull/20547/head",
    })  # fmt: skip
    plan = make_plan(host_facts("h200x2", sglang=None), s, predicted=True, weights_bytes=1)
    assert plan.env == {**BASE_ENV, **SPEC_V2_ENV}
    assert "--speculative-dflash-draft-window-size" in plan.argv


@pytest.mark.local
def test_block_size_from_dflash_config_and_window_check():
    cfg = {"dflash_config": {"block_size": 16, "target_layer_ids": [1, 12]}, "block_size": 8}
    plan = make_plan(host_facts("h200x2"), settings(), cfg, weights_bytes=1)
    assert plan.argv[plan.argv.index("--speculative-num-draft-tokens") + 1] == "16"
    assert plan.reason("block-size").kind == "rule"
    with pytest.raises(PlanError) as err:
        make_plan(
            host_facts("h200x2"), settings(plan={"draft_window_size": 8}), cfg, weights_bytes=1
        )
    assert err.value.problem == "draft window 8 is smaller than the block size 16"


@pytest.mark.local
def test_bad_drafter_config():
    with pytest.raises(PlanError, match="no usable block_size"):
        make_plan(host_facts("h200x2"), settings(), {"block_size": "eight"}, weights_bytes=1)


@pytest.mark.local
def test_ddtree_reported_not_enabled():
    facts = host_facts("h200x2")
    install = json.loads(json.dumps(facts["facts.sglang.SGLangInstall"]))
    install["features"]["ddtree"] = True
    facts["facts.sglang.SGLangInstall"] = install
    plain = make_plan(host_facts("h200x2"), settings(), DRAFTER_CONFIG, weights_bytes=1)
    plan = make_plan(facts, settings(), DRAFTER_CONFIG, weights_bytes=1)
    assert plan.argv == plain.argv
    assert not any("ddtree" in a.lower() for a in plan.argv)
    # Without a design the facts matched, a budget asked for is not served either (the design
    # cases: tests/unit/test_plan_ddtree.py).
    asked = make_plan(facts, settings(plan={"ddtree_budget": 32}), DRAFTER_CONFIG, weights_bytes=1)
    assert asked.argv == plain.argv
    assert asked.reason("ddtree").choice == "off: serving DFlash"


# --------------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------------


@pytest.mark.local
def test_overrides_are_reported_and_applied():
    s = settings(
        plan={
            "tp_size": 1,
            "attention_backend": "flashinfer",
            "draft_attention_backend": "flashinfer",
            "mem_fraction_static": 0.8,
            "draft_window_size": 2048,
            "extra_args": {
                "--context-length": "131072",
                "--enable-metrics": True,
                "--reasoning-parser": None,
                "--port": 30001,
            },
            "extra_env": {"CUDA_VISIBLE_DEVICES": "0"},
        }
    )
    plan = make_plan(host_facts("h200x2", sglang="0.5.14"), s, DRAFTER_CONFIG, weights_bytes=1)
    argv = plan.argv
    assert argv[argv.index("--tp-size") + 1] == "1"
    assert argv[argv.index("--attention-backend") + 1] == "flashinfer"
    assert argv[argv.index("--speculative-draft-attention-backend") + 1] == "flashinfer"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.8"
    assert argv[argv.index("--speculative-draft-window-size") + 1] == "2048"
    assert argv[argv.index("--port") + 1] == "30001"
    assert argv.count("--port") == 1
    assert "--reasoning-parser" not in argv
    assert argv[-2:] == ["--context-length", "131072"]
    assert argv.count("--enable-metrics") == 1
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0"
    kinds = {r.topic: r.kind for r in plan.reasons}
    for topic in (
        "tensor-parallel", "attention-backend", "draft-attention-backend", "mem-fraction-static",
        "draft-window", "--context-length", "--enable-metrics", "--reasoning-parser", "--port",
        "env CUDA_VISIBLE_DEVICES",
    ):  # fmt: skip
        assert kinds[topic] == "override", topic
    assert "[override]" in plan.render()


@pytest.mark.local
def test_sm120_backend_override_rejects_runtime_failures():
    # fa3 on SM120 passes SGLang's checks at startup and fails at runtime: refused by the plan.
    facts = host_facts("rtx6000x8")
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(plan={"attention_backend": "fa3"}), DRAFTER_CONFIG)
    assert err.value.problem == "plan.attention_backend 'fa3' fails at runtime on SM120"


@pytest.mark.local
def test_attention_override_not_in_registry():
    # cutlass_mla left the registry in 0.5.23 (read from the wheel).
    with pytest.raises(PlanError) as err:
        make_plan(
            host_facts("h200x2", sglang="0.5.23"),
            settings(plan={"attention_backend": "dual_chunk_flash_attn"}),
            DRAFTER_CONFIG,
            weights_bytes=1,
        )
    assert "not in SGLang 0.5.23's attention registry" in err.value.problem


@pytest.mark.local
def test_draft_backend_pr20547_has_no_triton():
    with pytest.raises(PlanError) as err:
        make_plan(
            host_facts("h200x2", sglang="pr20547"),
            settings(plan={"draft_attention_backend": "triton"}),
            DRAFTER_CONFIG,
            weights_bytes=1,
        )
    assert "'triton' is not one DFLASH accepts" in err.value.problem
    assert err.value.fix == "choose one of: flashinfer, fa3, fa4"


@pytest.mark.parametrize(
    "build,flag,forbidden",
    [
        ("0.5.11", "--enable-dp-attention", True),
        ("0.5.14", "--enable-dp-attention", True),
        ("pr20547", "--enable-dp-attention", True),
        ("0.5.23", "--enable-dp-attention", False),
        ("0.5.23", "--speculative-num-steps", True),
        ("0.5.11", "--speculative-eagle-topk", True),
    ],
)
@pytest.mark.local
def test_forbidden_flags_with_dflash(build, flag, forbidden):
    s = settings(plan={"extra_args": {flag: True}})
    facts = host_facts("h200x2", sglang=build)
    if forbidden:
        with pytest.raises(PlanError) as err:
            make_plan(facts, s, DRAFTER_CONFIG, weights_bytes=1)
        assert err.value.problem.startswith(f"{flag} must not be passed with DFLASH on SGLang")
    else:
        assert flag in make_plan(facts, s, DRAFTER_CONFIG, weights_bytes=1).argv


@pytest.mark.local
def test_launcher_stand_in_keeps_flags(monkeypatch):
    monkeypatch.setenv("SPECFLEET_ALLOW_TEST_SETTINGS", "1")  # launcher is test-only
    s = settings(launcher=["/usr/bin/python3", "/srv/standin_sglang_server.py"])
    plan = make_plan(host_facts("h200x2"), s, DRAFTER_CONFIG, weights_bytes=1)
    real = make_plan(host_facts("h200x2"), settings(), DRAFTER_CONFIG, weights_bytes=1)
    assert plan.argv[:2] == ["/usr/bin/python3", "/srv/standin_sglang_server.py"]
    assert plan.argv[2:] == real.argv[3:]


@pytest.mark.local
def test_custom_paths_and_listen():
    s = settings(
        venv="/root/venv_sglang211/",
        models_root="/root/models",
        listen_host="0.0.0.0",
        port=31000,
        target={"repo_id": "moonshotai/Kimi-K2.6", "local_dir": "k26"},
    )
    plan = make_plan(host_facts("h200x2"), s, DRAFTER_CONFIG, weights_bytes=1)
    assert plan.argv[0] == "/root/venv_sglang211/bin/python"
    assert plan.argv[plan.argv.index("--model-path") + 1] == "/root/models/k26/current"
    draft = plan.argv[plan.argv.index("--speculative-draft-model-path") + 1]
    assert draft == "/root/models/z-lab--Kimi-K2.6-DFlash/current"
    assert plan.argv[-4:] == ["--host", "0.0.0.0", "--port", "31000"]


@pytest.mark.local
def test_to_json_and_render():
    plan = make_plan(host_facts("h200x2"), settings(), DRAFTER_CONFIG, weights_bytes=1)
    data = json.loads(plan.to_json())
    assert data["argv"] == plan.argv and data["env"] == plan.env
    assert data["reasons"][0] == {
        "topic": "gpus",
        "choice": "2x NVIDIA H200 (SM90)",
        "why": "from facts.gpu.Gpus",
        "kind": "rule",
    }
    lines = plan.render().splitlines()
    # One line per decision, then env and argv.
    assert len(lines) == 1 + len(plan.reasons) + 2
    assert lines[-1].startswith("  argv: /opt/specfleet/sglang/bin/python -m sglang.launch_server")


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specfleet.plan", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.local
def test_cli_json_ok(tmp_path):
    facts = host_facts("h200x2", sglang="0.5.11")
    facts["drafter_config"] = DRAFTER_CONFIG
    facts["weights_bytes"] = 200 * 2**30
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    (tmp_path / "settings.json").write_text(json.dumps({"port": 30005}))
    out = run_cli("--facts", str(tmp_path / "facts.json"), "--settings",
                  str(tmp_path / "settings.json"), "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    expected = make_plan(
        host_facts("h200x2", sglang="0.5.11"),
        settings(port=30005),
        DRAFTER_CONFIG,
        weights_bytes=200 * 2**30,
    )
    assert data["argv"] == expected.argv
    assert data["env"] == expected.env
    assert [r["topic"] for r in data["reasons"]] == [r.topic for r in expected.reasons]
    assert data["argv"][-2:] == ["--port", "30005"]


def pyinfra_fact_json(profile: str, tmp: Path) -> dict:
    """What `pyinfra @local fact facts.gpu.Gpus facts.gpu.GpuTopology --json` prints on a host
    whose nvidia-smi replays ``profile`` (the fleet's stand-in, put on PATH)."""
    shim = tmp / "bin" / "nvidia-smi"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{shim.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "STANDIN_NVIDIA_SMI_PROFILE": str(NVIDIA / profile),
        "STANDIN_NVIDIA_SMI_RUNTIME": str(tmp / "runtime"),
    }
    pyinfra = Path(sys.executable).parent / "pyinfra"
    out = subprocess.run(
        [str(pyinfra), "@local", "fact", "facts.gpu.Gpus", "facts.gpu.GpuTopology", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.local
def test_cli_takes_pyinfra_fact_json_output(tmp_path):
    facts = pyinfra_fact_json("rtx6000x8", tmp_path)
    assert set(facts["facts.gpu.Gpus"]) == {"@local"}
    facts["facts.sglang.SGLangInstall"] = {"@local": load_sglang("0.5.11")}
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    (tmp_path / "config.json").write_text(json.dumps({"block_size": 4}))
    out = run_cli("--facts", str(tmp_path / "facts.json"), "--drafter-config",
                  str(tmp_path / "config.json"), "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)["argv"]
    expected = make_plan(
        host_facts("rtx6000x8", sglang="0.5.11"), settings(), {"block_size": 4}
    ).argv
    assert argv == expected
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    # Two hosts in one file: --host picks one, without it the CLI asks for it.
    for name in list(facts):
        facts[name]["h2"] = facts[name]["@local"]
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    out = run_cli("--facts", str(tmp_path / "facts.json"), "--json")
    assert out.returncode == 2
    assert json.loads(out.stdout)["error"] == (
        "the facts file holds facts of 2 hosts (@local, h2): choose one with --host"
    )
    out = run_cli("--facts", str(tmp_path / "facts.json"), "--host", "h2", "--json")
    assert out.returncode == 0, out.stdout


@pytest.mark.local
def test_cli_error_exit_2(tmp_path):
    (tmp_path / "facts.json").write_text(json.dumps(host_facts("h200x2")))
    out = run_cli("--facts", str(tmp_path / "facts.json"), "--json")
    assert out.returncode == 2
    error = json.loads(out.stdout)["error"]
    assert error.startswith("2 GPUs hold 281 GiB in all, far below the 561 GiB of weights")
    assert "fix:" in error
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "cannot read facts file"),
        ("{not json", "is not JSON"),
        ("[1, 2]", "must hold a JSON object"),
    ],
)
@pytest.mark.local
def test_cli_bad_input_files(tmp_path, content, message):
    path = tmp_path / "facts.json"
    if content is not None:
        path.write_text(content)
    out = run_cli("--facts", str(path), "--json")
    assert out.returncode == 2
    assert message in json.loads(out.stdout)["error"]
    assert "Traceback" not in out.stderr


def _cli_facts() -> dict:
    facts = host_facts("h200x2", sglang="0.5.11")
    facts["drafter_config"] = DRAFTER_CONFIG
    facts["weights_bytes"] = 1
    return facts


def _set(path: str, value):
    """A change to the good facts: set the item at ``path`` (keys and indexes, '/'-separated)."""

    def change(facts: dict) -> dict:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split("/")]
        node = facts
        for p in parents:
            node = node[p]
        node[last] = value
        return facts

    return change


GPUS_F, TOPO_F, SGLANG_F = "facts.gpu.Gpus", "facts.gpu.GpuTopology", "facts.sglang.SGLangInstall"

# (id, a change to good facts or the raw bytes of the file, what the error must name)
MALFORMED_FACTS = [
    ("gpus not a list", _set(f"{GPUS_F}/gpus", "0,1"), "fact facts.gpu.Gpus.gpus is '0,1' (a string), expected a list"),
    ("gpus fact a list", _set(GPUS_F, [{"name": "H200"}]), "fact facts.gpu.Gpus is"),
    ("gpu entry a string", _set(f"{GPUS_F}/gpus/0", "NVIDIA H200"), "fact facts.gpu.Gpus.gpus[0] is 'NVIDIA H200' (a string), expected an object"),
    ("gpu entry a number", _set(f"{GPUS_F}/gpus/1", 5), "fact facts.gpu.Gpus.gpus[1] is 5"),
    ("gpu name a number", _set(f"{GPUS_F}/gpus/0/name", 5), "facts.gpu.Gpus.gpus[0].name"),
    ("compute capability an object", _set(f"{GPUS_F}/gpus/0/compute_capability", {"major": 9}), "facts.gpu.Gpus.gpus[0].compute_capability"),
    ("features a string", _set(f"{SGLANG_F}/features", "dflash"), "fact facts.sglang.SGLangInstall.features is 'dflash' (a string), expected an object"),
    ("unknown dflash worker", _set(f"{SGLANG_F}/features/dflash", "v3"), "facts.sglang.SGLangInstall.features.dflash is 'v3'"),
    ("feature flag a string", _set(f"{SGLANG_F}/features/dflash_pr20547", "yes"), "facts.sglang.SGLangInstall.features.dflash_pr20547"),
    ("memory as text", _set(f"{GPUS_F}/gpus/0/memory_mib", "141 GiB"), "fact facts.gpu.Gpus.gpus[0].memory_mib is '141 GiB' (a string)"),
    ("memory negative", _set(f"{GPUS_F}/gpus/1/memory_mib", -143771), "facts.gpu.Gpus.gpus[1].memory_mib is -143771"),
    ("memory fractional", _set(f"{GPUS_F}/gpus/0/memory_mib", 1.5), "facts.gpu.Gpus.gpus[0].memory_mib is 1.5"),
    ("memory a boolean", _set(f"{GPUS_F}/gpus/0/memory_mib", True), "facts.gpu.Gpus.gpus[0].memory_mib is True (a boolean)"),
    ("memory Infinity", lambda f: json.dumps(f).replace("143771", "Infinity", 1).encode(), "facts.gpu.Gpus.gpus[0].memory_mib is inf"),
    ("memory NaN", lambda f: json.dumps(f).replace("143771", "NaN", 1).encode(), "facts.gpu.Gpus.gpus[0].memory_mib is nan"),
    ("memory zero", _set(f"{GPUS_F}/gpus/1/memory_mib", 0), "GPU memory unknown: facts.gpu.Gpus gives no memory_mib (null or 0) for GPU 1"),
    ("memory unknown", _set(f"{GPUS_F}/gpus/0/memory_mib", None), "GPU memory unknown: facts.gpu.Gpus gives no memory_mib (null or 0) for GPU 0"),
    ("version garbage", _set(f"{SGLANG_F}/version", "garbage"), "the installed SGLang reports the version 'garbage' (facts.sglang.SGLangInstall.version), which does not parse"),
    ("version a number", _set(f"{SGLANG_F}/version", 5), "fact facts.sglang.SGLangInstall.version is 5 (a number), expected a string"),
    ("registry a string", _set(f"{SGLANG_F}/attention_backends", "triton"), "facts.sglang.SGLangInstall.attention_backends is 'triton'"),
    ("algorithm not a string", _set(f"{SGLANG_F}/speculative_algorithms", ["DFLASH", 1]), "facts.sglang.SGLangInstall.speculative_algorithms[1] is 1"),
    ("install a list", _set(SGLANG_F, ["0.5.11"]), "fact facts.sglang.SGLangInstall is ['0.5.11'] (a list)"),
    ("nvlink flag a string", _set(f"{TOPO_F}/nvlink_all_pairs", "false"), "fact facts.gpu.GpuTopology.nvlink_all_pairs is 'false' (a string)"),
    ("topology a string", _set(TOPO_F, "NV18"), "fact facts.gpu.GpuTopology is 'NV18'"),
    ("weights_bytes negative", _set("weights_bytes", -1), "weights_bytes"),
    ("not UTF-8", lambda f: b'{"facts.gpu.Gpus": "\xff\xfe"}', "facts file"),
    ("Latin-1 file", lambda f: json.dumps({GPUS_F: {"gpus": [], "error": "caf\u00e9"}}).encode().replace(b"\\u00e9", b"\xe9"), "is not UTF-8 text"),
    ("nested too deep", lambda f: b"[" * 200000 + b"]" * 200000, "nested too deep"),
]


def plan_cli_in_process(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m specfleet.plan ARGS`` as its ``main`` (exit status, stdout, stderr): the same
    code as the process, without an interpreter start and specfleet's imports for each call."""
    from specfleet import cli

    capsys.readouterr()
    rc = cli.main(["plan", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _write_malformed(tmp_path: Path, change) -> Path:
    out = change(_cli_facts())
    path = tmp_path / "facts.json"
    path.write_bytes(out if isinstance(out, bytes) else json.dumps(out).encode())
    return path


@pytest.mark.parametrize("change, names", [m[1:] for m in MALFORMED_FACTS],
                         ids=[m[0] for m in MALFORMED_FACTS])
@pytest.mark.local
def test_cli_malformed_facts_exit_2_with_an_error_naming_the_fact(tmp_path, capsys, change, names):
    path = _write_malformed(tmp_path, change)
    rc, out, err = plan_cli_in_process(capsys, "--facts", str(path), "--json")
    assert rc == 2, (out, err)
    error = json.loads(out)["error"]
    assert names in error, error
    assert "Traceback" not in err and "Traceback" not in out
    # Without --json: one error line on stderr, no traceback.
    rc, out, err = plan_cli_in_process(capsys, "--facts", str(path))
    assert rc == 2 and err.startswith("specfleet: ") and names in err and not out, (out, err)
    assert "Traceback" not in err


@pytest.mark.local
@pytest.mark.parametrize("case", ["gpus not a list", "nested too deep"])
def test_cli_malformed_facts_exit_2_as_a_process(tmp_path, case):
    """The process itself (the cases above run its main in-process): exit status 2, the error
    on stdout (--json) or one line on stderr, never a traceback; the deepest input included."""
    _id, change, names = next(m for m in MALFORMED_FACTS if m[0] == case)
    path = _write_malformed(tmp_path, change)
    res = run_cli("--facts", str(path), "--json")
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert names in json.loads(res.stdout)["error"]
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    res = run_cli("--facts", str(path))
    assert res.returncode == 2 and res.stderr.startswith("specfleet: ") and names in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.local
def test_cli_the_good_facts_of_the_malformed_cases_plan(tmp_path):
    (tmp_path / "facts.json").write_text(json.dumps(_cli_facts()))
    res = run_cli("--facts", str(tmp_path / "facts.json"), "--json")
    assert res.returncode == 0, res.stdout
    assert json.loads(res.stdout)["argv"][:3] == LAUNCH


@pytest.mark.local
def test_cli_settings_file_not_utf8(tmp_path):
    (tmp_path / "facts.json").write_text(json.dumps(_cli_facts()))
    (tmp_path / "settings.json").write_bytes(b'{"venv": "/opt/\xe9"}')
    res = run_cli("--facts", str(tmp_path / "facts.json"), "--settings",
                  str(tmp_path / "settings.json"), "--json")  # fmt: skip
    assert res.returncode == 2
    assert "settings file" in json.loads(res.stdout)["error"]
    assert "Traceback" not in res.stderr


@pytest.mark.local
def test_cli_settings_checked_as_at_load(tmp_path):
    (tmp_path / "facts.json").write_text(json.dumps(_cli_facts()))
    (tmp_path / "settings.json").write_text(json.dumps({"service_name": "../x", "port": 0}))
    res = run_cli("--facts", str(tmp_path / "facts.json"), "--settings",
                  str(tmp_path / "settings.json"), "--host", "gpu-3", "--json")  # fmt: skip
    assert res.returncode == 2
    error = json.loads(res.stdout)["error"]
    assert error.startswith("[gpu-3] 2 settings are bad:")
    assert "settings key 'service_name' is '../x'" in error and "settings key 'port' is 0" in error


@pytest.mark.local
def test_an_install_without_a_version_goes_by_its_dflash_worker_and_says_so():
    facts = host_facts("h200x2", sglang="0.5.14")
    facts["facts.sglang.SGLangInstall"]["version"] = None
    plan = make_plan(facts, settings(), DRAFTER_CONFIG, weights_bytes=1)
    reason = plan.reason("version-table")
    assert (reason.choice, reason.kind) == ("SGLang 0.5.14 row", "assumed")
    assert "reports no version; its DFLASH worker is v2" in reason.why
    assert "--speculative-draft-window-size" in plan.argv
    # No version and no DFLASH worker: no plan.
    facts["facts.sglang.SGLangInstall"]["features"]["dflash"] = None
    with pytest.raises(PlanError, match="has no DFLASH speculative decoding"):
        make_plan(facts, settings(), DRAFTER_CONFIG, weights_bytes=1)


@pytest.mark.local
def test_an_unparseable_installed_version_never_falls_back_to_another_release():
    facts = host_facts("h200x2", sglang="0.5.11")
    facts["facts.sglang.SGLangInstall"]["version"] = "garbage"
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(), DRAFTER_CONFIG, weights_bytes=1)
    assert "'garbage' (facts.sglang.SGLangInstall.version), which does not parse" in str(err.value)


@pytest.mark.local
def test_cli_bad_settings(tmp_path):
    (tmp_path / "facts.json").write_text(json.dumps(host_facts("h200x2")))
    (tmp_path / "settings.json").write_text(json.dumps({"port": "high"}))
    out = run_cli("--facts", str(tmp_path / "facts.json"), "--settings",
                  str(tmp_path / "settings.json"), "--json")  # fmt: skip
    assert out.returncode == 2
    assert "settings key 'port'" in json.loads(out.stdout)["error"]


@pytest.mark.local
def test_cli_human_rendering(tmp_path):
    (tmp_path / "facts.json").write_text(json.dumps(host_facts("h200x2", sglang=None)))
    out = run_cli("--facts", str(tmp_path / "facts.json"), "--predicted", "--weights-bytes", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("plan (predicted: SGLang not installed yet):")
    assert "attention-backend" in out.stdout and "argv: " in out.stdout
    bad = run_cli("--facts", str(tmp_path / "facts.json"))
    assert bad.returncode == 2
    assert bad.stderr.startswith("specfleet: SGLang is not installed")


@pytest.mark.local
def test_specfleet_plan_says_its_error_as_every_subcommand_does(tmp_path, capsys):
    """``specfleet plan`` and ``python -m specfleet.plan`` (above) prefix an error as the rest of
    the CLI does (``specfleet: ...``), not ``error: ...``."""
    from specfleet import cli

    (tmp_path / "facts.json").write_text(json.dumps(host_facts("h200x2", sglang=None)))
    capsys.readouterr()
    assert cli.main(["plan", "--facts", str(tmp_path / "facts.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specfleet: SGLang is not installed"), err


# --------------------------------------------------------------------------------------------------
# CT200: the real target's inventory entry (never contacted), on the rtx6000x8 capture
# --------------------------------------------------------------------------------------------------


def ct200_settings():
    inventory = runpy.run_path(str(ROOT / "inventories" / "ct200.py"))
    ((name, data),) = inventory["ct200"]
    return settings_from_dict(data["specfleet"], host=name)


@pytest.mark.local
def test_ct200_plan():
    facts = host_facts("rtx6000x8", sglang="0.5.11")
    plan = make_plan(facts, ct200_settings(), DRAFTER_CONFIG, host="ct200")
    assert plan.argv == [
        "/root/venv_sglang211/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/root/models/moonshotai--Kimi-K2.6/current",
        "--trust-remote-code",
        "--tp-size", "8",
        "--attention-backend", "triton",
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", "/root/models/z-lab--Kimi-K2.6-DFlash/current",
        "--speculative-num-draft-tokens", "8",
        "--speculative-draft-attention-backend", "flashinfer",
        "--speculative-dflash-draft-window-size", "4096",
        "--mem-fraction-static", "0.85",
        "--disable-custom-all-reduce",
        "--enable-metrics",
        "--reasoning-parser", "kimi_k2",
        "--tool-call-parser", "kimi_k2",
        "--host", "127.0.0.1",
        "--port", "30000",
    ]  # fmt: skip
    assert plan.env == BASE_ENV
    assert plan.reason("custom-all-reduce").why.startswith("PCIe-only (8 GPUs")
    # 0.85 x 95.6 GiB = 81.3 GiB per GPU, 70.1 GiB of it weights.
    room = plan.reason("kv-cache-room")
    assert room.choice == "11.2 GiB/GPU"
    # SGLang 0.5.11's own accounting (pool_configurator.py, dflash_utils.py): the MLA cell
    # (512 + 64) x 61 layers x 2 bytes = 70,272, scaled by 67/61 for the drafter's 6 layers.
    assert room.why == (
        "mem_fraction_static 0.850 x 95.6 GiB = 81.3 GiB per GPU, minus 70.1 GiB of weights per "
        "GPU: about 155,166 tokens of KV cache by SGLang 0.5.11's accounting (77,184 bytes per "
        "token: the target's cell of 70,272 scaled by 67/61 for the drafter's 6 layers)"
    )
    # Not one full-context request fits: a warning with the cap, and the plan stays.
    request = plan.reason("request-tokens")
    assert (request.choice, request.kind) == ("about 155,000 of 262,144", "warning")
    assert request.why.startswith("requests capped at about 155,000 of 262,144 tokens")
    assert "shared by up to 48 running requests" in request.why
    # The 0.85 is named as overriding SGLang's own fraction, with its reason.
    fraction = plan.reason("mem-fraction-static")
    assert fraction.why.startswith("SM120: at most 0.85, more has been seen to OOM with K2.6; "
                                   "it overrides the 0.")
    assert "SGLang 0.5.11 would choose on 97887 MiB GPUs at TP 8" in fraction.why
    # The requests DFLASH refuses on 0.5.11, and the tool calls that become one.
    refused = plan.reason("refused-requests")
    assert refused.choice == "logprobs, grammar"
    assert "answers these with an error (HTTP 400)" in refused.why
    assert 'tool_choice "required", a named tool_choice or a strict tool' in refused.why
    assert 'with --tool-call-parser kimi_k2 only tool_choice "auto" or "none"' in refused.why
    assert "srt/managers/scheduler.py validate_dflash_request" in refused.why
    # Stock 0.5.11 runs v1; CT200 opts in to the PR#20547 port, so before SGLang is installed
    # (--dry) the prediction is the same launch with the v2 switches the port brings.
    assert plan.reason("dflash-worker").choice == "v1"
    dry = make_plan(host_facts("rtx6000x8", sglang=None), ct200_settings(), predicted=True)
    assert dry.argv == plan.argv
    assert dry.env == {**BASE_ENV, **SPEC_V2_ENV}
    assert dry.reason("dflash-worker").choice == "v2 (PR#20547)"
    assert dry.reason("sglang").choice == "0.5.11 + this project's PR#20547 port"
    # --dry says the same about requests: 0.5.11's refusals and the cap.
    for topic in ("refused-requests", "request-tokens", "kv-cache-room"):
        assert dry.reason(topic).choice == plan.reason(topic).choice, topic
    # Backing out of v2 with the flag alone (#29): the port honours it, the plan says v1.
    off = ct200_settings()
    off = off.model_copy(update={"plan": off.plan.model_copy(
        update={"extra_args": {"--disable-overlap-schedule": True}})})
    dry_off = make_plan(host_facts("rtx6000x8", sglang=None), off, predicted=True)
    assert dry_off.env == BASE_ENV
    assert dry_off.reason("dflash-worker").choice == "v1 (--disable-overlap-schedule)"
    assert "--disable-overlap-schedule" in dry_off.argv


@pytest.mark.local
def test_sm120_mem_fraction_override_above_085_is_flagged():
    facts = host_facts("rtx6000x8", sglang="0.5.11")
    plan = make_plan(facts, settings(plan={"mem_fraction_static": 0.9}), DRAFTER_CONFIG)
    reason = plan.reason("mem-fraction-static")
    assert reason.kind == "override"
    assert "above 0.85 has been seen to OOM on SM120" in reason.why


@pytest.mark.local
def test_kv_cache_room_too_small_even_at_an_explicit_fraction():
    # 8x H100 80GB at 0.85: 67.7 GiB per GPU for 70.1 GiB of weights per GPU.
    facts = host_facts("h100x8", "b200x8", sglang="0.5.23")
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(plan={"mem_fraction_static": 0.85}), DRAFTER_CONFIG)
    assert err.value.problem.startswith(
        "8 GPUs of 79.6 GiB: mem_fraction_static 0.850 (set by the plan) gives 67.7 GiB per GPU for "
        "weights and KV cache; the weights need 70.1 GiB per GPU, leaving -2.4 GiB"
    )


@pytest.mark.local
def test_explicit_fraction_that_fits_names_its_risk():
    # 0.94 x 79.6 GiB = 74.9 GiB: 4.8 GiB of KV cache, above SGLang's own 0.727 (0.5.23).
    facts = host_facts("h100x8", "b200x8", sglang="0.5.23")
    plan = make_plan(facts, settings(plan={"mem_fraction_static": 0.94}), DRAFTER_CONFIG)
    assert plan.reason("kv-cache-room").choice == "4.8 GiB/GPU"
    why = plan.reason("mem-fraction-static").why
    assert "above the 0.727 SGLang 0.5.23 would choose" in why
    assert "out of memory under load is possible" in why


@pytest.mark.local
def test_cli_states_ct200s_refusals_and_request_cap(tmp_path, capsys):
    # `specfleet plan` on CT200's facts and settings, before SGLang is installed (as --dry).
    (tmp_path / "facts.json").write_text(json.dumps(host_facts("rtx6000x8", sglang=None)))
    inventory = runpy.run_path(str(ROOT / "inventories" / "ct200.py"))
    (tmp_path / "settings.json").write_text(json.dumps(inventory["ct200"][0][1]["specfleet"]))
    rc, out, err = plan_cli_in_process(capsys, "--facts", str(tmp_path / "facts.json"),
                                       "--settings", str(tmp_path / "settings.json"),
                                       "--predicted")
    assert rc == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "logprobs, grammar: DFLASH on SGLang 0.5.11" in lines["refused-requests"]
    assert "requests capped at about 155,000 of 262,144 tokens" in lines["request-tokens"]
    assert lines["request-tokens"].endswith("[warning]")


@pytest.mark.local
def test_min_request_tokens_setting():
    facts = host_facts("rtx6000x8", sglang="0.5.14")
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(plan={"min_request_tokens": 200000}), DRAFTER_CONFIG)
    assert ("leaving 11.2 GiB for the KV cache: a KV pool of 155,166 tokens by SGLang 0.5.14's "
            "accounting") in err.value.problem
    assert "so no request may hold more; below plan.min_request_tokens 200,000" in \
        err.value.problem
    assert "or lower plan.min_request_tokens (now 200,000)" in err.value.fix
    # The default, 32,768, keeps the plan.
    assert make_plan(facts, settings(), DRAFTER_CONFIG).reason("request-tokens").kind == "warning"


@pytest.mark.local
def test_a_full_context_request_that_fits_is_said_with_how_many_fit():
    # 8x B200 at 0.9 (SM100), 0.5.23's accounting: the target's cell plus the drafter's own.
    plan = make_plan(host_facts("b200x8", sglang="0.5.23"), settings(), DRAFTER_CONFIG)
    assert "73,344 bytes per token: the target's cell of 70,272 plus the drafter's 3,072" in \
        plan.reason("kv-cache-room").why
    request = plan.reason("request-tokens")
    assert (request.choice, request.kind) == ("262,144 of 262,144", "info")
    assert re.match(r"one request may hold its full context; \d+ full-context requests fit",
                    request.why)


@pytest.mark.parametrize("key", ["plan.min_kv_gib", "group.min_kv_gib_per_gpu"])
def test_the_gib_floors_are_gone_with_the_key_that_replaced_them(key):
    section, leaf = key.split(".")
    data = {section: {leaf: 4}}
    if section == "group":
        data["group"].update(name="g", members=["a", "b"])
    with pytest.raises(SettingsError) as err:
        settings_from_dict(data)
    assert f"settings key '{key}' is gone: the KV floor is plan.min_request_tokens" in \
        err.value.render()


@pytest.mark.parametrize("release, port, env", [
    ("0.5.11", 55535, None), ("0.5.11", 55536, "45536"), ("0.5.14", 60000, "50000"),
    ("0.5.23", 60000, None),
])
@pytest.mark.local
def test_the_port_rule_plans_sglang_grpc_port_where_the_release_needs_it(release, port, env):
    # 0.5.11-0.5.15 derive the gRPC port as --port + 10000 and refuse it above 65535 unless
    # SGLANG_GRPC_PORT is set (server_args.py); 0.5.16 on only in gRPC mode.
    plan = make_plan(host_facts("b200x8", sglang=release), settings(port=port), DRAFTER_CONFIG)
    assert plan.env.get("SGLANG_GRPC_PORT") == env
    reason = plan.reason("grpc-port")
    assert (reason is None) == (env is None)
    if env is not None:
        assert f"--port + 10000 = {port + 10000} and refuses to start above 65535" in reason.why
    # The user's own value is kept, and said.
    mine = make_plan(host_facts("b200x8", sglang="0.5.11"),
                     settings(port=60000, plan={"extra_env": {"SGLANG_GRPC_PORT": "40000"}}),
                     DRAFTER_CONFIG)
    assert mine.env["SGLANG_GRPC_PORT"] == "40000"
    assert mine.reason("grpc-port").kind == "override"


@pytest.mark.local
def test_sm120_flashinfer_target_choice():
    facts = host_facts("rtx6000x8", sglang="0.5.14")
    plan = make_plan(facts, settings(plan={"sm120_target_backend": "flashinfer"}), DRAFTER_CONFIG)
    assert plan.argv[plan.argv.index("--attention-backend") + 1] == "flashinfer"
    reason = plan.reason("attention-backend")
    assert (reason.kind, reason.why) == (
        "override",
        "plan.sm120_target_backend chose flashinfer (rule: triton)",
    )


@pytest.mark.local
def test_unknown_arch_with_both_backends_given():
    # The real H200 capture with an A100's compute capability (8.0), both backends overridden.
    lines = (NVIDIA / "h200x2" / "query-gpu.csv").read_text().splitlines()
    facts = host_facts("h200x2", sglang="0.5.23")
    facts["facts.gpu.Gpus"] = parse_query_gpu([ln.replace(", 9.0,", ", 8.0,") for ln in lines])
    s = settings(plan={"attention_backend": "triton", "draft_attention_backend": "flashinfer"})
    plan = make_plan(facts, s, DRAFTER_CONFIG, weights_bytes=1)
    argv = plan.argv
    assert argv[argv.index("--attention-backend") + 1] == "triton"
    assert argv[argv.index("--speculative-draft-attention-backend") + 1] == "flashinfer"
    assert "--mem-fraction-static" not in argv


@pytest.mark.local
def test_topology_unknown_disables_custom_all_reduce():
    # h100x8 has no `nvidia-smi topo -m` capture: the stand-in fails that command, as a host whose
    # nvidia-smi cannot print the matrix would, and GpuTopology carries the error. (A small target:
    # Kimi K2.6 does not fit one 8x H100 host.)
    facts = host_facts("h100x8", "h100x8", sglang="0.5.23")
    assert facts["facts.gpu.GpuTopology"]["error"]
    small = settings(target={"repo_id": "Qwen/Qwen3-8B"})
    plan = make_plan(facts, small, DRAFTER_CONFIG, weights_bytes=16 * 1024**3)
    assert "--disable-custom-all-reduce" in plan.argv
    reason = plan.reason("custom-all-reduce")
    assert reason.kind == "assumed" and reason.why.startswith("GPU topology unknown with 8 GPUs")
    del facts["facts.gpu.GpuTopology"]
    assert make_plan(facts, small, DRAFTER_CONFIG, weights_bytes=16 * 1024**3).argv == plan.argv


@pytest.mark.local
def test_a_pinned_revision_is_served_from_its_own_folder():
    """A new pin changes the argv (and so the unit); a followed branch serves `current`."""
    pin = "0123456789abcdef0123456789abcdef01234567"
    s = settings(target={"repo_id": "moonshotai/Kimi-K2.6", "revision": pin})
    plan = make_plan(host_facts("h200x2", sglang="0.5.11"), s, DRAFTER_CONFIG, weights_bytes=1)
    assert plan.argv[plan.argv.index("--model-path") + 1] == f"/srv/models/moonshotai--Kimi-K2.6/{pin}"
    s = settings(target={"repo_id": "moonshotai/Kimi-K2.6", "revision": "main", "follow_branch": True})
    plan = make_plan(host_facts("h200x2", sglang="0.5.11"), s, DRAFTER_CONFIG, weights_bytes=1)
    assert plan.argv[plan.argv.index("--model-path") + 1] == "/srv/models/moonshotai--Kimi-K2.6/current"
