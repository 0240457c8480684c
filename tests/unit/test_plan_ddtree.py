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


# -- The DDTree rules read from the fork's kernels (issue 51) --------------------------------------

GPU_PROFILES = ("b200x8", "h100x8", "h200x2", "rtx6000x8")
SMALL = 1024**3  # weights_bytes: a small target, so every profile gets to the DDTree rules


def fork_on(fork_fact: dict, profile: str) -> dict:
    return {**host_facts(profile), "facts.sglang.SGLangInstall": json.loads(json.dumps(fork_fact))}


def pr29907_on(profile: str, tmp_path) -> dict:
    """A 0.5.23 install with PR#29907's design declared (authored from its description)."""
    facts = host_facts(profile)
    install = json.loads(json.dumps(facts["facts.sglang.SGLangInstall"]))
    install["ddtree"] = {"design": ddtree_designs.PR29907_ALGORITHM.name,
                         "declared": list(ddtree_designs.PR29907_ALGORITHM.keys)}  # fmt: skip
    install["speculative_algorithms"] = [*install["speculative_algorithms"], "DDTREE"]
    facts["facts.sglang.SGLangInstall"] = install
    return facts


def ddtree_on(plan) -> bool:
    return ("--speculative-dflash-enable-ddtree" in plan.argv
            or value(plan.argv, "--speculative-algorithm") == "DDTREE")


@pytest.mark.local
@pytest.mark.parametrize("design", ["fork", "pr29907"])
def test_plan_never_renders_ddtree_with_a_backend_that_drops_the_tree_mask(fork_fact, design,
                                                                            tmp_path):
    """Every GPU profile, every backend of the installed registry (and the arch's own pick),
    two budgets: a DDTree flag only ever goes with a backend whose row honours the mask."""
    seen_on, seen_off = set(), set()
    for profile in GPU_PROFILES:
        facts = fork_on(fork_fact, profile) if design == "fork" else pr29907_on(profile, tmp_path)
        registry = facts["facts.sglang.SGLangInstall"]["attention_backends"]
        for att in [None, *registry]:
            for budget in (8, 32):
                plan_args = {"ddtree_budget": budget, **({"attention_backend": att} if att else {})}
                try:
                    plan = make_plan(facts, settings(**plan_args), DRAFTER_CONFIG,
                                     weights_bytes=SMALL)  # fmt: skip
                except PlanError:
                    continue  # a backend broken on that arch: no plan at all
                backend = value(plan.argv, "--attention-backend")
                if ddtree_on(plan):
                    row = FORK.mask_mla.get(backend)
                    assert row is not None and row.honours, (profile, att, budget, backend)
                    assert plan.reason("ddtree-mask").choice.startswith(backend)
                    seen_on.add(backend)
                else:
                    assert plan.reason("ddtree").choice == "off: serving DFlash"
                    assert plan.reason("ddtree").kind == "warning"
                    seen_off.add(backend)
    assert seen_on == {"triton"}
    assert {"fa3", "trtllm_mla", "flashinfer"} <= seen_off  # chosen explicitly: kept, no DDTree


@pytest.mark.local
def test_sm100_and_sm90_plan_triton_instead_saying_why(fork_fact):
    for profile, rule_pick, cite in (
        ("b200x8", "trtllm_mla", "trtllm_mla_backend.py:456-467"),
        ("h200x2", "fa3", "flashattention_backend.py:490"),
    ):
        plain = make_plan(fork_on(fork_fact, profile), settings(), DRAFTER_CONFIG,
                          weights_bytes=SMALL)  # fmt: skip
        assert value(plain.argv, "--attention-backend") == rule_pick
        plan = make_plan(fork_on(fork_fact, profile), settings(ddtree_budget=16), DRAFTER_CONFIG,
                         weights_bytes=SMALL)  # fmt: skip
        assert value(plan.argv, "--attention-backend") == "triton"
        assert "--speculative-dflash-enable-ddtree" in plan.argv
        mask = plan.reason("ddtree-mask")
        assert mask.choice == f"triton instead of {rule_pick}" and mask.kind == "override"
        assert cite in mask.why and "triton_backend.py:402-409" in mask.why
        assert plan.reason("page-size").choice == "1"  # trtllm_mla's forced 64 is gone too


