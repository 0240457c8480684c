"""Fan-out: the pure parts (tree, swarms, key restrictions, sshd config, status protocol) and the
agent's serve command run for real on local files. The fleet tests are tests/fleet/test_fanout_fleet.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from facts.fanout import parse_leftovers, parse_serve
from operations.fanout import authorized_keys, known_hosts, serve_command, sshd_config
from specfleet.core.errors import SpecfleetError
from specfleet.core.fanout import auto_degree, plan_fanout, swarm_key, tree_sources
from specfleet.core.settings import settings_from_dict
from specfleet.fleet.fanout import add_keys, make_keypair
from specfleet.hostside.fanout_agent import (
    STATUS_WAIT_MAX,
    SourceChannel,
    StatusRequest,
    available,
    cmd_wait,
    parse_status_request,
    progress_news,
    source_finished,
    ssh_command,
    stream_status,
)
from specfleet.hostside.weights_agent import expected_hash

AGENT = Path(__file__).resolve().parents[2] / "specfleet" / "hostside" / "fanout_agent.py"
REV = "a" * 40
ADDR = {"h1": "10.250.9.11", "h2": "10.250.9.12", "h3": "10.250.9.13", "h4": "10.250.9.14",
        "h5": "10.250.9.15"}


def same_keys(hosts, key=("m",)):
    return {w: {h: key for h in hosts} for w in ("target", "drafter")}


def sources(plan, host, which="target"):
    return [s["host"] for s in plan["hosts"][host]["models"][which]["sources"]]


def test_tree_sources_walk_up_to_the_seed():
    assert tree_sources(0, 2) == []
    assert tree_sources(1, 2) == [0]
    assert tree_sources(2, 2) == [0]
    assert tree_sources(3, 2) == [1, 0]
    assert tree_sources(6, 2) == [2, 0]
    assert tree_sources(3, 1) == [2, 1, 0]  # a chain
    assert tree_sources(3, 3) == [0]  # a star


def test_plan_four_hosts_binary_tree():
    hosts = ["h1", "h2", "h3", "h4"]
    plan = plan_fanout(hosts, ADDR, same_keys(hosts), degree=2)
    t = {h: plan["hosts"][h]["models"]["target"] for h in hosts}
    assert t["h1"] == {"role": "seed", "sources": []}
    assert [t[h]["role"] for h in ("h2", "h3", "h4")] == ["peer"] * 3
    assert sources(plan, "h2") == ["h1"] and sources(plan, "h3") == ["h1"]
    assert sources(plan, "h4") == ["h2", "h1"]  # its parent, then the seed
    # The drafter's swarm starts one host on: another host takes the second upstream download.
    assert plan["hosts"]["h2"]["models"]["drafter"]["role"] == "seed"
    assert sources(plan, "h1", "drafter") == ["h3", "h2"]
    # from= of each server: exactly the hosts that copy from it.
    assert sorted(plan["hosts"]["h1"]["receivers"]) == [ADDR["h2"], ADDR["h3"], ADDR["h4"]]
    assert plan["hosts"]["h4"]["receivers"] == []
    assert [s["seed"] for s in plan["swarms"]] == ["h1", "h2"]


def test_auto_degree_keeps_every_host_within_two_hops():
    assert [auto_degree(n) for n in (1, 2, 4, 7, 8, 16, 21, 22, 32, 73)] == [
        2, 2, 2, 2, 3, 4, 4, 5, 6, 8]
    assert auto_degree(74) == auto_degree(1000) == 8  # the cap: a third hop beyond 73 hosts
    for n in range(2, 74):
        d = auto_degree(n)
        assert max(len(tree_sources(i, d)) for i in range(n)) <= 2, n
        assert d == 2 or max(len(tree_sources(i, d - 1)) for i in range(n)) > 2, n


def test_plan_degree_from_the_swarms_size():
    """16 hosts: a tree of degree 4 (two hops), not a binary one (four hops); 4 hosts keep the
    binary tree; the degree is recorded per swarm."""
    hosts = [f"n{i}" for i in range(1, 17)]
    addr = {h: f"10.250.9.{10 + i}" for i, h in enumerate(hosts, 1)}
    plan = plan_fanout(hosts, addr, same_keys(hosts))
    assert [s["degree"] for s in plan["swarms"]] == [4, 4]
    assert sources(plan, "n2") == ["n1"] and sources(plan, "n5") == ["n1"]
    assert sources(plan, "n6") == ["n2", "n1"] and sources(plan, "n16") == ["n4", "n1"]
    assert max(len(sources(plan, h)) for h in hosts) == 2
    assert len(plan["hosts"]["n1"]["receivers"]) == 15  # its 4 children, and theirs (fallback)
    assert plan_fanout(hosts, addr, same_keys(hosts), degree=2)["swarms"][0]["degree"] == 2
    assert sources(plan_fanout(hosts, addr, same_keys(hosts), degree=2), "n16") == [
        "n8", "n4", "n2", "n1"]
    four = plan_fanout(hosts[:4], addr, same_keys(hosts[:4]))
    assert four["swarms"][0]["degree"] == 2 and sources(four, "n4") == ["n2", "n1"]


def test_plan_follows_order_and_degree():
    hosts = ["h1", "h2", "h3", "h4", "h5"]
    plan = plan_fanout(hosts, ADDR, same_keys(hosts), order=["h3", "h5"], degree=1)
    assert plan["swarms"][0]["hosts"] == ["h3", "h5", "h1", "h2", "h4"]
    assert sources(plan, "h4") == ["h2", "h1", "h5", "h3"]
    with pytest.raises(SpecfleetError):
        plan_fanout(hosts, ADDR, same_keys(hosts), degree=0)


def test_plan_groups_hosts_by_what_they_want():
    """A host that wants another revision (or mirror, or path) is a swarm of its own."""
    base = {"target": {"repo_id": "o/m", "revision": REV},
            "drafter": {"repo_id": "o/d", "revision": "b" * 40}}
    other = {**base, "target": {"repo_id": "o/m", "revision": "c" * 40}}
    mirror = {**base, "weights": {"hf_endpoint": "https://mirror.b:8080"}}
    settings = {"h1": settings_from_dict(base), "h2": settings_from_dict(other),
                "h3": settings_from_dict(base), "h4": settings_from_dict(mirror)}
    hosts = list(settings)
    keys = {w: {h: swarm_key(settings[h], w) for h in hosts} for w in ("target", "drafter")}
    plan = plan_fanout(hosts, ADDR, keys)
    target = [s["hosts"] for s in plan["swarms"] if s["which"] == "target"]
    assert target == [["h1", "h3"], ["h2"], ["h4"]]
    assert plan["hosts"]["h2"]["models"]["target"]["role"] == "seed"
    assert sources(plan, "h3") == ["h1"]
    drafter = [s["hosts"] for s in plan["swarms"] if s["which"] == "drafter"]
    assert drafter == [["h2", "h3", "h1"], ["h4"]]


def test_plan_one_seed_per_site():
    base = {"target": {"repo_id": "o/m", "revision": REV},
            "drafter": {"repo_id": "o/d", "revision": "b" * 40}}
    site = {h: settings_from_dict({**base, "rollout": {"fanout_site": s}})
            for h, s in (("h1", "dc-a"), ("h2", "dc-b"), ("h3", "dc-a"), ("h4", "dc-b"))}
    hosts = list(site)
    keys = {w: {h: swarm_key(site[h], w) for h in hosts} for w in ("target", "drafter")}
    plan = plan_fanout(hosts, ADDR, keys)
    assert [s["hosts"] for s in plan["swarms"] if s["which"] == "target"] == [
        ["h1", "h3"], ["h2", "h4"]]
    assert sources(plan, "h3") == ["h1"] and sources(plan, "h4") == ["h2"]


@pytest.mark.local
def test_keys_are_real_openssh_keys(tmp_path):
    private, public = make_keypair("specfleet-fanout-test")
    key = tmp_path / "k"
    key.write_text(private)
    key.chmod(0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True,
                             text=True, check=True).stdout.split()
    assert derived[:2] == public.split()[:2]
    assert public.startswith("ssh-ed25519 ") and public.endswith(" specfleet-fanout-test")
    plan = add_keys(plan_fanout(["h1", "h2", "h3"], ADDR, same_keys(["h1", "h2", "h3"])),
                    22113, "abc123")
    assert set(plan["servers"]) == {"h1", "h2"}  # h3 serves no one
    assert "host_private_key" in plan["hosts"]["h1"]
    assert "host_private_key" not in plan["hosts"]["h3"]
    pubs = {s["host_public_key"] for s in plan["servers"].values()}
    assert len(pubs) == 2  # a host key of its own per server


def test_authorized_keys_restricts_the_key():
    cmd = serve_command("/opt/specfleet/tools", "/srv/models", "/var/lib/specfleet")
    line = authorized_keys("ssh-ed25519 AAAAC3 c", ["10.250.9.12", "10.250.9.13"], cmd)
    assert line == ('from="10.250.9.12,10.250.9.13",restrict,command="/opt/specfleet/tools/'
                    'bin/python /opt/specfleet/tools/fanout_agent.py serve /srv/models '
                    '/var/lib/specfleet" ssh-ed25519 AAAAC3 c\n')
    with pytest.raises(ValueError):
        authorized_keys("ssh-ed25519 AAAAC3 c", [], cmd)
    with pytest.raises(ValueError):
        authorized_keys("ssh-ed25519 AAAAC3 c", ['1.2.3.4",command="sh'], cmd)
    with pytest.raises(ValueError):
        authorized_keys("ssh-ed25519 AAAAC3 c", ["10.0.0.1"], 'rm -rf "/"')


def test_sshd_config_is_key_only_and_forced():
    cfg = sshd_config(22113, "/var/lib/specfleet/fanout/sshd", "CMD", "10.250.9.11")
    lines = set(cfg.splitlines())
    assert "ListenAddress 10.250.9.11" in lines
    assert "ListenAddress" not in sshd_config(22113, "/d", "CMD")
    for want in ("Port 22113", "PermitRootLogin forced-commands-only", "PasswordAuthentication no",
                 "AllowTcpForwarding no", "PermitTTY no", "ForceCommand CMD",
                 "AuthorizedKeysFile /var/lib/specfleet/fanout/sshd/authorized_keys",
                 "HostKey /var/lib/specfleet/fanout/sshd/host_key", "UsePAM no"):
        assert want in lines


def test_known_hosts_pins_each_server():
    kh = known_hosts({"h1": {"address": "10.250.9.11", "port": 22113,
                             "host_public_key": "ssh-ed25519 AAA h1"},
                      "h2": {"address": "10.250.9.12", "port": 22113,
                             "host_public_key": "ssh-ed25519 BBB h2"}})
    assert kh == ("[10.250.9.11]:22113 ssh-ed25519 AAA h1\n"
                  "[10.250.9.12]:22113 ssh-ed25519 BBB h2\n")
    argv = ssh_command("/k", "/kh", 22113, "/run/x")
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/kh" in argv
    assert "IdentitiesOnly=yes" in argv and "BatchMode=yes" in argv


def test_status_request_parsing():
    assert parse_status_request(f"specfleet-status o--m {REV}") == StatusRequest("o--m", REV,
                                                                                 -1, 0.0)
    # A stream: an answer at each change (at least every WAIT seconds), on one channel.
    assert parse_status_request(f"specfleet-status o--m {REV} 0 10 stream") == (
        "o--m", REV, 0, 10.0, True)
    assert parse_status_request(f"specfleet-status o--m {REV} 0 2.5 stream").wait == 2.5
    assert parse_status_request(
        f"specfleet-status o--m {REV} 0 9999 stream").wait == STATUS_WAIT_MAX
    for bad in (f"specfleet-status ../etc {REV}", f"specfleet-status o--m {REV} x",
                "specfleet-status o--m main", f"specfleet-status .. {REV}",
                f"specfleet-status a/b {REV}", "rsync --server --sender . x", "",
                f"specfleet-status o--m {REV} 3", f"specfleet-status o--m {REV} -1 5",
                f"specfleet-status o--m {REV} 3 x", f"specfleet-status o--m {REV} 3 5 6",
                f"specfleet-status o--m {REV} 3 1e9", f"specfleet-status o--m {REV} stream",
                # the long poll without a stream is gone: nothing asks for it
                f"specfleet-status o--m {REV} 3 10",
                f"specfleet-status o--m {REV} 3 5 streams", f"specfleet-status o--m {REV} 3 5 6 7"):
        assert parse_status_request(bad) is None, bad


def verified_folder(tmp_path: Path) -> tuple[Path, Path, Path]:
    models, state = tmp_path / "models", tmp_path / "state"
    rev_dir = models / "o--m" / REV
    (rev_dir / ".specfleet").mkdir(parents=True)
    return models, state, rev_dir


def add_verified(rev_dir: Path, name: str, data: bytes) -> None:
    (rev_dir / name).write_bytes(data)
    st = (rev_dir / name).stat()
    with open(rev_dir / ".specfleet" / "verified.jsonl", "a") as f:
        f.write(json.dumps({"path": name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                            "hash_kind": "git", "hash": f"h-{name}", "at": 1.0}) + "\n")


class Clock:
    """A clock that a sleep moves on, and a hook that runs at a given sleep."""

    def __init__(self, at: dict[int, object] | None = None):
        self.t, self.sleeps, self.at = 0.0, 0, at or {}

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.sleeps += 1
        if self.sleeps in self.at:
            self.at[self.sleeps]()


def mark_complete(rev_dir: Path) -> None:
    (rev_dir / ".specfleet" / "manifest.json").write_text(json.dumps(
        {"revision": REV, "complete": True}))


class FakeChannel:
    """``stream_status``'s channel, on a ``Clock``: what is written, and requests given at a
    time; the receiver hangs up at ``hang_up``."""

    def __init__(self, clock: Clock, hang_up: float, requests: dict[float, list] | None = None):
        self.clock, self.hang_up, self.pending = clock, hang_up, dict(requests or {})
        self.out = b""

    def write(self, data: bytes) -> None:
        self.out += data

    def requests(self, timeout: float) -> list | None:
        if self.clock.t >= self.hang_up:
            return None
        self.clock.sleep(timeout)
        due = [t for t in self.pending if t <= self.clock.t]
        return [r for t in sorted(due) for r in self.pending.pop(t)]


def test_status_stream_answers_at_each_change_and_takes_requests_until_hung_up(tmp_path):
    """One channel per receiver and source: a status at once, one at each new verified file,
    one after ``wait`` seconds without a change (so silence means a dead channel); requests
    are answered on it; it ends when the receiver hangs up."""
    models, state, rev_dir = verified_folder(tmp_path)
    add_verified(rev_dir, "a.bin", b"hello")
    clock = Clock({5: lambda: add_verified(rev_dir, "b.bin", b"world")})
    channel = FakeChannel(clock, hang_up=3.0, requests={1.0: [{"send": ["a.bin"]}]})
    asked = []
    assert stream_status(str(models), str(state), StatusRequest("o--m", REV, 0, 2.0, True),
                         channel, lambda r: asked.append((clock.t, r)) or True, clock) == 0
    answers = [json.loads(line) for line in channel.out.splitlines()]
    assert [sorted(a["verified"]) for a in answers] == [["a.bin"], ["a.bin", "b.bin"],
                                                        ["a.bin", "b.bin"]]
    assert [r for _, r in asked] == [{"send": ["a.bin"]}] and 1.0 <= asked[0][0] < 1.2
    assert 3.0 <= clock.t < 3.2
    # A send that leaves the channel out of step ends it.
    channel = FakeChannel(Clock(), hang_up=9.0, requests={0.5: [{"send": ["a.bin"]}]})
    assert stream_status(str(models), str(state), StatusRequest("o--m", REV, 0, 2.0, True),
                         channel, lambda r: False, channel.clock) == 1


def channel_answers(data: bytes) -> list:
    """What came on a status stream: statuses (dicts) and files ((header, bytes or None))."""
    out = []
    while data:
        line, _, data = data.partition(b"\n")
        msg = json.loads(line)
        if "file" in msg:
            size = msg.get("size")
            out.append((msg, None if size is None else data[:size]))
            data = data[size or 0:]
        else:
            out.append(msg)
    return out


def stream(models: Path, state: Path, *requests, allowed: tuple[str, ...] = (f"o--m={REV}",),
           folder: str = f"o--m {REV}") -> tuple[int, list, str]:
    """The forced command, run for real as sshd runs it: a status stream of ``folder``, the
    ``requests`` on its stdin, then hung up."""
    env = {**os.environ, "SSH_ORIGINAL_COMMAND": f"specfleet-status {folder} 0 10 stream"}
    r = subprocess.run([sys.executable, str(AGENT), "serve", str(models), str(state), *allowed],
                       env=env, capture_output=True, timeout=30, input=b"".join(
                           (json.dumps(q) + "\n").encode() if not isinstance(q, bytes) else q
                           for q in requests))
    return r.returncode, channel_answers(r.stdout), r.stderr.decode()


@pytest.mark.local
def test_status_stream_through_the_forced_command_and_the_receivers_end(tmp_path):
    """The forced command, run for real, streams until stdin ends; the receiver's end keeps
    the newest status, and says so when the channel ends or goes silent."""
    models, state, rev_dir = verified_folder(tmp_path)
    add_verified(rev_dir, "a.bin", b"hello")
    rc, answers, err = stream(models, state, {"send": ["a.bin"]})
    assert rc == 0, err
    assert list(answers[0]["verified"]) == ["a.bin"]
    assert answers[1:] == [({"file": "a.bin", "size": 5}, b"hello")]

    lines = "".join(f"print({json.dumps(json.dumps({'n': n}))}, flush=True);" for n in (1, 2))
    channel = SourceChannel([sys.executable, "-c", f"{lines} import time; time.sleep(0.3)"],
                            lambda stream, head, asked: None)
    time.sleep(0.2)
    assert channel.latest(5) == {"n": 2}  # the newest of what came
    assert channel.latest(5) is None and "exit 0" in channel.error()  # the channel ended
    assert channel.next_file(1) is None and not channel.send(["x"])
    channel.close()
    channel = SourceChannel([sys.executable, "-c", "import time; time.sleep(30)"],
                            lambda stream, head, asked: None)
    assert channel.latest(0.3) is None and "no answer for" in channel.error()
    channel.close()


@pytest.mark.local
def test_serve_answers_a_status_at_once_and_refuses_a_long_poll(tmp_path):
    """The forced command, run for real: a plain status request is answered at once; the long
    poll without a stream (which nothing asks for) is refused like any other command."""
    models, state, rev_dir = verified_folder(tmp_path)
    add_verified(rev_dir, "a.bin", b"hello")
    r = serve(models, state, f"specfleet-status o--m {REV}")
    assert r.returncode == 0, r.stderr
    assert list(json.loads(r.stdout)["verified"]) == ["a.bin"]
    r = serve(models, state, f"specfleet-status o--m {REV} 1 0.5")
    assert r.returncode == 1 and "only status requests" in r.stderr


def test_available_only_files_the_source_verified_with_the_hubs_hash():
    wanted = {"a.safetensors": {"path": "a.safetensors", "size": 5, "sha256": "s1",
                                "blob_id": "b1"},
              "c.json": {"path": "c.json", "size": 2, "blob_id": "g2"},
              "d.json": {"path": "d.json", "size": 2, "blob_id": "g3"}}
    status = {"verified": {"a.safetensors": {"size": 5, "hash": "s1"},
                           "c.json": {"size": 2, "hash": "other"},  # another content
                           "zzz": {"size": 1, "hash": "x"}}}  # not wanted
    assert available(status, wanted, expected_hash) == ["a.safetensors"]


def test_source_finished():
    rid = "r1"
    assert source_finished({"complete": True}, REV, rid)
    assert source_finished({"weights": {"revision": REV, "state": "done"}}, REV, rid)
    assert source_finished({"weights": {"revision": REV, "state": "failed"}}, REV, rid)
    # Another revision's old download says nothing about this one.
    assert not source_finished({"weights": {"revision": "b" * 40, "state": "done"}}, REV, rid)
    assert not source_finished({"weights": {"revision": REV, "state": "downloading"}}, REV, rid)
    assert source_finished({"pull": {"rollout_id": rid, "state": "partial"}}, REV, rid)
    # A pull of an earlier fan-out says nothing about this one.
    assert not source_finished({"pull": {"rollout_id": "old", "state": "done"}}, REV, rid)


def test_fact_parsers():
    assert parse_serve(["unit specfleet-fanout-sshd-ab.service", "digest ff00"]) == {
        "active": ["specfleet-fanout-sshd-ab.service"], "digest": "ff00"}
    assert parse_serve([]) == {"active": [], "digest": None}
    assert parse_leftovers(["unit specfleet-fanout-pull-x-1.service", "file sshd",
                            "file o--m.key"]) == {
        "units": ["specfleet-fanout-pull-x-1.service"], "files": ["sshd", "o--m.key"]}


def serve(models: Path, state: Path, command: str, allowed: tuple[str, ...] = (f"o--m={REV}",),
          path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SSH_ORIGINAL_COMMAND": command}
    if path:
        env["PATH"] = f"{path}:{env['PATH']}"
    return subprocess.run([sys.executable, str(AGENT), "serve", str(models), str(state), *allowed],
                          env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.local
def test_serve_status_reports_only_files_that_still_match(tmp_path):
    models, state = tmp_path / "models", tmp_path / "state"
    rev_dir = models / "o--m" / REV
    (rev_dir / ".specfleet").mkdir(parents=True)
    entries = []
    for name, data in (("a.bin", b"hello"), ("b.bin", b"world!")):
        (rev_dir / name).write_bytes(data)
        st = (rev_dir / name).stat()
        entries.append({"path": name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                        "hash_kind": "git", "hash": f"h-{name}", "at": 1.0})
    (rev_dir / ".specfleet" / "verified.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in entries))
    (rev_dir / "b.bin").write_bytes(b"WORLD!!")  # changed since it was verified
    (state / "weights").mkdir(parents=True)
    (state / "weights" / "o--m.progress.json").write_text(json.dumps(
        {"revision": REV, "state": "downloading", "updated_at": 5.0, "job_id": "x"}))
    r = serve(models, state, f"specfleet-status o--m {REV}")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["verified"] == {"a.bin": {"size": 5, "hash": "h-a.bin"}}
    assert status["complete"] is False
    assert status["weights"] == {"revision": REV, "state": "downloading", "updated_at": 5.0}
    assert status["pull"] == {"rollout_id": None, "revision": None, "state": None,
                              "updated_at": None}


@pytest.mark.local
def test_serve_refuses_anything_but_status(tmp_path):
    for command in ("cat /etc/shadow", "rsync --server --sender . o--m", "rsync --server . x",
                    f"specfleet-status ../.. {REV}", "sh", f"specfleet-send o--m {REV} x"):
        r = serve(tmp_path, tmp_path, command)
        assert r.returncode == 1, command
        assert "only status requests" in r.stderr
        assert r.stdout == ""


def models_tree(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    for d in (models / "o--m" / REV, models / "o--d" / ("b" * 40), models / "o--m" / ("c" * 40),
              models / ".cache"):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    return models


def files_of(answers: list) -> list:
    return [a for a in answers if isinstance(a, tuple)]


@pytest.mark.local
def test_serve_sends_only_files_of_the_revision_folder_it_fans_out(tmp_path):
    """A send names paths under the revision folder of its stream; any other folder (another
    model, another revision, the model's root, .cache, ``..``, an absolute path) is refused,
    and not a byte of it goes out."""
    models = models_tree(tmp_path)
    (models / "o--m" / REV / "sub").mkdir()
    (models / "o--m" / REV / "sub" / "x.bin").write_text("xyz")
    rc, answers, err = stream(models, tmp_path, {"send": ["config.json", "sub/x.bin"]},
                              {"send": ["no such"]})
    assert rc == 0, err
    assert files_of(answers) == [({"file": "config.json", "size": 2}, b"{}"),
                                 ({"file": "sub/x.bin", "size": 3}, b"xyz"),
                                 ({"file": "no such", "error": "No such file or directory"},
                                  None)]
    hostile = [f"../{'c' * 40}/config.json", "sub/../../x", "/etc/shadow", "./config.json",
               "sub//x.bin", "../../o--d/" + "b" * 40 + "/config.json", "../../.cache/config.json",
               "", "."]
    rc, answers, err = stream(models, tmp_path, {"send": hostile}, {"send": "config.json"},
                              b"not json\n", {"other": 1})
    assert rc == 0, err
    got = files_of(answers)
    assert [h["file"] for h, _ in got] == [*hostile, None, None, None]
    assert all("error" in h and data is None for h, data in got), got
    # Streams only of the folders it serves.
    for folder in (f"o--d {'b' * 40}", f"o--m {'c' * 40}", "o--m .", ".cache x"):
        rc, answers, err = stream(models, tmp_path, {"send": ["config.json"]}, folder=folder)
        assert rc == 1 and answers == [] and ("not served" in err or "only status" in err), folder


@pytest.mark.local
def test_serve_follows_no_symlink_out_of_the_folder(tmp_path):
    models = models_tree(tmp_path)
    rev = models / "o--m" / REV
    # A symlink inside that stays inside does not stop the serving; it is not sent itself.
    os.symlink("config.json", rev / "inner.json")
    rc, answers, err = stream(models, tmp_path, {"send": ["inner.json", "config.json"]})
    (inner, _), (config, data) = files_of(answers)
    assert "error" in inner and config == {"file": "config.json", "size": 2} and data == b"{}"
    # One that leads out (a file or a folder, relative or absolute) stops the sending.
    for target in (models / "o--d" / ("b" * 40), "../../o--d", "/etc/passwd", ".."):
        os.symlink(target, rev / "out")
        rc, answers, err = stream(models, tmp_path, {"send": ["config.json"]})
        (head, data), = files_of(answers)
        assert data is None and "symlink" in head["error"] and "out" in head["error"], target
        os.unlink(rev / "out")


@pytest.mark.local
def test_serve_of_a_followed_branch_takes_the_revision_this_host_resolved(tmp_path):
    """A swarm that follows a branch names no commit in the plan: the folder served is the one
    this host's own download (or pull) resolved."""
    models = models_tree(tmp_path)
    other = "c" * 40
    ask = {"send": ["config.json"]}
    assert stream(models, tmp_path, ask, allowed=("o--m",))[0] == 1  # nothing resolved yet
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "o--m.progress.json").write_text(json.dumps({"revision": REV}))
    rc, answers, err = stream(models, tmp_path, ask, allowed=("o--m",))
    assert rc == 0 and files_of(answers)[0][1] == b"{}", err
    assert stream(models, tmp_path, ask, allowed=("o--m",), folder=f"o--m {other}")[0] == 1
    (tmp_path / "fanout").mkdir()
    (tmp_path / "fanout" / "o--m.pull.json").write_text(json.dumps({"revision": other}))
    assert stream(models, tmp_path, ask, allowed=("o--m",), folder=f"o--m {other}")[0] == 0


