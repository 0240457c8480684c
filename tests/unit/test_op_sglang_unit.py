"""specfleet.core.sglang and operations.sglang_commands: the pure decisions, the patch filter, and the shell scripts run with
real GNU patch and tar in a temporary directory (no host, no pyinfra state)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from facts.sglang import PatchCheck, PatchState, Venv
from operations.sglang_commands import (
    apply_script,
    forget_script,
    pinned_install_script,
    restore_script,
)
from specfleet.core.sglang.install import (
    PATCH_STATE_DIR,
    decide_compressed_tensors,
    decide_install,
    git_requirement,
    is_commit,
    parse_ls_remote,
    split_git_url,
)
from specfleet.core.sglang.patch import (
    PatchFormatError,
    filter_patch,
    parse_patch_failures,
)
from specfleet.core.sglang.pr20547.decision import PortVerdict, conflict_message, decide_pr20547
from specfleet.core.tables.sglang_versions import compressed_tensors_specifier

ENVIRON = """\
class Envs:
    SGLANG_USE_MODELSCOPE = EnvBool(False)
    SGLANG_ENABLE_SPEC_V2 = EnvBool(False)
    SGLANG_LOG_GC = EnvBool(False)
"""

# A git format-patch mail: a preamble with a diffstat, package files, a benchmark file, the
# pyproject, a removed line that starts with "-- " (must not be taken for a header) and a mail
# signature at the end.
PATCH = """\
From e67a0d488 Mon Sep 17 00:00:00 2001
From: Someone <s@example.com>
Subject: [PATCH] dflash v2

---
 benchmark/dflash/bench.py                  | 2 ++
 python/pyproject.toml                      | 2 +-
 python/sglang/srt/environ.py               | 1 +
 python/sglang/srt/speculative/dflash_worker_v2.py | 3 +++
 4 files changed

diff --git a/benchmark/dflash/bench.py b/benchmark/dflash/bench.py
new file mode 100644
index 0000000..1111111
--- /dev/null
+++ b/benchmark/dflash/bench.py
@@ -0,0 +1,2 @@
+print("bench")
+print("more")
diff --git a/python/pyproject.toml b/python/pyproject.toml
index 2222222..3333333 100644
--- a/python/pyproject.toml
+++ b/python/pyproject.toml
@@ -1,2 +1,2 @@
 [project]
-version = "0.5.11"
+version = "0.5.11.dev0"
diff --git a/python/sglang/srt/environ.py b/python/sglang/srt/environ.py
index 4444444..5555555 100644
--- a/python/sglang/srt/environ.py
+++ b/python/sglang/srt/environ.py
@@ -1,4 +1,5 @@
 class Envs:
     SGLANG_USE_MODELSCOPE = EnvBool(False)
     SGLANG_ENABLE_SPEC_V2 = EnvBool(False)
+    SGLANG_ENABLE_DFLASH_SPEC_V2 = EnvBool(False)
     SGLANG_LOG_GC = EnvBool(False)
diff --git a/python/sglang/srt/speculative/dflash_worker_v2.py b/python/sglang/srt/speculative/dflash_worker_v2.py
new file mode 100644
index 0000000..6666666
--- /dev/null
+++ b/python/sglang/srt/speculative/dflash_worker_v2.py
@@ -0,0 +1,3 @@
+-- not a header
+class DFlashWorkerV2:
+    pass
--
2.39.2

