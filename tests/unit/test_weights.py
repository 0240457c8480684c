"""Pure parts of the weights feature: preflight, hashes, patterns, errors, facts' parsers."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from facts.weights import WeightsJob, WeightsPlan, WeightsState, parse_job
from operations.weights import (
    format_progress,
    own_units,
    read_control_token,
    run_unit,
    unit_name,
    unit_pattern,
)
from specfleet.core.errors import SpecfleetError
from specfleet.hostside.weights_agent import (
    GIB,
    classify_error,
    disk_preflight,
    git_blob_id,
    job_id,
    select_files,
)

# CT200: Kimi K2.6 (554.3 GiB) + the DFlash drafter (6.5 GiB) onto 593 GiB free.
CT200_TARGET = int(554.3 * GIB)
CT200_DRAFTER = int(6.5 * GIB)
CT200_FREE = 593 * GIB


def test_ct200_fits_with_low_headroom_warning():
    r = disk_preflight(CT200_TARGET + CT200_DRAFTER, CT200_FREE, host="ct200",
                       path="/srv/models")
    assert r["ok"] is True
    # 2 % of 560.8 GiB = 11.2 GiB, above the 10 GiB floor.
    assert r["margin_bytes"] == int((CT200_TARGET + CT200_DRAFTER) * 0.02)
    assert 5.0 < r["headroom_percent"] < 6.0
    assert len(r["warnings"]) == 1
    assert "low disk headroom at ct200:/srv/models" in r["warnings"][0]
    assert r["problem"] is None


def test_margin_floor_is_10_gib_for_small_downloads():
    r = disk_preflight(CT200_DRAFTER, 16 * GIB)
    assert r["margin_bytes"] == 10 * GIB
    assert r["ok"] is False  # 6.5 + 10 > 16
    r = disk_preflight(CT200_DRAFTER, 17 * GIB)
    assert r["ok"] is True


def test_too_small_names_numbers_host_and_path():
    r = disk_preflight(CT200_TARGET, 500 * GIB, host="gpu7", path="/srv/models/x")
    assert r["ok"] is False
    assert "gpu7:/srv/models/x" in r["problem"]
    assert "554.3 GiB still to download" in r["problem"]
    assert "500.0 GiB free" in r["problem"]
    assert "/srv/models/x" in r["fix"]


def test_margin_is_configurable():
    assert disk_preflight(100 * GIB, 105 * GIB, margin_percent=1, margin_min_gib=1)["ok"]
    assert not disk_preflight(100 * GIB, 105 * GIB)["ok"]


def test_nothing_missing_always_fits():
    r = disk_preflight(0, 0)
    assert r["ok"] and r["margin_bytes"] == 0 and not r["warnings"]


@pytest.mark.local
def test_git_blob_id_matches_git(tmp_path):
    data = b"hello\x00world\n" * 100
    (tmp_path / "f").write_bytes(data)
    want = subprocess.run(["git", "hash-object", str(tmp_path / "f")], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert git_blob_id(data) == want


def test_select_files_like_huggingface_hub():
    from huggingface_hub.utils import filter_repo_objects

    paths = ["config.json", "model-1.safetensors", "sub/tok.json", "sub/x.bin", "README.md"]
    for allow, ignore in [(None, None), (["*.json"], None), (["sub/"], ["*.bin"]),
                          (None, ["*.safetensors", "sub/*"]), (["*.md", "*.json"], ["sub/*"])]:
        want = list(filter_repo_objects(paths, allow_patterns=allow, ignore_patterns=ignore))
        assert select_files(paths, allow, ignore) == want, (allow, ignore)


def test_job_id_is_stable_and_sensitive():
    a = {"repo_id": "x/y", "revision": "a" * 40, "keep": []}
    assert job_id(a) == job_id(dict(reversed(list(a.items()))))
    assert job_id(a) != job_id({**a, "revision": "b" * 40})


class _Resp:
    def __init__(self, code):
        self.status_code = code


def _err(name, code):
    cls = type(name, (Exception,), {})
    e = cls("boom")
    e.response = _Resp(code)
    return e


@pytest.mark.parametrize("name,code,kind", [
    ("GatedRepoError", 403, "gated"),
    ("GatedRepoError", 401, "gated"),
    ("RepositoryNotFoundError", 401, "not_found"),
    ("RevisionNotFoundError", 404, "revision_not_found"),
    ("HfHubHTTPError", 500, "http"),
])
def test_classify_error_names_the_repo(name, code, kind):
    e = classify_error(_err(name, code), "z-lab/Kimi-K2.6-DFlash", "main", "https://hf.co", True)
    assert e["kind"] == kind
    assert "z-lab/Kimi-K2.6-DFlash" in e["message"] + e["fix"]


def test_classify_network_error():
    e = classify_error(ConnectionError("refused"), "a/b", "main", "http://mirror:1", False)
    assert e["kind"] == "network" and "http://mirror:1" in e["message"]


def test_control_token_from_file_then_env(tmp_path):
    f = tmp_path / "tok"
    f.write_text("hf_file\n")
    assert read_control_token(str(f), {"HF_TOKEN": "hf_env"}) == "hf_file"
    assert read_control_token(None, {"HF_TOKEN": "hf_env"}) == "hf_env"
    assert read_control_token(None, {}) is None
    with pytest.raises(SpecfleetError, match="cannot be read"):
        read_control_token(str(tmp_path / "missing"), {})


def test_unit_names_are_systemd_safe_and_new_for_each_run():
    root = "/srv/models/moonshotai--Kimi-K2.6"
    assert unit_name(root) == "specfleet-weights-moonshotai--Kimi-K2.6"
    assert unit_name("/srv/models/a b") == "specfleet-weights-a_b"
    first, second = run_unit(root), run_unit(root)
    assert first != second
    assert re.fullmatch(r"specfleet-weights-moonshotai--Kimi-K2\.6-run-[0-9a-f]{8}\.service", first)
    assert unit_pattern(root) == "specfleet-weights-moonshotai--Kimi-K2.6*"


def test_own_units_leave_other_models_that_the_glob_matches():
    root = "/srv/models/moonshotai--Kimi-K2"
    mine = run_unit(root)
    listed = [
        mine,
        "specfleet-weights-moonshotai--Kimi-K2.service",  # the fixed name of earlier versions
        "specfleet-weights-moonshotai--Kimi-K2.6.service",
        run_unit("/srv/models/moonshotai--Kimi-K2.6"),
        "specfleet-weights-moonshotai--Kimi-K2-run-nothex00.service",
    ]
    assert own_units(root, listed) == sorted([mine, "specfleet-weights-moonshotai--Kimi-K2.service"])
    assert own_units(root, []) == []


def test_parse_job_and_progress_line():
    prog = {"job_id": "j", "repo_id": "a/b", "revision": "c" * 40, "state": "downloading",
            "bytes_done": 3 * GIB, "bytes_total": 12 * GIB, "files_done": 2, "files_total": 8,
            "rate_bps": 100_000_000}
    unit = "specfleet-weights-a--b-run-0123abcd.service"
    info = parse_job([f"unit {unit}", "progress", *json.dumps(prog, indent=1).splitlines()])
    assert info["active"] and info["units"] == [unit] and info["progress"]["job_id"] == "j"
    line = format_progress(info["progress"])
    assert "3.0 GiB of 12.0 GiB (25 %)" in line and "2/8 files" in line and "100.0 MB/s" in line
    assert parse_job(["progress", json.dumps(prog)]) == {"active": False, "units": [],
                                                         "progress": prog}
    assert parse_job([]) == {"active": False, "units": [], "progress": None}
    assert parse_job([f"unit {unit}", "progress", "{cut"])["progress"] is None


def test_a_progress_line_before_the_size_is_known_has_no_zero_sizes():
    """While the agent starts and lists the repo, it knows no size yet: the line says the state,
    not "0.0 MiB of 0.0 MiB, 0/0 files"."""
    for state in ("starting", "planning"):
        prog = {"repo_id": "a/b", "requested": "main", "revision": None, "state": state,
                "bytes_done": 0, "bytes_total": 0, "files_done": 0, "files_total": 0}
        assert format_progress(prog) == f"a/b@main {state}"
    # Known, even with nothing left to fetch: the sizes are said.
    done = {"repo_id": "a/b", "revision": "c" * 40, "state": "verifying", "bytes_done": GIB,
            "bytes_total": GIB, "files_done": 1, "files_total": 1}
    assert "1.0 GiB of 1.0 GiB (100 %), 1/1 files" in format_progress(done)


@pytest.mark.local
def test_job_command_lists_units_and_reads_progress_locally(tmp_path):
    """The job command run for real: with no such unit it still prints the progress file."""
    progress = tmp_path / "p q.json"
    progress.write_text(json.dumps({"job_id": "j"}))
    cmd = WeightsJob().command(pattern="specfleet-weights-none-such*", progress_path=str(progress))
    out = subprocess.run(["sh", "-c", cmd.get_raw_value()], capture_output=True, text=True)
    assert parse_job(out.stdout.splitlines())["progress"] == {"job_id": "j"}


def test_fact_commands_quote_paths():
    cmd = WeightsState().command(path="/srv/models/a b").get_raw_value()
    assert "'/srv/models/a b'" in cmd
    cmd = WeightsJob().command(pattern="u*", progress_path="/x y.json").get_raw_value()
    assert "'/x y.json'" in cmd
    cmd = WeightsPlan().command(python="/p/bin/python", agent="/p/a.py",
                                job_json='{"a": 1}').get_raw_value()
    assert "'{\"a\": 1}'" in cmd


@pytest.mark.local
def test_state_fact_script_reads_a_tree(tmp_path):
    """The state fact's command run for real (locally) over a manifest it must check."""
    sha = "a" * 40
    rev = tmp_path / sha
    (rev / ".specfleet").mkdir(parents=True)
    (rev / "w.safetensors").write_bytes(b"x" * 10)
    (rev / "c.json").write_bytes(b"{}")
    st = (rev / "w.safetensors").stat()
    manifest = {"revision": sha, "complete": True, "bytes": 12, "files": {
        "w.safetensors": {"size": 10, "mtime_ns": st.st_mtime_ns},
        "c.json": {"size": 2, "mtime_ns": 1},
        "gone.json": {"size": 1, "mtime_ns": 1},
    }}
    (rev / ".specfleet" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "current").symlink_to(sha)
    cmd = WeightsState().command(path=str(tmp_path)).get_raw_value()
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
    fact = WeightsState().process(out.splitlines())
    assert fact["current"] == sha
    r = fact["revisions"][sha]
    assert r["complete"] and r["files"] == 3
    assert r["changed"] == ["c.json"] and r["missing"] == ["gone.json"]


