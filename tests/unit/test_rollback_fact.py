"""facts.rollback.RollbackState's command, run here by a real shell on a stand-in venv (milliseconds).

The command runs as root on the host: ``pip freeze``'s output must never go to a predictable path
in a world-writable folder (``/tmp/.specfleet-freeze.$$``), where another user could plant a
symlink first and have root write through it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from facts.rollback import RollbackState, parse_rollback_state


def _venv(tmp_path: Path, record: Path, freeze: str, status: int = 0) -> Path:
    """A stand-in venv whose python, as ``-m pip freeze``, prints ``freeze`` and records where its
    stdout goes: the file, its folder's mode and owner."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'out=$(readlink /proc/$$/fd/1); d=$(dirname "$out")\n'
        f'printf "%s\\n%s\\n" "$out" "$(stat -c "%a %u" "$d")" > {record}\n'
        f"printf '%s\\n' '{freeze}'\n"
        f"exit {status}\n"
    )
    python.chmod(0o755)
    return venv


def _run(tmp_path: Path, venv: Path) -> tuple[dict, list[str]]:
    command = RollbackState().command(str(tmp_path / "rb"), "/nonexistent/unit",
                                      "/nonexistent/env", "/nonexistent/secret", str(venv),
                                      str(tmp_path / "wheels"))  # fmt: skip
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30,
                          check=True)  # fmt: skip
    return parse_rollback_state(done.stdout.splitlines()), done.stdout.splitlines()


@pytest.mark.local
def test_the_freeze_goes_to_a_private_folder_of_random_name_and_is_removed(tmp_path):
    record = tmp_path / "where"
    venv = _venv(tmp_path, record, "sglang==0.5.11")
    value, _ = _run(tmp_path, venv)
    assert value["current"]["freeze"] == ["sglang==0.5.11"]
    assert value["current"]["freeze_error"] is None
    out, mode_owner = record.read_text().splitlines()
    folder = os.path.dirname(out)
    mode, owner = mode_owner.split()
    # Not a shared folder such as /tmp (mode 1777): one only its owner (root, on a host) can
    # enter, so nobody else can have put anything at that name.
    assert mode == "700" and int(owner) == os.getuid(), (out, mode_owner)
    assert ".specfleet-freeze" not in out and "/tmp/." not in out
    assert not os.path.exists(folder)  # cleaned up


@pytest.mark.local
def test_a_failing_freeze_is_reported_as_its_error(tmp_path):
    venv = _venv(tmp_path, tmp_path / "where", "pip: broken", status=1)
    value, _ = _run(tmp_path, venv)
    assert value["current"]["freeze"] == []
    assert value["current"]["freeze_error"] == "pip: broken"