"""


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
        for name in dirnames:
            h.update(str((Path(dirpath) / name).relative_to(root)).encode() + b"/\0")
    return h.hexdigest()


def make_site(tmp_path: Path) -> Path:
    site = tmp_path / "venv/lib/python3.11/site-packages"
    (site / "sglang/srt/speculative").mkdir(parents=True)
    (site / "sglang/srt/environ.py").write_text(ENVIRON)
    (site / "sglang/srt/speculative/dflash_worker.py").write_text("class DFlashWorker: ...\n")
    return site


def sh(script, **kw) -> subprocess.CompletedProcess:
    if not isinstance(script, str):
        script = script.get_raw_value()  # a fact's StringCommand
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, **kw)


# --- the patch filter -----------------------------------------------------------------------------


def test_filter_keeps_only_package_files_mapped_onto_site_packages():
    fp = filter_patch(PATCH)
    assert [(f.path, f.kind) for f in fp.files] == [
        ("sglang/srt/environ.py", "modify"),
        ("sglang/srt/speculative/dflash_worker_v2.py", "create"),
    ]
    assert fp.dropped == ("benchmark/dflash/bench.py", "python/pyproject.toml")
    assert "python/" not in fp.text and "benchmark" not in fp.text and "From:" not in fp.text
    assert "--- a/sglang/srt/environ.py\n+++ b/sglang/srt/environ.py\n" in fp.text
    assert "--- /dev/null\n+++ b/sglang/srt/speculative/dflash_worker_v2.py\n" in fp.text
    # The removed-looking line inside a hunk is content, kept as is; the signature is gone.
    assert "+-- not a header\n" in fp.text and "2.39.2" not in fp.text
    assert fp.existing == ["sglang/srt/environ.py"]
    assert fp.created == ["sglang/srt/speculative/dflash_worker_v2.py"]
    assert fp.hunks == 2
    assert "leaves out 2: benchmark/dflash/bench.py, python/pyproject.toml" in fp.summary()


def test_filter_plain_unified_diff_and_deletion():
    plain = (
        "--- a/python/sglang/x.py\t2026-01-01\n+++ b/python/sglang/x.py\t2026-01-02\n"
        "@@ -1 +1 @@\n-a\n+b\n"
        "--- a/python/sglang/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
        "--- a/docs/x.md\n+++ b/docs/x.md\n@@ -1 +1 @@\n-a\n+b\n"
    )
    fp = filter_patch(plain)
    assert [(f.path, f.kind) for f in fp.files] == [
        ("sglang/x.py", "modify"),
        ("sglang/gone.py", "delete"),
    ]
    assert fp.dropped == ("docs/x.md",)
    assert "+++ /dev/null\n" in fp.text and "--- a/sglang/x.py\n" in fp.text


def test_filter_refuses_a_patch_with_nothing_for_the_package():
    with pytest.raises(PatchFormatError, match="no file under python/sglang/"):
        filter_patch("--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-a\n+b\n")


def test_filter_refuses_a_truncated_patch():
    with pytest.raises(PatchFormatError, match="truncated"):
        filter_patch("--- a/python/sglang/x.py\n+++ b/python/sglang/x.py\n@@ -1,3 +1,3 @@\n a\n")


# --- GNU patch, for real, on a temporary site-packages -----------------------------------------


@pytest.mark.local
def test_apply_and_restore_scripts_round_trip(tmp_path):
    site = make_site(tmp_path)
    before = tree_hash(site)
    fp = filter_patch(PATCH)
    d = tmp_path / "venv" / PATCH_STATE_DIR
    d.mkdir(parents=True)
    (d / "applied.diff").write_text(fp.text)
    r = sh(apply_script(str(d), str(site), fp))
    assert r.returncode == 0, r.stderr
    assert not (d / "conflict").exists()
    assert "SGLANG_ENABLE_DFLASH_SPEC_V2" in (site / "sglang/srt/environ.py").read_text()
    assert (site / "sglang/srt/speculative/dflash_worker_v2.py").exists()
    assert not list(site.rglob("*.orig")) and not list(site.rglob("*.rej"))
    assert not (site / "benchmark").exists() and not (site.parent / "benchmark").exists()
    (d / "sha256").write_text("ab" * 32 + "\n")

    # The PatchState fact's command, run here: the marker is confirmed by a reverse dry run.
    fact = PatchState()
    out = sh(fact.command(str(tmp_path / "venv")))
    state = fact.process(out.stdout.splitlines())
    assert state["sha256"] == "ab" * 32 and state["intact"] is True
    assert state["site"] == str(site)

    r = sh(restore_script(str(d)))
    assert r.returncode == 0, r.stderr
    assert tree_hash(site) == before
    assert not d.exists()
    assert fact.process(sh(fact.command(str(tmp_path / "venv"))).stdout.splitlines()) is None


@pytest.mark.local
def test_created_directories_are_removed_on_restore(tmp_path):
    site = make_site(tmp_path)
    before = tree_hash(site)
    text = (
        "--- /dev/null\n+++ b/python/sglang/srt/speculative/triton_ops/fused.py\n"
        "@@ -0,0 +1 @@\n+x = 1\n"
    )
    fp = filter_patch(text)
    d = tmp_path / "state"
    d.mkdir()
    (d / "applied.diff").write_text(fp.text)
    assert sh(apply_script(str(d), str(site), fp)).returncode == 0
    assert (site / "sglang/srt/speculative/triton_ops/fused.py").exists()
    assert sh(restore_script(str(d))).returncode == 0
    assert tree_hash(site) == before


@pytest.mark.local
def test_conflict_is_a_dry_run_only_and_names_files_and_hunks(tmp_path):
    site = make_site(tmp_path)
    (site / "sglang/srt/environ.py").write_text(ENVIRON.replace("SGLANG_ENABLE_SPEC_V2", "OTHER"))
    (site / "sglang/srt/speculative/dflash_worker_v2.py").write_text("already here\n")
    before = tree_hash(site)
    fp = filter_patch(PATCH)

    # PatchCheck (the op's pre-check): the diff on stdin, nothing written.
    check = PatchCheck()
    r = subprocess.run(
        ["sh", "-c", check.command(str(site))], input=fp.text, capture_output=True, text=True
    )
    result = check.process(r.stdout.splitlines())
    assert result["applies"] is False
    failures = parse_patch_failures(result["output"])
    assert failures == {
        "sglang/srt/environ.py": ["hunk #1 FAILED at line 1"],
        "sglang/srt/speculative/dflash_worker_v2.py": ["already exists"],
    }
    assert tree_hash(site) == before

    # The apply script's own dry run: exits 0, leaves the conflict for the verify step.
    d = tmp_path / "state"
    d.mkdir()
    (d / "applied.diff").write_text(fp.text)
    r = sh(apply_script(str(d), str(site), fp))
    assert r.returncode == 0
    assert tree_hash(site) == before
    state = PatchState().process(["partial=1"] + [f"conflict:{x}" for x in r.stdout.splitlines()])
    assert parse_patch_failures(state["conflict"]) == failures

    msg = conflict_message("0.5.11", str(site), "cd" * 32, failures, "keep-v1")
    assert "sglang/srt/environ.py: hunk #1 FAILED at line 1" in msg
    assert "dflash_worker_v2.py: already exists" in msg
    assert "install is unchanged" in msg and ">=0.5.14 has the DFlash v2 worker" in msg
    assert "v1 with overlap scheduling off" in msg


@pytest.mark.local
def test_missing_file_and_reversed_patch_are_named(tmp_path):
    site = make_site(tmp_path)
    fp = filter_patch(PATCH)
    assert sh(f"cd {site} && patch -p1 -s < /dev/stdin", input=fp.text).returncode == 0
    (site / "sglang/srt/speculative/dflash_worker_v2.py").unlink()
    r = subprocess.run(
        ["sh", "-c", PatchCheck().command(str(site))], input=fp.text, text=True,
        capture_output=True,
    )  # fmt: skip
    failures = parse_patch_failures(PatchCheck().process(r.stdout.splitlines())["output"])
    assert failures["sglang/srt/environ.py"] == ["already applied (reversed patch detected)"]
    (site / "sglang/srt/environ.py").unlink()
    r = subprocess.run(
        ["sh", "-c", PatchCheck().command(str(site))], input=fp.text, text=True,
        capture_output=True,
    )  # fmt: skip
    failures = parse_patch_failures(PatchCheck().process(r.stdout.splitlines())["output"])
    assert failures["sglang/srt/environ.py"] == ["file not found"]


# --- decisions ------------------------------------------------------------------------------------


def test_decide_install_from_an_index():
    d = decide_install(None, None, version="0.5.11")
    assert d.action == "install" and "not installed" in d.reason
    assert decide_install("0.5.11", None, version="0.5.11").action == "noop"
    # packaging, not strings: a local label satisfies the pin, a zero suffix is equal.
    assert decide_install("0.5.11+cu128", None, version="0.5.11").action == "noop"
    assert decide_install("0.5.11.0", None, version="0.5.11").action == "noop"
    up = decide_install("0.5.11", None, version="0.5.14")
    assert up.action == "install" and "settings pin 0.5.14" in up.reason
    git_build = decide_install("0.5.11", {"url": "x", "commit": "a" * 40}, version="0.5.11")
    assert git_build.action == "reinstall"


def test_decide_install_from_git_keys_on_the_commit():
    url = "git+file:///srv/git/sglang.git#subdirectory=python"
    a, b = "a" * 40, "b" * 40
    same = decide_install("0.5.9", {"url": "file:///srv/git/sglang.git", "commit": a},
                            version="0.5.11", git_url=url, commit=a)  # fmt: skip
    assert same.action == "noop" and "/srv/git/sglang.git at aaaaaaaaaaaa" in same.reason
    moved = decide_install(
        "0.5.9", {"url": "u", "commit": b}, version=None, git_url=url, commit=a
    )
    assert moved.action == "reinstall" and "bbbbbbbbbbbb" in moved.reason
    release = decide_install("0.5.11", None, version="0.5.11", git_url=url, commit=a)
    assert release.action == "reinstall"
    assert decide_install(None, None, version=None, git_url=url, commit=a).action == "install"


def test_git_requirement_and_ls_remote():
    url = "https://github.com/sgl-project/sglang.git#subdirectory=python"
    assert split_git_url("git+" + url) == (
        "https://github.com/sgl-project/sglang.git",
        "#subdirectory=python",
    )
    assert git_requirement(url, "c" * 40) == (
        f"git+https://github.com/sgl-project/sglang.git@{'c' * 40}#subdirectory=python"
    )
    lines = [
        f"{'1' * 40}\trefs/heads/main",
        f"{'2' * 40}\trefs/tags/v1",
        f"{'3' * 40}\trefs/tags/v1^{{}}",
        f"{'4' * 40}\trefs/pull/20547/head",
    ]
    assert parse_ls_remote(lines, "main") == "1" * 40
    assert parse_ls_remote(lines, "v1") == "3" * 40  # the commit, not the tag object
    assert parse_ls_remote(lines, "refs/pull/20547/head") == "4" * 40
    assert parse_ls_remote(lines, "nope") is None
    assert is_commit("A" * 40) and not is_commit("main")


def test_decide_compressed_tensors_uses_the_version_table():
    d, spec = decide_compressed_tensors("0.9.4", "0.5.11")
    assert spec == compressed_tensors_specifier("0.5.11")
    assert d.action == "install" and "0.9.4 is outside" in d.reason
    assert decide_compressed_tensors("0.18.0", "0.5.11")[0].action == "noop"
    assert decide_compressed_tensors("0.14.0.1", "0.5.11")[0].action == "install"
    assert decide_compressed_tensors(None, "0.5.11")[0].action == "install"
    d, spec = decide_compressed_tensors("0.15.0.1", "0.5.23")
    assert spec == SpecifierSet("==0.18.0") and d.action == "install"
    # A user-given specifier overrides the table.
    d, spec = decide_compressed_tensors("0.9.4", "0.5.11", override=">=0.9,<0.10")
    assert d.action == "noop" and spec == SpecifierSet(">=0.9,<0.10")
    with pytest.raises(ValueError, match="not a version specifier"):
        decide_compressed_tensors("0.9.4", "0.5.11", override="latest please")


V1 = {"version": "0.5.11", "location": "/x", "features": {"dflash": "v1", "dflash_pr20547": False}}
V2 = {"version": "0.5.14", "location": "/x", "features": {"dflash": "v2", "dflash_pr20547": False}}
SHA, OTHER = "a" * 64, "b" * 64
APPLIED = {"sha256": SHA, "site": "/x", "intact": True, "partial": False}


PORT = PortVerdict(True, port_id=SHA, text="the PR#20547 port for SGLang 0.5.11 (5 PR hunks)")
OTHER_PORT = PortVerdict(True, port_id=OTHER, text="the PR#20547 port for SGLang 0.5.11 (6)")
NO_PORT = PortVerdict(False, text="this project has no port of PR#20547 for SGLang 0.5.12",
                      fix="set sglang.version >= 0.5.14")  # fmt: skip


@pytest.mark.parametrize(
    "install, marker, present, opted_in, port, steps, row, words",
    [
        (V1, None, True, True, PORT, ("apply",), "apply port", "applies the PR#20547 port"),
        (V1, None, True, False, None, (), "keep v1", "PR#20547 is not opted in"),
        (V1, None, True, True, NO_PORT, (), "keep v1", "no port of PR#20547 for SGLang 0.5.12"),
        (V2, None, True, True, None, (), "built in", "has the DFlash v2 worker"),
        ({**V1, "features": {"dflash": "v2", "dflash_pr20547": True}}, None, True, True, None, (),
         "built in", "PR#20547 built in"),
        (V1, APPLIED, True, True, PORT, (), "applied", "is applied"),
        (V1, APPLIED, True, True, OTHER_PORT, ("restore", "apply"), "apply port", "replaces it"),
        (V1, {**APPLIED, "intact": False}, True, True, PORT, ("drop-marker", "apply"),
         "apply port", "applies"),
        (V1, {"partial": True}, True, True, PORT, ("restore", "apply"), "apply port", "applies"),
        (V1, {"partial": True}, False, True, PORT, ("restore",), "keep v1", "not opted in"),
        (V1, APPLIED, False, True, PORT, ("restore",), "remove", "removes PR#20547 port aaaa"),
        (V1, APPLIED, True, False, None, ("restore",), "remove", "removes"),
        (V1, None, False, False, None, (), "keep v1", "keeps DFLASH v1"),
        (V1, {"rejected": SHA}, True, True, PORT, (), "keep v1", "failed the readiness gate"),
        (V1, {"rejected": OTHER}, True, True, PORT, ("apply",), "apply port", "applies"),
        ({**V1, "features": {"dflash": "v1", "dflash_v2_missing": ["spec_info.py does not route"]}},
         None, True, False, None, (), "keep v1", "not wired in: spec_info.py does not route"),
    ],
)  # fmt: skip
def test_decide_pr20547(install, marker, present, opted_in, port, steps, row, words):
    d = decide_pr20547(install, marker, present=present, opted_in=opted_in, port=port)
    assert d.steps == steps
    assert d.row == row
    assert words in d.reason
    if row == "keep v1":
        assert d.fix and "\n" not in d.reason


def test_an_apply_killed_after_it_patched_is_restored_and_applied_again():
    """The control machine died after the apply had wired the v2 worker in, before its marker
    (found by bench/drills ctl-kill-patch): the tree shows v2, yet it is our half-done port, not
    SGLang's. The release's features decide: restore, then apply, in one run."""
    ours = {**V1, "features": {"dflash": "v2", "dflash_pr20547": True}}
    d = decide_pr20547(ours, {"partial": True}, present=True, opted_in=True, port=PORT,
                       release_features=V1["features"])
    assert (d.steps, d.row) == (("restore", "apply"), "apply port")
    gone = decide_pr20547(ours, {"partial": True}, present=False, opted_in=True, port=None,
                          release_features=V1["features"])
    assert (gone.steps, gone.row) == (("restore",), "keep v1")


@pytest.mark.local
def test_venv_fact_parses_its_own_command_output(tmp_path):
    fact = Venv()
    assert fact.process(sh(fact.command(str(tmp_path / "none"))).stdout.splitlines()) is None
    (tmp_path / "plain").mkdir()
    out = sh(fact.command(str(tmp_path / "plain"))).stdout.splitlines()
    assert fact.process(out) == {"python": None}
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    os.symlink(shutil.which("python3"), venv / "bin/python")
    assert fact.process(sh(fact.command(str(venv))).stdout.splitlines())["python"].startswith("3.")


@pytest.mark.local
def test_stale_marker_after_a_reinstall_finds_and_removes_only_its_leftovers(tmp_path):
    site = make_site(tmp_path)
    before = tree_hash(site)
    fp = filter_patch(PATCH)
    venv = tmp_path / "venv"
    d = venv / PATCH_STATE_DIR
    d.mkdir(parents=True)
    (d / "applied.diff").write_text(fp.text)
    assert sh(apply_script(str(d), str(site), fp)).returncode == 0
    (d / "sha256").write_text("ab" * 32 + "\n")
    # pip reinstalls SGLang under the patch: environ.py is the release's again, the added worker
    # is not in RECORD and stays. A file pip would own (same path, other bytes) is not ours.
    (site / "sglang/srt/environ.py").write_text(ENVIRON)
    fact = PatchState()
    state = fact.process(sh(fact.command(str(venv))).stdout.splitlines())
    assert state["intact"] is False
    assert state["leftovers"] == ["sglang/srt/speculative/dflash_worker_v2.py"]

    # The leftover worker is not wired in, so the facts say v1: the port is applied again.
    d1 = decide_pr20547(V1, state, present=True, opted_in=True, port=PORT)
    assert d1.steps == ("drop-marker", "apply") and "no longer matches" in d1.warning
    d2 = decide_pr20547(V1, state, present=False, opted_in=False, port=None)
    assert d2.steps == ("drop-marker",)

    assert sh(forget_script(str(d))).returncode == 0
    assert tree_hash(site) == before and not d.exists()


@pytest.mark.local
def test_forget_keeps_a_file_that_is_no_longer_ours(tmp_path):
    site = make_site(tmp_path)
    fp = filter_patch(PATCH)
    d = tmp_path / "state"
    d.mkdir()
    (d / "applied.diff").write_text(fp.text)
    assert sh(apply_script(str(d), str(site), fp)).returncode == 0
    worker = site / "sglang/srt/speculative/dflash_worker_v2.py"
    worker.write_text("# shipped by a newer SGLang\n")
    assert sh(forget_script(str(d))).returncode == 0
    assert worker.read_text() == "# shipped by a newer SGLang\n" and not d.exists()


# --- the constrained install + pip check, with real pip in a throwaway venv ------------------------


def tiny_wheel(where: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal pure-Python wheel (a stand-in distribution: only pip's resolver is under test)."""
    import base64
    import zipfile

    mod = name.replace("-", "_")
    dist = f"{mod}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{mod}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}.dist-info/METADATA": meta,
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(where / f"{dist}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            data = text.encode()
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(data)}")
        record.append(f"{dist}.dist-info/RECORD,,")
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")