@pytest.mark.local
def test_an_explicit_backend_that_drops_the_mask_serves_dflash_without_ddtree(fork_fact):
    plan = make_plan(fork_on(fork_fact, "b200x8"),
                     settings(ddtree_budget=16, attention_backend="trtllm_mla"), DRAFTER_CONFIG,
                     weights_bytes=SMALL)  # fmt: skip
    assert value(plan.argv, "--attention-backend") == "trtllm_mla"
    assert "--speculative-dflash-enable-ddtree" not in plan.argv
    assert value(plan.argv, "--speculative-num-draft-tokens") == "8"  # the drafter's block
    off = plan.reason("ddtree")
    assert off.choice == "off: serving DFlash" and off.kind == "warning"
    assert "plan.attention_backend trtllm_mla is kept" in off.why
    assert "set plan.attention_backend to triton" in off.why
    assert [r.topic for r in plan.reasons].count("ddtree") == 1


@pytest.mark.local
def test_pr29907_page_size_chain_and_overlap(tmp_path):
    facts = pr29907_on("b200x8", tmp_path)
    plan = make_plan(facts, settings(ddtree_budget=6), DRAFTER_CONFIG, weights_bytes=SMALL)
    assert value(plan.argv, "--attention-backend") == "triton"  # not trtllm_mla (page 64)
    assert value(plan.argv, "--speculative-algorithm") == "DDTREE"
    budget = plan.reason("ddtree-budget")
    assert budget.choice == "--speculative-ddtree-budget 6 (a chain)"
    assert "block size - 1 (7)" in budget.why and "one chain, not a tree" in budget.why
    tree = make_plan(facts, settings(ddtree_budget=8), DRAFTER_CONFIG, weights_bytes=SMALL)
    assert tree.reason("ddtree-budget").choice == "--speculative-ddtree-budget 8"
    worker = plan.reason("dflash-worker")
    assert worker.choice == "no overlap (DDTree)" and "overlap scheduler off" in worker.why
    assert "SGLANG_ENABLE_SPEC_V2" not in plan.env
    # Any page size other than 1 is refused by the design: DFlash without DDTree, no crash loop.
    paged = make_plan(facts, settings(ddtree_budget=16, extra_args={"--page-size": 16}),
                      DRAFTER_CONFIG, weights_bytes=SMALL)  # fmt: skip
    assert value(paged.argv, "--speculative-algorithm") == "DFLASH"
    assert "--speculative-ddtree-budget" not in paged.argv
    assert "page size 16" in paged.reason("ddtree").why
    assert "crash-loop" in paged.reason("ddtree").why


@pytest.mark.local
def test_verify_graph_memory_counted_and_a_budget_that_cannot_fit_refused(fork_fact):
    """CT200 (triton, CUDA graphs, 0.85 of 95.6 GiB): the issue's estimate, 0.84 GiB at 8 draft
    tokens, 6.75 at 64, 13.5 at 128 against 14.3 GiB outside the fraction less SGLang's own."""
    from specfleet.core.plan.ddtree import verify_graph_bytes

    gib = 1024**3
    assert [verify_graph_bytes(48, t, 262144) / gib for t in (8, 64, 128)] == [0.84375, 6.75, 13.5]
    facts = fork_on(fork_fact, "rtx6000x8")
    fits = make_plan(facts, settings(ddtree_budget=64), DRAFTER_CONFIG)
    mem = fits.reason("ddtree-verify-memory")
    assert mem.choice == "6.75 GiB fits"
    assert "48 requests" in mem.why and "262,144 context positions" in mem.why
    assert "14.3 GiB outside mem_fraction_static 0.850" in mem.why
    with pytest.raises(PlanError) as err:
        make_plan(facts, settings(ddtree_budget=128), DRAFTER_CONFIG, host="ct200")
    assert err.value.problem.startswith(ddtree_designs.DDTREE_REFUSED)
    assert "13.50 GiB per GPU" in err.value.problem
    assert "use plan.ddtree_budget 112 or lower" in err.value.fix
    # A smaller verify batch makes it fit (the experiment's batch 8).
    small = make_plan(facts, settings(ddtree_budget=128,
                                      extra_args={"--max-running-requests": 8}), DRAFTER_CONFIG)
    assert small.reason("ddtree-verify-memory").choice == "2.25 GiB fits"


