"""The rollout's pure parts, in milliseconds: batches, the failure budget, options, reading
pyinfra's results (real captures in tests/fixtures/rollout/), the controller's decisions with a
scripted runner, and the rollback decisions (pins, files, wheel cache, drift)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from facts.rollback import parse_rollback_state
from operations.rollback import (
    drift,
    file_restores,
    missing_wheels,
    pin_changes,
    pin_name,
    pip_source_args,
)
from specfleet.core.errors import SpecfleetError
from specfleet.core.settings import RolloutOptions
from specfleet.fleet.pyinfra_run import (
    HostStep,
    PyinfraOptions,
    StepRun,
    failure_text,
    select_hosts,
)
from specfleet.fleet.rollout import (
    GATE_DEPLOY,
    LOCK_DEPLOY,
    RESTORE_DEPLOY,
    SNAPSHOT_DEPLOY,
    HostReport,
    Options,
    Rollout,
    batch_size_for,
    busy_words,
    make_batches,
    over_budget,
    resolve_options,
    summary_table,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "rollout"
H4 = ["h1", "h2", "h3", "h4"]


# --------------------------------------------------------------------------------------------------
# Batches and budget


def test_canary_first_alone_then_batches_in_inventory_order():
    assert make_batches(H4, batch_size=2) == [["h1"], ["h2", "h3"], ["h4"]]
    assert make_batches(H4) == [["h1"], ["h2"], ["h3"], ["h4"]]
    assert make_batches(H4, batch_size=10) == [["h1"], ["h2", "h3", "h4"]]
    assert make_batches(["only"]) == [["only"]]


def test_explicit_order_and_canary():
    assert make_batches(H4, order=["h3", "h1"], batch_size=2) == [["h3"], ["h1", "h2"], ["h4"]]
    assert make_batches(H4, canary="h4", batch_size=2) == [["h4"], ["h1", "h2"], ["h3"]]
    assert make_batches(H4, order=["h2", "h3", "h4", "h1"], canary="h4", batch_size=3) == [
        ["h4"], ["h2", "h3", "h1"]]


@pytest.mark.parametrize(("total", "percent", "size"), [
    (4, 25, 1), (4, 50, 2), (10, 30, 3), (10, 35, 3), (4, 10, 1), (7, 100, 7), (3, 33.34, 1),
    (100, 0.5, 1),
])
def test_batch_percent_is_of_the_whole_fleet_rounded_down_at_least_one(total, percent, size):
    assert batch_size_for(total, None, percent) == size


def test_batch_percent_shapes_the_batches():
    hosts = [f"g{i}" for i in range(10)]
    assert [len(b) for b in make_batches(hosts, batch_percent=30)] == [1, 3, 3, 3]


@pytest.mark.parametrize(("hosts", "kw", "message"), [
    (H4, {"order": ["h5"]}, "--order names hosts not in the inventory: h5"),
    (H4, {"order": ["h1", "h1"]}, "--order names h1 more than once"),
    (H4, {"canary": "gpu9"}, "the canary 'gpu9' is not in the inventory"),
    ([], {}, "the inventory has no hosts"),
    (H4, {"batch_size": 2, "batch_percent": 50}, "both a batch size and a batch percent"),
])
def test_bad_batching_input_is_a_clear_error(hosts, kw, message):
    with pytest.raises(SpecfleetError) as err:
        make_batches(hosts, **kw)
    assert message in err.value.render()
    assert "fix: " in err.value.render()


@pytest.mark.parametrize(("failed", "size", "budget", "canary", "stop"), [
    (0, 3, 0, False, False),
    (1, 3, 0, False, True),
    (1, 2, 50, False, False),   # 50% is not more than 50%: Ansible's max_fail_percentage
    (1, 2, 49, False, True),
    (2, 2, 99.9, False, True),
    (2, 2, 100, False, False),
    (1, 3, 33.33, False, True),
    (1, 3, 34, False, False),
    (1, 1, 100, True, True),    # the canary: any failure stops, whatever the budget
    (0, 1, 0, True, False),
])
def test_over_budget(failed, size, budget, canary, stop):
    assert over_budget(failed, size, budget, canary=canary) is stop


def test_options_from_settings_and_flags():
    per_host = {h: RolloutOptions(batch_size=2, max_fail_percent=25) for h in H4}
    opts = resolve_options(per_host, {})
    assert (opts.batch_size, opts.max_fail_percent, opts.prefetch_weights) == (2, 25.0, True)
    opts = resolve_options(per_host, {"max_fail_percent": 50, "canary": "h3",
                                      "prefetch_weights": False})
    assert (opts.max_fail_percent, opts.canary, opts.prefetch_weights) == (50, "h3", False)


def test_hosts_that_disagree_on_the_rollout_are_an_error_unless_a_flag_decides():
    per_host = {"h1": RolloutOptions(max_fail_percent=10.0), "h2": RolloutOptions(),
                "h3": RolloutOptions()}
    with pytest.raises(SpecfleetError) as err:
        resolve_options(per_host, {})
    text = err.value.render()
    assert "hosts disagree on rollout.max_fail_percent: 10.0 on h1; 0.0 on h2, h3" in text
    assert "--max-fail-percent" in text
    assert resolve_options(per_host, {"max_fail_percent": 5}).max_fail_percent == 5


@pytest.mark.parametrize(("flags", "message"), [
    ({"batch_size": 2, "batch_percent": 50}, "both rollout.batch_size and"),
    ({"batch_size": 0}, "rollout.batch_size is 0"),
    ({"batch_percent": 150}, "rollout.batch_percent is 150"),
    ({"max_fail_percent": -1}, "rollout.max_fail_percent is -1"),
])
def test_bad_rollout_flags(flags, message):
    # Bad values in the settings never get here (RolloutOptions refuses them); the flags can.
    with pytest.raises(SpecfleetError, match=message):
        resolve_options({"h1": RolloutOptions()}, flags)


# --------------------------------------------------------------------------------------------------
# Reading pyinfra's results (pyinfra's objects; tests/unit/test_pyinfra_run.py runs the real API)


def test_a_failure_reads_as_the_reason_the_operation_gave_on_its_meta():
    """The why of a failed host comes from pyinfra's OperationMeta: the reason the operation
    put there (record_failure), else the failed command's stderr; never from the log."""
    from types import SimpleNamespace

    from specfleet.core.errors import ERROR_ATTR

    meta = SimpleNamespace(stderr_lines=["x", "E: boom"], stdout_lines=[])
    setattr(meta, ERROR_ATTR, "sf-roll.service not ready after 16 s\n    | journal line\n"
            "  fix: read `journalctl -u sf-roll.service`")
    assert failure_text(meta) == ["sf-roll.service not ready after 16 s",
                                  "fix: read `journalctl -u sf-roll.service`"]
    plain = SimpleNamespace(stderr_lines=["x", "y", "z", "E: boom"], stdout_lines=[])
    assert failure_text(plain) == ["y", "z", "E: boom"]


