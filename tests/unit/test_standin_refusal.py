"""The stand-in server refuses what the installed SGLang would, decided from the tree.

A real 0.5.11 tree (the PyPI wheel's ``sglang`` package, unpacked), the nvidia-smi stand-in
replaying a real capture, model folders whose safetensors have Kimi K2.6's size (sparse files),
and the stand-in started with a plan's flags as the unit starts it. Nothing tells the stand-in the
verdict: its own ``sglang_refusal`` runs the tree's parser and rules (tests/harness/sglang_rules.py
beside it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specfleet.core.plan import KIMI_K26_WEIGHTS_BYTES, make_plan
from specfleet.core.settings import settings_from_dict
from tests.harness.sources import sglang_wheel
from tests.unit.test_plan import DRAFTER_CONFIG, NVIDIA, host_facts

HARNESS = Path(__file__).parents[1] / "harness"
STANDIN_NVIDIA_SMI = HARNESS / "standin_nvidia_smi.py"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A host's files: the stand-in and its rules beside it, a 0.5.11 tree, the model folders."""
    return _host(tmp_path_factory, "0.5.11")


@pytest.fixture(scope="module")
def host_0_5_23(tmp_path_factory):
    """The same host with a 0.5.23 tree (its ServerArgs a msgspec record, its rules in
    arg_groups/*_hook.py)."""
    return _host(tmp_path_factory, "0.5.23")


def _host(tmp_path_factory, release: str) -> Path:
    root = tmp_path_factory.mktemp(f"standin-host-{release}")
    for name in ("standin_sglang_server.py", "sglang_rules.py", "releases.py"):
        shutil.copy(HARNESS / name, root / name)
    site = root / "site-packages"
    with zipfile.ZipFile(sglang_wheel(release)) as z:
        z.extractall(site, [n for n in z.namelist() if n.startswith("sglang/") and n.endswith(".py")])
    target, drafter = root / "target", root / "drafter"
    target.mkdir()
    drafter.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512}}))
    (drafter / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"],
                                                     "block_size": 8}))
    # Sparse files of Kimi K2.6's size: the weights the model load would put on the GPUs.
    with open(target / "model-00001-of-00001.safetensors", "wb") as f:
        f.truncate(KIMI_K26_WEIGHTS_BYTES)
    bindir = root / "bin"
    bindir.mkdir()
    shim = bindir / "nvidia-smi"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN_NVIDIA_SMI}" "$@"\n')
    shim.chmod(0o755)
    return root


def start(host: Path, profile: str, flags: list[str],
          python: tuple[str, ...] = (sys.executable,)) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{host / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(host / "site-packages"),
        "STANDIN_NVIDIA_SMI_PROFILE": str(NVIDIA / profile),
        "STANDIN_NVIDIA_SMI_RUNTIME": str(host / f"runtime-{profile}"),
    }
    record = host / "standin.json"
    record.unlink(missing_ok=True)
    argv = [*python, str(host / "standin_sglang_server.py"), "--standin-record", str(record),
            "--standin-exit", "0", *flags]  # fmt: skip
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def judged(host: Path) -> dict:
    """What the last start recorded of SGLang's rules (its --standin-record)."""
    return json.loads((host / "standin.json").read_text())["sglang_rules"]


def assert_accepted(rules: dict, under: str) -> None:
    """A stand-in's start reads as SGLang accepting the plan only where the rules of a tree under
    ``under`` ran on its flags and refused nothing: "no rules ran" must not read as "it starts".
    ``rules`` is the record's ``sglang_rules`` (tests/harness/standin_sglang_server.py)."""
    assert rules["ran"] is True, f"SGLang's rules did not run: {rules['why_not']} ({rules})"
    assert rules["refusal"] is None, rules
    assert (rules["tree"] or "").startswith(under.rstrip("/") + "/"), (under, rules)


def plan_flags(host: Path, profile: str, topo: str, release: str = "0.5.11") -> list[str]:
    """The plan's flags; its weights check is left out (weights_bytes=1): the stand-in decides."""
    s = settings_from_dict({"sglang": {"version": release}})
    facts = host_facts(profile, topo, sglang=release)
    argv = make_plan(facts, s, DRAFTER_CONFIG, weights_bytes=1).argv[3:]
    argv[argv.index("--model-path") + 1] = str(host / "target")
    argv[argv.index("--speculative-draft-model-path") + 1] = str(host / "drafter")
    return argv


