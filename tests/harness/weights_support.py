"""Helpers for the weights tests: small git model repos, the stand-in hub, olah, pyinfra runs."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PYINFRA = str(VENV_BIN / "pyinfra")
DEPLOY = "tests/deploys/weights_deploy.py"
OLAH_VERSION = "0.5.4"
OLAH_VENV = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet")) / (
    f"olah-{OLAH_VERSION}"
)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def make_repo(mirrors: Path, repo_id: str, files: Mapping[str, bytes]) -> str:
    """A git repo at ``mirrors/models/<repo_id>`` holding ``files``; returns the commit."""
    repo = mirrors / "models" / repo_id
    if not (repo / ".git").exists():
        repo.mkdir(parents=True)
        git(repo, "init", "-q", "-b", "main")
        git(repo, "config", "user.email", "tests@specfleet")
        git(repo, "config", "user.name", "specfleet tests")
    return commit_files(mirrors, repo_id, files)


def commit_files(mirrors: Path, repo_id: str, files: Mapping[str, bytes],
                 message: str = "update") -> str:
    repo = mirrors / "models" / repo_id
    for path, data in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(data)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def blob(repo_mirrors: Path, repo_id: str, rev: str, path: str) -> bytes:
    repo = repo_mirrors / "models" / repo_id
    return subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{path}"], check=True,
                          capture_output=True).stdout


def random_bytes(n: int, seed: str) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest() * 128
        counter += 1
    return bytes(out[:n])


def free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - fleet bridge only
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 within {timeout}s")
        time.sleep(0.3)


def _adopt_by_fleet(ip: str, role: str, pid: int) -> None:
    """A server on a fleet's bridge is that fleet's: its ``down`` stops it (by name, tag, --all,
    or as an orphan), even when the process that started it is gone (``.ci/demo --keep``)."""
    from tests.harness.core import fleet_on_bridge

    fleet = fleet_on_bridge(ip)
    if fleet is not None:
        fleet.adopt(role, pid)


class StandinHub:
    """tests/harness/standin_hub.py as a subprocess on ``ip`` (the fleet bridge)."""

    def __init__(self, mirrors: Path, ip: str, workdir: Path):
        self.mirrors, self.ip, self.workdir = mirrors, ip, workdir
        self.config_path = workdir / "hub-config.json"
        self.log_path = workdir / "hub.log"
        self.port = free_port(ip)
        self.url = f"http://{ip}:{self.port}"
        self.configure()
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "tests" / "harness" / "standin_hub.py"), "--root", str(mirrors),
             "--host", ip, "--port", str(self.port), "--config", str(self.config_path),
             "--log", str(self.log_path)],
            stdout=subprocess.DEVNULL, stderr=open(workdir / "hub.err", "w"),  # noqa: SIM115
        )
        _adopt_by_fleet(ip, "standin-hub", self.proc.pid)

    def configure(self, **cfg) -> None:
        self.epoch = getattr(self, "epoch", 0) + 1
        base = {"lfs": ["*.safetensors"], "epoch": self.epoch}
        self.config_path.write_text(json.dumps({**base, **cfg}))

    def wait(self, repo_id: str) -> None:
        wait_http(f"{self.url}/api/models/{repo_id}/revision/main")

    def log_lines(self) -> list[str]:
        return self.log_path.read_text().splitlines() if self.log_path.exists() else []

    def gets(self, repo_id: str, path: str) -> int:
        """How many GETs of ``path`` in ``repo_id`` the hub served (at any revision)."""
        return sum(1 for line in self.log_lines()
                   if line.startswith(f"GET /{repo_id}/resolve/")
                   and line.split()[1].endswith("/" + path))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def ensure_olah() -> Path:
    """olah 0.5.4 in its own venv (its pins differ from ours); made once, then cached."""
    olah = OLAH_VENV / "bin" / "olah-cli"
    if olah.exists():
        return olah
    subprocess.run([sys.executable, "-m", "venv", str(OLAH_VENV)], check=True)
    subprocess.run([str(OLAH_VENV / "bin" / "pip"), "install", "--quiet",
                    f"olah=={OLAH_VERSION}"], check=True)
    return olah


class Olah:
    """olah, offline, serving git repos from ``mirrors`` on ``ip`` (the fleet bridge)."""

    def __init__(self, mirrors: Path, ip: str, workdir: Path):
        olah = ensure_olah()
        self.port = free_port(ip)
        self.url = f"http://{ip}:{self.port}"
        cache = workdir / "olah-cache"
        cache.mkdir(exist_ok=True)
        conf = workdir / "olah.toml"
        conf.write_text(
            "[basic]\n"
            f'host = "{ip}"\nport = {self.port}\n'
            f'repos-path = "{cache}"\nmirrors-path = ["{mirrors}"]\n'
            # "upstream" is a dead local port: offline mode never asks it.
            'hf-scheme = "http"\nhf-netloc = "127.0.0.1:9"\nhf-lfs-netloc = "127.0.0.1:9"\n'
            "\n[accessibility]\noffline = true\n"
        )
        self.log = open(workdir / "olah.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen([str(olah), "-c", str(conf), "--log-path",
                                      str(workdir / "olah-logs")],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir)
        _adopt_by_fleet(ip, "olah", self.proc.pid)

    def wait(self, repo_id: str) -> None:
        wait_http(f"{self.url}/api/models/{repo_id}/revision/main", timeout=60)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)
        self.log.close()


def settings_data(fleet, endpoint: str, repo_id: str, revision: str | None, **over) -> dict:
    """The ``specfleet`` host data of a weights test."""
    # The stand-in hub (or olah) serves plain http on the fleet's bridge: allowed by name.
    weights = {"hf_endpoint": endpoint, "allow_http_hosts": [urllib.parse.urlsplit(endpoint).hostname],
               "poll_seconds": 0.5, "margin_min_gib": 0.001, "stall_minutes": 1.0,
               **over.pop("weights", {})}
    target = {"repo_id": repo_id, "revision": revision, **over.pop("target", {})}
    return {
        "target": target,
        "weights": weights,
        "sglang": {"find_links": fleet.wheelhouse_url, "trusted_hosts": [fleet.bridge_ip]},
        **over,
    }


def inventory(fleet, path: Path, per_host: Mapping[str, dict]) -> Path:
    return fleet.write_inventory(path, host_data={h: {"specfleet": sf}
                                                  for h, sf in per_host.items()})


def pyinfra(inventory_path: Path, *flags: str, env: Mapping[str, str] | None = None,
            limit: str | None = None, timeout: float = 300,
            deploy: str = DEPLOY) -> subprocess.CompletedProcess:
    """``pyinfra -y INVENTORY tests/deploys/weights_deploy.py`` with a clean HF environment."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e.update(env or {})
    # --dry shows planned changes only with change detection, which -y skips.
    argv = [PYINFRA, *(() if "--dry" in flags else ("-y",)), *flags]
    if limit:
        argv += ["--limit", limit]
    argv += [str(inventory_path), deploy]
    return subprocess.run(argv, cwd=REPO_ROOT, env=e, capture_output=True, text=True,
                          timeout=timeout)


def op_status(out: str, host: str, op: str = "Target weights") -> str:
    """The status pyinfra printed for ``host`` in the operation ``op`` (Success/No changes/...)."""
    section = out.split(f"--> Starting operation: {op}", 1)[-1].split("--> Starting", 1)[0]
    section = section.split("--> Results", 1)[0]
    for line in reversed(section.splitlines()):
        line = line.strip()
        if line.startswith(f"[{host}] ") and any(
            s in line for s in ("Success", "No changes", "Error", "error")
        ):
            return line[len(host) + 3:]
    return ""


@contextmanager
def argv_recorder(fleet, host: str, path: str = "/tmp/argv.log") -> Iterator[str]:
    """Record every process's argv on ``host`` (20 times a second) while the block runs."""
    loop = (f"rm -f {path}; echo $$ > {path}.pid; while :; do for f in /proc/[0-9]*/cmdline; do "
            f"tr '\\0' ' ' < $f 2>/dev/null; echo; done >> {path}; sleep 0.05; done")
    proc = subprocess.Popen(fleet.ssh_argv(host) + ["--", loop], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        yield path
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        fleet.run(host, f"kill $(cat {path}.pid) 2>/dev/null || true")