def test_a_busy_lock_reads_as_who_holds_it_and_since_when():
    why = ["in 'Hold the run lock for the whole rollout': another specfleet run holds this host: "
           "ops@ctl (run 5e0b7c1d2a9f, pid 42 on machine 9f1c2b3a, since 2026-12-01 15:00:00)"
           ": python -m specfleet.fleet.rollout inv.py; its lease expires ..."]
    assert busy_words(why) == ("ops@ctl (run 5e0b7c1d2a9f, pid 42 on machine 9f1c2b3a, since "
                               "2026-12-01 15:00:00)")
    assert busy_words(["in 'x': disk full"]) is None


def test_limit_selects_hosts_and_groups_and_rejects_what_matches_nothing():
    groups = {"gpu": ["h1", "h2"], "all": H4}
    assert select_hosts(H4, groups, []) == H4
    assert select_hosts(H4, groups, ["gpu"]) == ["h1", "h2"]
    assert select_hosts(H4, groups, ["h4", "h3"]) == ["h3", "h4"]
    assert select_hosts(H4, groups, ["h[34]"]) == ["h3", "h4"]
    with pytest.raises(SpecfleetError, match="--limit h9 matches no host or group"):
        select_hosts(H4, groups, ["h9"])


def test_pyinfra_options_become_override_data_as_the_cli_makes_them():
    o = PyinfraOptions(ssh_user="deploy", key="/k", port=2222,
                       data=["ssh_strict_host_key_checking=off", "n=3"])
    assert o.override_data() == {"ssh_strict_host_key_checking": "off", "n": 3,
                                 "ssh_user": "deploy", "ssh_key": "/k", "ssh_port": 2222}
    with pytest.raises(SpecfleetError, match="not KEY=VALUE"):
        PyinfraOptions(data=["oops"]).override_data()