# The citations of the mask rows, checked against the fork's own files at those lines.
CITED = [
    ("arg_groups/speculative_hook.py", 163, 170, "server_args.speculative_eagle_topk = 1"),
    ("layers/attention/flashattention_backend.py", 490, 490, "if self.topk <= 1:"),
    ("layers/attention/flashattention_backend.py", 571, 571, "spec_info.custom_mask["),
    ("layers/attention/flashinfer_mla_backend.py", 868, 868, "causal=True"),
    ("layers/attention/flashinfer_mla_backend.py", 882, 882, "True,"),
    ("layers/attention/attention_registry.py", 32, 36, "if not runner.use_mla_backend"),
    ("layers/attention/trtllm_mla_backend.py", 456, 467, "cuda_graph_custom_mask = torch.zeros"),
    ("layers/attention/triton_backend.py", 402, 409, "custom_mask[: spec_info.custom_mask"),
    ("layers/attention/triton_backend.py", 811, 816, "cuda_graph_custom_mask = torch.zeros"),
    ("layers/attention/triton_backend.py", 875, 890, "custom_mask=custom_mask"),
    ("model_executor/cuda_graph_runner.py", 1279, 1280, "build_custom_mask = True"),
    ("layers/attention/flashinfer_backend.py", 718, 728, "use_custom_mask"),
]


@pytest.mark.parametrize("path,first,last,text", CITED)
def test_mask_rows_cite_the_forks_lines(path, first, last, text):
    lines = (ddtree_fork_site() / "sglang" / "srt" / path).read_text().splitlines()
    assert text in "\n".join(lines[first - 1:last])
    name = path.rsplit("/", 1)[1]
    span = f":{first}" + (f"-{last}" if last != first else "")
    rows = [*FORK.mask_mla.values(), *FORK.mask_mha.values()]
    assert any(name in r.source and span in r.source for r in rows)


def test_trtllm_mla_reads_no_mask_in_the_fork():
    src = (ddtree_fork_site() / "sglang" / "srt" / "layers" / "attention" /
           "trtllm_mla_backend.py").read_text()  # fmt: skip
    assert "spec_info.custom_mask" not in src and "forward_metadata.custom_mask" not in src
    assert not FORK.mask_mla["trtllm_mla"].honours


@pytest.mark.local
def test_extra_args_cannot_turn_ddtree_on_with_a_backend_that_drops_the_mask(fork_fact):
    raw = {"--speculative-dflash-enable-ddtree": True, "--speculative-num-draft-tokens": 16}
    with pytest.raises(PlanError) as err:
        make_plan(fork_on(fork_fact, "h200x2"), settings(extra_args=raw), DRAFTER_CONFIG,
                  weights_bytes=SMALL)  # fmt: skip
    assert "--attention-backend fa3, which drops the tree mask" in err.value.problem
    assert "flashattention_backend.py:490" in err.value.problem
    ok = make_plan(fork_on(fork_fact, "h200x2"), settings(attention_backend="triton",
                   extra_args=raw), DRAFTER_CONFIG, weights_bytes=SMALL)  # fmt: skip
    assert "--speculative-dflash-enable-ddtree" in ok.argv
