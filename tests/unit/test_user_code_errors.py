"""An inventory's own Python error is the user's (issue 56): said with its file and line, exit 3,
one line and a fix; not "this is a bug in specfleet" (exit 70), not a traceback."""

from __future__ import annotations

import pytest

from specfleet import cli


@pytest.mark.parametrize("text,line,kind", [
    ('hosts = [\n    ("box", {"ssh_hostname": ADDRESS}),\n]\n', 2, "NameError: name 'ADDRESS'"),
    ('hosts = [\n  ("box", {)\n]\n', 2, "SyntaxError"),
    ('import json\n\nhosts = json.loads("[")\n', 3, "JSONDecodeError"),
])
@pytest.mark.parametrize("command", [["settings"], ["status"], ["monitoring", "--out", "x"]])
def test_an_error_in_the_inventory_names_its_file_and_line(tmp_path, capsys, text, line, kind,
                                                           command):
    inv = tmp_path / "inv.py"
    inv.write_text(text)
    argv = [command[0], str(inv), *command[1:]]
    assert cli.main(argv) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert f"{inv}:{line}: {kind}" in err, err
    assert "fix: fix inv.py at that line" in err
    assert "bug in specfleet" not in err and "Traceback" not in err


def test_an_error_in_group_data_names_that_file(tmp_path, capsys):
    inv = tmp_path / "inv.py"
    inv.write_text('hosts = ["box"]\n')
    (tmp_path / "group_data").mkdir()
    bad = tmp_path / "group_data" / "all.py"
    bad.write_text('specfleet = {\n    "port": 1 / 0,\n}\n')
    assert cli.main(["settings", str(inv)]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert f"{bad}:2: ZeroDivisionError" in err, err
