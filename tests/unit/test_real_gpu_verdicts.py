"""Today's launch plans against the verdicts a real SGLang gave them on a real GPU (issue 30).

``tests/fixtures/real_gpu/serverargs-verdicts.json`` holds what each release's own ``ServerArgs``
(parse + the whole ``__post_init__``, on an H200, each machine's GPU memory put in place) did with
each plan of the matrix (``tests/harness/real_gpu_plans.py``): accepted or refused, and every value
it changed. A verdict is about one exact argv + env (its ``key``): a plan that changed since has no
verdict and is listed, with the command that refreshes the fixture, never judged on an old one.

For a plan that still has its verdict: SGLang must not have refused it, and where SGLang changed a
value the plan decides (memory fraction, running requests, overlap, page size, backends), the
plan's reasons must say so (name the value SGLang ends with).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from tests.harness.real_gpu_plans import matrix_plans

FIXTURE = Path(__file__).parents[1] / "fixtures" / "real_gpu" / "serverargs-verdicts.json"
REFRESH = (
    "python -m tests.harness.real_gpu_plans bench/real_gpu/plans.json, then the real-GPU run "
    "(bench/real_gpu/README.md, 'Refresh the verdicts'), then python "
    "bench/real_gpu/collect_verdicts.py COMMIT DATE bench/real_gpu/results/<run>/verdicts-*.jsonl"
)
# The plan build each verdict's tree stands for.
RELEASE_OF_BUILD = {"0.5.11": "0.5.11", "pr20547": "0.5.11+pr20547-port-fixed",
                    "0.5.14": "0.5.14", "0.5.23": "0.5.23"}
# A value the plan decides -> the words a reason of the plan must hold to say what SGLang did.
PLAN_DECIDES = {
    "mem_fraction_static": ("mem-fraction", "memory fraction"),
    "max_running_requests": ("running-requests", "running requests"),
    "disable_overlap_schedule": ("overlap",),
    "page_size": ("page-size", "page size"),
    "attention_backend": ("attention-backend",),
    "prefill_attention_backend": ("attention-backend",),
    "decode_attention_backend": ("attention-backend",),
    "speculative_draft_attention_backend": ("draft-attention-backend",),
}


def load_fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def value_words(value) -> list[str]:
    """How a reason may name SGLang's value: 0.749 as '0.749' or '0.75', True/False as said."""
    if isinstance(value, bool):
        return [""]  # overlap on/off: naming the topic is saying it
    if isinstance(value, float):
        return [f"{value:g}", f"{value:.3f}", f"{value:.2f}"]
    return [str(value)]


def says(reasons: list[dict], field: str, value) -> bool:
    for r in reasons:
        text = f"{r['topic']} {r['choice']} {r['why']}".lower()
        if any(w in text for w in PLAN_DECIDES[field]) and any(
            v.lower() in text for v in value_words(value)
        ):
            return True
    return False


def text_model_fraction(verdict: dict) -> float:
    """The fraction the planner's copy of SGLang's memory rule gives for the run's own model: the
    real run's target was K2's text model (``DeepseekV3ForCausalLM``, no vision tower;
    bench/real_gpu/README.md), where K2.6 is a vision model that SGLang gives less."""
    from specfleet.core.tables.sglang_versions import sglang_mem_fraction, version_row

    row = version_row(verdict["release"].split("+")[0])
    fraction, _ = sglang_mem_fraction(
        row.memory, verdict["gpus"]["memory_mib"], verdict["values"]["tp_size"],
        speculative=True, mla=True, architecture="DeepseekV3ForCausalLM", vision=None)
    return fraction


def problems_of(verdict: dict, plan: dict) -> list[str]:
    where = f"{verdict['release']} {verdict['case']} ({verdict['build']})"
    if verdict["result"] == "refused":
        return [f"{where}: SGLang refused the plan: {verdict.get('error')}"]
    out = []
    for field, (before, after) in sorted((verdict.get("changed") or {}).items()):
        if field == "mem_fraction_static":
            # The run's model is not K2.6 (see text_model_fraction): the rule itself must give
            # SGLang's figure for that model, and the plan must say what SGLang will choose.
            ours = text_model_fraction(verdict)
            if abs(ours - after) > 0.0015:
                out.append(f"{where}: SGLang chose mem_fraction_static {after} for the run's "
                           f"text model; the planner's copy of its rule gives {ours:.3f}")
            if not any(r["topic"] == "mem-fraction-static" and "will choose" in r["why"]
                       for r in plan["reasons"]):
                out.append(f"{where}: SGLang chose mem_fraction_static; the plan's reasons do "
                           "not say what it will choose")
            continue
        if field in PLAN_DECIDES and not says(plan["reasons"], field, after):
            out.append(f"{where}: SGLang changed {field} from {before!r} to {after!r}; the "
                       "plan's reasons do not say so")
    return out