# pip without this machine's own configuration (find-links, constraints): only the test's wheels.
PIP_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}


@pytest.fixture(scope="module")
def venv_and_wheels(tmp_path_factory):
    root = tmp_path_factory.mktemp("pinned")
    wheels = root / "wheels"
    wheels.mkdir()
    tiny_wheel(wheels, "sf-torch", "2.11.0")
    tiny_wheel(wheels, "sf-torch", "2.14.1")
    tiny_wheel(wheels, "sf-broken", "1.0", ("sf-absent>=1",))
    tiny_wheel(wheels, "sf-ct", "0.9.4", ("sf-torch",))
    tiny_wheel(wheels, "sf-ct", "0.18.0", ("sf-torch",))
    tiny_wheel(wheels, "sf-ct", "0.19.0", ("sf-torch>=2.14",))
    tiny_wheel(wheels, "sf-ct", "0.19.1", ("sf-absent>=1",))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=PIP_ENV)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-index", "-f", str(wheels)]
    subprocess.run([*pip, "sf-torch==2.11.0", "sf-ct==0.9.4"], check=True, env=PIP_ENV)
    # A problem that was there before: pip check reports it, the op must not blame itself.
    subprocess.run([*pip, "--no-deps", "sf-broken"], check=True, env=PIP_ENV)
    return venv, wheels


