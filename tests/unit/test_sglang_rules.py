"""The planner against SGLang's own code: every machine profile x release of the version table.

Each plan's argv is parsed by that release's own ``add_cli_args`` and its rule methods run on it
(tests/harness/sglang_rules.py: loaded standalone from the real wheel, hardware predicates per
profile, ``__post_init__`` never run whole). The planner and SGLang must agree on every value the
plan decides that SGLang would change (memory fraction, running requests, overlap, draft settings)
and on every refusal. "Not enough memory" happens at model load, not in ServerArgs: it is modelled
from the fraction SGLang's code computed, the GPU memory and the weights per GPU.

``python -m tests.unit.test_sglang_rules --argv-json`` prints every plan's argv per profile and
release (the input of the real-GPU cross-check, which runs the whole real ServerArgs).
"""

from __future__ import annotations

import json
import sys

import pytest

from specfleet.core.plan import KIMI_K26_WEIGHTS_BYTES, PlanError, make_plan
from specfleet.core.plan.group import NET, RDMA, GroupMember, make_group_plan
from specfleet.core.settings import settings_from_dict
from specfleet.core.tables.sglang_versions import MEMORY_0_5_23, VERSIONS, version_row
from tests.harness.sglang_rules import (
    GIB,
    KIMI_K2_TEXT_MODEL,
    KIMI_K26_MODEL,
    MIB,
    RELEASES,
    Machine,
    judge,
)
from tests.unit.test_plan import DRAFTER_CONFIG, gpus_fact, host_facts

# (profile, Gpus capture, GpuTopology capture, hosts in one serving group)
PROFILES = [
    ("h100x8", "h100x8", "b200x8", 1),
    ("h100x8-pair", "h100x8", "b200x8", 2),
    ("b200x8", "b200x8", "b200x8", 1),
    ("rtx6000x8", "rtx6000x8", "rtx6000x8", 1),
    ("h200x2", "h200x2", "h200x2", 1),
]
# Releases whose installed facts are captured (tests/fixtures/sglang/); the others are predicted
# from the version table, as a fresh host's --dry is.
INSTALLED = {"0.5.11", "0.5.14", "0.5.23"}
LAUNCH_TAIL = 3  # argv[:3] is the venv's python -m sglang.launch_server


def _interfaces(address: str) -> list[dict]:
    return [{"name": "eth0", "state": "UP", "loopback": False, "mtu": 9000, "speed_mbps": 100000,
             "addresses": [address]}]  # fmt: skip


def plan_for(profile: str, gpus: str, topo: str, nhosts: int, release: str):
    """The plan (rank 0's for a group), or the PlanError."""
    sglang = release if release in INSTALLED else None
    data = {"sglang": {"version": release}}
    predicted = sglang is None
    if nhosts == 1:
        return make_plan(host_facts(gpus, topo, sglang=sglang), settings_from_dict(data),
                         DRAFTER_CONFIG, predicted=predicted, host=profile)  # fmt: skip
    names = [f"g{i}" for i in range(nhosts)]
    group = {"group": {"name": "kimi-pair", "members": names}}
    members = [
        GroupMember(
            host=name,
            facts={**host_facts(gpus, topo, sglang=sglang), NET: _interfaces(f"10.0.0.{11 + i}"),
                   RDMA: []},
            settings=settings_from_dict({**data, **group}),
            address=f"10.0.0.{11 + i}",
        )  # fmt: skip
        for i, name in enumerate(names)
    ]
    group_plan = make_group_plan(members, DRAFTER_CONFIG, predicted=predicted)
    return group_plan.plans[group_plan.rank0]


def machine(gpus: str, nhosts: int) -> Machine:
    g = gpus_fact(gpus)["gpus"]
    cc = tuple(int(x) for x in g[0]["compute_capability"].split("."))
    return Machine(memory_mib=min(x["memory_mib"] for x in g), sm=cc, device_count=len(g))


