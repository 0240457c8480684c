"""``specfleet plan --profile NAME``: the machine profiles (specfleet/profiles/*.json) are what
specfleet's own facts make of the real nvidia-smi captures of tests/fixtures/nvidia/ (each
fact's real command run against the nvidia-smi stand-in replaying the capture, then its parser:
``tests.unit.test_plan._fact_json``), and the plans a user previews from them are right.

    python -m tests.unit.test_plan_profiles --write     (rewrites specfleet/profiles/*.json)
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet import profiles
from tests.unit.test_plan import gpus_fact, topology_fact

# They start processes (pyinfra, specfleet, the stand-in hub): the full suite, not the fast lane.
pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "specfleet" / "profiles"
GPUS, TOPOLOGY = "facts.gpu.Gpus", "facts.gpu.GpuTopology"


def _widened(gpus: dict, count: int) -> dict:
    """A Gpus fact of ``count`` GPUs of the capture's one kind: its first GPU as the parser read
    it, repeated with indices 0..count-1 and bus ids counted up from its own."""
    first = gpus["gpus"][0]
    domain, bus = first["pci_bus_id"].rsplit(":", 2)[0], int(first["pci_bus_id"].split(":")[-2], 16)
    out = copy.deepcopy(gpus)
    out["gpus"] = [{**first, "index": i, "pci_bus_id": f"{domain}:{bus + i:02X}.0"}
                   for i in range(count)]
    return out


def build() -> dict[str, dict]:
    """Every profile, from the captures."""
    b200_topo = topology_fact("b200x8")
    nvswitch = ("b200x8's `nvidia-smi topo -m` (an HGX board: every pair of the 8 GPUs on NVLink "
                "through NVSwitch)")
    return {
        "rtx6000x8": {"machine": "8x NVIDIA RTX PRO 6000 Blackwell (SM120), PCIe",
                      "source": "tests/fixtures/nvidia/rtx6000x8: both facts captured",
                      "facts": {GPUS: gpus_fact("rtx6000x8"),
                                TOPOLOGY: topology_fact("rtx6000x8")}},
        "b200x8": {"machine": "8x NVIDIA B200 (SM100), HGX NVSwitch",
                   "source": "tests/fixtures/nvidia/b200x8: both facts captured",
                   "facts": {GPUS: gpus_fact("b200x8"), TOPOLOGY: b200_topo}},
        "h200x2": {"machine": "2x NVIDIA H200 (SM90), NVLink",
                   "source": "tests/fixtures/nvidia/h200x2: both facts captured",
                   "facts": {GPUS: gpus_fact("h200x2"), TOPOLOGY: topology_fact("h200x2")}},
        "h100x8": {"machine": "8x NVIDIA H100 80GB HBM3 (SM90), HGX NVSwitch",
                   "source": "GPUs: tests/fixtures/nvidia/h100x8 (captured); topology: derived, "
                             f"{nvswitch}: the h100x8 capture has no topology",
                   "facts": {GPUS: gpus_fact("h100x8"), TOPOLOGY: b200_topo}},
        "h200x8": {"machine": "8x NVIDIA H200 (SM90), HGX NVSwitch",
                   "source": "GPUs: derived, the h200x2 capture's GPU as its parser read it, "
                             "8 of them; topology: derived, " + nvswitch,
                   "facts": {GPUS: _widened(gpus_fact("h200x2"), 8), TOPOLOGY: b200_topo}},
    }


def write() -> None:
    OUT.mkdir(exist_ok=True)
    for name, profile in build().items():
        (OUT / f"{name}.json").write_text(json.dumps({"profile": name, **profile}, indent=1,
                                                     sort_keys=True) + "\n")


def test_the_shipped_profiles_are_what_the_facts_make_of_the_captures():
    built = build()
    assert profiles.names() == sorted(built)
    for name, profile in built.items():
        assert profiles.load(name) == {"profile": name, **profile}, (
            f"{name}: run python -m tests.unit.test_plan_profiles --write")


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specfleet.cli", "plan", *args],
                          capture_output=True, text=True, timeout=120, cwd="/")


@pytest.mark.parametrize("name,expect", [
    ("h200x8", "custom-all-reduce       SGLang default: NVLink between all pairs"),
    ("b200x8", "custom-all-reduce       SGLang default: NVLink between all pairs"),
    ("rtx6000x8", "custom-all-reduce       disabled: PCIe-only"),
])
def test_a_profile_is_planned_as_if_sglang_were_installed(name, expect):
    res = plan("--profile", name)
    assert res.returncode == 0, res.stdout + res.stderr
    assert expect in res.stdout and "profile" in res.stdout
    assert profiles.load(name)["source"].split(":")[0] in res.stdout


def test_an_8x_h100_is_refused_for_kimi_with_the_numbers():
    res = plan("--profile", "h100x8")
    assert res.returncode == 2 and "as one (settings 'group'" in res.stdout + res.stderr


def test_list_and_an_unknown_profile():
    res = plan("--list-profiles")
    assert res.returncode == 0 and "h200x8" in res.stdout and "B200" in res.stdout
    res = plan("--profile", "h300x8")
    assert res.returncode == 2 and "name one of: b200x8, h100x8" in res.stdout + res.stderr


def test_a_facts_file_without_a_topology_field_says_which_never_assumes_pcie(tmp_path):
    """The silent PCIe plan: a hand-written 8x H200 facts file whose GpuTopology lacks
    nvlink_all_pairs was planned with --disable-custom-all-reduce, unsaid."""
    facts = copy.deepcopy(profiles.load("h200x8")["facts"])
    del facts[TOPOLOGY]["nvlink_all_pairs"]
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts))
    res = plan("--facts", str(path), "--predicted")
    assert res.returncode == 2, res.stdout
    assert "facts.gpu.GpuTopology.nvlink_all_pairs" in res.stderr and "missing" in res.stderr
    del facts[TOPOLOGY]
    path.write_text(json.dumps(facts))
    res = plan("--facts", str(path), "--predicted")
    assert res.returncode == 2 and "facts.gpu.GpuTopology" in res.stderr, res.stderr


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
