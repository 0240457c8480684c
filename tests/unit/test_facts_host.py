"""facts.python, facts.hf, facts.disk, facts.net: their real commands run here by sh."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import StringCommand
from pyinfra_testing.util import get_command_string

from facts import disk, hf, net, python


def run(fact, env: dict | None = None, **kwargs):
    command = get_command_string(StringCommand(fact.command(**kwargs)))
    done = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, env=env, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    return fact.process(out) if out else fact.default()


# --- facts.hf.Token -------------------------------------------------------------------------


def hub_token_path(env: dict) -> str:
    """Where the real huggingface_hub looks for the token under ``env``."""
    code = "from huggingface_hub import constants; print(constants.HF_TOKEN_PATH)"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.local
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"XDG_CACHE_HOME": "{tmp}/xdg"},
        {"HF_HOME": "{tmp}/hf-home"},
        {"HF_TOKEN_PATH": "{tmp}/custom/token", "HF_HOME": "{tmp}/hf-home"},
    ],
)
def test_token_default_path_matches_huggingface_hub(tmp_path, extra):
    env = {"HOME": str(tmp_path / "home"), "PATH": os.environ["PATH"]}
    env.update({k: v.format(tmp=tmp_path) for k, v in extra.items()})
    value = run(hf.Token(), env=env)
    assert value == {"path": hub_token_path(env), "exists": False}
    token = Path(value["path"])
    token.parent.mkdir(parents=True, exist_ok=True)
    token.write_text("")
    assert run(hf.Token(), env=env)["exists"] is False  # an empty file is no token
    token.write_text("hf_secret_value_never_read\n")
    value = run(hf.Token(), env=env)
    assert value["exists"] is True
    assert "hf_secret" not in json.dumps(value)


@pytest.mark.local
def test_token_configured_path(tmp_path):
    path = tmp_path / "dir with space" / "token"
    assert run(hf.Token(), path=str(path)) == {"path": str(path), "exists": False}
    path.parent.mkdir()
    path.write_text("x")
    assert run(hf.Token(), path=str(path)) == {"path": str(path), "exists": True}


# --- facts.disk.FreeSpace -------------------------------------------------------------------


@pytest.mark.local
def test_free_space_existing_and_future_path(tmp_path):
    value = run(disk.FreeSpace(), path=str(tmp_path))
    stat = os.statvfs(tmp_path)
    assert value["path"] == value["measured_path"] == str(tmp_path)
    assert value["total_bytes"] == stat.f_blocks * stat.f_frsize
    assert abs(value["free_bytes"] - stat.f_bavail * stat.f_frsize) < 64 * 2**20
    assert value["error"] is None
    future = tmp_path / "models" / "moonshotai--Kimi-K2.6"
    value = run(disk.FreeSpace(), path=str(future))
    assert value["path"] == str(future)
    assert value["measured_path"] == str(tmp_path)
    assert value["mount"] and value["total_bytes"] == stat.f_blocks * stat.f_frsize


def test_free_space_df_failure_is_carried():
    output = ["##specfleet-path=/x", "##specfleet-measured=/x", "df: /x: Stale file handle"]
    value = disk.parse_free_space(output)
    assert value["total_bytes"] is None
    assert value["error"] == "df: /x: Stale file handle"


def test_free_space_mount_with_spaces():
    output = [
        "##specfleet-path=/mnt/a b/c",
        "##specfleet-measured=/mnt/a b",
        "      1B-blocks         Avail Mounted on",
        "  1000000000000  900000000000 /mnt/a b",
    ]
    value = disk.parse_free_space(output)
    assert value["mount"] == "/mnt/a b"
    assert (value["total_bytes"], value["free_bytes"]) == (1000000000000, 900000000000)


# --- facts.net.ListeningPorts ---------------------------------------------------------------


@pytest.mark.local
def test_listening_ports_sees_our_socket():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        mine = net.port_users(run(net.ListeningPorts()), port)
    assert [(e["address"], e["port"]) for e in mine] == [("127.0.0.1", port)]
    if os.geteuid() == 0:
        assert mine[0]["pid"] == os.getpid()


def test_listeners_parser_ipv6_and_several_processes():
    output = [
        'LISTEN 0      4096   [::]:30000   [::]:*    users:(("python3",pid=10,fd=3),("python3",pid=11,fd=3))',
        "LISTEN 0      128    0.0.0.0:22   0.0.0.0:*",
        "garbage",
    ]  # fmt: skip
    assert net.parse_listeners(output) == [
        {"address": "::", "port": 30000, "process": "python3", "pid": 10},
        {"address": "::", "port": 30000, "process": "python3", "pid": 11},
        {"address": "0.0.0.0", "port": 22, "process": None, "pid": None},
    ]


# --- facts.python.Packages ------------------------------------------------------------------


@pytest.mark.local
def test_packages_missing_interpreter(tmp_path):
    value = run(python.Packages(), python=str(tmp_path / "nope" / "python"))
    assert value == python.empty_value()
    assert value["torch"] is None and value["direct_urls"] == {}


@pytest.mark.local
def test_packages_and_sglang_accept_a_bare_interpreter_name():
    """`python=python3` (as on the device run) is looked up on PATH, not tested as a path."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    bare = os.path.basename(sys.executable)
    value = run(python.Packages(), env=env, python=bare)
    assert value["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert value["huggingface-hub"]
    from facts.sglang import SGLangInstall

    assert run(SGLangInstall(), env=env, python=bare) is None


# A PEP 517 backend with no dependencies (this venv's setuptools cannot build wheels offline).
TINY_BACKEND = """
import base64, hashlib, os, zipfile
NAME, VERSION = "Tiny_Pkg", "1.2.3"
def _record(files):
    lines = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(data)}")
    return "\\n".join(lines) + "\\n"
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = f"{NAME}-{VERSION}.dist-info"
    files = [
        ("tinypkg/__init__.py", b""),
        (f"{info}/METADATA", f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n".encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\\nGenerator: tiny\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"),
    ]
    record = _record(files) + f"{info}/RECORD,,\\n"
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        for path, data in files + [(f"{info}/RECORD", record.encode())]:
            whl.writestr(path, data)
    return name
"""


@pytest.mark.local
def test_packages_git_install_direct_url(tmp_path):
    """A real ``pip install git+file://...`` writes direct_url.json with the commit."""
    repo = tmp_path / "src"
    (repo / "tinypkg").mkdir(parents=True)
    (repo / "tinypkg" / "__init__.py").write_text("")
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    (repo / "backend.py").write_text(TINY_BACKEND)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "tiny"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            f"git+file://{repo}@{commit}",
        ],  # fmt: skip
        check=True,
        capture_output=True,
        timeout=300,
    )
    names = "tiny-pkg,torch"
    done = subprocess.run(
        [sys.executable, "-I", "-c", python.COLLECT, names, str(site)],
        capture_output=True,
        text=True,
        check=True,
    )
    value = python.Packages().process(done.stdout.splitlines())
    assert value["tiny-pkg"] == "1.2.3"
    assert value["torch"] is None
    assert value["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert value["direct_urls"]["tiny-pkg"] == {"url": f"file://{repo}", "commit": commit}


@pytest.mark.local
def test_packages_command_on_this_venv():
    value = run(python.Packages(), python=sys.executable, names=["huggingface_hub", "PyYAML"])
    assert set(value) == {"huggingface-hub", "pyyaml", "python_version", "direct_urls"}
    from importlib.metadata import version

    assert value["huggingface-hub"] == version("huggingface_hub")
    assert value["pyyaml"] == version("PyYAML")
