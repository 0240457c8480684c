"""Hub file names are not trusted: a listing with ``../x``, ``/abs``, a backslash, a control
character, an empty component or a symlink in the way fails that download with a message naming
the file and the repository, before anything is written, linked or deleted, in the weights agent
and in the fan-out receiver. The fleet tests are in tests/fleet/test_weights_fleet.py
(``test_hostile_listing_...``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet.hostside import fanout_agent
from specfleet.hostside.weights_agent import plan

HOSTSIDE = Path(__file__).resolve().parents[2] / "specfleet" / "hostside"
AGENT = HOSTSIDE / "weights_agent.py"
OLD, NEW = "1" * 40, "2" * 40
DATA = b"the same bytes " * 64
SHA = hashlib.sha256(DATA).hexdigest()
REPO = "evil/model"

# (name, what the message says about it); "{tmp}" is the test's own folder.
HOSTILE = [
    ("../escape.bin", ".."),
    ("sub/../../escape.bin", ".."),
    ("{tmp}/escape-abs.bin", "absolute"),
    ("sub\\..\\escape.bin", "backslash"),
    ("sub//escape.bin", "empty"),
    ("sub/escape.bin/", "empty"),
    ("./escape.bin", "'.'"),
    ("esc\nape.bin", "control"),
    ("esc\x7fape.bin", "control"),
    ("esc\x00ape.bin", "control"),
    (".specfleet/verified.jsonl", ".specfleet"),
]


def models(tmp_path: Path) -> Path:
    """``<tmp>/models/evil--model`` with a verified revision OLD holding ``w.bin`` (DATA): a new
    revision would hard-link a file of the same size and hash from it."""
    root = tmp_path / "models" / "evil--model"
    (root / OLD / ".specfleet").mkdir(parents=True)
    (root / OLD / "w.bin").write_bytes(DATA)
    st = (root / OLD / "w.bin").stat()
    entry = {"path": "w.bin", "size": len(DATA), "mtime_ns": st.st_mtime_ns,
             "hash_kind": "sha256", "hash": SHA, "at": 1.0}
    (root / OLD / ".specfleet" / "verified.jsonl").write_text(json.dumps(entry) + "\n")
    return root


def listing(*names: str) -> list[dict]:
    return [{"path": n, "size": len(DATA), "blob_id": "0" * 40, "sha256": SHA} for n in names]


def snapshot(tmp_path: Path) -> dict[str, bytes | str]:
    """Every file and link under the test's folder (what a hostile name could create/delete)."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(tmp_path):
        for n in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, n)
            out[full] = ("-> " + os.readlink(full)) if os.path.islink(full) else open(
                full, "rb").read()
    return out


