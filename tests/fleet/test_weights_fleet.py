"""Weights on real hosts (tests.fleet): olah as a real offline mirror, and the stand-in hub
(tests/harness/standin_hub.py) for what olah cannot do (LFS sha256, gating, Range, failure knobs).

Every test runs ``pyinfra -y INVENTORY tests/deploys/weights_deploy.py`` (weights.tools_from_settings,
weights.token_from_settings, weights.model) against its own small repository.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time

import pytest

from tests.harness import HostSpec
from tests.harness.weights_support import (
    Olah,
    StandinHub,
    argv_recorder,
    blob,
    commit_files,
    inventory,
    make_repo,
    op_status,
    pyinfra,
    random_bytes,
    settings_data,
)

MB = 1_000_000
TOKEN = "hf_specfleetTestTokenDoNotLeak0123456789"
WRONG_TOKEN = "hf_specfleetWrongTokenDoNotLeak9876543210"
HOST_OWN_TOKEN = "hf_hostOwnTokenMustStayUntouched"


def shards(prefix: str, n: int, size: int) -> dict[str, bytes]:
    files = {f"model-{i:05d}-of-{n:05d}.safetensors": random_bytes(size, f"{prefix}{i}")
             for i in range(1, n + 1)}
    files["config.json"] = json.dumps({"model_type": "test", "name": prefix}).encode()
    files["sub/tokenizer.json"] = b'{"vocab": {}}'
    return files


@pytest.fixture(scope="module")
def env(make_fleet, tmp_path_factory):
    """A fleet of two hosts, the git repos, the stand-in hub and olah on the fleet's bridge."""
    fleet = make_fleet("weights", [HostSpec("h1", disk="1G"), HostSpec("h2", disk="2M")])
    work = tmp_path_factory.mktemp("weights")
    mirrors = work / "mirrors"
    repos = {
        "tiny": make_repo(mirrors, "testorg/tiny", shards("tiny", 2, 2 * MB)),
        "resume": make_repo(mirrors, "testorg/resume", shards("resume", 6, MB)),
        "deep": make_repo(mirrors, "testorg/deep", shards("deep", 2, MB)),
        "gated": make_repo(mirrors, "testorg/gated", shards("gated", 1, MB)),
        "stall": make_repo(mirrors, "testorg/stall", shards("stall", 2, MB)),
        "follow": make_repo(mirrors, "testorg/follow", shards("follow", 1, MB)),
        "hostile": make_repo(mirrors, "testorg/hostile", shards("hostile", 1, MB)),
    }
    hub = StandinHub(mirrors, fleet.bridge_ip, work)
    olah = Olah(mirrors, fleet.bridge_ip, work)
    try:
        hub.wait("testorg/tiny")
        olah.wait("testorg/tiny")
        yield {"fleet": fleet, "work": work, "mirrors": mirrors, "repos": repos, "hub": hub,
               "olah": olah}
    finally:
        hub.stop()
        olah.stop()
        fleet.down()  # now, not at the session's end: hosts are RAM and inotify instances


def deploy(env, name: str, repo: str, per_host: dict | None = None, hosts=("h1",),
           endpoint: str | None = None, **over) -> subprocess.CompletedProcess:
    """Write an inventory for ``repo`` on ``hosts`` and run the weights deploy on it."""
    fleet = env["fleet"]
    flags = over.pop("flags", ())
    run_env = over.pop("run_env", None)
    sf = settings_data(fleet, endpoint or env["hub"].url, f"testorg/{repo}",
                       over.pop("revision", env["repos"][repo]), **over)
    inv = inventory(fleet, env["work"] / f"inv-{name}.py", per_host or {h: sf for h in hosts})
    return pyinfra(inv, *flags, env=run_env, limit=",".join(hosts) if len(hosts) == 1 else None)


def host_sha256(env, host: str, path: str) -> dict[str, str]:
    out = env["fleet"].run(host, f"cd {path} && find . -type f -not -path './.*' "
                           "-exec sha256sum {} +", check=True).stdout
    return {line.split()[1][2:]: line.split()[0] for line in out.splitlines()}


