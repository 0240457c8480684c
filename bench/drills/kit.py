"""The fault drills' kit: the fleet environment (``Env``), a controller run (``Run``), the
checks and the constants every drill shares. ``run.py`` (the suite), ``hostile.py`` and
``broken_verify.py`` (drills of their own files) import it; it imports none of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from specfleet.core.settings import deep_merge
from tests.harness import Fleet
from tests.harness.weights_support import StandinHub, blob, make_repo, random_bytes

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
DEPLOY = "tests/deploys/rollout_deploy.py"
SERVICE = "sf-drill"
PORT = 30100
STANDIN = "/opt/specfleet-standin/standin_sglang_server.py"
RECORD = f"/run/standin/{SERVICE}.json"
VENV = "/opt/specfleet/sglang"
KEPT = f"/var/lib/specfleet/rollback/{SERVICE}"
TOKEN = "hf_drillTokenNeverPrinted0123456789abcdef"
API_KEY = "sk-drill-api-key-never-printed-42"
SECRETS = {"hf token": TOKEN, "api key": API_KEY}
DRAFTER = "drills/drafter"
MB = 1_000_000
ARGV_LOG = "/var/tmp/drill-argv.log"
# Records every distinct command line on a host, 10 times a second (it reads no secret itself).
ARGV_RECORDER = r"""
import glob, time
seen = set()
with open('@LOG@', 'a') as out:
    while True:
        for f in glob.glob('/proc/[0-9]*/cmdline'):
            try:
                line = open(f, 'rb').read().replace(b'\0', b' ').decode('utf-8', 'replace')
            except OSError:
                continue
            if line and line not in seen:
                seen.add(line)
                out.write(line + '\n')
        out.flush()
        time.sleep(0.1)
""".replace("@LOG@", ARGV_LOG)


class DrillFailed(Exception):
    pass


class ExpectedFailure(Exception):
    """A known defect that an open issue fixes: recorded, not counted as survived."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise DrillFailed(what)


@dataclasses.dataclass
class Drill:
    name: str
    fault: str
    where: str
    checked: str
    run: Callable[[Env, Drill], None]
    fails_on: str  # the earlier code it fails on
    known_issue: str | None = None
    detail: str = ""  # what the drill saw, for its row


@dataclasses.dataclass
class Row:
    drill: Drill
    result: str
    seconds: float
    lost: int = 0
    tracebacks: int = 0