def test_agent_check_rehashes_against_the_manifest(tmp_path):
    import hashlib

    from specfleet.hostside.weights_agent import cmd_check

    rev = tmp_path / ("b" * 40)
    (rev / ".specfleet").mkdir(parents=True)
    good, other = b"weights" * 1000, b'{"a": 1}'
    (rev / "w.safetensors").write_bytes(good)
    (rev / "c.json").write_bytes(other)
    files = {
        "w.safetensors": {"size": len(good), "hash_kind": "sha256",
                          "hash": hashlib.sha256(good).hexdigest()},
        "c.json": {"size": len(other), "hash_kind": "git", "hash": git_blob_id(other)},
    }
    (rev / ".specfleet" / "manifest.json").write_text(
        json.dumps({"complete": True, "files": files}))
    assert cmd_check(str(rev)) == {"checked": 2, "bad": {}, "error": None}
    (rev / "w.safetensors").write_bytes(b"X" + good[1:])  # same size, other bytes
    bad = cmd_check(str(rev))["bad"]
    assert list(bad) == ["w.safetensors"] and bad["w.safetensors"].startswith("sha256 ")
    assert cmd_check(str(tmp_path / "nope"))["error"] == "no complete manifest"


@pytest.mark.local
def test_pids_using_sees_cwd_open_files_and_argv(tmp_path):
    import os
    import subprocess as sp
    import sys
    import time

    from specfleet.hostside.weights_agent import pids_using

    sha = os.urandom(20).hex()  # unique: other processes must not name it
    rev = tmp_path / sha
    rev.mkdir()
    (rev / "w.bin").write_bytes(b"x")
    assert pids_using(str(rev)) == []
    holders = [
        sp.Popen(["sleep", "30"], cwd=rev),
        sp.Popen(["sh", "-c", "exec 3<w.bin; cd /; exec sleep 30"], cwd=rev),
        sp.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--model-path",
                  f"/srv/x/{sha}"], cwd="/"),
    ]
    try:
        time.sleep(0.3)
        assert {h.pid for h in holders} <= set(pids_using(str(rev)))
    finally:
        for h in holders:
            h.kill()
            h.wait()
    assert pids_using(str(rev)) == []