def cases():
    for profile, gpus, topo, nhosts in PROFILES:
        for release in RELEASES:
            yield profile, gpus, topo, nhosts, release


def _try_plan(*case):
    try:
        return plan_for(*case), None
    except PlanError as exc:
        return None, exc


def test_every_release_of_the_version_table_is_judged():
    """The matrix covers the version table's releases: each row read from a wheel has one."""
    rows = {str(version_row(v).sglang) for v in RELEASES}
    assert rows == {str(row.sglang) for row in VERSIONS if row.dflash is not None}


@pytest.mark.local
@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("profile,gpus,topo,nhosts", PROFILES, ids=[p[0] for p in PROFILES])
def test_planner_agrees_with_sglang(profile, gpus, topo, nhosts, release):
    plan, refusal = _try_plan(profile, gpus, topo, nhosts, release)
    check_against_sglang(profile, gpus, topo, nhosts, release, plan, refusal)


def check_against_sglang(profile, gpus, topo, nhosts, release, plan, refusal):
    """The plan (or the planner's refusal) against what ``release``'s own rules make of it."""
    m = machine(gpus, nhosts)
    tp = m.device_count * nhosts
    per_gpu = KIMI_K26_WEIGHTS_BYTES / tp
    if plan is None:
        # The planner refuses: SGLang must too. Judge the argv the plan would have had without
        # the memory check (the same flags on a host that fits: the H200 pair's argv shape).
        argv = _argv_without_memory_check(gpus, topo, nhosts, release)
        verdict = judge(release, m, argv)
        assert verdict.refused is None, verdict.refused
        room = verdict.kv_room_gib(m.memory_mib, per_gpu)
        # Modelled: SGLang's fraction x GPU memory - weights per GPU, below the 4 GiB minimum.
        assert room < 4, (refusal, room)
        assert f"leaving {room:.1f} GiB for the KV cache" in refusal.problem or (
            "far below" in refusal.problem and room < 0
        ), (refusal.problem, room)
        return
    argv = plan.argv[LAUNCH_TAIL:]
    verdict = judge(release, m, argv)
    assert verdict.refused is None, f"SGLang {release} refuses {argv}: {verdict.refused}"
    room = verdict.kv_room_gib(m.memory_mib, per_gpu)
    assert room >= 4, (
        f"the planner plans {profile}, but SGLang {release} sets mem_fraction_static "
        f"{verdict.mem_fraction_static:.3f}: {room:.1f} GiB per GPU left for the KV cache "
        "(modelled: Not enough memory at model load)"
    )
    # The fraction: the plan's flag, or the one the plan says SGLang will choose.
    reason = plan.reason("mem-fraction-static")
    if "--mem-fraction-static" in argv:
        assert "mem_fraction_static" not in verdict.changed
    else:
        assert f"SGLang {plan_version(plan)} will choose {verdict.mem_fraction_static:.3f}" in (
            reason.why
        ), (reason.why, verdict.mem_fraction_static)
    assert plan.reason("kv-cache-room").choice == f"{room:.1f} GiB/GPU"
    # Running requests: SGLang's reset is what the plan states.
    assert plan.reason("max-running-requests").choice == str(verdict.max_running_requests)
    # Overlap: where SGLang turns it off, the plan's worker reason says v1 (no overlap).
    if verdict.disable_overlap_schedule and "disable_overlap_schedule" in verdict.changed:
        assert plan.reason("dflash-worker").choice == "v1", plan.reason("dflash-worker")
    # Page size: where SGLang sets it, the plan says so.
    if "page_size" in verdict.changed:
        assert plan.reason("page-size").choice == str(verdict.changed["page_size"][1])
    # Draft steps/top-k: SGLang forces 1 because the plan never sets them.
    for flag in ("--speculative-num-steps", "--speculative-eagle-topk"):
        assert flag not in argv
    assert set(verdict.changed) <= {
        "mem_fraction_static", "max_running_requests", "disable_overlap_schedule",
        "speculative_num_steps", "speculative_eagle_topk", "chunked_prefill_size", "page_size",
    }, verdict.changed  # fmt: skip


