"""specfleet.fleet.pyinfra_run on pyinfra's real API, against @local: a step's results and
failure reasons are read from pyinfra's objects (OperationMeta, state callbacks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specfleet.fleet.pyinfra_run import PyinfraOptions, Session, load_inventory

DEPLOY = '''
from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import server

from operations.util import check_command, fail_step
from specfleet.core.errors import SpecfleetError


@operation()
def broken():
    yield fail_step(SpecfleetError("the disk is full", fix="free some space"))


@operation()
def looked():
    yield check_command(lambda state, host: True, ())


server.shell(name="Change something", commands=["true"])
looked(name="Only a check")
if host.data.get("broken"):
    broken(name="Break it")
server.shell(name="After the break", commands=["true"])
'''


def _files(tmp_path: Path) -> tuple[str, str]:
    inv = tmp_path / "local.py"
    inv.write_text('hosts = ["@local"]\nother = (["@local"], {"colour": "blue"})\n')
    deploy = tmp_path / "deploy.py"
    deploy.write_text(DEPLOY)
    return str(inv), str(deploy)


@pytest.mark.local
def test_changes_and_checks_and_a_failure_reason_come_from_pyinfras_objects(tmp_path):
    inv, deploy = _files(tmp_path)
    s = Session(inv)
    try:
        first = s.run(deploy, ["@local"], "first").results["@local"]
        assert first.status == "changed"
        assert first.changed_ops == ["Change something", "After the break"]  # the check is not
    finally:
        s.close()
    s = Session(inv, PyinfraOptions(data=["broken=True"]))
    try:
        step = s.run(deploy, ["@local"], "second")
        res = step.results["@local"]
        assert step.rc == 1 and res.status == "failed"
        assert res.error_ops == ["Break it"]
        assert res.why == ["in 'Break it': the disk is full", "fix: free some space"]
        # The same session runs the next step on the same host, from a clean slate.
        again = s.run(deploy, ["@local"], "third").results["@local"]
        assert again.status == "failed" and again.error_ops == ["Break it"]
    finally:
        s.close()


def test_the_inventory_reads_groups_group_data_and_the_file_stem(tmp_path):
    inv, _ = _files(tmp_path)
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "other.py").write_text("import os\nsize = 3\n")
    made = load_inventory(inv, {"x": 1})
    host = made.get_host("@local")
    assert set(made.groups) >= {"hosts", "other", "local"}
    assert host.data.get("colour") == "blue" and host.data.get("size") == 3
    assert host.data.get("x") == 1 and host.data.get("os") is None


@pytest.mark.local
def test_a_hook_on_the_host_runs_over_its_connection_with_the_hook_environment(tmp_path):
    from specfleet.fleet.rollout import hook_env, run_on_host

    inv, _ = _files(tmp_path)
    out = tmp_path / "hook.out"
    s = Session(inv)
    try:
        assert s.connect(["@local"]) == {}
        ok, _ = run_on_host(s.host("@local"), f'echo "$SPECFLEET_HOST $SPECFLEET_RUN_ID" > {out}',
                            hook_env("@local", "127.0.0.1", "run1"))
        assert ok and out.read_text() == "@local run1\n"
        failed, output = run_on_host(s.host("@local"), "echo nope >&2; exit 3", {})
        assert not failed and output.stderr_lines == ["nope"]
    finally:
        s.close()


DRY_DEPLOY = '''
from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import server

from operations.util import fails_host
from specfleet.core.errors import SpecfleetError


@operation()
@fails_host
def disk():
    if host.data.get("full"):
        raise SpecfleetError("only 3 GiB free on /srv/models", fix="free some space")
    host.noop("there is room")
    yield from ()


server.shell(name="Change something", commands=["touch {marker}"])
disk(name="Disk check")
'''


def test_dry_plans_changes_and_expected_failures_and_runs_nothing(tmp_path):
    inv, _ = _files(tmp_path)
    marker = tmp_path / "touched"
    deploy = tmp_path / "dry.py"
    deploy.write_text(DRY_DEPLOY.replace("{marker}", str(marker)))
    s = Session(inv, dry=True)
    try:
        res = s.run(str(deploy), ["@local"], "dry").results["@local"]
        assert res.status == "changed" and res.changed_ops == ["Change something"]
    finally:
        s.close()
    s = Session(inv, PyinfraOptions(data=["full=True"]), dry=True)
    try:
        res = s.run(str(deploy), ["@local"], "dry").results["@local"]
        assert res.status == "failed"
        assert res.why == ["only 3 GiB free on /srv/models", "fix: free some space"]
    finally:
        s.close()
    assert not marker.exists()
