"""PR#20547's apply and restore can be killed at any line and lose nothing.

The real PR diff (../shared/fixtures/sglang-pr20547/) meets the real SGLang 0.5.11 wheel, unpacked:
the whole diff (which conflicts there, and names as "new" six files 0.5.11 already ships) and this
project's port (built from its recipe, specfleet/patchdata/pr20547/sglang-0.5.11/). The apply script is killed (SIGKILL) after each of its lines;
the next run reads the patch state with the real fact command, restores, and every file of the
wheel is checked against the wheel's own RECORD hashes. Restores are killed the same way.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from facts.sglang import PatchState
from operations.sglang_commands import apply_script, restore_script
from specfleet.core.sglang.patch import filter_patch
from specfleet.core.sglang.pr20547.decision import decide_pr20547
from tests.harness.port_build import port_patch
from tests.harness.sources import pr20547_diff, sglang_wheel

# Files 0.5.11 ships that the PR's diff says it creates.
SHIPPED_BUT_NEW_IN_PR = (
    "sglang/srt/speculative/dflash_worker.py", "sglang/srt/speculative/dflash_info.py",
    "sglang/srt/speculative/dflash_utils.py", "sglang/srt/models/dflash.py",
)  # fmt: skip


def record(site: Path) -> dict[str, str]:
    """{path: sha256 (urlsafe base64, as RECORD writes it)} of the wheel's sglang/ files."""
    (dist,) = site.glob("sglang-*.dist-info")
    with open(dist / "RECORD", newline="") as f:
        return {
            row[0]: row[1].split("=", 1)[1]
            for row in csv.reader(f)
            if row[0].startswith("sglang/") and row[1].startswith("sha256=")
        }


def digest(path: Path) -> str:
    raw = hashlib.sha256(path.read_bytes()).digest()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def differences(site: Path, wheel_record: dict[str, str], paths) -> list[str]:
    """Files of the wheel missing anywhere under sglang/, files added, and any of ``paths``
    whose bytes differ from RECORD."""
    on_disk = {
        str(p.relative_to(site))
        for p in (site / "sglang").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    out = [f"missing {p}" for p in sorted(set(wheel_record) - on_disk)]
    out += [f"added {p}" for p in sorted(on_disk - set(wheel_record))]
    out += [
        f"changed {p}"
        for p in paths
        if p in wheel_record and (site / p).is_file() and digest(site / p) != wheel_record[p]
    ]
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site-0.5.11")
    with zipfile.ZipFile(sglang_wheel("0.5.11")) as wheel:
        wheel.extractall(site)
    return site


@pytest.fixture(scope="module")
def wheel_record(pristine) -> dict[str, str]:
    return record(pristine)


@pytest.fixture(scope="module")
def whole_pr():
    return filter_patch(pr20547_diff().decode())


@pytest.fixture(scope="module")
def the_port():
    return port_patch()


def sh(script: str, check: bool = True, syntax_only: bool = False) -> subprocess.CompletedProcess:
    argv = ["sh", "-n", "-c", script] if syntax_only else ["sh", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def patch_state(state_dir: Path) -> dict | None:
    fact = PatchState()
    venv = str(state_dir.parents[1])
    out = sh(fact.command(venv)).stdout.splitlines()
    return fact.process(out)


def start_apply(state_dir: Path, patch) -> None:
    """What the operation does before the script: a fresh state directory with the diff."""
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    (state_dir / "applied.diff").write_text(patch.text)


def recover(state_dir: Path) -> list[str]:
    """The next run: read the state, decide, restore. Returns the steps taken."""
    marker = patch_state(state_dir)
    install = {"version": "0.5.11", "features": {"dflash": "v1"}}
    decision = decide_pr20547(install, marker, present=False, opted_in=False, port=None)
    for step in decision.steps:
        assert step == "restore", decision
        sh(restore_script(str(state_dir)))
    return list(decision.steps)


def kill_points(script: str) -> list[int]:
    """The lines after which the script is between two of its commands (``sh -n`` accepts the
    lines up to there): a SIGKILL can land at each."""
    lines = script.split("\n")
    return [
        i for i in range(len(lines))
        if sh("\n".join(lines[: i + 1]) + "\n", check=False, syntax_only=True).returncode == 0
    ]  # fmt: skip


def killed_after(script: str, line: int) -> str:
    lines = script.split("\n")
    return "\n".join([*lines[: line + 1], "kill -KILL $$", *lines[line + 1 :]])


@pytest.fixture
def site(pristine, tmp_path) -> Path:
    copy = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    shutil.copytree(pristine, copy, symlinks=True)
    return copy


def state_dir_of(site: Path) -> Path:
    return site.parents[2] / ".specfleet" / "pr20547"


@pytest.mark.local
@pytest.mark.parametrize("which", ["whole_pr", "the_port"])
def test_apply_killed_at_every_line_loses_nothing(which, site, wheel_record, request):
    patch = request.getfixturevalue(which)
    d = state_dir_of(site)
    script = apply_script(str(d), str(site), patch)
    watched = [*patch.touched, *SHIPPED_BUT_NEW_IN_PR]
    assert set(SHIPPED_BUT_NEW_IN_PR) <= set(filter_patch(pr20547_diff().decode()).created)
    kills = 0
    points = kill_points(script)
    assert len(points) >= 12
    for line in points:
        start_apply(d, patch)
        done = sh(killed_after(script, line), check=False)
        # A kill after the dry run's conflict exit is never reached: that run simply ended.
        kills += done.returncode == -9
        assert recover(d) == ["restore"], f"killed after line {line}"
        assert differences(site, wheel_record, watched) == [], f"killed after line {line}"
        assert not d.exists()
    assert kills >= 10


@pytest.mark.local
def test_a_complete_apply_and_its_restore_give_the_wheel_back(site, the_port, wheel_record):
    d = state_dir_of(site)
    start_apply(d, the_port)
    done = sh(apply_script(str(d), str(site), the_port))
    assert "conflict" not in done.stdout
    changed = differences(site, wheel_record, the_port.touched)
    assert "added sglang/srt/speculative/dflash_worker_v2.py" in changed
    assert "changed sglang/srt/environ.py" in changed
    (d / "sha256").write_text("a" * 64 + "\n")  # the marker, as the operation writes it
    restore = restore_script(str(d))
    for line in kill_points(restore):
        sh(killed_after(restore, line), check=False)
        recover(d)
        assert differences(site, wheel_record, the_port.touched) == [], line
        start_apply(d, the_port)
        sh(apply_script(str(d), str(site), the_port))
        (d / "sha256").write_text("a" * 64 + "\n")
    sh(restore)
    assert differences(site, wheel_record, [*the_port.touched, *SHIPPED_BUT_NEW_IN_PR]) == []


@pytest.mark.local
def test_the_whole_pr_conflicts_on_0511_and_changes_nothing(site, whole_pr, wheel_record):
    d = state_dir_of(site)
    start_apply(d, whole_pr)
    done = sh(apply_script(str(d), str(site), whole_pr))
    assert "FAILED" in done.stdout
    assert patch_state(d)["conflict"]
    assert not (d / "journal").exists()
    assert differences(site, wheel_record, [*whole_pr.touched, *SHIPPED_BUT_NEW_IN_PR]) == []