def plan_version(plan) -> str:
    return plan.reason("sglang").choice


def _argv_without_memory_check(gpus, topo, nhosts, release) -> list[str]:
    """The argv a refused host would run: the plan with min_request_tokens 0 and a tiny weights size."""
    sglang = release if release in INSTALLED else None
    data = {"sglang": {"version": release}, "plan": {"min_request_tokens": 0}}
    if nhosts != 1:
        raise AssertionError("no group is refused in PROFILES")
    plan = make_plan(host_facts(gpus, topo, sglang=sglang), settings_from_dict(data),
                     DRAFTER_CONFIG, predicted=sglang is None, weights_bytes=1)  # fmt: skip
    return plan.argv[LAUNCH_TAIL:]


@pytest.mark.parametrize(
    "mib,sm,expected",
    [(81559, (9, 0), 0.749), (97887, (12, 0), 0.791), (143771, (9, 0), 0.858),
     (183359, (10, 0), 0.821)],
)  # fmt: skip
@pytest.mark.local
def test_harness_gives_the_real_gpu_figures(mib, sm, expected):
    """0.5.11's own rule in the harness reproduces what the real ServerArgs gave on a real H200
    machine (issue 30) for a text-only Kimi K2 config at TP 8 with DFLASH."""
    argv = _argv_without_memory_check("h200x2", "h200x2", 1, "0.5.11")
    argv[argv.index("--tp-size") + 1] = "8"
    verdict = judge("0.5.11", Machine(mib, sm, 8), argv, model=KIMI_K2_TEXT_MODEL)
    assert verdict.mem_fraction_static == expected
    assert verdict.max_running_requests == 48


@pytest.mark.local
@pytest.mark.parametrize("release", RELEASES)
def test_one_h100_host_is_refused_by_both(release):
    """The case of issue 30: one 8x H100 host, refused by the planner, and SGLang's own fraction
    leaves less than the weights per GPU."""
    plan, refusal = _try_plan("h100x8", "h100x8", "b200x8", 1, release)
    assert plan is None
    m = machine("h100x8", 1)
    verdict = judge(release, m, _argv_without_memory_check("h100x8", "b200x8", 1, release))
    assert verdict.mem_fraction_static * m.memory_mib * MIB / GIB < KIMI_K26_WEIGHTS_BYTES / 8 / GIB
    assert "Not enough memory" in refusal.problem


@pytest.mark.local
@pytest.mark.parametrize("release", RELEASES)
def test_the_matrix_fails_the_old_planner(release):
    """The check can fail: the planner before issue 30 compared only the GPUs' total memory with
    the weights, so it planned one 8x H100 host (the plan as it was: no KV-room refusal). The
    matrix check on that plan fails with SGLang's own fraction (modelled "Not enough memory")."""
    sglang = release if release in INSTALLED else None
    old = make_plan(host_facts("h100x8", "b200x8", sglang=sglang),
                    settings_from_dict({"sglang": {"version": release}, "plan": {"min_request_tokens": 0}}),
                    DRAFTER_CONFIG, predicted=sglang is None, weights_bytes=1)  # fmt: skip
    with pytest.raises(AssertionError, match="Not enough memory at model load"):
        check_against_sglang("h100x8", "h100x8", "b200x8", 1, release, old, None)


