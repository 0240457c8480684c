"""Every subcommand that takes an inventory takes it in each form ``pyinfra`` itself takes
(``pyinfra_cli.inventory.make_inventory``): ``@local``, ``@ssh/host``, a host name, a comma list,
narrowed by ``--limit``. They used to fail with "no inventory file .../@local" (the controllers
made the argument an absolute path, and kept their own copy of pyinfra's loader).

Each command runs through the console script's click command, on pyinfra's own loader and
``Session``, up to where it would connect: there the connection is stood in for (named as such,
``not_tried``), every host reported unreachable or its run recorded, so nothing connects anywhere
(the test fleet's tests run them against real hosts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specfleet import cli
from specfleet.fleet import pyinfra_run
from specfleet.fleet.pyinfra_run import HostStep, StepRun, load_inventory

ROOT = Path(__file__).resolve().parents[2]
NOT_TRIED = "not tried: the test's stand-in for the connection"
FORMS = [
    ("@local", ["@local"]),
    ("@local,h2", ["@local", "h2"]),
    ("h1,h2", ["h1", "h2"]),
    ("@ssh/h1,@ssh/h2", ["@ssh/h1", "@ssh/h2"]),
]


@pytest.fixture()
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the fleet commands run the checkout's deploy files


@pytest.fixture()
def all_answer(monkeypatch):
    """The reachability check of sweep and bench (``specfleet.fleet.fleet_checks``) stood in
    for: every host answers, so the forms reach the controller (tests/unit/test_sweep_preflight.py
    tests the check itself, against a real refused connection)."""
    from specfleet.fleet import fleet_checks

    monkeypatch.setattr(fleet_checks, "reachable_hosts", lambda *a, **k: {})


@pytest.fixture()
def not_tried(monkeypatch):
    """``Session.connect`` stood in for: every host "unreachable" without a connection tried;
    the hosts it was asked for recorded."""
    asked: list[list[str]] = []

    def connect(self, hosts):
        asked.append(list(hosts))
        return {h: NOT_TRIED for h in hosts}

    monkeypatch.setattr(pyinfra_run.Session, "connect", connect)
    return asked


@pytest.mark.parametrize("form, names", FORMS)
def test_pyinfra_s_own_loader_reads_every_form(form, names):
    assert [h.name for h in load_inventory(form, {"x": 1})] == names
    assert load_inventory(form, {"x": 1}).get_host(names[0]).data.get("x") == 1
    assert [h.name for h in load_inventory(form, only=names[-1:])] == names[-1:]


def test_ssh_hosts_get_their_address_from_pyinfra_s_connector():
    host = load_inventory("@ssh/10.0.0.7").get_host("@ssh/10.0.0.7")
    assert host.data.get("ssh_hostname") == "10.0.0.7"
    assert load_inventory("@local").get_host("@local").connector_cls.__name__ == "LocalConnector"


def test_a_missing_file_or_a_name_pyinfra_cannot_place_is_said_as_such():
    from specfleet.core.errors import SpecfleetError

    with pytest.raises(SpecfleetError, match="no inventory file inventories/typo.py"):
        load_inventory("inventories/typo.py")
    with pytest.raises(SpecfleetError, match="has no host"):
        load_inventory("no-such-host.invalid")


@pytest.mark.local
@pytest.mark.parametrize("command", ["status", "probe"])
@pytest.mark.parametrize("form, names", FORMS)
def test_status_and_probe_take_every_form(at_root, not_tried, capsys, command, form, names):
    assert cli.main([command, form]) == cli.EXIT_HOSTS  # every host "unreachable"
    assert not_tried == [names]
    out = capsys.readouterr()
    assert all(f"{h}" in out.out + out.err for h in names)
    assert "no inventory file" not in out.err


@pytest.mark.local
def test_limit_narrows_a_comma_list(at_root, not_tried):
    assert cli.main(["status", "h1,h2,h3", "--limit", "h3", "--limit", "h1"]) == cli.EXIT_HOSTS
    assert not_tried == [["h1", "h3"]]
    assert cli.main(["status", "h1,h2", "--limit", "h9"]) == cli.EXIT_INPUT


@pytest.mark.local
@pytest.mark.parametrize("form, names", FORMS)
def test_rollout_takes_every_form(at_root, monkeypatch, form, names):
    from specfleet.fleet import rollout

    seen = []
    monkeypatch.setattr(rollout.Rollout, "run", lambda self: seen.append(self.hosts) or 0)
    assert cli.main(["rollout", form, "deploys/kimi_k26.py", "--dry", "--no-prefetch"]) == 0
    assert seen == [names]


@pytest.mark.local
@pytest.mark.parametrize("form, names", FORMS)
def test_bench_takes_every_form(at_root, all_answer, monkeypatch, tmp_path, form, names):
    """Through ``run_with_data`` and ``run_pyinfra``'s own ``Session`` (its run stood in for:
    each host "failed" with no result, so the table flags every host and the exit is 1)."""
    seen = []

    def run(self, deploy, hosts, name):
        seen.append((Path(deploy).name, list(hosts)))
        return StepRun(name, list(hosts), 1, 0.0,
                       {h: HostStep("failed", why=[NOT_TRIED]) for h in hosts})

    monkeypatch.setattr(pyinfra_run.Session, "run", run)
    monkeypatch.setattr(pyinfra_run.Session, "close", lambda self: None)
    assert cli.main(["bench", form, "--out", str(tmp_path)]) == cli.EXIT_HOSTS
    assert seen == [("bench_kimi.py", names)]


@pytest.mark.parametrize("form, names", FORMS)
def test_sweep_takes_every_form(at_root, all_answer, monkeypatch, tmp_path, form, names):
    from specfleet.fleet import sweep

    seen = []
    monkeypatch.setattr(sweep.Sweep, "run", lambda self: seen.append(self.args.host) or 0)
    assert cli.main(["sweep", form, "--host", names[-1], "--out", str(tmp_path)]) == 0
    assert seen == [names[-1]]
    assert cli.main(["sweep", form, "--host", "h9", "--out", str(tmp_path)]) == cli.EXIT_INPUT


@pytest.mark.parametrize("form, names", [("@local", ["@local"]), ("127.0.0.1,127.0.0.2",
                                                                  ["127.0.0.1", "127.0.0.2"])])
def test_fanout_takes_every_form(at_root, monkeypatch, form, names):
    from specfleet.fleet import fanout

    seen = []

    def prefetch(inventory, hosts, order, runner, degree, port, plan_out):
        seen.append(list(hosts))
        return StepRun("prefetch", list(hosts), 0, 0.0, {h: HostStep("ok") for h in hosts})

    monkeypatch.setattr(fanout, "run_prefetch", prefetch)
    assert cli.main(["fanout", form]) == 0
    assert seen == [names]


@pytest.mark.parametrize("form, names", FORMS)
def test_remove_hands_the_form_to_pyinfra_as_given(at_root, monkeypatch, form, names):
    seen = []
    monkeypatch.setattr(cli, "_in_checkout", lambda argv, where, **kw: seen.append(argv) or 0)
    assert cli.main(["remove", form, "--dry"]) == 0
    assert seen[0][3] == form


@pytest.mark.parametrize("form, names", FORMS)
def test_settings_monitoring_and_logs_take_every_form(monkeypatch, capsys, tmp_path, form,
                                                      names):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    pins = '{"target": {"revision": "%s"}, "drafter": {"revision": "%s"}}' % (("0" * 40,) * 2)
    assert cli.main(["settings", form, "--json", "--data", f"specfleet={pins}"]) == 0
    assert list(__import__("json").loads(capsys.readouterr().out)) == names
    # monitoring reads every host: @local is this machine, whose loopback relay a Prometheus
    # here scrapes; another host's loopback relay is refused, by name
    rc = cli.main(["monitoring", form, "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    remote = [h for h in names if h != "@local"]
    assert rc == (cli.EXIT_INPUT if remote else 0), err
    assert all(f"{h}: 127.0.0.1, scraped at " in err or f"[{h}] the metrics relay listens on "
               "127.0.0.1" in err for h in remote), err
    if not remote:
        assert "127.0.0.1:30091" in (tmp_path / "targets" / "specfleet-sglang.json").read_text()
    assert cli.main(["logs", form, "h9"]) == cli.EXIT_INPUT
    assert f"name one of: {', '.join(names)}" in capsys.readouterr().err