def test_serve_command_names_the_folders(tmp_path):
    cmd = serve_command("/opt/t", "/srv/models", "/var/lib/specfleet",
                        {"o--m": REV, "o--d": None})
    assert cmd == (f"/opt/t/bin/python /opt/t/fanout_agent.py serve /srv/models "
                   f"/var/lib/specfleet o--d o--m={REV}")


def receiver_pull(tmp_path):
    """``(fanout_agent, the revision folder, a Pull)`` of one model with no sources."""
    from specfleet.hostside import fanout_agent

    rev_dir = tmp_path / REV
    (rev_dir / ".specfleet").mkdir(parents=True)
    job = {"rollout_id": "r", "repo_id": "o/m", "revision": REV, "root": str(tmp_path),
           "sources": [], "port": 22113, "key_path": "/k", "known_hosts": "/kh",
           "control_dir": "/run/x", "progress_path": str(tmp_path / "p.json")}
    return fanout_agent, rev_dir, fanout_agent.Pull(job)


@contextmanager
def source_channel(pull, rev_dir: Path, timeout: float):
    """``(channel, its status)``: the pull's channel to ``SOURCE`` for the model's revision,
    its status line read, closed on the way out."""
    channel = pull.channel(SOURCE, "o--m", REV, str(rev_dir))
    try:
        yield channel, channel.latest(timeout)
    finally:
        channel.close()