# --------------------------------------------------------------------------------------------------
# The controller, with a scripted runner (no pyinfra, no hosts)


class Script:
    """A runner that answers each step from a table: {(deploy kind, host): status}."""

    def __init__(self, fails: dict[tuple[str, str], str] | None = None):
        self.fails = fails or {}
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, inventory, deploy, hosts, name):
        kind = {SNAPSHOT_DEPLOY: "snapshot", GATE_DEPLOY: "gate", RESTORE_DEPLOY: "rollback",
                LOCK_DEPLOY: "lock", "prefetch.py": "prefetch"}.get(Path(deploy).name, "deploy")
        self.calls.append((kind, list(hosts)))
        results = {}
        for h in hosts:
            status = self.fails.get((kind, h), "changed" if kind in ("deploy", "rollback") else "ok")
            results[h] = HostStep(status, changed_ops=["x"] if status == "changed" else [],
                                  why=[f"{kind} broke"] if status not in ("ok", "changed") else [])
        return StepRun(name, list(hosts), 0, 0.01, results)

    def touched(self) -> set[str]:
        return {h for kind, hosts in self.calls if kind not in ("prefetch", "lock")
                for h in hosts}


def _rollout(script, **opts) -> Rollout:
    return Rollout("inv.py", "deploy.py", H4, Options(**opts), "prefetch.py", runner=script)


def test_a_clean_rollout_runs_every_step_in_order():
    script = Script()
    r = _rollout(script, batch_size=2)
    assert r.run() == 0
    assert script.calls == [
        ("lock", H4),  # every host's run lock, once, before any step
        ("prefetch", H4),
        ("snapshot", ["h1"]), ("deploy", ["h1"]), ("gate", ["h1"]),
        ("snapshot", ["h2", "h3"]), ("deploy", ["h2", "h3"]), ("gate", ["h2", "h3"]),
        ("snapshot", ["h4"]), ("deploy", ["h4"]), ("gate", ["h4"]),
    ]
    assert {h: rep.status for h, rep in r.reports.items()} == {h: "changed" for h in H4}


def test_a_failed_canary_is_rolled_back_and_nothing_else_is_touched():
    script = Script({("gate", "h1"): "failed"})
    r = _rollout(script, batch_size=2, max_fail_percent=100)
    assert r.run() == 2
    assert script.touched() == {"h1"}
    assert ("rollback", ["h1"]) in script.calls
    assert r.reports["h1"].status == "rolled back"
    assert r.stopped == "the canary h1 failed"
    assert [r.reports[h].status for h in ("h2", "h3", "h4")] == ["not started"] * 3


def test_within_budget_continues_past_budget_stops():
    within = _rollout(Script({("deploy", "h3"): "failed"}), batch_size=2, max_fail_percent=50)
    assert within.run() == 1
    assert within.reports["h4"].status == "changed"
    assert within.reports["h3"].status == "rolled back"

    script = Script({("deploy", "h3"): "failed"})
    past = _rollout(script, batch_size=2, max_fail_percent=49)
    assert past.run() == 2
    assert "h4" not in script.touched()
    assert past.reports["h4"].status == "not started"
    assert past.stopped == "1 of 2 hosts of batch 1/2 failed, over the budget of 49%"


