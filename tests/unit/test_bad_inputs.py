"""Generated bad inputs (hypothesis): every bad setting and every bad host state gets a clear error.

A clear error is a ``SpecfleetError`` (settings) or a preflight ``Problem`` (host facts) that names
what is wrong (the setting's key) and says how to fix it (``fix:``), never another exception.
``run_generated`` is shared with the fault drills (bench/drills/run.py), which try many more.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfleet.core.errors import SpecfleetError
from specfleet.core.preflight import FREE_SPACE, GPU_PROCESSES, PORTS, SERVICE, TOKEN, check
from specfleet.core.settings import settings_from_dict

COMMIT = "0123456789abcdef0123456789abcdef01234567"
GOOD = {"target": {"revision": COMMIT}, "drafter": {"revision": COMMIT, "gated": True},
        "sglang": {"version": "0.5.11"}}
ENV: dict[str, str] = {}  # no SPECFLEET_ALLOW_TEST_SETTINGS: test-only settings are refused

nonfinite = st.sampled_from([math.nan, math.inf, -math.inf])
not_positive = st.one_of(st.floats(max_value=0, allow_nan=False), nonfinite)
rel_path = st.text(string.ascii_letters + string.digits + "_-./", min_size=1, max_size=20).filter(
    lambda p: not p.startswith("/") and not p.startswith("~"))
bad_abs_path = st.one_of(
    rel_path,
    st.just("/"),
    st.builds(lambda a, b: f"/{a}/../{b}", st.from_regex(r"[a-z]{1,8}", fullmatch=True),
              st.from_regex(r"[a-z]{1,8}", fullmatch=True)),
    st.builds(lambda a: f"/{a}//x", st.from_regex(r"[a-z]{1,8}", fullmatch=True)),
)
bad_unit_name = st.one_of(
    st.text(min_size=65, max_size=80, alphabet=string.ascii_letters),
    st.builds(lambda a, c, b: f"{a}{c}{b}", st.from_regex(r"[a-z]{1,6}", fullmatch=True),
              st.sampled_from(list(" /;$`'\"\n*?")), st.from_regex(r"[a-z]{0,6}", fullmatch=True)),
    st.just(""), st.sampled_from(["-x", ".x", "@x"]),
)
bad_repo_id = st.one_of(
    st.from_regex(r"[a-z]{1,10}", fullmatch=True),
    st.from_regex(r"[a-z]{1,5}/[a-z]{1,5}/[a-z]{1,5}", fullmatch=True),
    st.builds(lambda a, b: f"{a}--x/{b}", st.from_regex(r"[a-z]{1,5}", fullmatch=True),
              st.from_regex(r"[a-z]{1,5}", fullmatch=True)),
    st.sampled_from(["../x", "a/..", "a/b c", "/abs", "a/" + "b" * 100]),
)
secret_env = st.one_of(st.sampled_from(["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]),
                       st.from_regex(r"[A-Z]{1,8}_(KEY|SECRET|PASSWORD)", fullmatch=True))

# (setting path, what a bad value of it is)
CASES: list[tuple[str, st.SearchStrategy]] = [
    ("port", st.one_of(st.integers(max_value=0), st.integers(min_value=65536))),
    ("service_name", bad_unit_name),
    ("models_root", bad_abs_path),
    ("venv", bad_abs_path),
    ("state_dir", bad_abs_path),
    ("target.repo_id", bad_repo_id),
    ("drafter.repo_id", bad_repo_id),
    ("sglang.version", st.sampled_from(["latest", "0.5.x", "v0..5", "1.0-beta!", "=0.5", ""])),
    ("patch.sha256", st.one_of(st.text(string.hexdigits, max_size=63),
                               st.text(string.hexdigits, min_size=65, max_size=70),
                               st.from_regex(r"[g-z]{64}", fullmatch=True))),
    ("weights.hf_endpoint", st.one_of(
        st.builds(lambda h: f"http://{h}.example", st.from_regex(r"[a-z]{1,10}", fullmatch=True)),
        st.sampled_from(["ftp://hub", "huggingface.co", "file:///etc", ""]))),
    ("rollout.batch_size", st.integers(max_value=0)),
    ("rollout.batch_percent", st.one_of(not_positive, st.floats(min_value=100.001,
                                                                 allow_infinity=False))),
    ("rollout.max_fail_percent", st.one_of(st.floats(max_value=-0.001, allow_infinity=False),
                                           st.floats(min_value=100.001, allow_infinity=False),
                                           st.just(math.nan))),
    ("readiness_timeout_s", not_positive),
    ("weights.poll_seconds", not_positive),
    ("plan.extra_env", st.one_of(
        st.builds(lambda k: {k: "x"}, secret_env),
        st.builds(lambda k: {k: "x"}, st.from_regex(r"[0-9-][A-Za-z0-9-]{0,6}", fullmatch=True)))),
    ("plan.extra_args", st.builds(lambda k: {k: "x"}, st.sampled_from(
        ["--api-key", "--hf-token", "--db-password", "--client-secret", "port", "-p"]))),
    ("api_key", st.just("")),
    ("launcher", st.lists(st.text(string.ascii_letters, min_size=1, max_size=8), min_size=1,
                          max_size=3)),
    ("port", st.one_of(st.text(string.ascii_letters, min_size=1, max_size=6), st.lists(
        st.integers(), max_size=2))),
    ("target", st.one_of(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2))),
]


def put(data: dict, path: str, value) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    keys = path.split(".")
    node = out
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return out


def settings_verdict(path: str, value) -> str | None:
    """None when ``value`` at ``path`` gives a clear error; otherwise what went wrong."""
    data = put(GOOD, path, value)
    try:
        settings_from_dict(data, host="h1", environ=ENV)
    except SpecfleetError as exc:
        text = str(exc)
        leaf = path.split(".")[-1]
        if leaf not in text:
            return f"{path}={value!r}: the error does not name {leaf!r}: {text}"
        if "fix:" not in text:
            return f"{path}={value!r}: the error gives no fix: {text}"
        if path == "api_key" or "extra_env" in path:
            if isinstance(value, str) and value and value in text.replace(leaf, ""):
                return f"{path}: the error quotes the secret"
        return None
    except Exception as exc:  # noqa: BLE001 - any other exception is what this looks for
        return f"{path}={value!r}: {type(exc).__name__}: {exc}"
    return f"{path}={value!r}: accepted"


# ----- bad host state (facts): the preflight names the problem and a fix ---------------------------
def facts_case(draw: Callable) -> tuple[str, dict]:
    from tests.unit.test_preflight import facts_for

    kind = draw(st.sampled_from(["disk", "busy", "no-gpu", "gpu-error", "port", "token"]))
    facts = facts_for("h200x2")
    if kind == "disk":
        facts[FREE_SPACE] = {**facts[FREE_SPACE], "free_bytes": draw(st.integers(0, 10 ** 9))}
    elif kind == "busy":
        facts[GPU_PROCESSES] = {"error": None, "processes": [
            {"pid": draw(st.integers(2, 10 ** 6)), "used_memory_mib": draw(st.integers(1, 140000))}
            for _ in range(draw(st.integers(1, 4)))]}
    elif kind == "no-gpu":
        facts["facts.gpu.Gpus"] = {"gpus": [], "error": None}
    elif kind == "gpu-error":
        facts["facts.gpu.Gpus"] = {"gpus": [], "error": draw(st.sampled_from(
            ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
             "Failed to initialize NVML: Driver/library version mismatch"]))}
    elif kind == "port":
        facts[PORTS] = [{"port": 30000, "address": "127.0.0.1",
                         "pid": draw(st.integers(2, 10 ** 6)),
                         "process": draw(st.from_regex(r"[a-z]{1,10}", fullmatch=True))}]
    else:
        facts[TOKEN] = {"path": "/root/.cache/huggingface/token", "exists": False}
    facts.setdefault(SERVICE, {"active_state": "inactive", "main_pid": 0})
    return kind, facts


def facts_verdict(kind: str, facts: dict) -> str | None:
    settings = settings_from_dict({**GOOD, "plan": {"tp_size": 2}, "target": {
        "repo_id": "org/small", "revision": COMMIT}}, host="h1", environ=ENV)
    try:
        result = check(facts, settings, missing_weights_bytes=5 * 10 ** 9,
                       control_token=False)
    except SpecfleetError:
        return None
    except Exception as exc:  # noqa: BLE001
        return f"facts {kind}: {type(exc).__name__}: {exc}"
    if result.ok:
        return f"facts {kind}: the preflight passed a bad host"
    if not all(p.problem and p.fix for p in result.problems):
        return f"facts {kind}: a problem without a fix: {[p.render() for p in result.problems]}"
    return None


def run_generated(examples: int = 150) -> tuple[int, list[str]]:
    """Try ``examples`` generated bad settings and as many bad host states; (tried, failures)."""
    tried, failures = [0], []

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def bad_setting(data):
        path, strategy = data.draw(st.sampled_from(CASES))
        tried[0] += 1
        why = settings_verdict(path, data.draw(strategy))
        if why:
            failures.append(why)

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def bad_facts(data):
        kind, facts = facts_case(data.draw)
        tried[0] += 1
        why = facts_verdict(kind, facts)
        if why:
            failures.append(why)

    bad_setting()
    bad_facts()
    return tried[0], failures


@pytest.mark.local
def test_every_case_kind_is_generated_and_answered_clearly():
    tried, failures = run_generated(examples=60)
    assert tried >= 100
    assert not failures, "\n".join(failures[:20])


def test_a_good_setting_is_not_counted_as_a_clear_error():
    # The check can fail: a value that is fine is reported as "accepted".
    assert settings_verdict("port", 30001) == "port=30001: accepted"
    assert settings_verdict("port", 0) is None