@pytest.mark.local
def test_pipeline_steps_are_each_releases():
    """The harness runs a pipeline step only where the release's own pipeline.py calls it: the
    one step a release lacks is handle_deprecated_dp_attention before 0.5.22 (a renamed or
    dropped step would show here rather than go unrun)."""
    from packaging.version import Version

    from tests.harness.sglang_rules import PIPELINE_MARKER, PIPELINE_STEPS, pipeline_steps
    from tests.harness.sglang_rules import wheel_text as text

    pipelined = [r for r in RELEASES if Version(r) >= Version("0.5.19")]
    assert pipelined and all("run_resolution_pipeline" in text(r, PIPELINE_MARKER) for r in pipelined)
    for release in pipelined:
        missing = [name for step in PIPELINE_STEPS if step not in pipeline_steps(release)
                   for name in step[1:]]  # fmt: skip
        expected = [] if Version(release) >= Version("0.5.22") else ["handle_deprecated_dp_attention"]
        assert missing == expected, release


@pytest.mark.local
def test_harness_refuses_what_sglang_refuses():
    """The harness can fail: 0.5.11's own parser and DFLASH checks refuse bad argv."""
    argv = _argv_without_memory_check("h200x2", "h200x2", 1, "0.5.11")
    m = machine("h200x2", 1)
    assert "unrecognized arguments: --speculative-draft-window-size" in judge(
        "0.5.11", m, [a.replace("-dflash-draft-", "-draft-") for a in argv]
    ).refused
    assert judge("0.5.11", m, [*argv, "--enable-dp-attention", "--dp-size", "2"]).refused == (
        "Currently DFLASH speculative decoding does not support dp attention."
    )


@pytest.mark.local
@pytest.mark.parametrize("release", ["0.5.11", "0.5.14"])
def test_context_length_is_parsed_by_the_wheels_own_type(release):
    """--context-length (a deploy's plan.extra_args) goes through utils.common's
    human_readable_int: the wheel's own, so "4k" is 4000 and a bad value is SGLang's refusal."""
    argv = _argv_without_memory_check("h200x2", "h200x2", 1, release)
    m = machine("h200x2", 1)
    assert judge(release, m, [*argv, "--context-length", "4k"]).refused is None
    assert "Invalid integer value: 'four'" in judge(release, m, [*argv, "--context-length",
                                                                 "four"]).refused


@pytest.mark.local
def test_harness_refuses_what_0_5_23_refuses():
    """0.5.23's own parser and resolution hooks refuse bad argv in the harness: the old window
    flag is gone, the window must hold a block, DFLASH needs pp_size 1."""
    argv = _argv_without_memory_check("h200x2", "h200x2", 1, "0.5.23")
    m = machine("h200x2", 1)
    assert "unrecognized arguments: --speculative-dflash-draft-window-size" in judge(
        "0.5.23", m, [a.replace("--speculative-draft-window", "--speculative-dflash-draft-window")
                      for a in argv]
    ).refused  # fmt: skip
    small = list(argv)
    small[small.index("--speculative-draft-window-size") + 1] = "4"
    assert judge("0.5.23", m, small).refused.startswith(
        "--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size)."
    )
    assert judge("0.5.23", m, [*argv, "--pp-size", "2"]).refused == (
        "Currently DFLASH speculative decoding only supports pp_size == 1."
    )
    # The argv unchanged is accepted: each refusal above comes from its one change.
    assert judge("0.5.23", m, argv).refused is None


# (GPU MiB, compute capability): the profiles' GPUs, and smaller ones of each memory tier
# (RTX 4090 24 GiB, RTX 5090 32 GiB, L40 48 GiB).
MEMORY_RULE_GPUS = [(81559, (9, 0)), (143771, (9, 0)), (183359, (10, 0)), (97887, (12, 0)),
                    (24564, (8, 9)), (32607, (12, 0)), (49140, (8, 9))]  # fmt: skip


@pytest.mark.local
@pytest.mark.parametrize("gpu", MEMORY_RULE_GPUS, ids=[str(g[0]) for g in MEMORY_RULE_GPUS])
@pytest.mark.parametrize("tp", [2, 8, 16])
@pytest.mark.parametrize("model", ["vision", "text"])
def test_version_table_memory_rule_is_0_5_23s(gpu, tp, model):
    """The version table's MemoryRule for 0.5.23 gives the fraction memory_hook.py computes when
    run (not only on the profiles' shapes): each memory tier, TP 2/8/16, K2.6 and text-only K2."""
    assert_memory_rule_is_releases("0.5.23", gpu, tp, model)
    assert version_row("0.5.23").memory is MEMORY_0_5_23


