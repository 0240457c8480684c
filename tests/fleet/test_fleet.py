"""The test fleet itself: real hosts boot, answer over SSH, carry their profile, take pyinfra."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import (
    Fleet,
    FleetError,
    HostSpec,
    check_target,
    core,
    parse_hosts,
    standin_nvidia_smi,
)
from tests.harness.core import FIXTURES_NVIDIA, NO_GPU, TAG_ENV
from tests.harness.weights_support import StandinHub, make_repo

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted(p.parent.name for p in FIXTURES_NVIDIA.glob("*/commands.json"))
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def size_bytes(size: str) -> int:
    return int(size[:-1]) * UNITS[size[-1]] if size[-1] in UNITS else int(size)


# ----- fast checks, no fleet -------------------------------------------------------------------

def test_parse_hosts_reads_the_cli_spec():
    hosts = parse_hosts("h1:h200x2:disk=64G, h2:nogpu:disk=8G,h3")
    assert hosts == [HostSpec("h1", "h200x2", "64G"), HostSpec("h2", "nogpu", "8G"),
                     HostSpec("h3", "nogpu", "8G")]
    assert parse_hosts("p1:disk=1G:persistent") == [HostSpec("p1", disk="1G", persistent=True)]
    with pytest.raises(FleetError, match="unknown option"):
        parse_hosts("h1:h200x2:ram=4G")


@pytest.mark.parametrize("spec, message", [
    (HostSpec("H1"), "host name"),
    (HostSpec("h1", disk="lots"), "not a size"),
    (HostSpec("h1", gpu="tpu-v9"), "no GPU profile 'tpu-v9'"),
])
def test_bad_host_specs_are_refused(spec, message):
    with pytest.raises(FleetError, match=message):
        spec.check()


@pytest.mark.parametrize("ip", ["10.1.2.200", "127.0.0.1", "10.251.0.5", "8.8.8.8", "ct200"])
def test_guard_refuses_addresses_outside_the_fleet(ip):
    with pytest.raises(FleetError, match="refusing to target"):
        check_target(ip)


def test_guard_refuses_another_fleets_subnet():
    assert check_target("10.250.7.11", "10.250.7.0/24") == "10.250.7.11"
    with pytest.raises(FleetError, match="outside the test fleet"):
        check_target("10.250.8.11", "10.250.7.0/24")


def test_fleet_never_connects_to_a_host_outside_it(tmp_path):
    # A tampered state naming CT200 is refused before ssh is started.
    state = {"name": "x", "idx": 7, "subnet": "10.250.7.0/24", "bridge_ip": "10.250.7.1",
             "bridge": "sfbr7", "hosts": {"ct200": {"ip": "10.1.2.200", "gpu": NO_GPU,
                                                    "disk": "8G", "netns": "n", "veth": "v"}}}
    with pytest.raises(FleetError, match="refusing to target 10.1.2.200"):
        Fleet(state).run("ct200", "true")
    with pytest.raises(FleetError, match="refusing to target 10.1.2.200"):
        Fleet(state).write_inventory(tmp_path / "inv.py")


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_folder_is_complete(profile):
    d = FIXTURES_NVIDIA / profile
    spec = json.loads((d / "commands.json").read_text())
    assert (d / "SOURCE.md").is_file(), "every profile records where its captures came from"
    answers = list(spec.get("commands", [])) + ([spec["any"]] if spec.get("any") else [])
    assert answers, "a profile answers at least one command"
    for entry in answers:
        assert entry.get("kind") in ("verbatim", "derived"), entry
        assert entry.get("source"), entry
        for stream in ("stdout", "stderr"):
            if entry.get(stream):
                assert (d / entry[stream]).is_file(), f"{profile}: missing {entry[stream]}"
    if spec.get("query_gpu"):
        assert (d / spec["query_gpu"]["table"]).is_file()


@pytest.mark.parametrize("profile", [p for p in PROFILES if json.loads(
    (FIXTURES_NVIDIA / p / "commands.json").read_text()).get("query_gpu")])
def test_standin_query_derivation_reproduces_the_verbatim_capture(profile, monkeypatch, capsys):
    """Answering the capture's own query through the derivation path gives the capture back."""
    d = FIXTURES_NVIDIA / profile
    spec = json.loads((d / "commands.json").read_text())
    table = (d / spec["query_gpu"]["table"]).read_text()
    fields = [h.split(" [")[0] for h in next(csv.reader(io.StringIO(table),
                                                        skipinitialspace=True))]
    monkeypatch.setattr(standin_nvidia_smi, "PROFILE_DIR", str(d))
    argv = [f"--query-gpu={','.join(fields)}", "--format=csv"]
    assert standin_nvidia_smi._query_gpu(spec["query_gpu"], standin_nvidia_smi._options(argv),
                                         argv) == 0
    assert capsys.readouterr().out == table


