"""The facts over SSH on real fleet hosts: GPU profiles, the probe, real SGLang installs.

One fleet of our own (name ``facts``): hosts with the b200x8, rtx6000x8 and driver-mismatch
nvidia-smi profiles and one with no GPU. The CLI is run the way a user runs it,
``pyinfra INVENTORY fact ... --json`` from the repository root.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import HostSpec

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
SGLANG_VERSIONS = ("0.5.11", "0.5.14", "0.5.23")

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def facts_fleet(make_fleet):
    return make_fleet(
        "facts",
        [
            HostSpec("b200", gpu="b200x8", disk="64G"),
            HostSpec("rtx", gpu="rtx6000x8", disk="593G"),
            HostSpec("broken", gpu="driver-mismatch", disk="8G"),
            HostSpec("cpu", gpu="nogpu", disk="8G"),
        ],
    )


def pyinfra_fact(fleet, fact: str, *args: str, limit: str | None = None) -> dict:
    argv = [PYINFRA, str(fleet.inventory_path), "fact", fact, *args, "--json"]
    if limit:
        argv[2:2] = ["--limit", limit]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    (value,) = data.values()
    return value


def test_gpu_facts_per_profile(facts_fleet):
    gpus = pyinfra_fact(facts_fleet, "facts.gpu.Gpus")
    assert {g["sm"] for g in gpus["b200"]["gpus"]} == {100}
    assert len(gpus["b200"]["gpus"]) == 8 and gpus["b200"]["error"] is None
    assert {g["sm"] for g in gpus["rtx"]["gpus"]} == {120}
    assert {g["memory_mib"] for g in gpus["rtx"]["gpus"]} == {97887}
    assert gpus["broken"]["gpus"] == []
    assert gpus["broken"]["error"].startswith(
        "Failed to initialize NVML: Driver/library version mismatch"
    )
    assert gpus["cpu"] == {"gpus": [], "error": None}

    topo = pyinfra_fact(facts_fleet, "facts.gpu.GpuTopology")
    assert topo["b200"]["nvlink_all_pairs"] is True
    assert topo["rtx"]["nvlink_all_pairs"] is False
    assert topo["rtx"]["links"]["GPU0"]["GPU4"] == "SYS"
    assert "version mismatch" in topo["broken"]["error"]
    assert topo["cpu"]["gpus"] == []


def test_busy_gpu_seen_over_ssh(facts_fleet):
    runtime = "/run/standin-nvidia-smi"
    facts_fleet.run(
        "b200",
        f"mkdir -p {runtime} && echo '3, 4242, 170000, python3' > {runtime}/compute-apps.csv",
        check=True,
    )
    try:
        busy = pyinfra_fact(facts_fleet, "facts.gpu.GpuProcesses", limit="b200")
    finally:
        facts_fleet.run("b200", f"rm -f {runtime}/compute-apps.csv")
    assert busy["b200"] == {"processes": [{"pid": 4242, "used_memory_mib": 170000}], "error": None}


def test_disk_token_ports_over_ssh(facts_fleet):
    disk = pyinfra_fact(facts_fleet, "facts.disk.FreeSpace", "path=/srv/models/moonshotai--Kimi")
    assert disk["rtx"]["measured_path"] == "/srv/models"
    assert disk["rtx"]["mount"] == "/srv/models"
    assert disk["rtx"]["total_bytes"] == 593 * 2**30
    assert disk["cpu"]["total_bytes"] == 8 * 2**30
    token = pyinfra_fact(facts_fleet, "facts.hf.Token", limit="cpu")
    assert token["cpu"] == {"path": "/root/.cache/huggingface/token", "exists": False}
    ports = pyinfra_fact(facts_fleet, "facts.net.ListeningPorts", limit="cpu")
    assert any(p["port"] == 22 and p["process"] == "sshd" for p in ports["cpu"])


def test_sglang_install_on_real_installs(facts_fleet):
    """``pip install --no-deps sglang==V`` from the fleet wheelhouse into a venv per version."""
    pip = " ".join(facts_fleet.pip_args())
    script = " && ".join(
        f"python3 -m venv /opt/sg-{v} && /opt/sg-{v}/bin/pip install -q --no-deps {pip} sglang=={v}"
        for v in SGLANG_VERSIONS
    )
    done = facts_fleet.run("cpu", script, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = {
        "0.5.11": ("v1", ["DFLASH", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NONE"], 17),
        "0.5.14": ("v2", ["DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM",
                          "NONE"], 21),
        "0.5.23": ("v2", ["DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP",
                          "STANDALONE", "NGRAM", "NONE"], 23),
    }  # fmt: skip
    for version, (dflash, algorithms, n_backends) in expected.items():
        python = f"/opt/sg-{version}/bin/python"
        value = pyinfra_fact(
            facts_fleet, "facts.sglang.SGLangInstall", f"python={python}", limit="cpu"
        )["cpu"]
        assert value["version"] == version
        assert value["location"] == f"/opt/sg-{version}/lib/python3.11/site-packages/sglang"
        assert value["features"]["dflash"] == dflash
        assert value["features"]["dflash_pr20547"] is False
        assert value["features"]["kimi_k25_model"] is True
        assert value["speculative_algorithms"] == algorithms
        assert len(value["attention_backends"]) == n_backends
        packages = pyinfra_fact(facts_fleet, "facts.python.Packages", f"python={python}",
                                limit="cpu")["cpu"]  # fmt: skip
        assert packages["sglang"] == version
        assert packages["torch"] is None  # --no-deps
        assert packages["python_version"].startswith("3.11.")
    absent = pyinfra_fact(
        facts_fleet, "facts.sglang.SGLangInstall", "python=/opt/none/bin/python", limit="cpu"
    )
    assert absent["cpu"] is None


def test_probe_one_command_per_host(facts_fleet):
    value = pyinfra_fact(
        facts_fleet,
        "facts.probe.Probe",
        "python=/opt/sg-0.5.11/bin/python",
        "models_path=/srv/models",
    )
    for host in ("b200", "rtx", "broken", "cpu"):
        assert value[host]["errors"] == {}, host
    assert len(value["b200"]["facts"]["facts.gpu.Gpus"]["gpus"]) == 8
    assert value["rtx"]["facts"]["facts.gpu.GpuTopology"]["nvlink_all_pairs"] is False
    assert "mismatch" in value["broken"]["facts"]["facts.gpu.Gpus"]["error"]
    cpu = value["cpu"]["facts"]
    if cpu["facts.sglang.SGLangInstall"] is not None:  # after test_sglang_install_on_real_installs
        assert cpu["facts.sglang.SGLangInstall"]["version"] == "0.5.11"
    assert cpu["facts.disk.FreeSpace"]["total_bytes"] == 8 * 2**30
    # The demo: every host rendered.
    done = subprocess.run(
        [sys.executable, "-m", "facts.probe", str(facts_fleet.inventory_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for host in ("b200:", "rtx:", "broken:", "cpu:"):
        assert host in done.stdout
    assert "8x NVIDIA B200 (sm 10.0, 183359 MiB)" in done.stdout
    assert "8x NVIDIA RTX PRO 6000 Blackwell Server Edition (sm 12.0, 97887 MiB)" in done.stdout


def test_nvidia_smi_replay_answers_as_the_python_standin_does(facts_fleet):
    """The fleet's nvidia-smi replays an answer the Python stand-in gave before to the same
    arguments, byte for byte with its exit status; compute-apps with test-made GPU processes in
    place always goes to the stand-in."""
    fleet = facts_fleet
    direct = "env -u STANDIN_NVIDIA_SMI_REPLAY python3 /usr/local/lib/standin-nvidia-smi/" \
             "standin_nvidia_smi.py"
    for host, argv in (("b200", "--query-gpu=index,name,compute_cap --format=csv,nounits"),
                       ("b200", "topo -m"), ("b200", "-q -x"), ("broken", "-L")):
        want = fleet.run(host, f"{direct} {argv}")
        first, second = (fleet.run(host, f"nvidia-smi {argv}") for _ in range(2))
        for got in (first, second):
            assert (got.stdout, got.stderr, got.returncode) == (
                want.stdout, want.stderr, want.returncode), (host, argv)
    # The second answer came from the replay: change it there and nvidia-smi says so.
    fleet.run("b200", "for f in /run/standin-nvidia-smi/replay/*.out; do "
                      "if grep -q NV18 $f; then echo replayed >> $f; fi; done", check=True)
    assert fleet.run("b200", "nvidia-smi topo -m").stdout.endswith("replayed\n")
    apps = "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
    try:
        assert fleet.run("b200", apps).stdout == ""
        fleet.run("b200", "echo '0, 4242, 1000, python3' > "
                          "/run/standin-nvidia-smi/compute-apps.csv", check=True)
        assert fleet.run("b200", apps).stdout == "4242, 1000\n"
    finally:
        fleet.run("b200", "rm -f /run/standin-nvidia-smi/compute-apps.csv")
    assert fleet.run("b200", apps).stdout == ""