def assert_memory_rule_is_releases(release, gpu, tp, model):
    from specfleet.core.tables.sglang_versions import sglang_mem_fraction

    argv = _argv_without_memory_check("h200x2", "h200x2", 1, release)
    argv[argv.index("--tp-size") + 1] = str(tp)
    fields = KIMI_K26_MODEL if model == "vision" else KIMI_K2_TEXT_MODEL
    # The harness's predicates do not read the device count: one Release per GPU, any TP.
    verdict = judge(release, Machine(gpu[0], gpu[1], 8), argv, model=fields)
    assert verdict.refused is None, verdict.refused
    vision = fields["vision_config"]
    ours, _ = sglang_mem_fraction(
        version_row(release).memory, gpu[0], tp, speculative=True, mla=True,
        architecture=fields["architectures"][0],
        vision=None if vision is None else (vision["num_hidden_layers"], vision["hidden_size"]),
    )  # fmt: skip
    assert ours == pytest.approx(verdict.mem_fraction_static, abs=1e-9), (
        f"the version table's memory rule for {release} gives {ours}, its own code "
        f"{verdict.mem_fraction_static} ({gpu[0]} MiB, TP {tp}, {model})"
    )


# One GPU of each memory tier whose rule differs between releases (the 20-35 GiB tier raised in
# 0.5.20), and one above 60 GiB (the 10 GiB reserve floor); TP below and above 4.
EVERY_RELEASE_GPUS = [(32607, (12, 0)), (143771, (9, 0))]


@pytest.mark.local
@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("gpu", EVERY_RELEASE_GPUS, ids=[str(g[0]) for g in EVERY_RELEASE_GPUS])
@pytest.mark.parametrize("tp", [2, 8])
@pytest.mark.parametrize("model", ["vision", "text"])
def test_version_table_memory_rule_is_each_releases(release, gpu, tp, model):
    """Each row's MemoryRule gives the fraction its release's own code computes (the draft-model
    reserve to 0.5.13, whether Kimi K2.5's prefill graph reserve counts from 0.5.16, the tiers
    of 0.5.20 on), for K2.6 and text-only K2."""
    assert_memory_rule_is_releases(release, gpu, tp, model)


DP_ATTENTION = {"--enable-dp-attention": True, "--dp-size": 2}


@pytest.mark.local
@pytest.mark.parametrize("lm_head", [False, True], ids=["dp-attention", "dp-attention+lm-head"])
@pytest.mark.parametrize("release", RELEASES)
def test_dp_attention_agrees_with_sglang(release, lm_head):
    """plan.extra_args turning on dp attention: the planner refuses exactly what SGLang refuses
    (0.5.11-0.5.22: DFLASH never runs with dp attention on CUDA; 0.5.23: only with
    --enable-dp-lm-head), and a plan it makes passes the matrix check."""
    check_dp_attention(release, {**DP_ATTENTION, **({"--enable-dp-lm-head": True} if lm_head else {})})


@pytest.mark.local
@pytest.mark.parametrize("release", ["0.5.22", "0.5.23"])
def test_attn_dp_size_agrees_with_sglang(release):
    """--attn-dp-size N (a flag from 0.5.22; --enable-dp-attention its deprecated spelling
    there): 0.5.22 refuses it with DFLASH as it refuses --enable-dp-attention, 0.5.23 runs it
    with --enable-dp-lm-head. The planner agrees on both."""
    check_dp_attention(release, {"--attn-dp-size": 2, "--enable-dp-lm-head": True})


