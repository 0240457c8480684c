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


def test_rollback_keeps_and_restores_every_server_file():
    """The rollback point keeps the server's files of the one list (issue 57: it left the
    logging config out); a point taken before it held them leaves them as they are."""
    from operations.rollback import file_restores, live_files
    from specfleet.core.layout import server_paths
    from specfleet.core.settings import settings_from_dict

    paths = server_paths(settings_from_dict({}))
    assert live_files(paths) == paths.files()
    cmd = RollbackState().command(directory="/d", unit=paths.unit, env=paths.env,
                                  secret=paths.secret, venv="/v", wheels="/w",
                                  log_config=paths.log_config, log_module=paths.log_module)
    assert paths.log_config in cmd and paths.log_module in cmd and "/d/log_module" in cmd
    value = parse_rollback_state(["saved.taken=t", "saved.unit=a", "cur.unit=a",
                                  "saved.log_config=1", "cur.log_config=2", "cur.log_module=3"])
    assert file_restores(value) == [("log_config", "copy")]