def through_forced_command(monkeypatch, fanout_agent, models: Path, state: Path):
    """The receiver's ssh replaced by the source's forced command itself, run for real with
    the request as ``SSH_ORIGINAL_COMMAND`` (what sshd does with the rollout's key)."""
    real_popen = subprocess.Popen

    def popen(argv, **kw):
        env = {**os.environ, "SSH_ORIGINAL_COMMAND": argv[-1]}
        return real_popen([sys.executable, str(AGENT), "serve", str(models), str(state),
                           f"o--m={REV}"], env=env, **kw)

    monkeypatch.setattr(fanout_agent.subprocess, "Popen", popen)


SOURCE = {"host": "h1", "address": "10.0.0.1"}


@pytest.mark.local
def test_receiver_takes_each_file_whole_hashed_as_it_comes(tmp_path, monkeypatch):
    """The files asked for come on the status channel, each under a temporary name, hashed on
    the way, recorded once whole (for this host's own receivers); nothing of the peer's copy
    is kept but the bytes (a setuid mode stays behind)."""
    from specfleet.hostside.weights_agent import git_blob_id

    fanout_agent, rev_dir, pull = receiver_pull(tmp_path)
    models = tmp_path / "src"
    src = models / "o--m" / REV
    (src / ".specfleet").mkdir(parents=True)
    add_verified(src, "a.bin", b"hello")
    add_verified(src, "b.bin", b"world!")
    (src / "a.bin").chmod(0o4755)
    through_forced_command(monkeypatch, fanout_agent, models, tmp_path / "state")
    wanted = {"a.bin": {"path": "a.bin", "size": 5, "blob_id": git_blob_id(b"hello")},
              "b.bin": {"path": "b.bin", "size": 6, "sha256": hashlib.sha256(b"world!")
                        .hexdigest()}}
    with source_channel(pull, rev_dir, 10) as (channel, status):
        assert sorted(status["verified"]) == ["a.bin", "b.bin"]
        got, failed, broke = pull.copy(channel, SOURCE, ["a.bin", "b.bin"], str(rev_dir),
                                       wanted, 10)
    assert (got, failed, broke) == (2, [], "") and wanted == {}
    rec = [json.loads(x) for x in (rev_dir / ".specfleet" / "verified.jsonl").read_text()
           .splitlines()]
    assert [(r["path"], r["hash"], r["from"]) for r in rec] == [
        ("a.bin", git_blob_id(b"hello"), "h1"),
        ("b.bin", hashlib.sha256(b"world!").hexdigest(), "h1")]
    assert (rev_dir / "a.bin").read_bytes() == b"hello"
    assert not (rev_dir / "a.bin").stat().st_mode & 0o7000
    assert sorted(p.name for p in rev_dir.iterdir()) == [".specfleet", "a.bin", "b.bin"]


