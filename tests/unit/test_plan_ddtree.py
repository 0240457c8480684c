"""DDTree in the plan: the fork's real tree (facts read from the shared tarball, laid in as a source
install) planned at a budget with its own flags, its block-size rule run by the harness on the
fork's own speculative_hook.py; a release, an unknown design and PR#29907's design (authored)."""

from __future__ import annotations

import json

import pytest

from facts import sglang as sglang_facts
from specfleet.core.plan import PlanError, make_plan
from specfleet.core.settings import settings_from_dict
from specfleet.core.tables import ddtree_designs
from tests.harness.sglang_rules import judge
from tests.harness.sources import DDTREE_FORK_VERSION, ddtree_fork_site
from tests.unit.test_facts_sglang import collect
from tests.unit.test_plan import DRAFTER_CONFIG, host_facts
from tests.unit.test_sglang_rules import LAUNCH_TAIL, machine

FORK = ddtree_designs.FORK_DFLASH_SWITCH
PROFILE = "rtx6000x8"  # CT200's kind of host


@pytest.fixture(scope="module")
def fork_fact() -> dict:
    return collect(ddtree_fork_site())


def fork_facts(fork_fact: dict) -> dict:
    return {**host_facts(PROFILE), "facts.sglang.SGLangInstall": json.loads(json.dumps(fork_fact))}


def settings(**plan):
    return settings_from_dict({"plan": plan})


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.local
def test_fork_planned_with_ddtree_at_a_budget(fork_fact):
    plan = make_plan(fork_facts(fork_fact), settings(ddtree_budget=32), DRAFTER_CONFIG, host="ct")
    argv = plan.argv
    assert value(argv, "--speculative-algorithm") == "DFLASH"
    assert "--speculative-dflash-enable-ddtree" in argv
    assert value(argv, "--speculative-num-draft-tokens") == "32"
    assert argv.count("--speculative-num-draft-tokens") == 1
    assert plan.reason("ddtree").choice == FORK.name
    assert "field:speculative_dflash_enable_ddtree" in plan.reason("ddtree").why
    budget = plan.reason("ddtree-budget")
    assert budget.choice == "--speculative-num-draft-tokens 32"
    assert "block size is 8" in budget.why and "top-k 31" in budget.why
    assert plan.reason("ddtree-switch").choice == "--speculative-dflash-enable-ddtree"
    # The placeholder version, mapped by the tree's files.
    row = plan.reason("version-table")
    assert row.choice == "SGLang 0.5.13 row" and DDTREE_FORK_VERSION in row.why
    # The fork's own parser and rules accept the plan (harness on the fork's tree).
    m = machine(PROFILE, 1)
    tree = str(ddtree_fork_site() / "sglang")
    verdict = judge(tree, m, argv[LAUNCH_TAIL:])
    assert verdict.refused is None, verdict.refused
    assert verdict.disable_overlap_schedule is True  # the fork's DFLASH is the non-overlap worker


@pytest.mark.local
def test_fork_block_size_rule_runs_on_its_own_hook(fork_fact):
    """speculative_hook.py: a block size that differs from the draft tokens only passes with the
    switch on (without it: "For DFLASH they must match")."""
    plan = make_plan(fork_facts(fork_fact), settings(ddtree_budget=64), DRAFTER_CONFIG)
    argv = [*plan.argv[LAUNCH_TAIL:], "--speculative-dflash-block-size", "8"]
    m = machine(PROFILE, 1)
    tree = str(ddtree_fork_site() / "sglang")
    on = judge(tree, m, argv)
    assert on.refused is None, on.refused
    assert "speculative_num_draft_tokens" not in on.changed  # the budget stays 64
    off = judge(tree, m, [a for a in argv if a != FORK.switch_flag])
    assert off.refused is not None and "For DFLASH they must match" in off.refused
    # And the window rule (>= draft tokens) holds for the budget: the planner refuses first.
    with pytest.raises(PlanError, match="smaller than the DDTree budget"):
        make_plan(fork_facts(fork_fact), settings(ddtree_budget=64, draft_window_size=32),
                  DRAFTER_CONFIG)  # fmt: skip
    short = [*plan.argv[LAUNCH_TAIL:]]
    # The 0.5.13 row's window flag (the fork keeps it as a deprecated alias of the new name).
    window_flag = next(a for a in short if a.endswith("draft-window-size"))
    short[short.index(window_flag) + 1] = "32"
    assert "must be >=" in judge(tree, m, short).refused


