"""Boot, describe and tear down a fleet of real Debian hosts with systemd-nspawn.

Each fleet NAME owns a subnet 10.250.<idx>.0/24, a bridge ``sfbr<idx>`` on 10.250.<idx>.1 and, per
host, a network namespace ``sf<idx>-<host>`` joined to the bridge by a veth pair. A host is
``systemd-nspawn --boot --volatile=overlay`` of the cached rootfs, so every write lands in RAM and
vanishes at shutdown. Everything a fleet needs to be found again (``status``, ``down``, a later
``Fleet.attach``) lives in ``/run/specfleet-fleet/<name>/state.json``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.harness import rootfs, wheelhouse

STATE_ROOT = Path(os.environ.get("SPECFLEET_FLEET_STATE", "/run/specfleet-fleet"))
# Tags every fleet booted under it (``down --tag T`` removes exactly those).
TAG_ENV = "SPECFLEET_FLEET_TAG"


def fleet_tag() -> str:
    return os.environ.get(TAG_ENV, "")
REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES_NVIDIA = REPO_ROOT / "tests" / "fixtures" / "nvidia"
STANDIN_NVIDIA_SMI = REPO_ROOT / "tests" / "harness" / "standin_nvidia_smi.py"
STANDIN_NVIDIA_SMI_REPLAY = REPO_ROOT / "tests" / "harness" / "standin_nvidia_smi_replay.sh"
STANDIN_NVIDIA_SMI_HOST_PATH = "/usr/local/lib/standin-nvidia-smi/standin_nvidia_smi.py"
STANDIN_PROFILE_MOUNT = "/usr/local/share/standin-nvidia-smi"

# Every fleet lives inside this network. Nothing in tests.fleet talks to an address outside it.
FLEET_NETWORK = ipaddress.ip_network("10.250.0.0/16")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
HOST_RE = re.compile(r"^[a-z][a-z0-9-]{0,15}$")
SIZE_RE = re.compile(r"^[0-9]+[KMGT]?$")
NO_GPU = "nogpu"
SSH_OPTS = [
    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
    "-o", "ServerAliveInterval=15",
]
WHEELHOUSE_PORT = 8000


class FleetError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(f"fleet: {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """One host: a name, a GPU profile (a folder of tests/fixtures/nvidia, or ``nogpu``), a
    models-disk size (tmpfs at /srv/models) and pyinfra host data for the generated inventory.

    ``persistent=True``: the host's writes (its root's overlay upper layer, /srv/models, a venv)
    live in a folder on the control machine (``<fleet dir>/disk/<host>``) instead of the
    container's volatile overlay, so ``Fleet.reboot(host)`` keeps them, as a real host's disk.
    /srv/models is then a tmpfs of ``disk`` mounted there by the control machine (a size limit
    that outlives the container)."""

    name: str
    gpu: str = NO_GPU
    disk: str = "8G"
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    persistent: bool = False

    def check(self) -> None:
        if not HOST_RE.match(self.name):
            raise FleetError(f"host name {self.name!r}: use [a-z][a-z0-9-], at most 16 chars")
        if not SIZE_RE.match(self.disk):
            raise FleetError(f"host {self.name}: disk {self.disk!r} is not a size like 64G")
        if self.gpu != NO_GPU and not (FIXTURES_NVIDIA / self.gpu / "commands.json").is_file():
            known = sorted(p.parent.name for p in FIXTURES_NVIDIA.glob("*/commands.json"))
            raise FleetError(
                f"host {self.name}: no GPU profile {self.gpu!r}; known: {known + [NO_GPU]}"
            )


# Preferred second GPU profile of the default fleet, in order, if its captures exist.
SECOND_GPU_PROFILES = ["rtx6000x8", "b200x8", "h100x8"]


def default_specs() -> list[HostSpec]:
    """The default 3-host fleet: h1 h200x2 64G, h2 another GPU profile 593G (CT200's free
    space), h3 nogpu 8G."""
    second = next((p for p in SECOND_GPU_PROFILES
                   if (FIXTURES_NVIDIA / p / "commands.json").is_file()), "h200x2")
    return [
        HostSpec("h1", gpu="h200x2", disk="64G"),
        HostSpec("h2", gpu=second, disk="593G"),
        HostSpec("h3", gpu=NO_GPU, disk="8G"),
    ]


def parse_hosts(spec: str) -> list[HostSpec]:
    """``h1:h200x2:disk=64G,h2:nogpu:disk=8G`` -> [HostSpec, ...]."""
    hosts = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        name, gpu, disk, persistent = parts[0], NO_GPU, "8G", False
        for part in parts[1:]:
            if part.startswith("disk="):
                disk = part[len("disk="):]
            elif part == "persistent":
                persistent = True
            elif "=" in part:
                raise FleetError(f"{item!r}: unknown option {part!r} (only disk=SIZE, persistent)")
            else:
                gpu = part
        hosts.append(HostSpec(name, gpu=gpu, disk=disk, persistent=persistent))
    return hosts


def check_target(ip: str, subnet: str | None = None) -> str:
    """Refuse any address outside the fleet network (and outside ``subnet`` when given)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError as e:
        raise FleetError(f"refusing to target {ip!r}: not an IP address of the test fleet") from e
    if addr not in FLEET_NETWORK or (subnet and addr not in ipaddress.ip_network(subnet)):
        raise FleetError(
            f"refusing to target {ip}: outside the test fleet ({subnet or FLEET_NETWORK})"
        )
    return ip


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, text=True, capture_output=True, **kw)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _idx_candidates(name: str) -> Iterable[int]:
    start = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 250 + 1
    for i in range(250):
        yield (start - 1 + i) % 250 + 1