def check_dp_attention(release, extra):
    sglang = release if release in INSTALLED else None
    data = {"sglang": {"version": release}, "plan": {"extra_args": extra}}
    facts = host_facts("b200x8", "b200x8", sglang=sglang)
    try:
        plan, refusal = make_plan(facts, settings_from_dict(data), DRAFTER_CONFIG,
                                  predicted=sglang is None, host="b200x8"), None  # fmt: skip
    except PlanError as exc:
        plan, refusal = None, exc
    if plan is not None:
        check_against_sglang("b200x8", "b200x8", "b200x8", 1, release, plan, None)
        return
    base = {"sglang": {"version": release}}
    argv = make_plan(facts, settings_from_dict(base), DRAFTER_CONFIG,
                     predicted=sglang is None).argv[LAUNCH_TAIL:]  # fmt: skip
    argv += [f for k, v in extra.items() for f in ((k,) if v is True else (k, str(v)))]
    verdict = judge(release, machine("b200x8", 1), argv)
    assert verdict.refused is not None, f"SGLang {release} accepts {argv}; the planner: {refusal}"
    assert "dp attention" in verdict.refused, verdict.refused
    assert (
        "--enable-dp-attention must not" in refusal.problem
        or f"which DFLASH on SGLang {release} refuses" in refusal.problem
        or f"with {verdict.refused.rsplit(' ', 1)[1].rstrip('.')}" in refusal.problem
    ), (verdict.refused, refusal.problem)


@pytest.mark.local
@pytest.mark.parametrize("gpus", ["h100x8", "h200x2"])
def test_dp_attention_memory_rule_is_sglangs(gpus):
    """With dp attention SGLang reserves more for the decode graphs; the version table's rule
    for 0.5.23 adds what memory_hook.py executed adds (K2.6 at TP 8, attention DP 2 and 4)."""
    from specfleet.core.tables.sglang_versions import sglang_mem_fraction

    m = machine(gpus, 1)
    for dp in (2, 4):
        argv = _argv_without_memory_check("h200x2", "h200x2", 1, "0.5.23")
        argv[argv.index("--tp-size") + 1] = "8"
        argv += ["--attn-dp-size", str(dp), "--enable-dp-lm-head"]
        verdict = judge("0.5.23", Machine(m.memory_mib, m.sm, 8), argv)
        assert verdict.refused is None, verdict.refused
        vision = KIMI_K26_MODEL["vision_config"]
        ours, _ = sglang_mem_fraction(
            MEMORY_0_5_23, m.memory_mib, 8, speculative=True, mla=True,
            architecture=KIMI_K26_MODEL["architectures"][0],
            vision=(vision["num_hidden_layers"], vision["hidden_size"]), attn_dp_size=dp,
        )  # fmt: skip
        assert ours == pytest.approx(verdict.mem_fraction_static, abs=1e-9)


def plan_argvs() -> list[dict]:
    """Every plan of every profile x release: the input of the real-GPU cross-check."""
    out = []
    for profile, gpus, topo, nhosts, release in cases():
        plan, refusal = _try_plan(profile, gpus, topo, nhosts, release)
        m = machine(gpus, nhosts)
        entry = {
            "profile": profile, "release": release, "hosts": nhosts,
            "gpu_memory_mib": m.memory_mib, "compute_capability": ".".join(map(str, m.sm)),
            "gpus_per_host": m.device_count, "row": str(version_row(release).sglang),
        }  # fmt: skip
        if plan is None:
            entry["refused"] = refusal.problem
            entry["argv"] = _argv_without_memory_check(gpus, topo, nhosts, release)
        else:
            entry["argv"] = plan.argv[LAUNCH_TAIL:]
            entry["env"] = plan.env
            entry["reasons"] = {r.topic: r.choice for r in plan.reasons}
        out.append(entry)
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["--argv-json"]:
        sys.exit("usage: python -m tests.unit.test_sglang_rules --argv-json")
    json.dump(plan_argvs(), sys.stdout, indent=1)
    print()