def _pinned(venv: Path, wheels: Path, spec: str) -> subprocess.CompletedProcess:
    script = pinned_install_script(
        str(venv / "bin/python"), ["--no-index", "--find-links", str(wheels)], "sf-ct", spec
    )
    return sh(script, env=PIP_ENV)


def _versions(venv: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True, text=True, check=True, env=PIP_ENV,
    ).stdout  # fmt: skip
    return dict(line.split("==") for line in out.split())


@pytest.mark.local
def test_pinned_install_moves_only_the_pinned_dist_and_checks(venv_and_wheels):
    venv, wheels = venv_and_wheels
    # 0.19.0 would need sf-torch 2.14: the constraints hold torch, so the resolver refuses.
    r = _pinned(venv, wheels, "==0.19.0")
    assert r.returncode != 0
    assert _versions(venv)["sf-torch"] == "2.11.0" and _versions(venv)["sf-ct"] == "0.9.4"
    # Into range: the newest that fits the pins, torch unmoved; the old pip check problem is
    # reported, not fatal.
    r = _pinned(venv, wheels, ">=0.10,<0.19.1")
    assert r.returncode == 0, r.stderr
    assert _versions(venv)["sf-ct"] == "0.18.0" and _versions(venv)["sf-torch"] == "2.11.0"
    assert "only problems that were there before" in r.stdout and "sf-broken" in r.stdout
    # A problem the install brings (forced in with --no-deps here) fails it.
    script = pinned_install_script(
        str(venv / "bin/python"),
        ["--no-index", "--find-links", str(wheels), "--no-deps"],
        "sf-ct",
        "==0.19.1",
    )
    r = sh(script, env=PIP_ENV)
    assert r.returncode == 1
    assert "pip check: installing sf-ct broke:" in r.stderr and "sf-absent" in r.stderr