def test_standin_fails_loudly_without_a_capture(monkeypatch, capsys):
    monkeypatch.setattr(standin_nvidia_smi, "PROFILE_DIR", str(FIXTURES_NVIDIA / "h200x2"))
    assert standin_nvidia_smi.main(["--query-gpu=clocks.max.sm", "--format=csv"]) == 97
    assert standin_nvidia_smi.main(["mig", "-lgi"]) == 97
    assert "no capture" in capsys.readouterr().err


# ----- the booted fleet ------------------------------------------------------------------------

def test_every_host_runs_systemd_as_pid1(fleet):
    for host in fleet.hosts:
        r = fleet.run(host, "cat /proc/1/comm; hostname; systemctl is-system-running")
        comm, hostname, state = r.stdout.split()
        assert (comm, hostname) == ("systemd", host)
        assert state in ("running", "degraded"), r.stdout


def test_hosts_are_bookworm_with_the_promised_tools(fleet):
    r = fleet.run("h3", ". /etc/os-release; echo $VERSION_CODENAME; python3 -c 'import sys, venv;"
                        " print(sys.version_info[:2])'; command -v patch rsync git curl sshd")
    lines = r.stdout.split("\n")
    assert lines[0] == "bookworm"
    assert lines[1] == "(3, 11)"
    assert len([x for x in lines[2:] if x]) == 5, r.stdout + r.stderr


def check_standin(fleet: Fleet, spec: HostSpec) -> None:
    """Over SSH, the host's nvidia-smi answers what its profile's captures say."""
    if spec.gpu == NO_GPU:
        r = fleet.run(spec.name, "command -v nvidia-smi")
        assert r.returncode != 0 and r.stdout == "", "a nogpu host has no nvidia-smi"
        return
    d = FIXTURES_NVIDIA / spec.gpu
    cmds = json.loads((d / "commands.json").read_text())
    if cmds.get("any"):  # an error profile answers everything with the same real error
        for argv in ([], ["--query-gpu=index,name", "--format=csv"]):
            r = fleet.run(spec.name, ["nvidia-smi", *argv])
            assert r.returncode == int(cmds["any"]["exit"]), (spec.gpu, r)
            assert r.stdout == (d / cmds["any"]["stdout"]).read_text()
        return
    for entry in cmds["commands"]:
        r = fleet.run(spec.name, ["nvidia-smi", *entry["argv"]])
        assert r.returncode == entry.get("exit", 0), (spec.gpu, entry["argv"], r.stderr)
        if entry.get("stdout"):
            assert r.stdout == (d / entry["stdout"]).read_text(), (spec.gpu, entry["argv"])
    if cmds.get("query_gpu"):
        r = fleet.run(spec.name, "nvidia-smi --query-gpu=index,name,memory.total "
                                 "--format=csv,noheader,nounits")
        assert r.returncode == 0, r.stderr
        real = list(csv.DictReader(io.StringIO((d / cmds["query_gpu"]["table"]).read_text()),
                                   skipinitialspace=True))
        assert r.stdout.splitlines() == [
            f"{g['index']}, {g['name']}, {g['memory.total [MiB]'].removesuffix(' MiB')}"
            for g in real]
    if cmds.get("query_compute_apps") is not False:
        r = fleet.run(spec.name, "nvidia-smi --query-compute-apps=pid,used_memory "
                                 "--format=csv,noheader,nounits")
        assert (r.returncode, r.stdout) == (0, ""), "idle GPUs list no processes"


