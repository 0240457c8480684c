"""facts.probe: one command per host gives the same values as each fact's own command."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest
from pyinfra.api import Config, FactBase, Inventory, State, StringCommand
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.facts import get_facts
from pyinfra_testing.util import get_command_string

from facts import probe
from tests.unit.test_facts_gpu import NVIDIA, STANDIN


class Failing(FactBase):
    """A fact whose command fails, for the probe's error path."""

    command = "echo partial; echo 'it broke' >&2; exit 3"


class NoNewline(FactBase):
    command = "printf 'abc'"

    def process(self, output):
        return output


class NeedsMissingBinary(FactBase):
    command = "echo should-not-run"

    @staticmethod
    def default():
        return "the default"

    def requires_command(self, *args, **kwargs):
        return "specfleet-no-such-binary"


def sh(command, env):
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def host_env(tmp_path):
    """PATH with the nvidia-smi stand-in (b200x8) and a venv whose SGLang is an authored tree."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    tree = tmp_path / "tree" / "sglang"
    (tree / "srt" / "speculative").mkdir(parents=True)
    (tree / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tree / "_version.py").write_text("__version__ = '0.5.11'\n")
    (tree / "srt" / "speculative" / "dflash_worker.py").write_text("")
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    (site / "tree.pth").write_text(str(tree.parent) + "\n")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "STANDIN_NVIDIA_SMI_PROFILE": str(NVIDIA / "b200x8"),
        "STANDIN_NVIDIA_SMI_RUNTIME": str(tmp_path / "run"),
    }
    return env, str(env_dir / "bin" / "python"), str(tmp_path / "models" / "kimi")


@pytest.mark.local
def test_probe_equals_each_fact_alone(host_env):
    env, python, models = host_env
    specs = probe.default_specs(python=python, models_path=models)
    value = probe.Probe().process(sh(probe.probe_command(specs), env))
    assert value["errors"] == {}
    assert list(value["facts"]) == list(specs)
    for key, (name, kwargs) in specs.items():
        fact = probe.fact_class(name)()
        out = sh(get_command_string(StringCommand(fact.command(**kwargs))), env)
        alone = fact.process(out) if out else fact.default()
        if key == "facts.net.ListeningPorts":
            continue  # live sockets change between the two runs
        if key == "facts.disk.FreeSpace":
            alone.pop("free_bytes"), value["facts"][key].pop("free_bytes")
        assert value["facts"][key] == alone, key
    assert len(value["facts"]["facts.gpu.Gpus"]["gpus"]) == 8
    assert value["facts"]["facts.gpu.GpuTopology"]["nvlink_all_pairs"] is True
    assert value["facts"]["facts.sglang.SGLangInstall"]["features"]["dflash"] == "v1"


@pytest.mark.local
def test_probe_errors_are_per_fact(host_env):
    env, _, _ = host_env
    specs = {
        "bad": Failing,
        "gpus": "facts.gpu.Gpus",
        "raw": NoNewline,
        "missing": NeedsMissingBinary,
        "token": ("facts.hf.Token", {"path": "/nonexistent/token"}),
    }
    value = probe.parse_probe(sh(probe.probe_command(specs), env))
    assert value["errors"] == {"bad": "exit status 3: it broke"}
    assert value["facts"]["bad"] is None  # FactBase's default
    assert len(value["facts"]["gpus"]["gpus"]) == 8
    assert value["facts"]["raw"] == ["abc"]
    assert value["facts"]["missing"] == "the default"
    assert value["facts"]["token"] == {"path": "/nonexistent/token", "exists": False}


@pytest.mark.local
def test_describe_host_b200(host_env):
    env, python, models = host_env
    specs = probe.default_specs(python=python, models_path=models)
    text = probe.describe_host(probe.parse_probe(sh(probe.probe_command(specs), env)), "h1")
    assert text.startswith("h1:")
    assert "8x NVIDIA B200 (sm 10.0, 183359 MiB), driver 595.91.07" in text
    assert "NVLink all pairs: yes" in text
    assert "sglang: 0.5.11" in text and "dflash v1" in text
    assert "hf token: absent" in text


def test_describe_host_errors_and_empty():
    text = probe.describe_host(
        {
            "facts": {"facts.gpu.Gpus": {"gpus": [], "error": "No devices were found"}},
            "errors": {"facts.disk.FreeSpace": "exit status 1: boom"},
        }
    )
    assert "gpus: none" in text
    assert "gpu error: No devices were found" in text
    assert "ERROR facts.disk.FreeSpace: exit status 1: boom" in text


@pytest.mark.local
def test_one_round_trip_per_host_through_pyinfra():
    """``host.get_fact(Probe)`` runs exactly one shell command on the host."""
    inventory = Inventory((["@local"], {}))
    state = State(inventory=inventory, config=Config())
    connect_all(state)
    try:
        host = inventory.get_host("@local")
        calls = []
        real = host.run_shell_command

        def counting(command, **kwargs):
            calls.append(command)
            return real(command, **kwargs)

        host.run_shell_command = counting
        values = get_facts(state, probe.Probe, kwargs={"python": sys.executable})
    finally:
        disconnect_all(state)
    assert len(calls) == 1
    value = values[host]
    assert value["errors"] == {}
    assert value["facts"]["facts.gpu.Gpus"] == {"gpus": [], "error": None}
    assert value["facts"]["facts.python.Packages"]["python_version"] is not None


@pytest.mark.local
def test_cli_demo_renders_every_host():
    done = subprocess.run(
        [sys.executable, "-m", "facts.probe", "@local", f"python={sys.executable}"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("@local:")
    assert "gpus: none" in done.stdout