def test_an_unreachable_host_counts_against_the_budget_and_is_not_rolled_back():
    script = Script({("snapshot", "h2"): "unreachable"})
    r = _rollout(script, batch_size=2, max_fail_percent=50)
    assert r.run() == 1
    assert r.reports["h2"].status == "failed" and r.reports["h2"].unreachable
    assert r.reports["h2"].why == ["snapshot: snapshot broke"]
    assert not any(kind in ("deploy", "rollback") and "h2" in hosts
                   for kind, hosts in script.calls)
    stop = _rollout(Script({("deploy", "h2"): "unreachable"}), batch_size=2, max_fail_percent=0)
    assert stop.run() == 2 and stop.reports["h4"].status == "not started"


def test_a_prefetch_failure_keeps_the_host_out_and_counts_in_its_batch():
    script = Script({("prefetch", "h3"): "failed"})
    r = _rollout(script, batch_size=2, max_fail_percent=0)
    assert r.run() == 2
    assert "h3" not in script.touched()
    assert r.reports["h3"].why == ["prefetch: prefetch broke"]
    assert r.reports["h4"].status == "not started"
    # Without prefetch, the prefetch deploy never runs.
    script = Script()
    assert _rollout(script, batch_size=2, prefetch_weights=False).run() == 0
    assert all(kind != "prefetch" for kind, _ in script.calls)


def test_the_default_prefetch_is_the_fanout_in_rollout_order(monkeypatch):
    import specfleet.fleet.rollout

    seen = {}

    def fake_run_prefetch(inventory, hosts, order=None, runner=None, **kw):
        seen.update(inventory=inventory, hosts=list(hosts), order=list(order), runner=runner)
        return runner(inventory, "prefetch.py", hosts, "prefetch")

    monkeypatch.setattr(specfleet.fleet.rollout, "run_prefetch", fake_run_prefetch)
    script = Script({("prefetch", "h2"): "failed"})
    r = Rollout("inv.py", "deploy.py", H4, Options(canary="h3", batch_size=3,
                                                   max_fail_percent=50), None, runner=script)
    assert r.run() == 1
    assert seen == {"inventory": "inv.py", "hosts": ["h3", "h1", "h2", "h4"],
                    "order": ["h3", "h1", "h2", "h4"], "runner": script}
    assert r.reports["h2"].why == ["prefetch: prefetch broke"]
    # --no-fanout without a weights-only deploy file: no prefetch (and no fan-out).
    seen.clear()
    script = Script()
    r = Rollout("inv.py", "deploy.py", H4, Options(fanout=False), None, runner=script)
    monkeypatch.setattr("specfleet.fleet.rollout.DEFAULT_PREFETCH", Path("/nonexistent/weights_only.py"))
    assert r.run() == 0 and seen == {}
    assert all(kind != "prefetch" for kind, _ in script.calls)


def test_a_failed_rollback_is_reported_as_failed():
    script = Script({("gate", "h2"): "failed", ("rollback", "h2"): "failed"})
    r = _rollout(script, batch_size=3, max_fail_percent=50)
    assert r.run() == 1
    assert r.reports["h2"].status == "failed"
    assert r.reports["h2"].why == ["gate: gate broke", "rollback FAILED: rollback broke"]


def test_summary_table_has_one_row_per_host_with_times():
    reports = [
        HostReport("h1", 0, "changed", [], {"snapshot": 1.0, "deploy": 12.25, "gate": 0.5}),
        HostReport("h2", 1, "rolled back", ["deploy: in 'SGLang server': not ready"],
                   {"deploy": 3.0, "rollback": 4.0}),
        HostReport("h3", 2, "not started", ["not started: the rollout stopped"], {}),
    ]
    lines = summary_table(reports).splitlines()
    assert lines[0].split() == ["host", "batch", "result", "prefetch", "snapshot", "deploy",
                                "gate", "rollback", "why"]
    assert lines[1].split()[:8] == ["h1", "canary", "changed", "-", "1.0s", "12.2s", "0.5s", "-"]
    assert lines[2].startswith("h2") and "rolled back" in lines[2] and "4.0s" in lines[2]
    assert lines[2].endswith("deploy: in 'SGLang server': not ready")
    assert lines[3].endswith("not started: the rollout stopped")


# --------------------------------------------------------------------------------------------------
# Rollback decisions


