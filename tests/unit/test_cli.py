"""The ``specfleet`` console script: its own help for every subcommand, pyinfra's connection
options with one meaning each, inventories as pyinfra takes them, settings checked before any
connection, the documented exit codes and never a traceback. (Help from the installed wheel,
outside a checkout: tests/unit/test_packaging.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from specfleet import cli
from specfleet.fleet import inventory_view as view
from specfleet.fleet.pyinfra_run import PyinfraOptions, inventory_names, load_inventory

ROOT = Path(__file__).resolve().parents[2]
CONNECTING = ("rollout", "fanout", "probe", "status", "remove", "bench", "sweep", "logs")
ALL = (*CONNECTING, "plan", "settings", "monitoring")


@pytest.mark.parametrize("command", ALL)
def test_every_subcommand_s_help_is_its_own(capsys, command):
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Usage: specfleet {command} [OPTIONS]"), out


@pytest.mark.local
def test_help_and_version_import_no_pyinfra_gevent_or_matplotlib():
    probe = ("import json, sys\nfrom specfleet import cli\n"
             f"rcs = [cli.main([c, '--help']) for c in {ALL!r}] + [cli.main(['--version'])]\n"
             "print(json.dumps([rcs, sorted(m for m in ('pyinfra', 'gevent', 'matplotlib', "
             "'paramiko') if m in sys.modules)]), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    rcs, heavy = json.loads(done.stderr.strip().splitlines()[-1])
    assert rcs == [0] * (len(ALL) + 1) and heavy == [], done.stderr
    assert "specfleet, version" in done.stdout


@pytest.mark.parametrize("command", CONNECTING)
def test_every_connecting_subcommand_takes_pyinfra_s_options_with_one_meaning(command):
    params = {p.name: p for p in cli.cli.commands[command].params}
    assert set(cli.CONNECTION_KEYS) <= set(params), command
    assert params["port"].opts == ["--port", "--ssh-port"]
    assert "SSH port" in params["port"].help
    assert params["ssh_user"].opts == ["--ssh-user", "--user"]


def test_the_fanout_s_sshd_port_has_its_own_name():
    params = {p.name: p for p in cli.cli.commands["fanout"].params}
    assert params["sshd_port"].opts == ["--sshd-port"]
    assert "not the SSH port" in params["sshd_port"].help


def test_rollout_hands_its_options_and_pyinfra_s_on(monkeypatch):
    import specfleet.fleet.rollout as rollout

    seen = []
    monkeypatch.setattr(rollout, "main", lambda flags: seen.append(flags) or 0)
    monkeypatch.setattr(cli, "_checkout", lambda ctx: ROOT)
    monkeypatch.setattr(cli, "check_inventory", lambda inv, opts: None)
    assert cli.main(["rollout", "--dry", "inv.py", "deploys/kimi_k26.py", "--limit", "h1",
                     "--port", "2222", "--sudo", "-vv", "--batch-size", "2",
                     "--speed-gate", "0.85", "--json"]) == 0
    (flags,) = seen
    assert isinstance(flags, rollout.RolloutFlags)
    assert (flags.inventory, flags.deploy) == ("inv.py", "deploys/kimi_k26.py")
    assert flags.dry and flags.json and flags.batch_size == 2 and flags.speed_gate == 0.85
    assert flags.hook_on == "control" and flags.batch_percent is None
    assert flags.connection == PyinfraOptions(port=2222, sudo=True, verbosity=2, limit=["h1"])


def test_rollout_s_help_lists_the_speed_gate_and_the_flag_parses(capsys):
    """The README's `specfleet rollout INVENTORY DEPLOY --speed-gate 0.85`: the argparse parser
    declared it, the console script did not ("No such option")."""
    assert cli.main(["rollout", "--help"]) == 0
    assert "--speed-gate FRACTION" in capsys.readouterr().out
    assert cli.flags("rollout", ["inv.py", "d.py", "--speed-gate", "0.85"]).speed_gate == 0.85
    assert cli.flags("rollout", ["inv.py", "d.py"]).speed_gate is None  # the settings' value


def test_pyinfra_s_flags_parse_back_to_the_same_options():
    """``PyinfraOptions.argv()`` (what a message tells the user to run) is read back by every
    connecting subcommand to the same options."""
    given = PyinfraOptions(ssh_user="u", key="/k", port=2222, sudo=True, sudo_user="s",
                           data=["a=1"], config="/c.py", verbosity=2, limit=["h1", "g"],
                           parallel=3)
    assert cli.flags("rollout", ["inv.py", "d.py", *given.argv()]).connection == given
    assert cli.flags("bench", ["inv.py", *given.argv()]).connection == given
    assert cli.flags("sweep", ["inv.py", "--host", "h1", *given.argv()]).connection == given


def test_the_cli_s_defaults_are_the_controllers_typed_options(monkeypatch):
    """One parser: the flags and their defaults are click's; the controllers get typed options
    (no argv rebuilt for a second parser)."""
    from specfleet.core.bench import SLOW_FRACTION
    from specfleet.fleet.bench import BenchFlags
    from specfleet.fleet.sweep import SweepFlags

    bench = cli.flags("bench", ["inv.py"])
    assert bench == BenchFlags(inventory="inv.py", concurrency="1,4", requests=0, max_tokens=64,
                               out="bench-results", slow_fraction=SLOW_FRACTION)
    params = {p.name: p for p in cli.cli.commands["bench"].params}
    assert params["slow_fraction"].show_default == str(SLOW_FRACTION)  # what --help says
    sweep = cli.flags("sweep", ["inv.py", "--host", "h1"])
    assert isinstance(sweep, SweepFlags) and sweep.host == "h1" and sweep.restore == "best"
    assert sweep.num_draft_tokens is None and sweep.max_minutes == 120.0
    assert cli.flags("plan", ["--facts", "f.json", "--json"]).json is True


def test_no_argparse_parser_is_left_in_specfleet():
    """The console script (click) is the one parser; ``specfleet/hostside`` is the exception: it
    is shipped to the hosts and runs on their stdlib alone, with no click there."""
    left = [str(p.relative_to(ROOT)) for p in (ROOT / "specfleet").rglob("*.py")
            if "hostside" not in p.parts and "argparse" in p.read_text()]
    assert left == []


def test_remove_is_the_deploy_with_present_false(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "_checkout", lambda ctx: ROOT)
    monkeypatch.setattr(cli, "check_inventory", lambda inv, opts: None)
    monkeypatch.setattr(cli, "_in_checkout", lambda argv, where, **kw: seen.append(argv) or 0)
    assert cli.main(["remove", "inv.py", "--limit", "h1", "--weights"]) == 0
    argv = seen.pop()
    assert argv[:5] == ["-m", "pyinfra", "-y", "inv.py", "deploys/kimi_k26.py"]
    assert argv[argv.index("--limit") + 1] == "h1"
    key, _, data = argv[argv.index("--data") + 1].partition("=")
    assert key == "specfleet"
    assert json.loads(data) == {"present": False, "removal": {"weights": True, "venv": False}}
    # --dry shows the detected changes, which -y would skip.
    assert cli.main(["remove", "inv.py", "--dry"]) == 0
    assert "-y" not in seen[-1] and "--dry" in seen[-1]


def test_a_bug_is_one_line_with_exit_70_never_a_traceback(monkeypatch, capsys):
    def broken(*_a, **_k):
        raise KeyError("boom")

    monkeypatch.setattr(cli, "_checkout", broken)
    assert cli.main(["probe", "inv.py"]) == cli.EXIT_BUG
    err = capsys.readouterr().err
    assert "unexpected KeyError" in err and "fix: this is a bug" in err
    assert "Traceback" not in err


def test_usage_errors_exit_2(capsys):
    assert cli.main(["--bogus", "status", "inv.py"]) == 2
    assert "--bogus" in capsys.readouterr().err
    assert cli.main(["rollout", "inv.py"]) == 2  # no DEPLOY
    assert cli.main(["fanout", "inv.py", "--port", "0"]) == 2


BAD = """
hosts = [
    ("h1", {"ssh_hostname": "127.0.0.1", "ssh_port": 1,
            "specfleet": {"bogus": 1}}),
    ("h2", {"ssh_hostname": "127.0.0.1", "ssh_port": 1,
            "specfleet": {"port": "eighty"}}),
]
"""


@pytest.mark.parametrize("command", ["status", "rollout", "probe", "remove", "fanout", "bench",
                                     "settings", "monitoring"])
def test_bad_settings_of_every_host_at_once_before_any_connection(tmp_path, capsys,
                                                                    monkeypatch, command):
    """Exit 3 with both hosts' problems, and no connection tried: the address is loopback port
    1, which nothing answers (a connection attempt would say "unreachable", not the keys)."""
    inv = tmp_path / "inv.py"
    inv.write_text(BAD)
    monkeypatch.chdir(ROOT)
    extra = {"rollout": ["deploys/kimi_k26.py"], "monitoring": ["--out", str(tmp_path)]}
    assert cli.main([command, str(inv), *extra.get(command, [])]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert "[h1] unknown settings key 'bogus'" in err, err
    assert "[h2]" in err and "'port'" in err, err
    assert "No hosts remaining" not in err and "Traceback" not in err


_PIN = "0123456789abcdef0123456789abcdef01234567"
PINS = f'"target": {{"revision": "{_PIN}"}}, "drafter": {{"revision": "{_PIN}"}}'


def test_settings_shows_each_host_merged_with_secrets_as_references(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".hf-token").write_text("hf_x\n")
    inv = tmp_path / "inv.py"
    inv.write_text("""