@pytest.mark.local
def test_receiver_keeps_nothing_of_a_channel_that_breaks(tmp_path, monkeypatch):
    """A channel that ends in the middle of a file leaves no file and no partial one (what came
    whole before stays); a file of another size than the Hub's, or one the source could not
    send, is left for the next source, and the channel stays in step."""
    from specfleet.hostside.weights_agent import git_blob_id

    fanout_agent, rev_dir, pull = receiver_pull(tmp_path)
    real_popen = subprocess.Popen
    status = json.dumps({"verified": {}})
    a = '{"file": "a.bin", "size": 5}\nhello'
    for answers, expect in (
        (a + '{"file": "b.bin", "size": 10}\nhalf', (1, ["b.bin"], "in the middle")),
        (a + '{"file": "b.bin", "size": 3}\nabc', (1, ["b.bin"], "")),
        ('{"file": "a.bin", "error": "gone"}\n{"file": "b.bin", "size": 3}\nabc',
         (0, ["a.bin", "b.bin"], "")),
    ):
        # A stand-in source: a status, then, once asked, these answers.
        monkeypatch.setattr(fanout_agent.subprocess, "Popen", lambda argv, s=answers, **kw:
                            real_popen(["sh", "-c", 'printf "%s\\n" "$0"; read -r x; '
                                        'printf "%s" "$1"; sleep 2', status, s], **kw))
        for p in rev_dir.glob("*.bin"):
            p.unlink()
        (rev_dir / ".specfleet" / "verified.jsonl").unlink(missing_ok=True)
        wanted = {"a.bin": {"path": "a.bin", "size": 5, "blob_id": git_blob_id(b"hello")},
                  "b.bin": {"path": "b.bin", "size": 10, "blob_id": "y"}}
        with source_channel(pull, rev_dir, 5) as (channel, _):
            got, failed, broke = pull.copy(channel, SOURCE, ["a.bin", "b.bin"], str(rev_dir),
                                           wanted, 5)
        assert (got, failed) == expect[:2] and expect[2] in broke, (answers, got, failed, broke)
        left = sorted(p.name for p in rev_dir.iterdir())
        assert left == [".specfleet", "a.bin"][:1 + got], left
    (rev_dir / ".b.bin.sf-part").write_bytes(b"stale")
    fanout_agent.remove_parts(str(rev_dir))  # what a killed pull left, at the next one's start
    assert not (rev_dir / ".b.bin.sf-part").exists()