def _used_indexes(exclude: str) -> set[int]:
    used = set()
    for state in STATE_ROOT.glob("*/state.json"):
        try:
            data = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        if data.get("name") != exclude:
            used.add(int(data["idx"]))
    return used


# systemd in each host takes ~7 inotify instances; the kernel's default of 128 per user (all hosts
# are root) stops the ~18th host with "Failed to allocate manager object: Too many open files".
KERNEL_MINIMUMS = {
    "fs/inotify/max_user_instances": 8192,
    "fs/inotify/max_user_watches": 524288,
}


def _raise_kernel_limits() -> None:
    for key, minimum in KERNEL_MINIMUMS.items():
        path = Path("/proc/sys") / key
        try:
            if int(path.read_text()) < minimum:
                path.write_text(str(minimum))
        except (OSError, ValueError) as e:
            _log(f"could not raise {key} to {minimum} ({e}); many hosts may fail to boot")


def _proc_starttime(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with the
    pid it names one process, never a later one that reused the pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def fleet_on_bridge(ip: str) -> Fleet | None:
    """The fleet whose bridge address is ``ip`` (a stand-in served there belongs to it)."""
    for name in list_fleets():
        try:
            fleet = Fleet.attach(name)
        except (FleetError, ValueError, OSError):
            continue
        if fleet.bridge_ip == ip:
            return fleet
    return None


def _systemd_is_pid1() -> bool:
    return Path("/run/systemd/system").is_dir()


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


class Fleet:
    """A booted fleet. Get one with ``Fleet.up(name, specs)`` or ``Fleet.attach(name)``."""

    def __init__(self, state: dict[str, Any]):
        self.state = state

    # ----- description -------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.state["name"]

    @property
    def dir(self) -> Path:
        return STATE_ROOT / self.name

    @property
    def subnet(self) -> str:
        return self.state["subnet"]

    @property
    def bridge_ip(self) -> str:
        return self.state["bridge_ip"]

    @property
    def key_path(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def inventory_path(self) -> Path:
        return self.dir / "inventory.py"

    @property
    def hosts(self) -> dict[str, str]:
        return {h: d["ip"] for h, d in self.state["hosts"].items()}

    @property
    def specs(self) -> list[HostSpec]:
        return [HostSpec(h, gpu=d["gpu"], disk=d["disk"], data=d.get("data", {}),
                         persistent=bool(d.get("persistent")))
                for h, d in self.state["hosts"].items()]

    @property
    def wheelhouse_url(self) -> str | None:
        wh = self.state.get("wheelhouse")
        return wh["url"] if wh else None

    @property
    def wheelhouse_index_url(self) -> str | None:
        """A PEP 503 simple index of the same wheels (``pip --index-url``)."""
        url = self.wheelhouse_url
        return url + "simple/" if url else None

    def pip_args(self) -> list[str]:
        """The pip arguments that install from the fleet's wheelhouse and nothing else.
        (No pip cache: every byte a host writes is RAM.)"""
        if not self.wheelhouse_url:
            raise FleetError(f"fleet {self.name} was booted without a wheelhouse")
        return ["--no-index", "--find-links", self.wheelhouse_url, "--trusted-host", self.bridge_ip,
                "--no-cache-dir"]

    def ip(self, host: str) -> str:
        try:
            return check_target(self.state["hosts"][host]["ip"], self.subnet)
        except KeyError as e:
            raise FleetError(f"fleet {self.name} has no host {host!r}: {list(self.hosts)}") from e

    # ----- talking to hosts --------------------------------------------------------------
    def ssh_argv(self, host: str) -> list[str]:
        return ["ssh", "-i", str(self.key_path), *SSH_OPTS, f"root@{self.ip(host)}"]

    def run(self, host: str, cmd: str | list[str], check: bool = False, timeout: float = 300,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run a shell command on a host as root over SSH (stdout/stderr captured as text)."""
        if not isinstance(cmd, str):
            cmd = shlex.join(cmd)
        return subprocess.run(self.ssh_argv(host) + ["--", cmd], text=True, capture_output=True,
                              check=check, timeout=timeout, input=input)

    def put(self, host: str, local: str | Path, remote: str) -> None:
        """Copy a local file to a host (scp)."""
        check = subprocess.run(
            ["scp", "-q", "-i", str(self.key_path), *SSH_OPTS, str(local),
             f"root@{self.ip(host)}:{remote}"], capture_output=True, text=True)
        if check.returncode:
            raise FleetError(f"scp to {host}:{remote} failed: {check.stderr.strip()}")

    def write_inventory(self, path: str | Path | None = None,
                        host_data: Mapping[str, Mapping[str, Any]] | None = None,
                        group_data: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
        """Write a pyinfra inventory for this fleet and return its path.

        Groups: ``all``, ``gpu`` (hosts with a GPU profile), ``nogpu`` and one group per GPU profile
        (named like the profile, ``-`` as ``_``). Host data = connection data + the HostSpec's data
        + ``host_data[host]``; ``group_data[group]`` becomes the group's data. Without ``path`` it
        writes the fleet's own ``inventory_path``.
        """
        host_data = host_data or {}
        group_data = dict(group_data or {})
        path = Path(path) if path else self.inventory_path
        unknown = set(host_data) - set(self.hosts)
        if unknown:
            raise FleetError(f"host_data for hosts not in fleet {self.name}: {sorted(unknown)}")
        groups: dict[str, list[str]] = {"gpu": [], NO_GPU: []}
        lines = [
            f"# pyinfra inventory of the specfleet test fleet {self.name!r}, generated by",
            "# tests.fleet: do not edit. Addresses are the fleet's own 10.250.x.y namespaces.",
            "",
            "_connect = " + repr({
                "ssh_user": "root",
                "ssh_key": str(self.key_path),
                "ssh_strict_host_key_checking": "off",
                "ssh_known_hosts_file": "/dev/null",
                "ssh_connect_retries": 2,
            }),
            "",
            "all = (",
            "    [",
        ]
        for spec in self.specs:
            data = {
                "ssh_hostname": self.ip(spec.name),
                "fleet_name": self.name,
                "fleet_gpu_profile": spec.gpu,
                "fleet_disk": spec.disk,
                **spec.data,
                **host_data.get(spec.name, {}),
            }
            lines.append(f"        ({spec.name!r}, {{**_connect, **{data!r}}}),")
            if spec.gpu == NO_GPU:
                groups[NO_GPU].append(spec.name)
            else:
                groups["gpu"].append(spec.name)
                groups.setdefault(spec.gpu.replace("-", "_"), []).append(spec.name)
        lines += ["    ],", f"    {dict(group_data.pop('all', {}))!r},", ")", ""]
        for group, members in groups.items():
            data = group_data.pop(group, None)
            lines.append(f"{group} = ({members!r}, {dict(data)!r})" if data is not None
                         else f"{group} = {members!r}")
        if group_data:
            raise FleetError(f"group_data for groups not in fleet {self.name}: {sorted(group_data)}")
        path.write_text("\n".join(lines) + "\n")
        return path

    # ----- processes beside the hosts ---------------------------------------------------
    @property
    def procs_dir(self) -> Path:
        return self.dir / "procs"

    def adopt(self, role: str, pid: int) -> Path:
        """Record a process serving this fleet from the control machine (a stand-in hub, olah)
        so that ``down`` stops it, whoever started it and whether or not that one is still
        there (``.ci/demo --keep`` exits and leaves its hub serving the kept fleet). One file per
        process beside state.json: starters in other processes never rewrite the state."""
        self.procs_dir.mkdir(exist_ok=True)
        path = self.procs_dir / f"{role}-{pid}.json"
        path.write_text(json.dumps({"role": role, "pid": pid, "starttime": _proc_starttime(pid),
                                    "tag": self.state.get("tag", "")}))
        return path

    def adopted(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.procs_dir.glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def _stop_adopted(self) -> None:
        """SIGTERM, then SIGKILL, each adopted process that is still the one recorded."""
        live = [p for p in self.adopted()
                if _alive(p["pid"]) and _proc_starttime(p["pid"]) == p["starttime"]]
        for p in live:
            try:
                os.kill(p["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        for p in live:
            while _alive(p["pid"]) and time.time() < deadline:
                time.sleep(0.1)
            if _alive(p["pid"]) and _proc_starttime(p["pid"]) == p["starttime"]:
                try:
                    os.kill(p["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # ----- lifecycle ---------------------------------------------------------------------
    @classmethod
    def attach(cls, name: str) -> Fleet:
        """The fleet NAME booted earlier (by this or another process)."""
        state_file = STATE_ROOT / name / "state.json"
        if not state_file.exists():
            raise FleetError(f"no fleet named {name!r} (no {state_file})")
        return cls(json.loads(state_file.read_text()))

    @classmethod
    def up(cls, name: str, specs: Iterable[HostSpec], wheelhouse_needed: bool = True,
           timeout: float = 180, owner_pid: int | None = None) -> Fleet:
        """Boot a fleet (tearing down an older fleet of the same name first).

        With ``owner_pid`` (pytest passes its own), the fleet is reaped by the next ``up`` on this
        machine once that process is gone, even if it died without tearing down.
        """
        specs = list(specs)
        if not NAME_RE.match(name):
            raise FleetError(f"fleet name {name!r}: use [a-z0-9-], at most 31 chars")
        if not specs:
            raise FleetError("a fleet needs at least one host")
        if len({s.name for s in specs}) != len(specs):
            raise FleetError(f"duplicate host names in {[s.name for s in specs]}")
        if len(specs) > 200:
            raise FleetError("at most 200 hosts per fleet")
        for s in specs:
            s.check()
        for tool in ("systemd-nspawn", "ip", "ssh", "ssh-keygen"):
            if shutil.which(tool) is None:
                raise FleetError(f"{tool} is not installed (apt-get install systemd-container "
                                 "iproute2 openssh-client)")
        reap_orphans()
        _raise_kernel_limits()
        root = rootfs.ensure_rootfs()
        wheels = wheelhouse.ensure_wheelhouse() if wheelhouse_needed else None
        with _lock(STATE_ROOT / f".{name}.lock"):
            if (STATE_ROOT / name / "state.json").exists():
                _log(f"tearing down the older fleet {name}")
                cls.attach(name).down()
            fleet = cls._create(name, specs, root, wheels, owner_pid)
        try:
            fleet._wait_ready(timeout)
        except BaseException:
            fleet.down()
            raise
        return fleet

    @classmethod
    def _create(cls, name: str, specs: list[HostSpec], root: Path, wheels: Path | None,
                owner_pid: int | None) -> Fleet:
        with _lock(STATE_ROOT / ".alloc.lock"):
            used = _used_indexes(exclude=name)
            idx = next((i for i in _idx_candidates(name)
                        if i not in used and not _link_exists(f"sfbr{i}")), None)
            if idx is None:
                raise FleetError("no free 10.250.x.0/24 subnet left")
            d = STATE_ROOT / name
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            state: dict[str, Any] = {
                "name": name, "idx": idx, "subnet": f"10.250.{idx}.0/24",
                "bridge": f"sfbr{idx}", "bridge_ip": f"10.250.{idx}.1", "rootfs": str(root),
                "created": time.time(), "tag": fleet_tag(),
                "owner_pid": owner_pid,
                "hosts": {}, "wheelhouse": None,
            }
            for n, s in enumerate(specs, start=1):
                state["hosts"][s.name] = {
                    "ip": f"10.250.{idx}.{10 + n}", "gpu": s.gpu, "disk": s.disk,
                    "data": dict(s.data), "netns": f"sf{idx}-{s.name}", "veth": f"sf{idx}v{n}",
                    "pid": None, "persistent": s.persistent,
                }
            fleet = cls(state)
            fleet._save()  # from here on, down() can clean up whatever exists
        try:
            fleet._boot(root, wheels)
        except BaseException:
            fleet.down()
            raise
        return fleet

    def _save(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=2))
        tmp.rename(self.dir / "state.json")

    def _boot(self, root: Path, wheels: Path | None) -> None:
        d = self.dir
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"specfleet-{self.name}",
              "-f", str(self.key_path)])
        ak = d / "authorized_keys"
        shutil.copy(d / "id_ed25519.pub", ak)
        os.chmod(ak, 0o600)
        br = self.state["bridge"]
        _run(["ip", "link", "add", br, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.bridge_ip}/24", "dev", br])
        _run(["ip", "link", "set", br, "up"])
        if wheels is not None:
            self._start_wheelhouse(wheels)
        for host, h in self.state["hosts"].items():
            ns = h["netns"]
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", h["veth"], "type", "veth", "peer", "name", "eth0",
                  "netns", ns])
            _run(["ip", "link", "set", h["veth"], "master", br, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{h['ip']}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            self._start_host(host)
        self.write_inventory()

    def disk_dir(self, host: str) -> Path:
        """Where a persistent host's writes live on the control machine."""
        return self.dir / "disk" / host

    def _mount_disk(self, host: str) -> None:
        """A persistent host's root: an overlay of the cached rootfs whose upper layer is a
        folder here, and its /srv/models a tmpfs of its disk size, both mounted by the control
        machine (once; a reboot finds them mounted)."""
        h, d = self.state["hosts"][host], self.disk_dir(host)
        for sub in ("upper", "work", "root", "models"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(d / "root"):
            _run(["mount", "-t", "overlay", "overlay", "-o",
                  f"lowerdir={self.state['rootfs']},upperdir={d / 'upper'},workdir={d / 'work'}",
                  str(d / "root")])
        if not os.path.ismount(d / "models"):
            _run(["mount", "-t", "tmpfs", "-o", f"mode=0755,size={h['disk']}", "tmpfs",
                  str(d / "models")])

    def _unmount_disk(self, host: str) -> bool:
        d = self.disk_dir(host)
        ok = True
        for sub in ("models", "root"):
            if os.path.ismount(d / sub):
                r = _run(["umount", str(d / sub)], check=False)
                if r.returncode:
                    r = _run(["umount", "-l", str(d / sub)], check=False)
                ok = ok and not r.returncode
        return ok

    def _start_host(self, host: str) -> None:
        """Start (or start again) a host's systemd-nspawn."""
        h = self.state["hosts"][host]
        ak = self.dir / "authorized_keys"
        root = Path(self.state["rootfs"])
        argv = [
            "systemd-nspawn", "--boot", "--register=no",
            f"--machine=sf{self.state['idx']}-{host}",
            f"--hostname={host}", f"--network-namespace-path=/run/netns/{h['netns']}",
            f"--bind-ro={ak}:/root/.ssh/authorized_keys",
            "--console=read-only",
        ]
        if h.get("persistent"):
            self._mount_disk(host)
            argv += [f"--directory={self.disk_dir(host) / 'root'}",
                     f"--bind={self.disk_dir(host) / 'models'}:/srv/models"]
        else:
            argv += ["--volatile=overlay", f"--directory={root}",
                     f"--tmpfs=/srv/models:mode=0755,size={h['disk']}"]
        if not _systemd_is_pid1():
            # No systemd here to make a scope for each host: nspawn stays in our cgroup.
            # (Where systemd is PID 1, --keep-unit would put every host in one unit, and it
            # is refused from a login session: there nspawn makes its own scope.)
            argv.insert(2, "--keep-unit")
        if h["gpu"] != NO_GPU:
            argv += [
                f"--bind-ro={STANDIN_NVIDIA_SMI_REPLAY}:/usr/local/bin/nvidia-smi",
                f"--bind-ro={STANDIN_NVIDIA_SMI}:{STANDIN_NVIDIA_SMI_HOST_PATH}",
                f"--bind-ro={FIXTURES_NVIDIA / h['gpu']}:{STANDIN_PROFILE_MOUNT}",
            ]
        with open(self.dir / f"{host}.log", "a") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        h["pid"] = proc.pid
        h["booted_at"] = time.time()
        h.pop("ready_s", None)
        self._save()

    def _kill_host_processes(self, host: str) -> None:
        """Whatever still runs in the host's namespace (a hung or power-cut container)."""
        h = self.state["hosts"][host]
        if Path(f"/run/netns/{h['netns']}").exists():
            r = _run(["ip", "netns", "pids", h["netns"]], check=False)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        if _alive(h.get("pid")):
            try:
                os.killpg(h["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass

    def reboot(self, host: str, hard: bool = False, timeout: float = 120) -> None:
        """Reboot a host: a clean shutdown (``hard=False``) or a power cut (``hard=True``: every
        process of the host is SIGKILLed at once), then boot it again and wait until it answers.
        A ``persistent`` host keeps its disk; any other comes back as fresh as it first booted."""
        h = self.state["hosts"][host]
        if hard:
            self._kill_host_processes(host)
        elif _alive(h.get("pid")):
            os.kill(h["pid"], signal.SIGTERM)  # nspawn powers the container off
        deadline = time.time() + 30
        while _alive(h.get("pid")) and time.time() < deadline:
            time.sleep(0.2)
        self._kill_host_processes(host)
        while _alive(h.get("pid")):
            time.sleep(0.1)
        self._start_host(host)
        self._wait_ready(timeout, only=[host])

    def _start_wheelhouse(self, wheels: Path) -> None:
        url = f"http://{self.bridge_ip}:{WHEELHOUSE_PORT}/"
        with open(self.dir / "wheelhouse.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "http.server", str(WHEELHOUSE_PORT), "--bind",
                 self.bridge_ip, "--directory", str(wheels)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.state["wheelhouse"] = {"pid": proc.pid, "url": url, "dir": str(wheels)}
        self._save()

    def _console_tail(self, host: str, chars: int = 1500) -> str:
        try:
            text = (self.dir / f"{host}.log").read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return re.sub(r"\x1b\[[0-9;]*m", "", text)[-chars:]

    def _wait_ready(self, timeout: float, only: list[str] | None = None) -> None:
        """Wait until every host (or those ``only``) accepts SSH and systemd has finished
        booting."""
        deadline = time.time() + timeout
        pending = {h: "not started" for h in (only or self.hosts)}
        while pending:
            for host in sorted(pending):
                h = self.state["hosts"][host]
                if not _alive(h["pid"]):
                    raise FleetError(f"host {host}: systemd-nspawn exited during boot; console:\n"
                                     + self._console_tail(host))
                try:
                    r = self.run(host, "timeout 20 systemctl is-system-running --wait >/dev/null;"
                                       " systemctl is-system-running", timeout=40)
                except subprocess.TimeoutExpired:
                    pending[host] = "ssh command timed out"
                    continue
                state = r.stdout.strip()
                if r.returncode == 255:  # ssh itself failed: not up yet
                    pending[host] = f"ssh: {r.stderr.strip()[-200:]}"
                    continue
                if state in ("initializing", "starting"):
                    pending[host] = f"systemd still {state}"
                    continue
                h["ready_s"] = round(time.time() - h["booted_at"], 2)
                h["systemd_state"] = state
                del pending[host]
            if pending:
                if time.time() > deadline:
                    details = "\n".join(
                        f"--- {host}: {why}; console:\n{self._console_tail(host)}"
                        for host, why in sorted(pending.items()))
                    raise FleetError(f"hosts {sorted(pending)} not ready after {timeout:.0f}s:\n"
                                     + details)
                time.sleep(0.5)
        self._save()
        if self.wheelhouse_url and not only:
            r = subprocess.run(["curl", "-fsS", "-o", "/dev/null", self.wheelhouse_url],
                               capture_output=True, text=True)
            if r.returncode:
                raise FleetError(f"wheelhouse {self.wheelhouse_url} not answering: {r.stderr}")

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "subnet": self.subnet, "bridge_ip": self.bridge_ip,
            "inventory": str(self.inventory_path), "key": str(self.key_path),
            "wheelhouse_url": self.wheelhouse_url, "hosts": {},
        }
        wh = self.state.get("wheelhouse")
        if wh:
            out["wheelhouse_alive"] = _alive(wh["pid"])
        for host, h in self.state["hosts"].items():
            out["hosts"][host] = {
                "ip": h["ip"], "gpu": h["gpu"], "disk": h["disk"], "alive": _alive(h["pid"]),
                "ready_s": h.get("ready_s"), "memory_mib": self.memory_mib(host),
            }
        return out

    def memory_mib(self, host: str) -> float | None:
        """Memory a host's processes use now (sum of PSS; the overlay's tmpfs is not counted)."""
        ns = self.state["hosts"][host]["netns"]
        r = _run(["ip", "netns", "pids", ns], check=False)
        pids = r.stdout.split()
        if not pids:
            return None
        total_kib = 0
        for pid in pids:
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total_kib += int(line.split()[1])
            except OSError:
                pass
        return round(total_kib / 1024, 1)

    def down(self) -> None:
        """Stop every host (clean shutdown, then SIGKILL), remove netns, bridge and state."""
        hosts = self.state["hosts"]
        for h in hosts.values():
            if _alive(h.get("pid")):
                try:
                    os.kill(h["pid"], signal.SIGTERM)  # nspawn powers the container off
                except ProcessLookupError:
                    pass
        deadline = time.time() + 20
        for h in hosts.values():
            while _alive(h.get("pid")) and time.time() < deadline:
                time.sleep(0.2)
        unmounted = True
        for host, h in hosts.items():
            # Whatever still runs in the host's namespace (a hung container) is killed.
            self._kill_host_processes(host)
            if h.get("persistent"):
                deadline = time.time() + 10
                while _alive(h.get("pid")) and time.time() < deadline:
                    time.sleep(0.1)
                unmounted = self._unmount_disk(host) and unmounted
            if Path(f"/run/netns/{h['netns']}").exists():
                _run(["ip", "netns", "del", h["netns"]], check=False)
            if _link_exists(h["veth"]):
                _run(["ip", "link", "del", h["veth"]], check=False)
        self._stop_adopted()
        wh = self.state.get("wheelhouse")
        if wh and _alive(wh["pid"]):
            try:
                os.killpg(wh["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        if _link_exists(self.state["bridge"]):
            _run(["ip", "link", "del", self.state["bridge"]], check=False)
        if unmounted:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            # Never delete through a mount that is still there (the rootfs cache lies below).
            _log(f"fleet {self.name}: a host disk is still mounted under {self.dir}/disk; "
                 "left in place")
            (self.dir / "state.json").unlink(missing_ok=True)


def list_fleets() -> list[str]:
    return sorted(p.parent.name for p in STATE_ROOT.glob("*/state.json"))


def reap_orphans() -> list[str]:
    """Tear down fleets whose owner process (a pytest run) has died without tearing them down."""
    reaped = []
    for name in list_fleets():
        try:
            fleet = Fleet.attach(name)
        except (FleetError, ValueError, OSError):
            continue
        owner = fleet.state.get("owner_pid")
        if owner and not _alive(owner):
            with _lock(STATE_ROOT / f".{name}.lock"):
                if (STATE_ROOT / name / "state.json").exists():
                    _log(f"reaping fleet {name}: its owner process {owner} is gone")
                    Fleet.attach(name).down()
                    reaped.append(name)
    return reaped