gpu = (["h1", "h2"], {"specfleet": {"port": 31000, "plan": {"tp_size": 8}}})
h2only = (["h2"], {"specfleet": {"api_key": "sk-do-not-print-me", "plan": {"tp_size": 4}}})
""")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        'specfleet = {"weights": {"token_file": "~/.hf-token"}, "models_root": "/data/m", '
        + PINS + '}\n')
    assert cli.main(["settings", str(inv), "h2", "--json"]) == 0
    out = capsys.readouterr().out
    assert "sk-do-not-print-me" not in out
    shown = json.loads(out)
    assert list(shown) == ["h2"]
    h2 = shown["h2"]
    assert h2["port"] == 31000 and h2["models_root"] == "/data/m"
    assert h2["api_key"] == view.HIDDEN
    assert h2["secrets"]["hf_token"] == "file ~/.hf-token on the control machine"
    assert cli.main(["settings", str(inv), "h9"]) == cli.EXIT_INPUT
    assert "name one of: h1, h2" in capsys.readouterr().err


def test_settings_says_whether_the_hf_token_is_set_never_its_value(tmp_path, capsys,
                                                                    monkeypatch):
    """A gated or private repo needs a token: ``settings`` says when none is given on the
    control machine, and only 'set' when one is."""
    inv = tmp_path / "inv.py"
    inv.write_text('hosts = [("h1", {"specfleet": {' + PINS + '}})]\n')
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert cli.main(["settings", str(inv)]) == 0
    out = capsys.readouterr().out
    assert 'hf_token: "$HF_TOKEN on the control machine: unset' in out, out
    assert "gated or private" in out and "export HF_TOKEN" in out
    monkeypatch.setenv("HF_TOKEN", "hf_do_not_print_me")
    assert cli.main(["settings", str(inv), "--json"]) == 0
    out = capsys.readouterr().out
    assert "hf_do_not_print_me" not in out
    assert json.loads(out)["h1"]["secrets"]["hf_token"] == "$HF_TOKEN on the control machine: set"
    # A variable of the settings' own choosing, unset: the deploy would stop, and says so here.
    inv.write_text('hosts = [("h1", {"specfleet": {"weights": {"token_env": "HF_TOKEN_PROD"}, '
                   + PINS + '}})]\n')
    monkeypatch.delenv("HF_TOKEN_PROD", raising=False)
    assert cli.main(["settings", str(inv), "--json"]) == cli.EXIT_INPUT
    out, err = capsys.readouterr()
    token = json.loads(out)["h1"]["secrets"]["hf_token"]
    assert token.startswith("$HF_TOKEN_PROD on the control machine: unset"), token
    assert "weights.token_env names $HF_TOKEN_PROD, which is not set here" in err


@pytest.mark.parametrize("text, names", [
    ("@local", ["@local"]), ("h1", ["h1"]), ("h1,h2", ["h1", "h2"]),
    ("@ssh/h1,@local", ["@ssh/h1", "@local"]), ("@docker/debian:12", ["@docker/debian:12"]),
    ("inventories/x.py", None), ("x.py", None), ("dir/inv", None), ("h1,,h2", None),
    ("", None),
])
def test_inventories_as_pyinfra_takes_them(text, names):
    assert inventory_names(text) == names


def test_a_host_list_inventory_loads_with_override_data():
    inv = load_inventory("h1,h2", {"ssh_port": 2222}, only=["h2"])
    assert [h.name for h in inv] == ["h2"]
    assert inv.get_override_data() == {"ssh_port": 2222}
    assert [h.name for h in load_inventory("@local")] == ["@local"]


def test_status_lists_every_host_the_unreachable_with_their_error():
    document = {"hosts": {"h1": {"host": "h1", "drift": [], "healthy": True,
                                 "verdict": "in sync, healthy"}}}
    doc = view.status_document(document, ["h1", "h2"], {"h2": "Could not connect (timed out)"})
    assert list(doc["hosts"]) == ["h1", "h2"]
    assert doc["hosts"]["h1"]["reachable"] is True
    assert doc["hosts"]["h2"] == {"host": "h2", "reachable": False,
                                  "error": "Could not connect (timed out)", "drift": [],
                                  "healthy": False,
                                  "verdict": "unreachable: Could not connect (timed out)"}
    assert view.status_exit(0, doc, fail_on_drift=False) == 1
    assert "h2  unreachable: Could not connect" in view.unreachable_table(doc)
    synced = view.status_document(document, ["h1"], {})
    assert view.status_exit(0, synced, fail_on_drift=True) == 0
    drifted = view.status_document(
        {"hosts": {"h1": {"host": "h1", "drift": ["unit"], "verdict": "drift: unit"}}},
        ["h1"], {})
    assert view.status_exit(0, drifted, fail_on_drift=False) == 0
    assert view.status_exit(0, drifted, fail_on_drift=True) == cli.EXIT_DRIFT


def test_guarded_turns_a_specfleet_error_into_exit_3(capsys):
    from specfleet.core.errors import SpecfleetError

    @cli.guarded
    def body() -> int:
        raise SpecfleetError("it is wrong", host="h1", fix="do this")

    with pytest.raises(click.exceptions.Exit) as done:
        body()
    assert done.value.exit_code == 3
    assert "specfleet: [h1] it is wrong\n  fix: do this" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# --dry tells the truth: conditional operations with their condition, decided where it can be
# --------------------------------------------------------------------------------------------------


def test_a_dry_host_with_only_conditional_changes_is_conditional_not_would_change():
    from specfleet.fleet.pyinfra_run import HostStep
    from specfleet.fleet.rollout import HostReport, dry_status, summary_table

    restart = "Kimi K2.6 | Restart (if the software or weights change)"
    assert dry_status(HostStep("ok")) == "ok"
    assert dry_status(HostStep("ok", conditional_ops=[restart])) == "conditional"
    assert dry_status(HostStep("changed", changed_ops=["Kimi K2.6 | Weights"],
                               conditional_ops=[restart])) == "would change"
    assert dry_status(HostStep("failed", why=["no GPUs"])) == "failed"
    row = HostReport("h1", 0, status="would change", changed_ops=["Kimi K2.6 | Weights"],
                     conditional_ops=[restart])
    assert f"Kimi K2.6 | Weights; conditional: {restart}" in summary_table([row])


def test_conditions_in_words_and_which_depend_only_on_changes():
    from pyinfra.operations.util import all_changed, any_changed

    from specfleet.core.errors import CONDITION_ATTR
    from specfleet.fleet.pyinfra_run import _conditional_name, _on_changes_only

    class Meta:
        names = {"Kimi K2.6 | Restart for new software or weights"}

    state = type("S", (), {"op_meta": {"op": Meta()}})()
    said = any_changed()
    setattr(said, CONDITION_ATTR, "if the software or weights change")
    assert _conditional_name(state, "op", said) == (
        "Kimi K2.6 | Restart for new software or weights (if the software or weights change)")
    assert _conditional_name(state, "op", lambda: True).endswith(
        "(if its condition holds at run time)")
    assert _on_changes_only(said) and _on_changes_only(any_changed())
    assert _on_changes_only([any_changed(), all_changed()])
    # Any other condition may read anything (another host's failure, the data): never decided.
    assert not _on_changes_only(lambda: True)
    assert not _on_changes_only([any_changed(), lambda: True])


def test_plain_pyinfra_s_last_bad_host_ends_with_its_settings_not_no_hosts_remaining():
    from pyinfra.api import Config, Inventory, State

    from operations.util import settings_in_play
    from specfleet.core.settings import SettingsError

    inv = Inventory(([("a", {"specfleet": {"bogus": 1}}), ("b", {"specfleet": {"port": "x"}})],
                     {}))
    state = State(inv, Config())
    state.active_hosts = set(inv)  # as after connecting
    a, b = inv.get_host("a"), inv.get_host("b")
    assert settings_in_play(a) is None  # failed alone: b goes on
    assert state.active_hosts == {b}
    with pytest.raises(SettingsError) as raised:
        settings_in_play(b)
    assert raised.value.render().startswith("[b] ") and "'port'" in raised.value.render()