def test_pin_changes_return_the_venv_to_its_freeze():
    saved = ["compressed-tensors==0.9.4", "sglang==0.5.11", "Foo_Bar==1.0"]
    current = ["compressed_tensors==0.18.0", "sglang==0.5.14", "foo-bar==1.0", "newdep==2"]
    ch = pin_changes(saved, current)
    assert ch.install == ["compressed-tensors==0.9.4", "sglang==0.5.11"]
    assert ch.uninstall == ["newdep"]
    assert pin_changes(saved, saved).empty
    git = "sglang @ git+https://github.com/sgl-project/sglang@0123abc#subdirectory=python"
    assert pin_changes([git], ["sglang==0.5.11"]).install == [git]
    assert pin_name("-e /src/x") is None and pin_name("# comment") is None


def test_missing_wheels_only_for_managed_pins():
    freeze = ["sglang==0.5.11", "compressed-tensors==0.18.0", "numpy==2.0.0",
              "sglang-router @ file:///x.whl"]
    wheels = ["compressed_tensors-0.18.0-py3-none-any.whl", "junk.txt"]
    assert missing_wheels(freeze, wheels) == ["sglang==0.5.11"]
    assert missing_wheels(freeze, [*wheels, "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"]) == []


def test_rollback_state_from_a_real_host_and_what_it_means():
    state = parse_rollback_state((FIXTURES / "rollback_state.txt").read_text().splitlines())
    assert state["saved"]["taken"] == "2026-11-30T15:24:11+00:00"
    assert state["saved"]["unit"] == state["current"]["unit"]
    assert state["saved"]["env"] != state["current"]["env"]
    assert state["current"]["secret"] is None and state["saved"]["secret"] is None
    assert state["current"]["freeze"] == ["compressed-tensors==0.18.0", "sglang==0.5.11"]
    assert len(state["wheels"]) == 2
    assert drift(state) == ["the environment file"]
    assert file_restores(state) == [("env", "copy")]
    assert missing_wheels(state["current"]["freeze"], state["wheels"]) == []


def test_no_rollback_point_yet_and_files_to_remove():
    empty = parse_rollback_state([])
    assert empty["saved"] is None
    assert drift(empty) == ["there is no rollback point yet"]
    state = parse_rollback_state(["saved.taken=t", "cur.unit=abc", "cur.secret=def",
                                  "saved.secret=def", "cur.patch=9f2c", "saved.patch=9f2c"])
    assert file_restores(state) == [("unit", "remove")]
    assert drift(state) == ["the unit"]
    state = parse_rollback_state(["saved.taken=t", "cur.patch=9f2c"])
    assert drift(state) == ["the PR#20547 patch state"]


def test_the_drafter_rope_patch_state_is_part_of_the_point():
    """Issue #52 x #55: the RoPE patch a failed deploy applied is drift from a point taken
    without it, and a point that kept it differs from a host that lost it; each patch keeps its
    own marker, and a point taken before the RoPE state was kept says "not applied"."""
    from facts.rollback import RollbackState

    cmd = RollbackState().command(directory="/d", unit="/u", env="/e", secret="/s", venv="/v",
                                  wheels="/w")
    assert "/v/.specfleet/dflash-rope/sha256" in cmd and "/d/rope/sha256" in cmd
    assert "/v/.specfleet/pr20547/sha256" in cmd and "/d/patch/sha256" in cmd
    state = parse_rollback_state(["saved.taken=t", "cur.rope=4e07"])
    assert state["current"]["rope"] == "4e07" and state["current"]["patch"] is None
    assert state["saved"]["rope"] is None
    assert drift(state) == ["the drafter RoPE patch state"]
    state = parse_rollback_state(["saved.taken=t", "saved.rope=4e07", "saved.patch=9f2c",
                                  "cur.patch=9f2c"])
    assert drift(state) == ["the drafter RoPE patch state"]
    state = parse_rollback_state(["saved.taken=t", "saved.rope=4e07", "cur.rope=4e07"])
    assert drift(state) == []


