"""A rollback point keeps both patch states (PR#20547's port and the drafter RoPE patch, issue
#52) and puts each back: the checkpoint, the ``RollbackState`` fact and the reapply script run by
a real shell, with real GNU patch, on a stand-in venv whose ``models/dflash.py`` is patched by the
deploy's own journaled apply script (milliseconds; no wheel).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from facts.rollback import RollbackState, parse_rollback_state
from facts.sglang import RopePatchState
from operations.rollback import checkpoint_script, drift, reapply_script
from operations.sglang_commands import apply_script, restore_script
from specfleet.core.layout import RollbackPaths, patch_state_dir, rope_state_dir
from specfleet.core.sglang.patch import filter_patch

TARGET = "sglang/srt/models/dflash.py"
CREATED = "sglang/srt/models/dflash_rope_extra.py"
ORIGINAL = "a = 1\nrope_theta = getattr(config, 'rope_theta', 1000000)\nb = 2\n"
PATCHED = "a = 1\nrope_theta, rope_scaling = get_rope_config(config)\nb = 2\n"
DIFF = (
    f"--- a/{TARGET}\n+++ b/{TARGET}\n@@ -1,3 +1,3 @@\n a = 1\n"
    "-rope_theta = getattr(config, 'rope_theta', 1000000)\n"
    "+rope_theta, rope_scaling = get_rope_config(config)\n b = 2\n"
    f"--- /dev/null\n+++ b/{CREATED}\n@@ -0,0 +1 @@\n+x = 1\n"
)
MARKER = "4e07" * 16


def sh(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)


@pytest.fixture
def host(tmp_path):
    """A venv with SGLang's ``models/dflash.py`` as the wheel has it (no python: no pins)."""
    venv = tmp_path / "venv"
    site = venv / "lib/python3.11/site-packages"
    (site / TARGET).parent.mkdir(parents=True)
    (site / TARGET).write_text(ORIGINAL)
    rp = RollbackPaths(directory=str(tmp_path / "rollback/svc"), wheels=str(tmp_path / "wheels"))
    return venv, site, rp


def apply_rope(venv: Path, site: Path) -> None:
    """What ``sglang.dflash_rope`` does: the journaled apply, then the marker."""
    d = Path(rope_state_dir(str(venv)))
    d.mkdir(parents=True)
    diff = filter_patch(DIFF, site_paths=True)
    (d / "applied.diff").write_text(diff.text)
    r = sh(apply_script(str(d), str(site), diff))
    assert r.returncode == 0 and not (d / "conflict").exists(), r.stdout + r.stderr
    (d / "sha256").write_text(MARKER + "\n")


def state(venv: Path, rp: RollbackPaths) -> dict:
    command = RollbackState().command(rp.directory, "/nonexistent/unit", "/nonexistent/env",
                                      "/nonexistent/secret", str(venv), rp.wheels)  # fmt: skip
    r = sh(command)
    assert r.returncode == 0, r.stderr
    return parse_rollback_state(r.stdout.splitlines())


def checkpoint(venv: Path, rp: RollbackPaths) -> None:
    live = {k: f"/nonexistent/{k}" for k in ("unit", "env", "secret", "log_config", "log_module")}
    r = sh(checkpoint_script(rp, live, str(venv), "run-1"))
    assert r.returncode == 0, r.stderr


def rope_marker(venv: Path) -> dict | None:
    fact = RopePatchState()
    return fact.process(sh(fact.command(str(venv))).stdout.splitlines())


def reapply(venv: Path, rp: RollbackPaths) -> subprocess.CompletedProcess:
    return sh(reapply_script(rp.file("rope"), rope_state_dir(str(venv)), "the drafter RoPE patch"))