def test_plan_reuses_verified_files_of_other_revisions(tmp_path):
    import hashlib
    import os

    from specfleet.hostside.weights_agent import plan

    old, new = "1" * 40, "2" * 40
    shared, changed = b"same bytes" * 100, b"new bytes" * 100
    (tmp_path / old / ".specfleet").mkdir(parents=True)
    (tmp_path / old / "w.safetensors").write_bytes(shared)
    st = os.stat(tmp_path / old / "w.safetensors")
    entry = {"path": "w.safetensors", "size": len(shared), "mtime_ns": st.st_mtime_ns,
             "hash_kind": "sha256", "hash": hashlib.sha256(shared).hexdigest(), "at": 1.0}
    (tmp_path / old / ".specfleet" / "verified.jsonl").write_text(json.dumps(entry) + "\n")
    files = [
        {"path": "w.safetensors", "size": len(shared), "blob_id": "x",
         "sha256": hashlib.sha256(shared).hexdigest()},
        {"path": "c.json", "size": len(changed), "blob_id": git_blob_id(changed)},
    ]
    job = {"repo_id": "a/b", "revision": new, "root": str(tmp_path)}
    p = plan(job, listing=(new, files))
    assert p["missing"] == ["w.safetensors", "c.json"]
    assert p["reuse"] == {"w.safetensors": str(tmp_path / old / "w.safetensors")}
    assert p["missing_bytes"] == len(changed)  # only what must be downloaded
    # Deep verification trusts nothing it has not hashed in this run: no reuse.
    assert plan({**job, "verify": "deep"}, listing=(new, files))["reuse"] == {}
    # A source that changed since it was verified is not reused.
    os.utime(tmp_path / old / "w.safetensors", ns=(1, 1))
    assert plan(job, listing=(new, files))["reuse"] == {}


