"""An install into an existing venv, changed in place (``sglang.side_by_side: False``): what pip
would change besides SGLang, from pip's own dry run, and the refusal to replace torch & co. in a
venv specfleet did not create. Pure decisions on recorded pip reports (milliseconds).

The recordings (tests/fixtures/pip/*.json) are real pip runs: ``pip install --dry-run --report``
in a venv holding the stand-in wheels of tests/harness/fake_wheels.py (an SGLang 0.5.11 venv:
torch 2.8.0, sgl-kernel 0.3.9), each with the fact's own script's value
(specfleet/hostside/facts/pip_plan.py). Re-record with
``python -m tests.unit.test_venv_changes --write``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from facts.python import PIP_PLAN, parse_pip_plan
from specfleet.core.settings import settings_from_dict
from specfleet.core.sglang.install import (
    PackageChange,
    judge_venv_changes,
    planned_changes,
    refused_message,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pip"
VENV = "/root/venv_sglang211"


def recorded(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_pip_report_of_an_upgrade_names_what_moves():
    rec = recorded("upgrade_0511_to_0514")
    changes = planned_changes(rec["report"], rec["installed"])
    assert [c.words() for c in changes] == [
        "newdep 1.0", "sgl-kernel 0.3.9 -> 0.3.16", "sglang 0.5.11 -> 0.5.14",
        "torch 2.8.0 -> 2.9.1",
    ]
    # The fact's value (its host-side script, cut to what the decision reads) says the same.
    fact = rec["fact"]
    assert planned_changes({"install": fact["install"]}, fact["installed"]) == changes
    assert fact["rc"] == 0 and fact["created_by_specfleet"] is False


def test_torch_is_not_replaced_in_a_venv_specfleet_did_not_create():
    rec = recorded("upgrade_0511_to_0514")
    changes = planned_changes(rec["report"], rec["installed"])
    verdict = judge_venv_changes(changes, created_by_specfleet=False)
    assert [c.words() for c in verdict.refused] == ["sgl-kernel 0.3.9 -> 0.3.16",
                                                    "torch 2.8.0 -> 2.9.1"]
    problem, fix = refused_message(VENV, "sglang==0.5.14", verdict)
    assert problem == (
        "installing sglang==0.5.14 into /root/venv_sglang211, a venv specfleet did not create, "
        "would replace sgl-kernel 0.3.9 -> 0.3.16, torch 2.8.0 -> 2.9.1 (pip's dry run on the "
        "host); nothing was changed")
    assert "sglang.side_by_side: True" in fix
    assert "sglang.allow_replacing: ['sgl-kernel', 'torch']" in fix
    assert verdict.summary() == ("replaces sgl-kernel 0.3.9 -> 0.3.16, torch 2.8.0 -> 2.9.1; "
                                 "adds newdep 1.0")


@pytest.mark.parametrize("allow, refused", [
    (True, []),
    (["torch"], ["sgl-kernel"]),
    (["torch", "sgl-kernel"], []),
    (["sgl-*", "TORCH"], []),
    ([], ["sgl-kernel", "torch"]),
])
def test_allow_replacing_lets_named_packages_move(allow, refused):
    rec = recorded("upgrade_0511_to_0514")
    changes = planned_changes(rec["report"], rec["installed"])
    verdict = judge_venv_changes(changes, created_by_specfleet=False, allow=allow)
    assert [c.name for c in verdict.refused] == refused
    assert [c.name for c in verdict.replaced] == ["sgl-kernel", "torch"]


def test_a_venv_specfleet_created_may_change_and_says_so():
    rec = recorded("upgrade_0511_to_0514")
    verdict = judge_venv_changes(planned_changes(rec["report"], rec["installed"]),
                                 created_by_specfleet=True)
    assert verdict.refused == ()
    assert verdict.summary().startswith("replaces sgl-kernel 0.3.9 -> 0.3.16, torch 2.8.0")


def test_an_upgrade_that_moves_only_sglang_is_no_problem():
    rec = recorded("upgrade_0511_to_0512")
    changes = planned_changes(rec["report"], rec["installed"])
    assert [c.words() for c in changes] == ["sglang 0.5.11 -> 0.5.12"]
    verdict = judge_venv_changes(changes, created_by_specfleet=False)
    assert verdict.refused == () and verdict.summary() is None


def test_compressed_tensors_is_this_installs_own():
    changes = [PackageChange("compressed-tensors", "0.9.4", "0.12.2"),
               PackageChange("sglang", "0.5.11", "0.5.14")]
    assert judge_venv_changes(changes, created_by_specfleet=False) == judge_venv_changes(
        [], created_by_specfleet=False)


def test_a_pip_that_cannot_tell_is_read_as_such():
    value = parse_pip_plan(["Traceback ...", "ModuleNotFoundError: No module named 'pip'"])
    assert value["rc"] is None and "No module named 'pip'" in value["error"]
    assert parse_pip_plan([]) is None


def test_the_setting_reads_a_bool_or_names():
    assert settings_from_dict({}, host="h").sglang.allow_replacing is False
    assert settings_from_dict({"sglang": {"allow_replacing": ["torch", "nvidia-*"]}},
                              host="h").sglang.allow_replacing == ["torch", "nvidia-*"]
    with pytest.raises(Exception, match="sglang.allow_replacing"):
        settings_from_dict({"sglang": {"allow_replacing": "torch"}}, host="h")


# --------------------------------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------------------------------


def _record(name: str, requirement: str, work: Path) -> dict:
    from tests.harness.fake_wheels import BEFORE, build_upgrade_wheels

    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    wheels = work / "wheels"
    build_upgrade_wheels(wheels)
    venv = work / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    source = ["--no-index", "--find-links", str(wheels)]
    subprocess.run([py, "-m", "pip", "install", "-q", *source, *BEFORE], check=True, env=env)
    report = work / f"{name}.report.json"
    subprocess.run([py, "-m", "pip", "install", "--dry-run", "-q", "--report", str(report),
                    *source, requirement], check=True, env=env)
    raw = json.loads(report.read_text())
    listed = subprocess.run([py, "-m", "pip", "list", "--format=json"], check=True, env=env,
                            capture_output=True, text=True).stdout
    fact = subprocess.run([py, "-I", "-c", PIP_PLAN, str(venv), *source, requirement],
                          check=True, env=env, capture_output=True, text=True).stdout
    value = parse_pip_plan(fact.splitlines())
    # Paths of this recording's machine are not part of what is recorded.
    for item in raw.get("install") or []:
        item.get("download_info", {}).pop("url", None)
    raw.pop("environment", None)
    return {"requirement": requirement, "report": raw,
            "installed": {d["name"]: d["version"] for d in json.loads(listed)}, "fact": value}


def write_fixtures() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for name, requirement in (("upgrade_0511_to_0514", "sglang==0.5.14"),
                                  ("upgrade_0511_to_0512", "sglang==0.5.12")):
            data = _record(name, requirement, Path(d))
            (FIXTURES / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            print(f"wrote {FIXTURES / name}.json")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_fixtures()
