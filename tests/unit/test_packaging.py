"""The wheel: only the ``specfleet`` namespace, with its templates and host-side programs as
package data, and a ``specfleet`` console script that plans from outside any checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from specfleet.core.sglang.recipe import check_recipe
from tests.harness.port_build import load_recipe, upstream_runs
from tests.unit.test_plan import host_facts
from tests.unit.test_plan_sglang_fixtures import load as load_sglang

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # A copy of the checkout: setuptools writes build/ and *.egg-info where it builds.
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".ruff_cache"))  # fmt: skip
    # No build isolation: the test extras bring setuptools, so no index is needed here.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(out), str(src)],
        check=True, capture_output=True, text=True, cwd=out,
    )  # fmt: skip
    (found,) = out.glob("specfleet-*.whl")
    return found


@pytest.mark.local
def test_the_wheel_holds_only_specfleet_with_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"specfleet"}  # never facts/, operations/ or deploys/: they would shadow a checkout
    for needed in (
        "specfleet/templates/sglang.service.j2",
        "specfleet/templates/sglang.env.j2",
        "specfleet/templates/fanout_sshd_config.j2",
        "specfleet/hostside/weights_agent.py",
        "specfleet/hostside/fanout_agent.py",
        "specfleet/hostside/readiness_gate.py",
        "specfleet/hostside/port_owner.py",
        "specfleet/hostside/specfleet_log_redact.py",
        "specfleet/hostside/facts/runner.py",
        "specfleet/hostside/facts/sglang_install.py",
        "specfleet/patchdata/__init__.py",
        "specfleet/patchdata/pr20547/sglang-0.5.11/NOTICE",
        "specfleet/patchdata/pr20547/sglang-0.5.11/port.json",
        "specfleet/patchdata/pr20547/sglang-0.5.11/recipe.json",
        "specfleet/patchdata/pr20547/sglang-0.5.11/provenance.json",
    ):
        assert needed in names, needed
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "specfleet = specfleet.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.mark.local
def test_the_wheel_holds_no_upstream_sglang_code_only_the_recipe(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        port = sorted(n.rsplit("/", 1)[1] for n in names if "/patchdata/pr20547/" in n)
        assert port == ["NOTICE", "port.json", "provenance.json", "recipe.json"]
        found = {}
        for name in names:
            if name.endswith((".py", ".json", ".j2", ".diff", ".txt")) or "/patchdata/" in name:
                runs = upstream_runs(zf.read(name).decode("utf-8", "replace"))
                if runs:
                    found[name] = runs[:2]
    assert found == {}
    # What the wheel's recipe builds is the port the checkout's recipe builds.
    recipe = json.loads(zf_read(wheel, "specfleet/patchdata/pr20547/sglang-0.5.11/recipe.json"))
    assert recipe == load_recipe()
    assert check_recipe(recipe) == []


def zf_read(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode("utf-8")


@pytest.mark.local
def test_installed_wheel_plans_from_outside_the_checkout(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--disable-pip-version-check", str(wheel)], check=True)  # fmt: skip
    facts = dict(host_facts("rtx6000x8"))
    facts["facts.sglang.SGLangInstall"] = load_sglang("0.5.11")
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    away = tmp_path / "elsewhere"
    away.mkdir()
    # The dependencies from this interpreter's site-packages (PYTHONPATH runs no .pth files, so
    # not the editable specfleet of the checkout): specfleet itself comes from the wheel.
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    env.pop("SPECFLEET_CHECKOUT", None)
    where = subprocess.run(
        [py, "-c", "import specfleet.core.resources as r; print(r.__file__); "
         "print(r.template_path('sglang.service.j2').is_file(), "
         "r.hostside_path('weights_agent.py').is_file())"],
        cwd=away, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert where[0].startswith(str(env_dir)), where
    assert where[1:] == ["True", "True"]
    ports = subprocess.run(
        [py, "-c", "from specfleet.core.sglang.pr20547.port import load_ports; print(*load_ports())"],
        cwd=away, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert "pr20547/sglang-0.5.11" in ports
    done = subprocess.run(
        [env_dir / "bin" / "specfleet", "plan", "--facts", str(tmp_path / "facts.json"),
         "--host", "ct200", "--json"],
        cwd=away, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["argv"][plan["argv"].index("--attention-backend") + 1] == "triton"
    assert "--disable-custom-all-reduce" in plan["argv"]
    # What needs a checkout says so, with the fix, and no traceback.
    done = subprocess.run([env_dir / "bin" / "specfleet", "status", "inv.py"], cwd=away,
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 3
    assert "no specfleet checkout here" in done.stderr and "--checkout PATH" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.local
def test_the_wheel_metadata_looks_maintained(wheel):
    """Classifiers, keywords and a version that is the changelog's newest release."""
    import re
    from email.parser import Parser

    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(name).decode())
    classifiers = meta.get_all("Classifier") or []
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert "pyinfra" in (meta["Keywords"] or "")
    newest = re.search(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert newest and meta["Version"] == newest.group(1)


SUBCOMMANDS = ("plan", "settings", "rollout", "fanout", "probe", "status", "remove", "bench",
               "sweep", "monitoring", "logs")
HEAVY = ("pyinfra", "gevent", "matplotlib", "paramiko")


@pytest.mark.local
def test_installed_wheel_helps_with_every_subcommand_outside_a_checkout(wheel, tmp_path):
    """``specfleet --version`` and each subcommand's ``--help`` from the wheel, in a folder with
    no checkout: exit 0, specfleet's own usage, and none of pyinfra, gevent or matplotlib
    imported to print it."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--disable-pip-version-check", str(wheel)], check=True)  # fmt: skip
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    env.pop("SPECFLEET_CHECKOUT", None)
    script = env_dir / "bin" / "specfleet"
    done = subprocess.run([script, "--version"], cwd=away, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0 and done.stdout.strip() == "specfleet, version 0.5.0", done
    for command in SUBCOMMANDS:
        done = subprocess.run([script, command, "--help"], cwd=away, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout.startswith(f"Usage: specfleet {command} [OPTIONS]"), done.stdout
        assert "Traceback" not in done.stdout + done.stderr
    probe = (
        "import json, sys\n"
        "from specfleet import cli\n"
        f"rcs = [cli.main([c, '--help']) for c in {SUBCOMMANDS!r}]\n"
        f"print(json.dumps([rcs, sorted(m for m in {HEAVY!r} if m in sys.modules)]),"
        " file=sys.stderr)\n"
    )
    done = subprocess.run([py, "-c", probe], cwd=away, env=env, capture_output=True, text=True,
                          timeout=60)
    rcs, heavy = json.loads(done.stderr.strip().splitlines()[-1])
    assert rcs == [0] * len(SUBCOMMANDS) and heavy == [], done.stderr