@pytest.mark.local
def test_tools_pin_huggingface_hub_to_a_tested_range():
    """The hosts' huggingface_hub is pinned with an upper bound (a major release may change the
    API the weights agent uses), and the range holds the versions the agent is tested with: the
    control machine's and the fleet wheelhouse's (tests/harness/wheelhouse.py)."""
    import inspect
    from importlib.metadata import version

    from packaging.requirements import Requirement

    from operations.weights import tools
    from tests.harness.wheelhouse import ensure_wheelhouse

    req = Requirement(inspect.signature(tools._inner).parameters["requirement"].default)
    assert req.name == "huggingface_hub"
    assert any(s.operator in ("<", "<=", "~=", "==") for s in req.specifier), str(req)
    assert req.specifier.contains(version("huggingface_hub"))
    wheels = sorted(ensure_wheelhouse().glob("huggingface_hub-*.whl"))
    assert wheels, "the fleet wheelhouse holds no huggingface_hub wheel to check the pin against"
    for whl in wheels:
        assert req.specifier.contains(whl.name.split("-")[1]), (str(req), whl.name)
    for old in ("0.25.2", "3.0.0"):
        assert not req.specifier.contains(old), old


@pytest.mark.parametrize("installed,pip", [("3.1.0", True), ("0.20.0", True), ("2.4.0", False),
                                           (None, True)])
def test_tools_installs_huggingface_hub_again_outside_the_range(installed, pip):
    """A tools venv whose huggingface_hub is outside the pinned range gets one within it."""
    import hashlib

    from pyinfra.api import StringCommand
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra_testing.util import FakeState, create_host, get_command_string

    from operations.weights import agent_source, tools

    info = {"path": "/opt/specfleet/tools", "huggingface_hub": installed,
            "agent_sha256": hashlib.sha256(agent_source().encode()).hexdigest()}
    host = create_host(FakeState(), facts={
        "weights.WeightsTools": {"path=/opt/specfleet/tools": info}})
    with ctx_state.use(FakeState()), ctx_host.use(host):
        commands = [get_command_string(c) for c in tools._inner(find_links="http://10.1.1.1/")
                    if isinstance(c, StringCommand)]
    pips = [c for c in commands if "/bin/pip install" in c]
    assert bool(pips) == pip, commands
    for c in pips:
        assert c.endswith("'huggingface_hub>=0.26,<3'"), c