def test_pip_sources_put_the_wheel_cache_first():
    from specfleet.core.settings import settings_from_dict

    s = settings_from_dict({"sglang": {"find_links": "http://10.250.1.1:8000/",
                                       "trusted_hosts": ["10.250.1.1"]}})
    assert pip_source_args(s, "/w") == [
        "--no-input", "--disable-pip-version-check", "--find-links", "/w", "--no-index",
        "--find-links", "http://10.250.1.1:8000/", "--trusted-host", "10.250.1.1"]
    s = settings_from_dict({"sglang": {"index_url": "https://mirror/simple"}})
    assert pip_source_args(s, "/w")[2:] == ["--find-links", "/w", "--index-url",
                                            "https://mirror/simple"]


def test_a_busy_host_is_not_started_never_touched_and_never_rolled_back():
    class Busy(Script):
        def __call__(self, inventory, deploy, hosts, name):
            run = super().__call__(inventory, deploy, hosts, name)
            if Path(deploy).name == LOCK_DEPLOY and "h2" in hosts:
                run.results["h2"] = HostStep("failed", why=[
                    "in 'Hold the run lock': another specfleet run holds this host: "
                    "bob@ci (run abc, pid 7, since 2026-12-01 15:00:00): pyinfra inv.py "
                    "deploys/kimi_k26.py; its lease expires ..."])
            return run

    script = Busy({("gate", "h2"): "failed"})
    r = _rollout(script, batch_size=2, max_fail_percent=0)
    assert r.run() == 1
    assert "h2" not in script.touched()
    assert r.reports["h2"].status == "not started" and not r.reports["h2"].failed
    assert r.reports["h2"].why == [
        "not started: busy (held by bob@ci (run abc, pid 7, since 2026-12-01 15:00:00))"]
    assert [r.reports[h].status for h in ("h1", "h3", "h4")] == ["changed"] * 3


def test_the_fleet_download_adds_every_hosts_progress_up():
    from specfleet.fleet.progress import download_words, fleet_download

    gib = 1024**3
    d = fleet_download([
        {"bytes_done": 100 * gib, "bytes_total": 600 * gib, "rate_bps": 1e9,
         "state": "downloading"},
        {"bytes_done": 312 * gib, "bytes_total": 600 * gib, "rate_bps": 0.9e9,
         "state": "downloading"},
        {"bytes_done": 0, "bytes_total": 0, "state": "done"},
    ])
    assert d["active"] == 2 and round(d["rate"]) == 1.9e9
    assert round(d["eta"]) == round(788 * gib / 1.9e9)
    assert download_words(d, 3) == "412.0 of 1200.0 GiB across 3 hosts, 1.90 GB/s, 7 min left"
    assert fleet_download([])["eta"] is None


def test_the_fleet_download_before_any_size_is_known_says_so_not_zeros():
    from specfleet.fleet.progress import download_words, fleet_download

    assert download_words(fleet_download([]), 0) == "no host downloading"
    listing = fleet_download([{"bytes_done": 0, "bytes_total": 0, "state": "planning"}] * 2)
    assert download_words(listing, 2) == "no size known yet on 2 hosts"


def test_the_live_view_renders_every_host_in_its_batch():
    from rich.console import Console

    from specfleet.fleet.progress import RichView

    r = _rollout(Script(), batch_size=2)
    r.run()
    view = RichView(r)
    view.step("batch 1/2 gate", ["h2", "h3"])
    console = Console(record=True, width=120)
    console.print(view.table())
    text = console.export_text()
    assert "prefetch: no host downloading" in text
    for h in H4:
        assert h in text
    assert "batch 1/2 gate" in text and "canary" in text


# --------------------------------------------------------------------------------------------------
# Serving groups: one unit in the batches
# --------------------------------------------------------------------------------------------------

PAIR = {"g0": ["g0", "g1"], "g1": ["g0", "g1"]}


def test_a_serving_group_is_never_split_across_batches():
    hosts = ["a", "g1", "b", "g0", "c"]
    assert make_batches(hosts, batch_size=2, groups=PAIR) == [
        ["a"], ["g0", "g1"], ["b", "c"],
    ]
    # Larger than the batch size: a batch of its own.
    assert make_batches(hosts, batch_size=1, groups=PAIR) == [
        ["a"], ["g0", "g1"], ["b"], ["c"],
    ]


