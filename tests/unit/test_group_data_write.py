"""``specfleet sweep --write-group-data FILE`` changes only the plan keys it decides (issue 56):
in a group data file of the user's, everything else (other settings, other data, comments)
stays; a second sweep replaces its own block; a new file holds just the winner."""

from __future__ import annotations

import runpy

from specfleet.core import bench as core

PLAN = {"draft_window_size": 2048, "extra_args": {"--speculative-num-draft-tokens": "8"}}
USERS = '''"""H100 hosts."""
# our own comment
ssh_user = "ubuntu"
specfleet = {"port": 31000, "plan": {"mem_fraction_static": 0.8,
                                     "extra_args": {"--enable-foo": True}}}
'''


def load(path) -> dict:
    return runpy.run_path(str(path))


def test_a_new_file_holds_the_winner(tmp_path):
    path = tmp_path / "g.py"
    path.write_text(core.group_data_merged(None, "sm90", PLAN))
    assert load(path)["specfleet"] == {"plan": PLAN}


def test_an_existing_file_keeps_everything_but_the_swept_keys(tmp_path):
    path = tmp_path / "g.py"
    path.write_text(core.group_data_merged(USERS, "sm90", PLAN))
    text = path.read_text()
    assert text.startswith(USERS) and "# our own comment" in text
    data = load(path)
    assert data["ssh_user"] == "ubuntu"
    assert data["specfleet"] == {"port": 31000, "plan": {
        "mem_fraction_static": 0.8, "draft_window_size": 2048,
        "extra_args": {"--enable-foo": True, "--speculative-num-draft-tokens": "8"}}}
    assert not any(k.startswith("_specfleet") for k in data)
    # A second sweep replaces its own block: one block, the new winner.
    again = core.group_data_merged(text, "sm90", {"draft_window_size": 4096})
    assert again.count(core.SWEEP_BEGIN) == 1 and again.startswith(USERS)
    path.write_text(again)
    plan = load(path)["specfleet"]["plan"]
    assert plan["draft_window_size"] == 4096 and "--speculative-num-draft-tokens" not in \
        plan["extra_args"]


def test_the_sweep_writes_into_a_folder_it_makes_and_keeps_the_rest(tmp_path):
    """Sweep.finish with --write-group-data: the folder is made; a second sweep into a file of
    the user's changes only the swept plan keys."""
    from types import SimpleNamespace

    from specfleet.fleet.sweep import Sweep

    point = {"num_draft_tokens": 4, "draft_window": 2048}
    key = core.point_key(point)
    target = tmp_path / "new" / "group_data" / "h100.py"
    args = SimpleNamespace(host="box", concurrency="1", requests=0, max_tokens=8,
                           write_group_data=str(target), no_report=True)
    sweep = Sweep(args, [point], tmp_path / "out")
    sweep.state.points[key].update(status="done", result={
        "meta": {"arch": "sm90"}, "levels": [{"concurrency": 1, "output_tokens_per_s": 9.0}]})
    (tmp_path / "out").mkdir()
    sweep.finish(key)
    plan = core.point_overrides(point)
    assert load(target)["specfleet"] == {"plan": plan}
    target.write_text(USERS)
    sweep.finish(key)
    data = load(target)
    assert data["ssh_user"] == "ubuntu" and data["specfleet"]["port"] == 31000
    assert data["specfleet"]["plan"]["mem_fraction_static"] == 0.8
    assert data["specfleet"]["plan"]["draft_window_size"] == 2048
