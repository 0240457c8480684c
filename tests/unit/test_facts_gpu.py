"""facts.gpu: parsers on real nvidia-smi captures, and the fact commands run against each profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from facts import gpu

ROOT = Path(__file__).resolve().parents[2]
NVIDIA = ROOT / "tests" / "fixtures" / "nvidia"
STANDIN = ROOT / "tests" / "harness" / "standin_nvidia_smi.py"


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


# --- parse_query_gpu ------------------------------------------------------------------------


def test_query_gpu_h200_capture_with_units():
    # The real capture asked for more fields, with units: columns are found by the header.
    value = gpu.parse_query_gpu(lines(NVIDIA / "h200x2" / "query-gpu.csv"))
    assert value["error"] is None
    assert [g["index"] for g in value["gpus"]] == [0, 1]
    assert value["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA H200",
        "compute_capability": "9.0",
        "sm": 90,
        "memory_mib": 143771,
        "driver": "580.159.04",
        "pci_bus_id": "00000000:00:07.0",
    }


def test_query_gpu_nounits_and_rc_marker():
    output = [
        "index, name, compute_cap, memory.total [MiB], driver_version, pci.bus_id",
        "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 97887, 580.65.06, 00000000:01:00.0",
        f"{gpu.RC_MARKER}0",
    ]
    value = gpu.parse_query_gpu(output)
    assert value["error"] is None
    assert value["gpus"][0]["sm"] == 120
    assert value["gpus"][0]["memory_mib"] == 97887


def test_query_gpu_old_driver_keeps_gpus_and_quotes_the_rejection():
    rejection = (NVIDIA / "old-driver" / "compute-cap-invalid.txt").read_text().split("\n")[0]
    output = [
        rejection,
        "index, name, memory.total [MiB], driver_version, pci.bus_id",
        "0, Tesla V100-SXM2-16GB, 16160, 470.182.03, 00000000:1A:00.0",
        f"{gpu.RC_MARKER}0",
    ]
    value = gpu.parse_query_gpu(output)
    assert value["error"] == 'Field "compute_cap" is not a valid field to query.'
    assert value["gpus"][0]["compute_capability"] is None
    assert value["gpus"][0]["sm"] is None
    assert value["gpus"][0]["driver"] == "470.182.03"


@pytest.mark.parametrize(
    ("profile", "needle", "rc"),
    [
        ("driver-mismatch", "Driver/library version mismatch", 18),
        ("no-driver", "couldn't communicate with the NVIDIA driver", 9),
        ("no-devices", "No devices were found", 6),
    ],
)
def test_query_gpu_errors_are_carried(profile, needle, rc):
    output = lines(NVIDIA / profile / "stdout.txt") + [f"{gpu.RC_MARKER}{rc}"]
    value = gpu.parse_query_gpu(output)
    assert value["gpus"] == []
    assert needle in value["error"]
    assert f"exit status {rc}" in value["error"]


# --- parse_topology -------------------------------------------------------------------------


def test_topology_h200_ansi_header():
    raw = (NVIDIA / "h200x2" / "topo-m.txt").read_text()
    assert "\x1b[4m" in raw  # the capture keeps the escape codes
    value = gpu.parse_topology(raw.split("\n"))
    assert value == {
        "gpus": ["GPU0", "GPU1"],
        "links": {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}},
        "nvlink_all_pairs": True,
        "error": None,
    }


def test_topology_b200_all_pairs_nv18():
    value = gpu.parse_topology(lines(NVIDIA / "b200x8" / "topo-m.txt"))
    assert len(value["gpus"]) == 8
    assert value["nvlink_all_pairs"] is True
    assert all(len(row) == 7 and set(row.values()) == {"NV18"} for row in value["links"].values())


def test_topology_rtx6000_pcie_only():
    value = gpu.parse_topology(lines(NVIDIA / "rtx6000x8" / "topo-m.txt"))
    assert value["nvlink_all_pairs"] is False
    assert value["links"]["GPU0"]["GPU3"] == "NODE"
    assert value["links"]["GPU0"]["GPU4"] == "SYS"
    assert value["links"]["GPU7"]["GPU4"] == "NODE"


# GPU rows of https://github.com/vllm-project/vllm/issues/13855 (8 GPUs NV18 + 12 NICs, tabs),
# where this driver printed some columns with no separator ("NIC8NIC9", "NODENODE").
GLUED = [
    "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tNIC2\tNIC3\tNIC4\tNIC5\tNIC6"
    "\tNIC7\tNIC8NIC9\tNIC10\tNIC11\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID",
    *(
        f"GPU{i}\t"
        + "\t".join(" X " if j == i else "NV18" for j in range(8))
        + (
            "\tPXB\tNODE\tNODE\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t0-55,112-167\t0\t\tN/A"
            if i < 4
            else "\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\tNODE\tNODENODE\tNODE\tNODE"
            "\t56-111,168-223\t1\t\tN/A"
        )
        for i in range(8)
    ),
    "NIC0\tPXB\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tNODE\tNODE\tNODE\tNODE",
]

# Space-separated layout as pasted from vLLM's collect_env (B200 in vllm-project/vllm#20862): the
# last NIC header cell runs into "CPU Affinity"; a leading line counts NICs (vllm#8908 style).
SPACED = [
    "140 NICs found in the topology, only displaying 63 in the matrix.",
    "        GPU0    GPU1    GPU2    NIC0    NIC11CPU Affinity     NUMA Affinity   GPU NUMA ID",
    "GPU0     X      NV18    NODE    PIX     SYS  0-27,112-139     0               N/A",
    "GPU1    NV18     X      NV18    NODE    SYS  0-27,112-139     0               N/A",
    "GPU2    NODE    NV18     X      SYS     PIX  28-55,140-167    1               N/A",
]


def test_topology_glued_columns_and_nic_rows():
    value = gpu.parse_topology(GLUED)
    assert value["gpus"] == [f"GPU{i}" for i in range(8)]
    assert "NIC0" not in value["links"]
    assert value["nvlink_all_pairs"] is True


def test_topology_spaced_and_partial_nvlink():
    value = gpu.parse_topology(SPACED)
    assert value["gpus"] == ["GPU0", "GPU1", "GPU2"]
    assert value["links"]["GPU0"] == {"GPU1": "NV18", "GPU2": "NODE"}
    assert value["nvlink_all_pairs"] is False


def test_topology_error_carried():
    output = lines(NVIDIA / "no-driver" / "stdout.txt") + [f"{gpu.RC_MARKER}9"]
    value = gpu.parse_topology(output)
    assert value["gpus"] == [] and value["nvlink_all_pairs"] is False
    assert "couldn't communicate" in value["error"]


# --- parse_compute_apps ---------------------------------------------------------------------


def test_compute_apps():
    assert gpu.parse_compute_apps([f"{gpu.RC_MARKER}0"]) == {"processes": [], "error": None}
    value = gpu.parse_compute_apps(["269473, 96860", "4242, [N/A]", f"{gpu.RC_MARKER}0"])
    assert value == {
        "processes": [
            {"pid": 269473, "used_memory_mib": 96860},
            {"pid": 4242, "used_memory_mib": None},
        ],
        "error": None,
    }
    failed = gpu.parse_compute_apps(["No devices were found", f"{gpu.RC_MARKER}6"])
    assert failed["processes"] == [] and "No devices" in failed["error"]


# --- the fact commands, run by sh against each profile's stand-in -------------------------------


def run_fact(fact, tmp_path: Path, profile: str | None, runtime: Path | None = None):
    """Run ``fact``'s real shell command with the stand-in nvidia-smi (or none) on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    if profile is not None:
        wrapper = bin_dir / "nvidia-smi"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
        wrapper.chmod(0o755)
        env["STANDIN_NVIDIA_SMI_PROFILE"] = str(NVIDIA / profile)
        env["STANDIN_NVIDIA_SMI_RUNTIME"] = str(runtime or tmp_path / "run")
    done = subprocess.run(
        ["sh", "-c", fact.command()], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr  # a fact command never fails the host
    out = done.stdout.splitlines()
    return fact.process(out) if out else fact.default()


EXPECTED = {
    # profile: (gpu count, sm, memory_mib, nvlink_all_pairs or None when not captured)
    "h200x2": (2, 90, 143771, True),
    "b200x8": (8, 100, 183359, True),
    "rtx6000x8": (8, 120, 97887, False),
    "h100x8": (8, 90, 81559, None),
}


@pytest.mark.local
@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_commands_on_gpu_profiles(profile, tmp_path):
    count, sm, memory, nvlink = EXPECTED[profile]
    gpus = run_fact(gpu.Gpus(), tmp_path, profile)
    assert gpus["error"] is None
    assert [g["index"] for g in gpus["gpus"]] == list(range(count))
    assert {g["sm"] for g in gpus["gpus"]} == {sm}
    assert {g["memory_mib"] for g in gpus["gpus"]} == {memory}
    assert all(g["pci_bus_id"] for g in gpus["gpus"])
    topo = run_fact(gpu.GpuTopology(), tmp_path, profile)
    if nvlink is None:
        assert topo["gpus"] == [] and "no capture" in topo["error"]
    else:
        assert topo["error"] is None
        assert len(topo["gpus"]) == count
        assert topo["nvlink_all_pairs"] is nvlink
    assert run_fact(gpu.GpuProcesses(), tmp_path, profile) == {"processes": [], "error": None}
    json.dumps([gpus, topo])


@pytest.mark.local
@pytest.mark.parametrize("profile", ["driver-mismatch", "no-driver", "no-devices"])
def test_commands_on_error_profiles(profile, tmp_path):
    text = (NVIDIA / profile / "stdout.txt").read_text().split("\n")[0]
    for fact in (gpu.Gpus(), gpu.GpuTopology(), gpu.GpuProcesses()):
        value = run_fact(fact, tmp_path, profile)
        assert value["error"].startswith(text)


@pytest.mark.local
def test_command_old_driver_falls_back(tmp_path):
    value = run_fact(gpu.Gpus(), tmp_path, "old-driver")
    assert value["error"] == 'Field "compute_cap" is not a valid field to query.'
    assert [g["name"] for g in value["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert {g["compute_capability"] for g in value["gpus"]} == {None}


@pytest.mark.local
def test_commands_without_nvidia_smi(tmp_path):
    assert run_fact(gpu.Gpus(), tmp_path, None) == {"gpus": [], "error": None}
    assert run_fact(gpu.GpuTopology(), tmp_path, None)["gpus"] == []
    assert run_fact(gpu.GpuProcesses(), tmp_path, None) == {"processes": [], "error": None}


@pytest.mark.local
def test_busy_gpu_processes(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir()
    (runtime / "compute-apps.csv").write_text("0, 4242, 96860, python3\n")
    value = run_fact(gpu.GpuProcesses(), tmp_path, "h200x2", runtime=runtime)
    assert value == {"processes": [{"pid": 4242, "used_memory_mib": 96860}], "error": None}


@pytest.mark.local
def test_pyinfra_cli_fact_on_local_without_gpu():
    """``pyinfra @local fact facts.gpu.Gpus --json`` from the repository root (no GPU here)."""
    pyinfra = Path(sys.executable).with_name("pyinfra")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    done = subprocess.run(
        [str(pyinfra), "@local", "fact", "facts.gpu.Gpus", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    start = done.stdout.index("{")
    value = json.loads(done.stdout[start : done.stdout.rindex("}") + 1])
    assert value == {"facts.gpu.Gpus": {"@local": {"gpus": [], "error": None}}}


# --- the facts as run on a real H200 machine (tests/fixtures/nvidia/h200x2-busy) ---------------

DEVICE = NVIDIA / "h200x2-busy"


def pyinfra_json_values(path: Path) -> dict:
    """``{fact: value}`` from the ``pyinfra ... fact X --json`` outputs saved in ``path``."""
    values = {}
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            for fact, by_host in json.loads(line).items():
                values[fact] = by_host["@local"]
    return values


def raw_fact_outputs() -> dict[str, list[str]]:
    """Each fact command's stdout as captured on the device, keyed by the command."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in (DEVICE / "fact-commands-raw.txt").read_text().split("\n"):
        if line.startswith("### sh -c "):
            current = sections.setdefault(line[len("### sh -c ") :].strip("'"), [])
        elif current is not None:
            current.append(line)
    return {cmd: out[:-1] if out and out[-1] == "" else out for cmd, out in sections.items()}


def test_device_pyinfra_values_match_parsers_on_raw_output():
    printed = pyinfra_json_values(DEVICE / "pyinfra-gpu-facts.txt")
    raw = raw_fact_outputs()
    for fact in (gpu.Gpus(), gpu.GpuTopology(), gpu.GpuProcesses()):
        command = fact.command().replace("\\n", "\\\\n")
        assert fact.process(raw[command]) == printed[fact.name]
    assert printed["facts.gpu.Gpus"]["gpus"][1]["pci_bus_id"] == "00000000:00:07.0"
    assert printed["facts.gpu.GpuTopology"]["nvlink_all_pairs"] is True
    busy = pyinfra_json_values(DEVICE / "pyinfra-gpu-processes-busy.txt")
    assert busy["facts.gpu.GpuProcesses"] == {
        "processes": [{"pid": 719, "used_memory_mib": 10758}],
        "error": None,
    }


@pytest.mark.local
def test_commands_on_device_capture_profile(tmp_path):
    gpus = run_fact(gpu.Gpus(), tmp_path, "h200x2-busy")
    assert [(g["sm"], g["memory_mib"]) for g in gpus["gpus"]] == [(90, 143771)] * 2
    assert run_fact(gpu.GpuTopology(), tmp_path, "h200x2-busy")["nvlink_all_pairs"] is True
    assert run_fact(gpu.GpuProcesses(), tmp_path, "h200x2-busy") == {
        "processes": [{"pid": 719, "used_memory_mib": 10758}],
        "error": None,
    }