def test_progress_news_and_the_wait_for_it(tmp_path):
    """The control machine's watch of a pull waits on the host until the pull wrote its
    progress again or has ended: one round trip per change, not one per poll."""
    assert progress_news(None, 1.0) and progress_news({"updated_at": 2.0}, 1.0)
    assert not progress_news(None, None) and not progress_news({"updated_at": 1.0}, 1.0)
    assert progress_news({"updated_at": 1.0, "state": "done"}, 1.0)  # ended: at once
    path = tmp_path / "o--m.pull.json"
    path.write_text(json.dumps({"updated_at": 1.0, "state": "pulling"}))
    clock = Clock({4: lambda: path.write_text(json.dumps({"updated_at": 2.5,
                                                          "state": "pulling"}))})
    assert cmd_wait(str(path), 1.0, 10, clock, clock.sleep, settle=0) == 0
    assert clock.sleeps == 4  # woke when the progress changed
    clock = Clock()
    cmd_wait(str(path), 2.5, 3, clock, clock.sleep, settle=0)
    assert 3.0 <= clock.t < 3.2  # no change: the whole wait, then the control looks anyway
    # Progress on the way is told once per settle time; the first look and the end at once.
    clock = Clock({4: lambda: path.write_text(json.dumps({"updated_at": 3.0,
                                                          "state": "pulling"}))})
    cmd_wait(str(path), 2.5, 20, clock, clock.sleep, settle=5)
    assert 5.0 <= clock.t < 5.2
    clock = Clock()
    cmd_wait(str(path), None, 20, clock, clock.sleep, settle=5)
    assert clock.t == 0
    clock = Clock({3: lambda: path.write_text(json.dumps({"updated_at": 3.5,
                                                          "state": "done"}))})
    cmd_wait(str(path), 3.0, 20, clock, clock.sleep, settle=5)
    assert clock.sleeps == 3  # ended: at once, within the settle time


def test_watch_command_waits_on_the_host_then_looks():
    from operations.fanout import watch_command

    cmd = str(watch_command("u1", "/s/p.json", ("/t/bin/python", "/t/fanout_agent.py"), 1.5))
    assert cmd.startswith("/t/bin/python /t/fanout_agent.py wait /s/p.json 1.5 30 ")
    assert "systemctl list-units" in cmd and "u1.service" in cmd
    assert " wait /s/p.json none 30 " in str(watch_command("u1", "/s/p.json", ("p", "a"), None))
    assert str(watch_command("u1", "/s/p.json", None, None)).startswith("( systemctl")