@pytest.mark.local
def test_a_point_keeps_the_rope_state_and_a_patch_applied_since_is_drift(host):
    venv, site, rp = host
    checkpoint(venv, rp)
    value = state(venv, rp)
    assert value["saved"]["rope"] is None and value["current"]["rope"] is None
    assert drift(value) == []
    apply_rope(venv, site)
    value = state(venv, rp)
    assert value["current"]["rope"] == MARKER and value["saved"]["rope"] is None
    assert drift(value) == ["the drafter RoPE patch state"]
    checkpoint(venv, rp)
    value = state(venv, rp)
    assert value["saved"]["rope"] == MARKER and drift(value) == []
    # The port's folder is another: the RoPE patch is not taken for it, in the point or the venv.
    assert value["saved"]["patch"] is None and value["current"]["patch"] is None
    assert not Path(rp.file("patch")).exists()
    assert not Path(patch_state_dir(str(venv))).exists()


@pytest.mark.local
def test_a_kept_rope_patch_is_applied_again_from_the_point_byte_for_byte(host):
    venv, site, rp = host
    apply_rope(venv, site)
    checkpoint(venv, rp)
    patched = (site / TARGET).read_bytes()
    # SGLang reinstalled under it (what rollback.pins does): the wheel's file, the marker gone.
    r = sh(restore_script(rope_state_dir(str(venv))))
    assert r.returncode == 0, r.stderr
    assert (site / TARGET).read_text() == ORIGINAL and not (site / CREATED).exists()
    assert state(venv, rp)["current"]["rope"] is None
    r = reapply(venv, rp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / TARGET).read_bytes() == patched
    assert (site / CREATED).read_text() == "x = 1\n"
    value = state(venv, rp)
    assert value["current"]["rope"] == MARKER and drift(value) == []
    marker = rope_marker(venv)
    assert marker["sha256"] == MARKER and marker["intact"] is True
    # And it comes off again as any apply does: the point's copy was a full journal.
    r = sh(restore_script(rope_state_dir(str(venv))))
    assert r.returncode == 0, r.stderr
    assert (site / TARGET).read_text() == ORIGINAL and not (site / CREATED).exists()


@pytest.mark.local
def test_the_kept_patch_goes_only_onto_the_tree_it_was_applied_to(host):
    venv, site, rp = host
    apply_rope(venv, site)
    checkpoint(venv, rp)
    sh(restore_script(rope_state_dir(str(venv))))
    (site / TARGET).write_text("another release's file\n")
    r = reapply(venv, rp)
    assert r.returncode != 0
    assert "applied to another tree" in r.stderr and TARGET in r.stderr and "fix:" in r.stderr
    assert (site / TARGET).read_text() == "another release's file\n"
    assert not (site / CREATED).exists() and not Path(rope_state_dir(str(venv))).exists()
    # A file it created already there: refused the same way.
    (site / TARGET).write_text(ORIGINAL)
    (site / CREATED).write_text("someone else's\n")
    r = reapply(venv, rp)
    assert r.returncode != 0 and CREATED in r.stderr
    assert (site / CREATED).read_text() == "someone else's\n"


@pytest.mark.local
def test_a_reapply_that_does_not_give_the_files_it_gave_restores_the_tree(host):
    venv, site, rp = host
    apply_rope(venv, site)
    checkpoint(venv, rp)
    sh(restore_script(rope_state_dir(str(venv))))
    kept = Path(rp.file("rope")) / "applied.sha256"
    kept.write_text(f"{hashlib.sha256(b'other').hexdigest()}  {TARGET}\n")
    r = reapply(venv, rp)
    assert r.returncode != 0 and "does not give the files it gave before" in r.stderr
    assert (site / TARGET).read_text() == ORIGINAL and not (site / CREATED).exists()
    assert not Path(rope_state_dir(str(venv))).exists()


@pytest.mark.local
def test_an_interrupted_apply_found_in_the_venv_is_restored_before_the_reapply(host):
    venv, site, rp = host
    apply_rope(venv, site)
    checkpoint(venv, rp)
    # The failed deploy's apply, killed after it wrote the file but before its marker.
    d = Path(rope_state_dir(str(venv)))
    (d / "sha256").unlink()
    assert rope_marker(venv)["partial"] is True
    r = reapply(venv, rp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert rope_marker(venv)["intact"] is True
    assert (site / TARGET).read_text() == PATCHED