def test_the_canarys_group_is_the_canary_in_rank_order():
    hosts = ["a", "g0", "g1", "b"]
    assert make_batches(hosts, canary="g1", batch_size=3, groups=PAIR) == [
        ["g0", "g1"], ["a", "b"],
    ]


def test_without_groups_the_batches_are_as_before():
    hosts = ["a", "b", "c", "d", "e"]
    assert make_batches(hosts, batch_size=2) == [["a"], ["b", "c"], ["d", "e"]]


# --------------------------------------------------------------------------------------------------
# The speed gate (rollout.speed_gate / --speed-gate): each batch benchmarked before and after


class Bench:
    """A scripted ``bench_runner``: each host's tokens/s and acceptance length, before the
    change (the first benchmark of a host) and after it (the second), written as the bench
    client's result files where ``fetch_to`` says."""

    def __init__(self, after: dict[str, tuple[float, float]] | None = None):
        self.after = after or {}
        self.seen: dict[str, int] = {}
        self.calls: list[list[str]] = []

    def __call__(self, inventory, deploy, hosts, data, log_path):
        from specfleet.fleet.bench import DataRun

        assert Path(deploy).name == "bench_kimi.py"
        self.calls.append(list(hosts))
        out = Path(data["specfleet_bench"]["fetch_to"])
        for h in hosts:
            n = self.seen[h] = self.seen.get(h, 0) + 1
            tps, accept = (100.0, 3.0) if n == 1 else self.after.get(h, (99.0, 3.0))
            (out / f"{h}.json").write_text(json.dumps({
                "levels": [{"concurrency": 4, "completed": 2, "output_tokens_per_s": tps}],
                "accept_length": accept}))
        return DataRun(0, 0.01, {h: HostStep("ok") for h in hosts}, "")


def test_the_speed_gate_holds_back_a_slow_host_rolls_it_back_and_counts_it(tmp_path):
    script, bench = Script(), Bench({"h2": (60.0, 3.0)})
    r = Rollout("inv.py", "deploy.py", H4, Options(batch_size=2, max_fail_percent=50,
                                                  speed_gate=0.85), "prefetch.py",
                runner=script, bench_runner=bench, bench_dir=tmp_path)
    assert r.run() == 1
    assert bench.calls == [["h1"], ["h1"], ["h2", "h3"], ["h2", "h3"], ["h4"], ["h4"]]
    kinds = [kind for kind, _ in script.calls]
    assert "gate" not in kinds  # the gate that keeps the rollback point at once is not used
    assert ("rollback", ["h2"]) in script.calls
    assert r.reports["h2"].status == "rolled back"
    assert any("speed gate: 60.0 tok/s is 60% of the earlier 100.0" in w
               for w in r.reports["h2"].why)
    assert {h: r.reports[h].status for h in ("h1", "h3", "h4")} == {
        h: "changed" for h in ("h1", "h3", "h4")}
    # Over the budget, the slow host stops the rollout like a failed gate.
    stop = Rollout("inv.py", "deploy.py", H4, Options(batch_size=2, max_fail_percent=0,
                                                     speed_gate=0.85), "prefetch.py",
                   runner=Script(), bench_runner=Bench({"h3": (100.0, 1.2)}),
                   bench_dir=tmp_path / "2")
    assert stop.run() == 2
    assert "accept length 1.20 is 40% of the earlier 3.00" in " ".join(stop.reports["h3"].why)
    assert stop.reports["h4"].status == "not started"


def test_without_the_speed_gate_nothing_is_benchmarked():
    script, bench = Script(), Bench({"h2": (1.0, 1.0)})
    r = Rollout("inv.py", "deploy.py", H4, Options(batch_size=2), "prefetch.py",
                runner=script, bench_runner=bench)
    assert r.run() == 0 and bench.calls == []
    assert ("gate", ["h1"]) in script.calls


def test_the_speed_gate_option_is_a_fraction():
    with pytest.raises(SpecfleetError, match="rollout.speed_gate is 1.5"):
        resolve_options({}, {"speed_gate": 1.5})
    assert resolve_options({}, {"speed_gate": 0.85}).speed_gate == 0.85