def test_nvidia_smi_standin_answers_per_profile(fleet):
    for spec in fleet.specs:
        check_standin(fleet, spec)
    h1 = fleet.run("h1", "nvidia-smi --query-gpu=index,name,compute_cap,memory.total,"
                         "driver_version,pci.bus_id --format=csv,nounits")
    assert h1.stdout == (
        "index, name, compute_cap, memory.total [MiB], driver_version, pci.bus_id\n"
        "0, NVIDIA H200, 9.0, 143771, 580.159.04, 00000000:00:06.0\n"
        "1, NVIDIA H200, 9.0, 143771, 580.159.04, 00000000:00:07.0\n"
    )


def test_every_other_profile_boots_and_answers(fleet, make_fleet):
    """One short-lived host per profile the session fleet lacks (error profiles included)."""
    rest = [p for p in PROFILES if p not in {s.gpu for s in fleet.specs}]
    assert rest, "the session fleet covers every profile: this test has nothing to boot"
    other = make_fleet("profiles", [HostSpec(f"p{i}", gpu=p, disk="1G")
                                    for i, p in enumerate(rest, 1)], wheelhouse_needed=False)
    try:
        for spec in other.specs:
            check_standin(other, spec)
    finally:
        other.down()


def test_standin_can_be_told_a_gpu_is_busy(fleet):
    gpu_host = next(s.name for s in fleet.specs if s.gpu == "h200x2")
    cmd = "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
    try:
        r = fleet.run(gpu_host, "mkdir -p /run/standin-nvidia-smi && echo '0, 4242, 70000, "
                                f"python3' > /run/standin-nvidia-smi/compute-apps.csv && {cmd}")
        assert r.stdout == "4242, 70000\n"
    finally:
        fleet.run(gpu_host, "rm -f /run/standin-nvidia-smi/compute-apps.csv")


def test_models_disk_has_the_profile_size(fleet):
    for spec in fleet.specs:
        r = fleet.run(spec.name, "df -B1 --output=fstype,size /srv/models | tail -1")
        fstype, size = r.stdout.split()
        assert fstype == "tmpfs"
        assert int(size) == size_bytes(spec.disk)


def test_hosts_have_no_route_out(fleet):
    for host in fleet.hosts:
        r = fleet.run(host, "ip -4 route show")
        routes = r.stdout.strip().splitlines()
        assert routes == [f"{fleet.subnet} dev eth0 proto kernel scope link src "
                          f"{fleet.hosts[host]}"], routes


def test_pyinfra_runs_an_operation_on_every_host_with_host_data(fleet, tmp_path):
    inventory = fleet.write_inventory(
        tmp_path / "inventory.py",
        host_data={h: {"probe": f"value-{h}"} for h in fleet.hosts},
        group_data={"gpu": {"probe_group": "gpu"}, "nogpu": {"probe_group": "nogpu"}},
    )
    deploy = tmp_path / "deploy.py"
    deploy.write_text(
        "from pyinfra import host\n"
        "from pyinfra.operations import files\n"
        "files.put(name='probe', src=__import__('io').StringIO(\n"
        "    host.data.probe + ' ' + host.data.probe_group + ' ' + ','.join(sorted(host.groups))),"
        "\n    dest='/tmp/specfleet-probe')\n"
    )
    r = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(inventory), str(deploy)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for spec in fleet.specs:
        content = fleet.run(spec.name, "cat /tmp/specfleet-probe").stdout
        probe, group, groups = content.split(" ")
        assert probe == f"value-{spec.name}"
        if spec.gpu == NO_GPU:
            assert (group, groups.split(",")) == ("nogpu", ["inventory", "nogpu"])
        else:
            assert group == "gpu"
            assert set(groups.split(",")) == {"gpu", "inventory", spec.gpu.replace("-", "_")}
    r = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(fleet.inventory_path),
                        "exec", "--", "true"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for host in fleet.hosts:
        assert f"[{host}] Success" in r.stdout + r.stderr