@pytest.mark.local
def test_one_h100_host_stops_with_not_enough_memory(host):
    # The flags the planner refuses for Kimi K2.6 (it plans them for a small model).
    flags = plan_flags(host, "h100x8", "b200x8")
    out = start(host, "h100x8", flags)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Not enough memory. Please try to increase --mem-fraction-static. Current value: " \
           "mem_fraction_static=0.69" in out.stderr


@pytest.mark.local
def test_b200_host_starts(host):
    out = start(host, "b200x8", plan_flags(host, "b200x8", "b200x8"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "exiting with status 0 as asked" in out.stdout
    assert_accepted(judged(host), str(host / "site-packages"))


@pytest.mark.local
def test_a_flag_the_tree_lacks_is_refused_by_its_parser(host):
    flags = plan_flags(host, "b200x8", "b200x8")
    flags = [f.replace("--speculative-dflash-draft-window-size", "--speculative-draft-window-size")
             for f in flags]
    out = start(host, "b200x8", flags)
    assert out.returncode == 2
    assert "error: unrecognized arguments: --speculative-draft-window-size 4096" in out.stderr


@pytest.mark.local
def test_0_5_23_one_h100_host_stops_with_not_enough_memory(host_0_5_23):
    """On a 0.5.23 tree the fraction is memory_hook.py's, run from the installed files."""
    out = start(host_0_5_23, "h100x8", plan_flags(host_0_5_23, "h100x8", "b200x8", "0.5.23"))
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Not enough memory. Please try to increase --mem-fraction-static. Current value: " \
           "mem_fraction_static=0.72" in out.stderr


@pytest.mark.local
def test_0_5_23_b200_host_starts(host_0_5_23):
    out = start(host_0_5_23, "b200x8", plan_flags(host_0_5_23, "b200x8", "b200x8", "0.5.23"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rules not run" not in out.stderr
    assert "exiting with status 0 as asked" in out.stdout
    assert_accepted(judged(host_0_5_23), str(host_0_5_23 / "site-packages"))


@pytest.mark.local
def test_0_5_23_without_msgspec_is_no_verdict(host_0_5_23):
    """A fleet host's --no-deps install has no msgspec: 0.5.23's rules cannot run there. The
    stand-in then starts, as it does with no tree, but says so (stderr and the record), and a test
    that expects a verdict fails on it instead of reading the start as "SGLang accepts it"."""
    short = plan_flags(host_0_5_23, "b200x8", "b200x8", "0.5.23")
    short[short.index("--speculative-draft-window-size") + 1] = "4"  # refused where judged
    # -S: no site-packages, so the unit venv's msgspec is not importable (PYTHONPATH still is).
    out = start(host_0_5_23, "b200x8", short, python=(sys.executable, "-S"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "standin: SGLang's rules not run on " in out.stderr
    rules = judged(host_0_5_23)
    assert rules["ran"] is False and rules["refusal"] is None
    assert "No module named 'msgspec'" in rules["why_not"], rules
    with pytest.raises(AssertionError, match="SGLang's rules did not run: .*msgspec"):
        assert_accepted(rules, str(host_0_5_23 / "site-packages"))


@pytest.mark.local
def test_0_5_23_refuses_the_old_window_flag_and_a_short_window(host_0_5_23):
    flags = plan_flags(host_0_5_23, "b200x8", "b200x8", "0.5.23")
    old = [f.replace("--speculative-draft-window-size", "--speculative-dflash-draft-window-size")
           for f in flags]
    out = start(host_0_5_23, "b200x8", old)
    assert out.returncode == 2
    assert "error: unrecognized arguments: --speculative-dflash-draft-window-size 4096" in out.stderr
    short = list(flags)
    short[short.index("--speculative-draft-window-size") + 1] = "4"
    out = start(host_0_5_23, "b200x8", short)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "--speculative-draft-window-size must be >= --speculative-num-draft-tokens" in out.stderr