def fetch(tmp_path: Path, root: Path, files: list[dict]) -> tuple[int, list[dict]]:
    """The agent's ``fetch`` (the child that links and downloads) on a given listing; the Hub
    is a dead port: nothing here may need it."""
    job = {"repo_id": REPO, "revision": NEW, "root": str(root),
           "endpoint": "http://127.0.0.1:9", "max_workers": 2}
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "listing.json").write_text(json.dumps({"revision": NEW, "files": files}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    r = subprocess.run([sys.executable, str(AGENT), "fetch", str(tmp_path / "job.json"),
                        f"--listing={tmp_path / 'listing.json'}"], capture_output=True,
                       text=True, env={**env, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return r.returncode, events


@pytest.mark.local
@pytest.mark.parametrize("name,why", HOSTILE, ids=[repr(n) for n, _ in HOSTILE])
def test_agent_fetch_refuses_a_hostile_name_before_any_link(tmp_path, name, why):
    name = name.format(tmp=tmp_path)
    root = models(tmp_path)
    (tmp_path / "models" / "victim.bin").write_bytes(b"not to be touched")
    before = snapshot(tmp_path)
    rc, events = fetch(tmp_path, root, listing("w.bin", name))
    after = {p: v for p, v in snapshot(tmp_path).items()
             if p not in (str(tmp_path / "job.json"), str(tmp_path / "listing.json"))}
    # Nothing was created or deleted anywhere but in the new revision's own state folder.
    new_files = sorted(set(after) - set(before))
    assert all(p.startswith(str(root / NEW) + "/") for p in new_files), new_files
    assert not [p for p in new_files if not p.startswith(str(root / NEW / ".specfleet"))], \
        new_files
    assert all(after.get(p) == v for p, v in before.items()), "a file changed or went away"
    assert rc != 0
    error = [e for e in events if e.get("event") == "error"]
    assert error, events
    message = error[-1]["message"]
    assert REPO in message and repr(name) in message and why in message, message
    assert error[-1]["kind"] == "unsafe_name"
    assert not [e for e in events if e.get("event") in ("verified", "linked")], events


def test_agent_plan_names_the_file_and_repo(tmp_path):
    root = models(tmp_path)
    p = plan({"repo_id": REPO, "revision": NEW, "root": str(root)},
             listing=(NEW, listing("w.bin", "../../../etc/cron.d/x")))
    assert p.get("error"), p
    assert p["error"]["kind"] == "unsafe_name"
    assert "'../../../etc/cron.d/x'" in p["error"]["message"]
    assert REPO in p["error"]["message"] and NEW[:12] in p["error"]["message"]


@pytest.mark.local
def test_agent_refuses_a_symlink_in_the_way(tmp_path):
    """A plain name, but a folder of it in the revision is a symlink out of the folder: no link
    or download goes through it."""
    root = models(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / NEW).mkdir()
    os.symlink(outside, root / NEW / "sub")
    rc, events = fetch(tmp_path, root, listing("w.bin", "sub/w.bin"))
    assert list(outside.iterdir()) == []
    assert rc != 0
    error = [e for e in events if e.get("event") == "error"][-1]
    assert error["kind"] == "unsafe_name"
    assert "'sub/w.bin'" in error["message"] and "symlink" in error["message"]
    assert REPO in error["message"]
    # A symlink that stays inside the revision is no escape: the name is fine.
    os.unlink(root / NEW / "sub")
    (root / NEW / "real").mkdir()
    os.symlink("real", root / NEW / "sub")
    p = plan({"repo_id": REPO, "revision": NEW, "root": str(root)},
             listing=(NEW, listing("sub/w.bin")))
    assert "error" not in p, p


@pytest.mark.local
def test_plain_names_still_work(tmp_path):
    root = models(tmp_path)
    names = ("w.bin", "sub/dir/w.bin", ".gitattributes", "a..b/c...d.bin", "spaced name.bin",
             "ünïcode.bin")
    rc, events = fetch(tmp_path, root, listing(*names))
    assert rc == 0, events
    for n in names:
        assert (root / NEW / n).read_bytes() == DATA


# ----------------------------------------------------------------------------------------------
# The fan-out receiver
# ----------------------------------------------------------------------------------------------


def pull_job(tmp_path: Path, root: Path) -> dict:
    (tmp_path / "state").mkdir(exist_ok=True)
    return {"rollout_id": "r1", "repo_id": REPO, "revision": NEW, "root": str(root),
            "endpoint": "http://127.0.0.1:9", "sources": [{"host": "h1", "address": "10.9.9.1"}],
            "port": 22113, "key_path": str(tmp_path / "state" / "k"),
            "known_hosts": str(tmp_path / "state" / "kh"), "control_dir": str(tmp_path),
            "progress_path": str(tmp_path / "state" / "pull.json"), "poll_seconds": 0.01,
            "stall_seconds": 1}


def hostile_pull(tmp_path: Path, monkeypatch, name: str) -> tuple[fanout_agent.Pull, list]:
    """A pull whose Hub lists ``name`` and whose source says it verified that name: a fake
    source (its status, a copy that copies nothing), the real hash check."""
    root = models(tmp_path)
    pull = fanout_agent.Pull(pull_job(tmp_path, root))
    monkeypatch.setattr(pull.wa, "setup_env", lambda *a, **k: None)
    monkeypatch.setattr(pull.wa, "remote_files", lambda job: (NEW, listing("w.bin", name)))
    copied: list = []
    status = {"complete": True, "verified": {p: {"size": len(DATA), "hash": SHA}
                                             for p in ("w.bin", name)}}

    class Stream:
        def latest(self, timeout):
            return status

        def error(self):
            return ""

        def close(self):
            pass

    monkeypatch.setattr(pull, "channel", lambda source, d, rev, rev_dir: Stream())

    def copy(channel, source, paths, rev_dir, wanted, timeout):
        copied.append(list(paths))
        return 0, list(paths), "the fake source copies nothing"

    monkeypatch.setattr(pull, "copy", copy)
    return pull, copied


@pytest.mark.parametrize("name", ["../../victim.bin", "{tmp}/models/victim.bin",
                                  "sub/../../../victim.bin"])
def test_pull_refuses_a_hostile_name_and_deletes_nothing(tmp_path, monkeypatch, name):
    name = name.format(tmp=tmp_path)
    pull, copied = hostile_pull(tmp_path, monkeypatch, name)
    victim = tmp_path / "models" / "victim.bin"
    victim.write_bytes(b"x" * len(DATA))  # same size, other bytes: a hash check would delete it
    pull.run()
    assert victim.read_bytes() == b"x" * len(DATA)
    assert copied == []  # nothing was asked of the source either
    assert pull.data["state"] == "failed"
    err = pull.data["error"]
    assert err["kind"] == "unsafe_name"
    assert repr(name) in err["message"] and REPO in err["message"], err


def test_pull_refuses_a_symlink_in_the_way(tmp_path, monkeypatch):
    pull, copied = hostile_pull(tmp_path, monkeypatch, "sub/w.bin")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w.bin").write_bytes(b"y" * len(DATA))
    rev_dir = Path(pull.job["root"]) / NEW
    rev_dir.mkdir()
    os.symlink(outside, rev_dir / "sub")
    pull.run()
    assert (outside / "w.bin").read_bytes() == b"y" * len(DATA)
    assert copied == []
    assert pull.data["error"]["kind"] == "unsafe_name"
    assert "symlink" in pull.data["error"]["message"]


def test_pull_receive_never_writes_outside_the_revision(tmp_path, monkeypatch):
    """Even asked for a bad name (it never is), the receiver writes nothing outside."""
    import io

    root = models(tmp_path)
    victim = tmp_path / "models" / "victim.bin"
    victim.write_bytes(b"x" * len(DATA))
    pull = fanout_agent.Pull(pull_job(tmp_path, root))
    rev_dir = root / NEW
    (rev_dir / ".specfleet").mkdir(parents=True)
    asked = {p: f for f in listing("../../victim.bin") for p in [f["path"]]}
    got = pull.receive(io.BytesIO(DATA), {"file": "../../victim.bin", "size": len(DATA)},
                       str(rev_dir), asked)
    assert got.entry is None and "not taken" in got.problem and not got.broken
    assert victim.read_bytes() == b"x" * len(DATA)
    assert list(tmp_path.joinpath("models").glob("*.sf-part")) == []