def test_wheelhouse_installs_real_sglang_without_deps(fleet):
    host = "h3"
    r = fleet.run(host, "rm -rf /tmp/v && python3 -m venv /tmp/v && /tmp/v/bin/pip install -q "
                        f"--disable-pip-version-check {' '.join(fleet.pip_args())} --no-deps "
                        "sglang==0.5.11 && /tmp/v/bin/pip show sglang | grep ^Version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Version: 0.5.11"
    r = fleet.run(host, "/tmp/v/bin/python -m sglang.launch_server --help")
    assert r.returncode != 0
    assert "No module named 'numpy'" in r.stderr
    fleet.run(host, "rm -rf /tmp/v")


def test_second_fleet_is_isolated_keeps_a_persistent_disk_and_goes_away(
        fleet, make_fleet, tmp_path, monkeypatch):
    """A second fleet has no route to the first; its ``persistent`` host keeps what it wrote
    (root, /srv/models) across a power cut and a reboot; ``python -m tests.fleet down --tag``
    removes the fleet, its disk's mounts and every server started beside it on its bridge (a
    stand-in hub, as ``.ci/demo --keep`` leaves one), even when the one that started it is gone."""
    tag = f"isolated-{os.getpid()}"
    monkeypatch.setenv(TAG_ENV, tag)
    other = make_fleet("isolated", [HostSpec("a1", disk="16M", persistent=True)],
                       wheelhouse_needed=False)
    assert other.subnet != fleet.subnet
    assert other.wheelhouse_url is None
    r = other.run("a1", f"ip -4 route get {fleet.hosts['h1']}")
    assert r.returncode != 0, "a host of one fleet has no route to another fleet"
    # Persistent disk: written before a power cut, there after the reboot (a new boot id).
    boot = other.run("a1", "cat /proc/sys/kernel/random/boot_id", check=True).stdout
    other.run("a1", "echo kept > /srv/models/shard && mkdir -p /root/venv && echo v > "
              "/root/venv/marker && echo e > /etc/specfleet-kept && sync", check=True)
    assert other.run("a1", "df --output=size -B1M /srv/models | tail -1").stdout.strip() == "16"
    other.reboot("a1", hard=True)
    assert other.run("a1", "cat /proc/sys/kernel/random/boot_id").stdout != boot
    assert other.run("a1", "cat /srv/models/shard /root/venv/marker /etc/specfleet-kept"
                     ).stdout == "kept\nv\ne\n"
    assert other.run("a1", "df --output=size -B1M /srv/models | tail -1").stdout.strip() == "16"
    disk = other.disk_dir("a1")
    assert (disk / "models" / "shard").read_text() == "kept\n"
    netns = other.state["hosts"]["a1"]["netns"]
    bridge = other.state["bridge"]
    make_repo(tmp_path / "mirrors", "t/x", {"config.json": b"{}"})
    hub = StandinHub(tmp_path / "mirrors", other.bridge_ip, tmp_path)
    hub.wait("t/x")
    assert other.run("a1", f"curl -fsS -o /dev/null {hub.url}/api/models/t/x/revision/main"
                     ).returncode == 0
    r = subprocess.run([sys.executable, "-m", "tests.fleet", "down", "--tag", tag], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"fleet {other.name}: down" in r.stdout
    try:  # wait() returns a status or raises: the timeout is the failure
        hub.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the stand-in hub outlived its fleet")
    assert not Path(f"/run/netns/{netns}").exists()
    assert not Path(f"/sys/class/net/{bridge}").exists()
    assert not os.path.ismount(disk / "root") and not os.path.ismount(disk / "models")
    assert not disk.exists()
    with pytest.raises(FleetError, match="no fleet named"):
        Fleet.attach(other.name)


def test_down_stops_only_the_adopted_process_it_recorded(tmp_path, monkeypatch):
    """An adopted process is stopped by ``down``; a pid reused by another process is not."""
    monkeypatch.setattr(core, "STATE_ROOT", tmp_path)
    f = Fleet({"name": "adopt", "hosts": {}, "bridge": "sfbr-none", "bridge_ip": "10.250.0.1"})
    f.dir.mkdir()
    mine = subprocess.Popen(["sleep", "300"])
    other = subprocess.Popen(["sleep", "300"])
    try:
        f.adopt("standin-hub", mine.pid)
        # A record whose pid now names another process (a reused pid): left alone.
        stale = f.adopt("old-hub", other.pid)
        stale.write_text(stale.read_text().replace('"starttime": "', '"starttime": "1'))
        f.down()
        assert mine.wait(timeout=15) == -15
        assert other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()
