"""specfleet's top-level parser hands each sub-command its own options, help included."""

from __future__ import annotations

import pytest

from specfleet import cli


@pytest.mark.parametrize("command, usage", [
    ("rollout", "usage: specfleet rollout"),
    ("fanout", "--degree"),
    ("sweep", "usage:"),
])
def test_a_sub_command_s_help_is_its_own(capsys, command, usage):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    assert usage in capsys.readouterr().out


def test_options_before_the_first_argument_reach_the_sub_command(monkeypatch):
    seen = []
    monkeypatch.setattr(cli.rollout, "main", lambda rest: seen.append(rest) or 0)
    monkeypatch.setattr(cli, "checkout_dir", lambda *_: None)
    assert cli.main(["rollout", "--dry", "inv.py", "deploys/kimi_k26.py", "--limit", "h1"]) == 0
    assert seen == [["--dry", "inv.py", "deploys/kimi_k26.py", "--limit", "h1"]]


def test_the_top_level_still_refuses_what_no_command_takes(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--bogus", "status", "inv.py"])
    assert done.value.code == 2
    assert "--bogus" in capsys.readouterr().err