class Env:
    def __init__(self, fleet: Fleet, work: Path):
        self.fleet, self.work = fleet, work
        self.mirrors = work / "mirrors"
        self.outputs: list[str] = []
        self.n = 0
        self.revs: dict[str, str] = {}
        self.revs[DRAFTER] = make_repo(self.mirrors, DRAFTER, {"config.json": json.dumps(
            {"architectures": ["DFlashDraftModel"], "block_size": 8,
             "mask_token_id": 163838}).encode()})
        self.hub = StandinHub(self.mirrors, fleet.bridge_ip, work)
        self.hub.configure(gated={DRAFTER: [hashlib.sha256(TOKEN.encode()).hexdigest()]})
        self.hub.wait(DRAFTER)
        self.token_file = work / "hf-token"
        self.token_file.write_text(TOKEN)
        self.token_file.chmod(0o600)
        self.corrupt_sends: Counter = Counter()
        self.nonce = f"{os.getpid()}-{time.time()}"

    # ----- the model repositories ------------------------------------------------------------
    def repo(self, name: str, shards: int = 4, size: int = MB,
             sizes: list[int] | None = None) -> str:
        repo_id = f"drills/{name}"
        sizes = sizes or [size] * shards
        # Bytes of this run only: a host never has them from an earlier run (no hard link).
        files = {f"model-{i:05d}-of-{len(sizes):05d}.safetensors": random_bytes(
            n, f"{name}{i}-{self.nonce}")
                 for i, n in enumerate(sizes, start=1)}
        files["config.json"] = json.dumps({"model_type": "test", "name": name}).encode()
        self.revs[repo_id] = make_repo(self.mirrors, repo_id, files)
        return repo_id

    def hub_config(self, **cfg) -> None:
        self.hub.configure(gated={DRAFTER: [hashlib.sha256(TOKEN.encode()).hexdigest()]}, **cfg)

    # ----- settings and runs ------------------------------------------------------------------
    def settings(self, repo_id: str, **over) -> dict:
        data = {
            "target": {"repo_id": repo_id, "revision": self.revs[repo_id]},
            "drafter": {"repo_id": DRAFTER, "revision": self.revs[DRAFTER], "gated": True},
            "weights": {"hf_endpoint": self.hub.url, "poll_seconds": 0.3,
                        "margin_min_gib": 0.001, "stall_minutes": 0.25,
                        "token_file": str(self.token_file),
                        "allow_http_hosts": [urllib.parse.urlsplit(self.hub.url).hostname]},
            "sglang": {"version": "0.5.11", "find_links": self.fleet.wheelhouse_url,
                       "trusted_hosts": [self.fleet.bridge_ip], "no_deps": True},
            "service_name": SERVICE, "port": PORT, "api_key": API_KEY,
            "readiness_timeout_s": 60,
            "launcher": ["/usr/bin/python3", STANDIN, "--standin-record", RECORD],
        }
        return deep_merge(data, over)

    def inventory(self, per_host: dict[str, dict], path: Path | None = None) -> Path:
        self.n += 1
        return self.fleet.write_inventory(
            path or self.work / f"inventory{self.n}.py",
            host_data={h: {"specfleet": sf} for h, sf in per_host.items()})

    def run_env(self) -> dict[str, str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        e["SPECFLEET_ALLOW_TEST_SETTINGS"] = "1"
        return e

    def argv(self, inv: Path, hosts: list[str], deploy: str = DEPLOY) -> list[str]:
        limits = [arg for h in hosts for arg in ("--limit", h)]
        return [PYINFRA, "-y", "-vvv", *limits, str(inv), deploy]

    def pyinfra(self, inv: Path, hosts: list[str], timeout: float = 600) -> Run:
        p = Run(self, self.argv(inv, hosts))
        p.wait(timeout)
        return p

    def start(self, inv: Path, hosts: list[str]) -> Run:
        return Run(self, self.argv(inv, hosts))

    def deploy(self, host: str, repo_id: str, **over) -> Run:
        return self.pyinfra(self.inventory({host: self.settings(repo_id, **over)}), [host])

    # ----- evidence ---------------------------------------------------------------------------
    def sh(self, host: str, cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.fleet.run(host, cmd, timeout=timeout)

    def start_recorders(self, hosts: list[str]) -> None:
        for h in hosts:
            self.sh(h, "systemctl stop drill-argv 2>/dev/null; systemd-run --quiet "
                       f"--unit=drill-argv /usr/bin/python3 -c {shq(ARGV_RECORDER)}")

    def record_mismatches(self, host: str) -> list[str]:
        """Files of the installed SGLang wheel that differ from its RECORD (or are missing)."""
        script = r"""
import base64, csv, glob, hashlib, os, sys
site = glob.glob('@VENV@/lib/python3*/site-packages')[0]
rec = glob.glob(site + '/sglang-*.dist-info/RECORD')[0]
bad = []
for row in csv.reader(open(rec)):
    if len(row) < 2 or not row[1]:
        continue
    path = os.path.normpath(os.path.join(site, row[0]))
    algo, want = row[1].split('=', 1)
    try:
        got = base64.urlsafe_b64encode(hashlib.new(algo, open(path, 'rb').read()).digest())
    except OSError:
        bad.append('missing ' + row[0]); continue
    if got.rstrip(b'=').decode() != want:
        bad.append('changed ' + row[0])
print('\n'.join(bad))
""".replace("@VENV@", VENV)
        r = self.sh(host, f"/usr/bin/python3 -c {shq(script)}")
        if r.returncode:
            return [f"RECORD unreadable on {host}: {r.stderr.strip()[-200:]}"]
        return [line for line in r.stdout.splitlines() if line.strip()]

    def weights_mismatches(self, host: str, repo_id: str) -> list[str]:
        rev = self.revs[repo_id]
        folder = f"/srv/models/{repo_id.replace('/', '--')}/{rev}"
        r = self.sh(host, f"cd {folder} && find . -type f -not -path './.*' -exec sha256sum {{}} +")
        got = {line.split()[1][2:]: line.split()[0] for line in r.stdout.splitlines()}
        repo_dir = self.mirrors / "models" / repo_id
        paths = subprocess.run(["git", "-C", str(repo_dir), "ls-tree", "-r", "--name-only", rev],
                               capture_output=True, text=True, check=True).stdout.split()
        bad = []
        for p in paths:
            want = hashlib.sha256(blob(self.mirrors, repo_id, rev, p)).hexdigest()
            if got.get(p) != want:
                bad.append(f"{host}:{repo_id}/{p} {'missing' if p not in got else 'differs'}")
        return bad

    def hub_lines(self, since: int = 0) -> list[str]:
        return self.hub.log_lines()[since:]

    def refetched(self) -> list[str]:
        """Files sent whole to one host more than once (less the corrupted sends)."""
        full: Counter = Counter()
        for line in self.hub.log_lines():
            parts = line.split()
            if parts and parts[0] == "SENT" and parts[-1] == "full":
                full[(parts[5], parts[1], parts[2], parts[3])] += 1
        return [f"{k[0]} {k[1]}@{k[2][:8]}/{k[3]} x{n}" for k, n in full.items()
                if n - self.corrupt_sends[(k[0], k[1], k[3])] > 1]

    def leaks(self, hosts: list[str]) -> list[str]:
        found = []
        for h in hosts:
            sources = {
                "journal": "journalctl --no-pager -o short-iso 2>/dev/null",
                "a command line": f"cat {ARGV_LOG} 2>/dev/null",
            }
            for where, cmd in sources.items():
                text = self.sh(h, cmd).stdout
                for what, secret in SECRETS.items():
                    hits = [ln for ln in text.splitlines() if secret in ln]
                    if hits:
                        # Where it was, with the secret itself blanked out (this output is kept).
                        shown = hits[0].replace(secret, "<" + what + ">")[:300]
                        found.append(f"{what} in {h}'s {where} ({len(hits)} lines): {shown}")
        for what, secret in SECRETS.items():
            n = sum(out.count(secret) for out in self.outputs)
            if n:
                found.append(f"{what} in controller output ({n}x)")
        return found

    def healthy(self, host: str) -> bool:
        # The key from stdin into a header file: never on a command line (the leak count reads
        # every command line on the host).
        r = self.fleet.run(host, "umask 077; cat > /root/.drill-auth; systemctl is-active "
                           f"{SERVICE}.service && curl -sf -o /dev/null -H @/root/.drill-auth "
                           f"http://127.0.0.1:{PORT}/health_generate && echo HEALTHY",
                           input=f"Authorization: Bearer {API_KEY}\n")
        return "HEALTHY" in r.stdout

    def converged(self, host: str, repo_id: str) -> None:
        """The host serves ``repo_id``: healthy, weights as the hub has them, SGLang as its
        wheel's RECORD says."""
        check(self.healthy(host), f"{host}: the server is not healthy")
        bad = self.weights_mismatches(host, repo_id) + self.weights_mismatches(host, DRAFTER)
        check(not bad, f"weights differ from the hub: {bad}")
        rec = self.record_mismatches(host)
        check(not rec, f"{host}: SGLang differs from its RECORD: {rec[:5]}")
        served = self.sh(host, f"cat {RECORD}").stdout
        check(self.revs[repo_id] in served, f"{host}: the server does not serve {repo_id}")


def shq(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


class Run:
    """A controller process whose output is read as it comes (to act mid-run)."""

    def __init__(self, env: Env, argv: list[str], cwd: Path = REPO, ssh_host: str | None = None):
        self.env, self.lines = env, []
        self.started = time.monotonic()
        self.timed_out = False
        if ssh_host:
            argv = env.fleet.ssh_argv(ssh_host) + ["--", " ".join(shq(a) for a in argv)]
        # A session of its own: "the control machine dies" kills the controller and every
        # process it started (pyinfra's ssh sessions, a rollout's pyinfra runs) at once.
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env.run_env(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 180) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.out):
                return True
            if self.proc.poll() is not None:
                time.sleep(0.3)
                return bool(re.search(pattern, self.out))
            time.sleep(0.1)
        return False

    def kill(self) -> int:
        os.killpg(self.proc.pid, signal.SIGKILL)
        return self.wait(60)

    def wait(self, timeout: float = 600) -> int:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.thread.join(timeout=30)
        self.env.outputs.append(self.out)
        (self.env.work / f"output-{len(self.env.outputs):03d}.txt").write_text(
            " ".join(self.proc.args) + "\n" + self.out)
        self.ended = time.monotonic()
        return self.proc.returncode

    @property
    def rc(self) -> int | None:
        return self.proc.returncode


def wait_until(cond: Callable[[], bool], timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return False


def verified(env: Env, host: str, repo_id: str) -> list[str]:
    out = env.sh(host, f"cat /srv/models/{repo_id.replace('/', '--')}/{env.revs[repo_id]}/"
                       ".specfleet/verified.jsonl 2>/dev/null").stdout
    return [json.loads(line)["path"] for line in out.splitlines() if line.strip()]


def download_unit_active(env: Env, host: str) -> bool:
    r = env.sh(host, "systemctl list-units --plain --no-legend --state=active "
                     "'specfleet-weights-*'")
    return bool(r.stdout.strip())


# ----- the drills ------------------------------------------------------------------------------
def slow_download(env: Env, host: str, name: str, rate: int = 100_000) -> tuple[str, Run]:
    """A deploy of a new repo on ``host`` whose shards come slowly (a small one first, then three
    that take 20 s each at ``rate``); returns once the small one is verified."""
    repo_id = env.repo(name, sizes=[200_000, 2 * MB, 2 * MB, 2 * MB])
    env.hub_config(rate_bps=rate)
    run = env.start(env.inventory({host: env.settings(repo_id)}), [host])
    first = "model-00001-of-00004.safetensors"
    ok = wait_until(lambda: first in verified(env, host, repo_id) or run.proc.poll() is not None,
                    240, 0.3)
    check(ok and run.proc.poll() is None,
          f"the download never got under way: rc={run.proc.poll()} {run.out[-1500:]}")
    return repo_id, run