def expected_sha256(env, repo: str, rev: str) -> dict[str, str]:
    """sha256 of every file of ``repo`` at ``rev``, from git."""
    repo_dir = env["mirrors"] / "models" / "testorg" / repo
    paths = subprocess.run(["git", "-C", str(repo_dir), "ls-tree", "-r", "--name-only", rev],
                           capture_output=True, text=True, check=True).stdout.split()
    return {p: hashlib.sha256(blob(env["mirrors"], f"testorg/{repo}", rev, p)).hexdigest()
            for p in paths}


def verified_paths(env, host: str, repo: str, rev: str) -> list[str]:
    out = env["fleet"].run(host, f"cat /srv/models/testorg--{repo}/{rev}/.specfleet/"
                           "verified.jsonl 2>/dev/null || true").stdout
    return [json.loads(line)["path"] for line in out.splitlines() if line.strip()]


def active_units(fleet, pattern: str) -> list[str]:
    out = fleet.run("h1", f"systemctl list-units --plain --no-legend --state=active '{pattern}'")
    return sorted(line.split()[0] for line in out.stdout.splitlines() if line.strip())


def test_a_unit_name_left_loaded_blocks_no_download(env):
    """systemd keeps a transient unit loaded while anything refers to it (here a timer; on nspawn
    hosts also a cgroup it could not remove), and systemd-run refuses a loaded name. Each
    download run gets a new name, so neither the fixed name of earlier versions nor a run of
    its own blocks the next download."""
    fleet, rev = env["fleet"], env["repos"]["tiny"]
    legacy = "specfleet-weights-tiny-blocked"
    fleet.run("h1", f"systemd-run --quiet --on-active=1h --unit={legacy} true", check=True)
    try:
        blocked = fleet.run("h1", f"systemd-run --quiet --collect --unit={legacy} true")
        assert "already loaded" in blocked.stderr, blocked.stderr
        for _ in range(2):
            fleet.run("h1", "rm -rf /srv/models/tiny-blocked", check=True)
            r = deploy(env, "blocked", "tiny", target={"local_dir": "tiny-blocked"})
            assert r.returncode == 0, r.stdout + r.stderr
            assert op_status(r.stdout + r.stderr, "h1") == "Success"
            got = host_sha256(env, "h1", f"/srv/models/tiny-blocked/{rev}")
            assert got == expected_sha256(env, "tiny", rev)
        runs = fleet.run("h1", "journalctl --no-pager -o verbose | grep -o "
                         f"'{legacy}-run-[0-9a-f]*' | sort -u").stdout.split()
        assert len(runs) == 2, runs
    finally:
        fleet.run("h1", f"systemctl stop {legacy}.timer")