@pytest.mark.local
def test_fork_without_budget_says_ddtree_is_there(fork_fact):
    plan = make_plan(fork_facts(fork_fact), settings(), DRAFTER_CONFIG)
    assert "--speculative-dflash-enable-ddtree" not in plan.argv
    assert value(plan.argv, "--speculative-num-draft-tokens") == "8"
    assert plan.reason("ddtree").choice == "off"
    assert "plan.ddtree_budget" in plan.reason("ddtree").why


@pytest.mark.local
def test_release_without_ddtree_serves_dflash_in_one_line():
    plain = make_plan(host_facts(PROFILE), settings(), DRAFTER_CONFIG)
    asked = make_plan(host_facts(PROFILE), settings(ddtree_budget=32), DRAFTER_CONFIG)
    assert asked.argv == plain.argv
    lines = [r for r in asked.reasons if r.topic.startswith("ddtree")]
    assert len(lines) == 1
    assert lines[0].choice == "off: serving DFlash"
    assert "SGLang 0.5.23 has no DDTree" in lines[0].why
    assert not [r for r in plain.reasons if r.topic.startswith("ddtree")]


@pytest.mark.local
def test_unknown_design_is_served_without_it():
    facts = host_facts(PROFILE)
    install = json.loads(json.dumps(facts["facts.sglang.SGLangInstall"]))
    install["features"]["ddtree"] = True
    install["ddtree"] = {"design": "unknown", "declared": ["flag:--speculative-tree-ddtree-mode"],
                         "mentions": ["srt/server_args.py"]}  # fmt: skip
    facts["facts.sglang.SGLangInstall"] = install
    plan = make_plan(facts, settings(ddtree_budget=32), DRAFTER_CONFIG)
    assert plan.argv == make_plan(host_facts(PROFILE), settings(), DRAFTER_CONFIG).argv
    reason = plan.reason("ddtree")
    assert "DDTree present, unknown design" in reason.why and "crash-loop" in reason.why


@pytest.mark.local
def test_pr29907_design_flags_and_knobs(tmp_path):
    """PR#29907 (authored from its description; its code is not available here)."""
    from tests.unit.test_facts_sglang import write_tree

    tree = write_tree(tmp_path, {
        "__init__.py": "",
        "srt/speculative/spec_info.py": (
            "from enum import Enum, auto\nclass SpeculativeAlgorithm(Enum):\n"
            "    DFLASH = auto()\n    DDTREE = auto()\n    NONE = auto()\n"
        ),
        "srt/arg_groups/fields/spec.py": "    speculative_ddtree_budget: Optional[int] = None\n",
    })  # fmt: skip
    ddtree = collect(tree)["ddtree"]
    facts = host_facts(PROFILE)
    install = json.loads(json.dumps(facts["facts.sglang.SGLangInstall"]))
    install["ddtree"] = ddtree
    install["speculative_algorithms"] = [*install["speculative_algorithms"], "DDTREE"]
    facts["facts.sglang.SGLangInstall"] = install
    plan = make_plan(facts, settings(ddtree_budget=16, ddtree_max_topk=4), DRAFTER_CONFIG)
    assert value(plan.argv, "--speculative-algorithm") == "DDTREE"
    assert value(plan.argv, "--speculative-ddtree-budget") == "16"
    assert value(plan.argv, "--speculative-num-draft-tokens") == "8"  # the drafter's block
    assert plan.env["SGLANG_DDTREE_MAX_TOPK"] == "4"
    assert "SGLANG_DDTREE_DEPTH_BONUS" not in plan.env


@pytest.mark.parametrize("bad", [1, 0, True, "32", 2.5])
def test_bad_budget_is_refused_by_the_settings(bad):
    from specfleet.core.settings import SettingsError

    with pytest.raises(SettingsError, match="plan.ddtree_budget"):
        settings(ddtree_budget=bad)


def test_collector_request_asks_for_ddtree_lines():
    assert "srt/arg_groups/fields" in sglang_facts.collect_request()