def current_and_verdicts():
    fixture = load_fixture()
    by_key = {(v["case"], v["build"], v["key"]): v for v in fixture["verdicts"]
              if v["result"] in ("accepted", "refused")}
    plans = [p for p in matrix_plans() if "argv" in p]
    judged = [(p, by_key[(p["case"], p["build"], p["key"])]) for p in plans
              if (p["case"], p["build"], p["key"]) in by_key]
    unjudged = [p for p in plans if (p["case"], p["build"], p["key"]) not in by_key]
    return fixture, judged, unjudged


def test_fixture_is_a_real_run_of_every_release_it_names():
    fixture = load_fixture()
    assert len(fixture["commit"]) == 40 and fixture["date"].startswith("20")
    releases = {v["release"] for v in fixture["verdicts"]}
    assert {"0.5.11", "0.5.11+pr20547-port-fixed"} <= releases
    for v in fixture["verdicts"]:
        assert v["release"] == RELEASE_OF_BUILD[v["build"]], v["case"]
        if v["result"] == "accepted" and v["release"].startswith("0.5.2"):
            # From 0.5.2x ServerArgs is a raw record: only resolve_once runs the rules.
            assert "resolve_once" in v.get("path", ""), (v["release"], v["case"])
        # Each verdict ran on the plan's own machine numbers, swapped in at the torch level.
        assert any(s.endswith("get_device_memory_capacity") for s in v["swapped"]), v["case"]
        assert v["argv"][1:3] == ["-m", "sglang.launch_server"]
        assert Path(Path(__file__).parents[2], v["source"]).is_file()


@pytest.mark.local
def test_real_sglang_refused_no_current_plan_and_changed_nothing_unsaid():
    _, judged, _ = current_and_verdicts()
    problems = [p for plan, verdict in judged for p in problems_of(verdict, plan)]
    assert not problems, (
        f"{len(problems)} finding(s) of the real SGLang on today's plans:\n  "
        + "\n  ".join(problems)
    )


@pytest.mark.local
def test_lists_plans_without_a_verdict():
    _, judged, unjudged = current_and_verdicts()
    if unjudged:
        lines = sorted({f"{p['build']} {p['case']}" for p in unjudged})
        warnings.warn(
            f"{len(unjudged)} current plan(s) have no real-GPU verdict (new or changed since the "
            f"run, or a release the run did not carry): {', '.join(lines)}. Refresh: "
            f"{REFRESH}",
            stacklevel=1,
        )
    # The listing is about today's matrix: every plan is either judged or listed.
    assert len(judged) + len(unjudged) == len([p for p in matrix_plans() if "argv" in p])


# The checks themselves, on verdicts made up for the purpose (each names what it stands for).
PLAN = {"reasons": [{"topic": "mem-fraction-static", "choice": "SGLang default",
                     "why": "SM90: left to SGLang's own default"}]}


H100 = {"gpus": {"memory_mib": 81559}, "values": {"tp_size": 8}}


@pytest.mark.parametrize("changed,expected", [
    ({"mem_fraction_static": [None, 0.749]}, "do not say what it will choose"),
    ({"mem_fraction_static": [None, 0.80]}, "the planner's copy of its rule gives 0.749"),
    ({"max_running_requests": [None, 48]}, "max_running_requests from None to 48"),
    ({"random_seed": [None, 5]}, None),  # not a value the plan decides
])  # fmt: skip
def test_a_change_the_plan_does_not_name_is_a_problem(changed, expected):
    verdict = {"release": "0.5.11", "case": "x", "build": "0.5.11", "result": "accepted",
               "changed": changed, **H100}
    found = problems_of(verdict, PLAN)
    assert any(expected in f for f in found) if expected else not found


def test_a_named_value_or_a_refusal():
    said = {"reasons": [{"topic": "mem-fraction-static", "choice": "SGLang default",
                         "why": "SGLang 0.5.11 will choose 0.699 (K2.6's vision tower)"}]}
    verdict = {"release": "0.5.11", "case": "x", "build": "0.5.11", "result": "accepted",
               "changed": {"mem_fraction_static": [None, 0.749]}, **H100}
    assert problems_of(verdict, said) == []
    refused = {**verdict, "result": "refused", "error": "ValueError: no"}
    assert "refused the plan: ValueError: no" in problems_of(refused, said)[0]