def test_olah_mirror_fresh_download_is_identical_then_noop(env):
    rev = env["repos"]["tiny"]
    r = deploy(env, "olah", "tiny", endpoint=env["olah"].url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert op_status(r.stdout + r.stderr, "h1") == "Success"
    got = host_sha256(env, "h1", f"/srv/models/testorg--tiny/{rev}")
    assert got == expected_sha256(env, "tiny", rev)
    link = env["fleet"].run("h1", "readlink /srv/models/testorg--tiny/current").stdout.strip()
    assert link == rev
    manifest = json.loads(env["fleet"].run(
        "h1", f"cat /srv/models/testorg--tiny/{rev}/.specfleet/manifest.json").stdout)
    assert manifest["complete"] and manifest["revision"] == rev
    assert set(manifest["files"]) == set(got)
    # olah has no LFS metadata: every file was checked against its git blob id.
    assert {e["hash_kind"] for e in manifest["files"].values()} == {"git"}

    again = deploy(env, "olah", "tiny", endpoint=env["olah"].url, flags=("-v",))
    assert again.returncode == 0, again.stdout + again.stderr
    out = again.stdout + again.stderr
    assert op_status(out, "h1") == "No changes"
    assert "is complete (4 files" in out


def test_allow_and_ignore_patterns(env):
    rev = env["repos"]["tiny"]
    r = deploy(env, "patterns", "tiny", target={"local_dir": "tiny-json",
                                                "allow_patterns": ["*.json", "sub/"],
                                                "ignore_patterns": ["sub/*.txt"]})
    assert r.returncode == 0, r.stdout + r.stderr
    got = host_sha256(env, "h1", f"/srv/models/tiny-json/{rev}")
    assert sorted(got) == ["config.json", "sub/tokenizer.json"]
    manifest = json.loads(env["fleet"].run(
        "h1", f"cat /srv/models/tiny-json/{rev}/.specfleet/manifest.json").stdout)
    assert sorted(manifest["files"]) == sorted(got)
    assert manifest["allow_patterns"] == ["*.json", "sub/"]


def test_standin_lfs_files_are_checked_by_sha256(env):
    rev = env["repos"]["deep"]
    r = deploy(env, "lfs", "deep")
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads(env["fleet"].run(
        "h1", f"cat /srv/models/testorg--deep/{rev}/.specfleet/manifest.json").stdout)
    kinds = {p: e["hash_kind"] for p, e in manifest["files"].items()}
    assert kinds["model-00001-of-00002.safetensors"] == "sha256"
    assert kinds["config.json"] == "git"
    assert manifest["files"]["model-00001-of-00002.safetensors"]["hash"] == hashlib.sha256(
        blob(env["mirrors"], "testorg/deep", rev, "model-00001-of-00002.safetensors")
    ).hexdigest()


def test_deep_verify_catches_a_corrupted_shard(env):
    rev = env["repos"]["deep"]
    first = deploy(env, "deep", "deep")
    assert first.returncode == 0, first.stdout + first.stderr
    shard = f"/srv/models/testorg--deep/{rev}/model-00002-of-00002.safetensors"
    # Corrupt 4 bytes in place, keeping the size and the mtime: only hashing can see it.
    env["fleet"].run("h1", "python3 -c \"import os,sys; p=sys.argv[1]; st=os.stat(p); "
                     "f=open(p,'r+b'); f.seek(1000); f.write(b'XXXX'); f.close(); "
                     f"os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\" {shard}", check=True)
    want = hashlib.sha256(blob(env["mirrors"], "testorg/deep", rev,
                               "model-00002-of-00002.safetensors")).hexdigest()
    assert env["fleet"].run("h1", f"sha256sum {shard}").stdout.split()[0] != want
    fast = deploy(env, "deep", "deep")
    assert op_status(fast.stdout + fast.stderr, "h1") == "No changes"  # the documented limit
    deep = deploy(env, "deep", "deep", weights={"verify": "deep"})
    out = deep.stdout + deep.stderr
    assert deep.returncode == 0, out
    assert "model-00002-of-00002.safetensors: corrupt (sha256" in out
    assert op_status(out, "h1") == "Success"
    assert env["fleet"].run("h1", f"sha256sum {shard}").stdout.split()[0] == want
    # Only the corrupt shard was fetched again.
    assert env["hub"].gets("testorg/deep", "model-00002-of-00002.safetensors") == 2
    assert env["hub"].gets("testorg/deep", "model-00001-of-00002.safetensors") == 1
    # A clean deep check is no change (so nothing downstream restarts for it).
    clean = deploy(env, "deep", "deep", weights={"verify": "deep"}, flags=("-v",))
    out = clean.stdout + clean.stderr
    assert op_status(out, "h1") == "No changes", out
    assert "every file re-hashed and matches the manifest" in out


def test_too_small_disk_fails_before_any_byte(env):
    hub = env["hub"]
    before = len(hub.log_lines())
    r = deploy(env, "small", "tiny", hosts=("h2",), weights={"margin_min_gib": 0.0001})
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "not enough disk space at h2:/srv/models/testorg--tiny" in out
    assert "still to download" in out and "MiB free" in out and "fix:" in out
    assert "Traceback" not in out
    assert env["fleet"].run("h2", "ls -A /srv/models").stdout.strip() == ""
    # --dry (change detection) says so too, before anything runs.
    dry = deploy(env, "small", "tiny", hosts=("h2",), weights={"margin_min_gib": 0.0001},
                 flags=("--dry",))
    out = dry.stdout + dry.stderr
    assert dry.returncode != 0
    assert "not enough disk space at h2:/srv/models/testorg--tiny" in out
    assert "Traceback" not in out
    # (a HEAD of the smallest file checks access; no file was downloaded)
    assert not any(line.startswith("GET ") and "/resolve/" in line
                   for line in hub.log_lines()[before:])


def test_unknown_repo_and_revision_give_clear_errors(env):
    r = deploy(env, "unknown", "tiny", target={"repo_id": "testorg/nope"})
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "repository testorg/nope was not found" in out and "Traceback" not in out
    r = deploy(env, "badrev", "tiny", revision="0" * 40)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"revision {'0' * 40} of testorg/tiny does not exist" in out


def test_gated_repo_errors_and_token_never_leaks(env):
    fleet, hub = env["fleet"], env["hub"]
    hub.configure(gated={"testorg/gated": [hashlib.sha256(TOKEN.encode()).hexdigest()]})
    try:
        fleet.run("h1", f"mkdir -p /root/.cache/huggingface && printf %s {HOST_OWN_TOKEN} > "
                  "/root/.cache/huggingface/token", check=True)
        # No token of ours: the host's own one is used, and it has no access -> 403 gated.
        r = deploy(env, "gated0", "gated")
        out = r.stdout + r.stderr
        assert r.returncode != 0
        assert "repository testorg/gated is gated" in out and "request access at" in out
        # The host has no token at all -> 401 gated, also named.
        fleet.run("h1", "mv /root/.cache/huggingface/token /root/hf-own.bak", check=True)
        r = deploy(env, "gated1", "gated")
        assert r.returncode != 0 and "testorg/gated is gated" in r.stdout + r.stderr
        fleet.run("h1", "mv /root/hf-own.bak /root/.cache/huggingface/token", check=True)
        # A wrong token from the control machine -> 403, named.
        r = deploy(env, "gated2", "gated", run_env={"HF_TOKEN": WRONG_TOKEN})
        assert r.returncode != 0 and "testorg/gated is gated" in r.stdout + r.stderr
        # Each refusal came from one HEAD, before any download or disk check.
        assert not any(line.startswith("GET /testorg/gated/resolve/")
                       for line in hub.log_lines())
        # The right token, with -vvv and --diff, while every argv on the host is recorded.
        with argv_recorder(fleet, "h1") as argv_log:
            r = deploy(env, "gated3", "gated", run_env={"HF_TOKEN": TOKEN},
                       flags=("-vvv", "--diff", "--debug"))
            argv = fleet.run("h1", f"cat {argv_log}").stdout
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert op_status(out, "h1") == "Success"
        # The token was sent with the last request (the hub's SENT lines, one per file body
        # served, come after its request line).
        requests = [ln for ln in hub.log_lines() if not ln.startswith("SENT ")]
        assert "auth" in requests[-1]
        assert len(argv.splitlines()) > 100  # the recorder did record
        where = {
            "pyinfra -vvv --diff --debug output": out,
            "argv of every process on the host": argv,
            "unit files": fleet.run("h1", "cat /run/systemd/transient/specfleet-weights-* "
                                    "/etc/systemd/system/specfleet-* 2>/dev/null; "
                                    "systemctl cat 'specfleet-weights-*' 2>/dev/null").stdout,
            "journal": fleet.run("h1", "journalctl --no-pager -o verbose -n 5000").stdout,
            "job and progress files": fleet.run("h1", "cat /var/lib/specfleet/weights/*").stdout,
            "models root": fleet.run("h1", "grep -r -l -a "
                                     f"{TOKEN} /srv/models || true").stdout,
        }
        for name, text in where.items():
            assert TOKEN not in text, f"the token leaked into {name}"
        modes = fleet.run("h1", "stat -c '%a %n' /var/lib/specfleet/hf /var/lib/specfleet/hf/"
                          "token /root/.cache/huggingface/token").stdout.split("\n")
        assert modes[0].startswith("700 ") and modes[1].startswith("600 ")
        assert fleet.run("h1", "cat /var/lib/specfleet/hf/token").stdout.strip() == TOKEN
        # The host's own token is never overwritten.
        own = fleet.run("h1", "cat /root/.cache/huggingface/token").stdout
        assert own == HOST_OWN_TOKEN
        # The second run is a no-op, token file included.
        again = deploy(env, "gated3", "gated", run_env={"HF_TOKEN": TOKEN})
        assert op_status(again.stdout + again.stderr, "h1") == "No changes"
        assert op_status(again.stdout + again.stderr, "h1", "Hugging Face token") == "No changes"
    finally:
        hub.configure()
        fleet.run("h1", "rm -f /root/.cache/huggingface/token /root/hf-own.bak")


def _wait_verified(env, repo: str, rev: str, at_least: int, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = verified_paths(env, "h1", repo, rev)
        if len(done) >= at_least:
            return done
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} files verified after {timeout}s")


def _start(env, name: str, repo: str, **over) -> subprocess.Popen:
    """The deploy in the background (so that it can be killed)."""
    from tests.harness.weights_support import PYINFRA, REPO_ROOT

    fleet = env["fleet"]
    sf = settings_data(fleet, env["hub"].url, f"testorg/{repo}", env["repos"][repo], **over)
    inv = inventory(fleet, env["work"] / f"inv-{name}.py", {"h1": sf})
    return subprocess.Popen([PYINFRA, "-y", "--limit", "h1", str(inv), "tests/deploys/weights_deploy.py"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _read_until(p: subprocess.Popen, text: str, timeout: float = 60) -> str:
    """The output of ``p`` up to the first line holding ``text`` (or all of it)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    out, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline and text not in out:
        if sel.select(timeout=1):
            line = p.stdout.readline()
            if not line:
                break
            out += line
    return out


def test_dropped_session_and_killed_download_resume(env):
    fleet, hub = env["fleet"], env["hub"]
    rev = env["repos"]["resume"]
    unit = "specfleet-weights-testorg--resume*"
    # The last two shards hang half-way (until the hub is reconfigured): the download cannot
    # end by itself, whatever the machine's load. The watchdog is set far beyond the test.
    stuck = ["model-00005-of-00006.safetensors", "model-00006-of-00006.safetensors"]
    hub.configure(stall=stuck, stall_count=1000)
    slow = {"poll_seconds": 0.3, "stall_minutes": 30.0}
    try:
        # 1. The control machine goes away mid-download: the unit goes on.
        p = _start(env, "resume", "resume", weights=slow)
        _wait_verified(env, "resume", rev, 1)
        p.send_signal(signal.SIGKILL)
        p.wait()
        started = active_units(fleet, unit)
        assert len(started) == 1, started
        # 2. A re-run attaches to it.
        p = _start(env, "resume", "resume", weights=slow)
        out = _read_until(p, "attaching to the running download")
        assert "attaching to the running download" in out, out
        assert started[0] in out, out
        _wait_verified(env, "resume", rev, 6)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert active_units(fleet, unit) == started
        # 3. The download itself is killed half-way.
        fleet.run("h1", f"systemctl kill --signal=KILL {started[0]}", check=True)
        time.sleep(1)
        kept = verified_paths(env, "h1", "resume", rev)
        assert sorted(kept) == sorted(set(shards("resume", 6, 1)) - set(stuck))
        mtimes = {path: fleet.run("h1", f"stat -c %Y.%y /srv/models/testorg--resume/{rev}/"
                                  f"{path}").stdout for path in kept}
        # 4. A re-run resumes: complete shards are kept, not fetched again; the partial
        # files of the killed run are removed.
        partial = fleet.run("h1", f"find /srv/models/testorg--resume/{rev}/.cache "
                            "-name '*.incomplete' | wc -l").stdout.strip()
        assert partial == "2"
        hub.configure()
        r = deploy(env, "resume", "resume")
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "removed 2 partial files" in out, out
        assert fleet.run("h1", f"find /srv/models/testorg--resume/{rev}/.cache "
                         "-name '*.incomplete' | wc -l").stdout.strip() == "0"
        for path in kept:
            assert hub.gets("testorg/resume", path) == 1, path
            assert fleet.run("h1", f"stat -c %Y.%y /srv/models/testorg--resume/{rev}/"
                             f"{path}").stdout == mtimes[path]
        for path in stuck:
            assert hub.gets("testorg/resume", path) == 2, path
        assert host_sha256(env, "h1", f"/srv/models/testorg--resume/{rev}") == expected_sha256(
            env, "resume", rev)
    finally:
        hub.configure()


def test_lost_ssh_session_leaves_the_download_running(env):
    fleet, hub = env["fleet"], env["hub"]
    rev = env["repos"]["stall"]
    unit = "specfleet-weights-drop*"
    hub.configure(stall=["model-00002-of-00002.safetensors"], stall_count=1000)
    over = {"target": {"local_dir": "drop"}, "weights": {"stall_minutes": 30.0}}
    try:
        sf = settings_data(fleet, hub.url, "testorg/stall", rev, **over)
        inv = inventory(fleet, env["work"] / "inv-drop.py", {"h1": sf})
        from tests.harness.weights_support import PYINFRA, REPO_ROOT

        p = subprocess.Popen([PYINFRA, "-y", "--limit", "h1", str(inv), "tests/deploys/weights_deploy.py"],
                             cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        _read_until(p, "downloading:")
        # Cut every SSH session on the host but the one that does the cutting.
        fleet.run("h1", "for p in $(pgrep -f 'sshd: root'); do "
                  "[ $p = $PPID ] || kill $p; done")
        out = p.communicate(timeout=120)[0]
        assert p.returncode != 0
        assert "lost the connection while watching specfleet-weights-drop" in out, out
        assert "re-run the deploy: it attaches to the running download" in out
        assert "Traceback" not in out
        assert len(active_units(fleet, unit)) == 1
    finally:
        fleet.run("h1", f"systemctl stop '{unit}'")
        hub.configure()


def test_stall_watchdog_retries_without_xet_then_fails_clearly(env):
    hub = env["hub"]
    stalled = "model-00002-of-00002.safetensors"
    hub.configure(stall=[stalled], stall_count=1)
    try:
        r = deploy(env, "stall", "stall", weights={"stall_minutes": 0.2})
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "retrying with HF_HUB_DISABLE_XET=1" in out
        assert any(line.startswith("STALL") for line in hub.log_lines())
    finally:
        hub.configure()


def test_stall_twice_is_a_clear_error(env):
    hub = env["hub"]
    hub.configure(stall=["model-00001-of-00002.safetensors"], stall_count=2)
    try:
        r = deploy(env, "stall2", "stall", target={"local_dir": "stall2"},
                   weights={"stall_minutes": 0.2})
        out = r.stdout + r.stderr
        assert r.returncode != 0
        assert "made no progress for 0.2 min, also with HF_HUB_DISABLE_XET=1" in out
        assert "a re-run resumes" in out
    finally:
        hub.configure()


def test_follow_branch_shows_a_moved_branch_and_prunes(env):
    fleet = env["fleet"]
    first = env["repos"]["follow"]
    over = {"revision": "main", "target": {"follow_branch": True},
            "weights": {"prune_other_revisions": True}}
    r = deploy(env, "follow", "follow", **over)
    assert r.returncode == 0, r.stdout + r.stderr
    second = commit_files(env["mirrors"], "testorg/follow",
                          {"model-00001-of-00001.safetensors": random_bytes(MB, "follow-2")})
    dry = deploy(env, "follow", "follow", flags=("--dry",), **over)
    out = dry.stdout + dry.stderr
    assert f"main moved from {first[:12]} to {second[:12]}: 1.0 MiB to download" in out, out
    assert f"testorg/follow@{second[:12]}: would fetch or check 3 of 3 files, 1.0 MiB" in out
    assert fleet.run("h1", "readlink /srv/models/testorg--follow/current").stdout.strip() == first
    # A server still runs on the first revision (it names it, like an SGLang unit does).
    fleet.run("h1", "systemd-run --quiet --unit=standin-server-follow "
              f"--setenv=SPECFLEET_TARGET_REVISION={first} sleep 600", check=True)
    try:
        r = deploy(env, "follow", "follow", **over)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        cur = fleet.run("h1", "readlink /srv/models/testorg--follow/current").stdout.strip()
        assert cur == second
        assert f"keeping revision {first}: in use by pid" in out
        # The files both revisions share were hard-linked, not fetched again.
        assert "2 hard-linked from other revisions" in out, out
        for shared in ("config.json", "sub/tokenizer.json"):
            inodes = fleet.run("h1", f"stat -c %i /srv/models/testorg--follow/{first}/{shared} "
                               f"/srv/models/testorg--follow/{second}/{shared}").stdout.split()
            assert len(inodes) == 2 and inodes[0] == inodes[1], shared
        assert env["hub"].gets("testorg/follow", "config.json") == 1
        assert set(fleet.run("h1", "ls /srv/models/testorg--follow").stdout.split()) == {
            first, second, "current"}
    finally:
        fleet.run("h1", "systemctl stop standin-server-follow")
    # Once nothing uses it, the old revision is pruned; never the one in use.
    r = deploy(env, "follow", "follow", **over)
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(fleet.run("h1", "ls /srv/models/testorg--follow").stdout.split()) == {
        second, "current"}
    again = deploy(env, "follow", "follow", **over)
    assert op_status(again.stdout + again.stderr, "h1") == "No changes"


def test_hostile_listing_creates_and_deletes_nothing_outside(env):
    """The Hub (here the stand-in, serving a crafted listing) names files ``../x``, ``/abs``,
    with a backslash or a newline, with the bytes of a file the host already holds verified (so
    a hard link would do): the download fails, naming the file and the repository, and nothing
    outside the revision folder is created, changed or deleted."""
    fleet, hub = env["fleet"], env["hub"]
    root = "/srv/models/testorg--hostile"
    r = deploy(env, "hostile", "hostile")
    assert r.returncode == 0, r.stdout + r.stderr
    # The tools' huggingface_hub is within the pinned range (operations/weights.py tools).
    import inspect

    from packaging.requirements import Requirement

    from operations.weights import tools

    req = Requirement(inspect.signature(tools._inner).parameters["requirement"].default)
    got = fleet.run("h1", "/opt/specfleet/tools/bin/python -c 'import importlib.metadata as m; "
                    "print(m.version(\"huggingface_hub\"))'", check=True).stdout.strip()
    assert req.specifier.contains(got), (str(req), got)
    second = commit_files(env["mirrors"], "testorg/hostile", {"README.md": b"second\n"})
    fleet.run("h1", "echo victim > /srv/models/victim.json && echo victim > /tmp/victim.json",
              check=True)
    hostile = ["../escape-rel.json", "../../../../tmp/escape-up.json", "/tmp/escape-abs.json",
               "../../victim.json", "/tmp/victim.json", "sub\\..\\..\\escape-bs.json",
               "esc\nape.json", "sub//escape.json"]
    listing = (f"find /srv/models -xdev -not -path '{root}/{second}*' \\( -type d -printf "
               "'%p d\\n' \\) -o -printf '%p %y %s %T@\\n' | sort")
    before = fleet.run("h1", listing, check=True).stdout
    hub.configure(aliases={"testorg/hostile": {name: "config.json" for name in hostile}})
    try:
        r = deploy(env, "hostile2", "hostile", revision=second)
    finally:
        hub.configure()
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "Traceback" not in out
    assert "testorg/hostile" in out and "not safe" in out, out
    assert any(repr(name) in out for name in hostile), out
    assert fleet.run("h1", listing, check=True).stdout == before
    for gone in ("/tmp/escape-up.json", "/tmp/escape-abs.json", "/srv/models/escape-bs.json"):
        assert fleet.run("h1", f"test -e {gone}").returncode != 0, gone
    for victim in ("/srv/models/victim.json", "/tmp/victim.json"):
        assert fleet.run("h1", f"cat {victim}").stdout == "victim\n", victim
    assert not set(verified_paths(env, "h1", "hostile", second)) & set(hostile)
    fleet.run("h1", "rm -f /srv/models/victim.json /tmp/victim.json")
