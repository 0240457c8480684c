"""The readiness gate's correctness probe: its verdict (``readiness_gate.judge``, pure), its settings
and a user's probe file, and the stand-in server's broken-verify state decided from a real tree
(the 0.5.11 wheel with the PR#20547 port: unfixed, without its mask fix, and fixed)."""

from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from operations.serving import gate_command, gate_source, probe_spec
from specfleet.core.errors import SettingsError
from specfleet.core.resources import hostside_path
from specfleet.core.settings import probe_from_file, schema, settings_from_dict
from tests.harness import port_build
from tests.harness.sources import sglang_wheel


def _load(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gate = _load("readiness_gate_under_test", hostside_path("readiness_gate.py"))
standin = _load("standin_server_under_test",
                Path(__file__).parents[1] / "harness"
                / "standin_sglang_server.py")

SPEC = probe_spec(settings_from_dict({}).probe)


# meta_info's draft counts under each release's names (tokenizer_manager.py
# _calculate_spec_decoding_metrics): 0.5.11 the old pair only, 0.5.12-0.5.20 both, 0.5.21 new only.
NAMES = {
    "0.5.11": [("spec_accepted_drafts", "spec_proposed_drafts")],
    "0.5.12": [("spec_num_correct_drafts", "spec_num_proposed_drafts"),
               ("spec_accepted_drafts", "spec_proposed_drafts")],
    "0.5.21": [("spec_num_correct_drafts", "spec_num_proposed_drafts")],
}


def answers(right: int, accept: float, block: int = 8, all_accepted: bool = False,
            release: str = "0.5.11") -> list:
    out = []
    for i, q in enumerate(SPEC["questions"]):
        steps = 16
        proposed = steps * (block - 1)
        accepted = proposed if all_accepted else int(round(accept * steps)) - steps
        meta = {"spec_accept_length": accept, "spec_verify_ct": steps}
        for correct, total in NAMES[release]:
            meta.update({correct: accepted, total: proposed})
        out.append({**q, "content": "Paris 42 144 63 72 Au 7 Jupiter" if i < right else "no idea",
                    "meta": meta})
    return out


def test_defaults_are_eight_questions_seven_right_and_accept_two():
    assert len(SPEC["questions"]) == 8
    assert (SPEC["min_correct"], SPEC["max_tokens"], SPEC["min_accept_length"]) == (7, 64, 2.0)
    assert SPEC["concurrency"] > 1


def test_a_right_server_passes_and_says_its_acceptance_length():
    passed, lines = gate.judge(answers(8, 3.2), SPEC, True, 8)
    assert passed, lines
    assert "8/8 answers right" in lines[0]
    assert "mean acceptance length 3.20" in lines[-1]


def test_seven_of_eight_pass_six_fail_naming_the_wrong_answers_and_the_acceptance():
    assert gate.judge(answers(7, 3.0), SPEC, True, 8)[0]
    passed, lines = gate.judge(answers(6, 3.0), SPEC, True, 8)
    assert not passed
    assert lines[-1].startswith("probe FAILED: 6/8 answers right (need 7)")
    assert "How many days are in a week?" in lines[-1] and "said 'no idea'" in lines[-1]
    assert "mean acceptance length 3.00" in lines[-1]


def test_acceptance_below_the_floor_or_above_the_block_fails():
    passed, lines = gate.judge(answers(8, 1.1), SPEC, True, 8)
    assert not passed and "below probe.min_accept_length 2" in lines[-1]
    passed, lines = gate.judge(answers(8, 9.0), SPEC, True, 8)
    assert not passed and "9.00 is above 8.06, the block size 8 plus the one token" in lines[-1]


def test_a_small_block_caps_the_floor_halfway_so_a_right_server_can_pass():
    # Two draft tokens: a mean of 2.0 would need every draft accepted (suspicious).
    passed, lines = gate.judge(answers(8, 1.7, block=2), SPEC, True, 2)
    assert passed, lines
    assert "within [1.5, 2 + prefill's 1/spec_verify_ct]" in lines[-1]
    passed, lines = gate.judge(answers(8, 1.2, block=2), SPEC, True, 2)
    assert not passed
    assert "below the floor 1.5 (probe.min_accept_length 2, capped halfway to the block size 2)" \
        in lines[-1]
    # A block of 3 or more keeps the configured floor.
    assert not gate.judge(answers(8, 1.9, block=3), SPEC, True, 3)[0]


def test_every_draft_accepted_everywhere_is_reported_as_suspicious():
    passed, lines = gate.judge(answers(8, 8.0, all_accepted=True), SPEC, True, 8)
    assert passed and "SUSPICIOUS" in lines[-1]
    passed, lines = gate.judge(answers(0, 8.0, all_accepted=True), SPEC, True, 8)
    assert not passed and "SUSPICIOUS" in lines[-1] and "0/8 answers right" in lines[-1]
    # One question with a rejected draft: a real acceptance, nothing to report.
    mixed = answers(8, 8.0, all_accepted=True)
    mixed[3]["meta"]["spec_accepted_drafts"] -= 1
    assert "SUSPICIOUS" not in " ".join(gate.judge(mixed, SPEC, True, 8)[1])


@pytest.mark.parametrize("release", sorted(NAMES))
def test_every_draft_accepted_is_seen_under_each_releases_field_names(release):
    passed, lines = gate.judge(answers(8, 8.0, all_accepted=True, release=release), SPEC, True, 8)
    assert passed and "SUSPICIOUS" in lines[-1]
    mixed = answers(8, 8.0, all_accepted=True, release=release)
    correct = NAMES[release][0][0]
    mixed[3]["meta"][correct] -= 1
    assert "SUSPICIOUS" not in " ".join(gate.judge(mixed, SPEC, True, 8)[1])


def test_the_prefill_token_lets_every_draft_accepted_read_above_the_block():
    # Block 7, 64 tokens, every draft accepted: prefill makes the first token, 9 verify steps of
    # 7 the other 63; SGLang reports 64 / 9 = 7.11 (completion_tokens / spec_verify_ct).
    block, steps, tokens = 7, 9, 64
    run = answers(8, tokens / steps, block=block, all_accepted=True)
    for a in run:
        a["meta"].update(spec_verify_ct=steps, completion_tokens=tokens,
                         spec_accepted_drafts=steps * (block - 1),
                         spec_proposed_drafts=steps * (block - 1))
    passed, lines = gate.judge(run, SPEC, True, block)
    assert passed, lines
    assert "mean acceptance length 7.11" in " ".join(lines)
    assert "SUSPICIOUS" in lines[-1]
    # Without the step count it is worked out from the tokens and the length.
    for a in run:
        del a["meta"]["spec_verify_ct"]
    assert gate.judge(run, SPEC, True, block)[0]
    # One token more than prefill and every step can give is still impossible.
    for a in run:
        a["meta"].update(spec_verify_ct=steps, spec_accept_length=(tokens + 1) / steps)
    passed, lines = gate.judge(run, SPEC, True, block)
    assert not passed and "7.22 is above 7.11, the block size 7 plus the one token prefill" \
        in lines[-1]


def test_no_acceptance_reported_fails_and_no_speculation_skips_the_check():
    bare = [{**a, "meta": {}} for a in answers(8, 3.0)]
    passed, lines = gate.judge(bare, SPEC, True, 8)
    assert not passed and "no spec_accept_length" in lines[-1]
    assert gate.judge(bare, SPEC, False, None)[0]


# The server's argv as /proc/MainPID/cmdline shows it: NUL-separated as exec'd; and as a process
# that set its title leaves it (setproctitle, imported by SGLang: the argv joined by spaces into
# the first word, the rest of that memory NUL padding). The real H200 run (bench/real_gpu, run 3)
# saw a DFLASH server the probe took for a plain one.
SERVER_ARGV = ["/opt/specfleet/sglang/bin/python", "-m", "sglang.launch_server", "--model-path",
               "/srv/models/m/current", "--speculative-algorithm", "DFLASH",
               "--speculative-num-draft-tokens", "8", "--host", "127.0.0.1", "--port", "30001"]


@pytest.mark.parametrize("raw", [
    b"\0".join(w.encode() for w in SERVER_ARGV) + b"\0",
    " ".join(SERVER_ARGV).encode() + b"\0" * 300,
], ids=["as-execd", "title-set-by-setproctitle"])
def test_the_gate_reads_the_servers_flags_from_its_command_line(monkeypatch, raw):
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/4242/cmdline":
            import io
            return io.BytesIO(raw)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(gate, "open", fake_open, raising=False)
    argv = gate.cmdline("4242")
    assert gate.argv_value(argv, "--speculative-algorithm") == "DFLASH"
    assert gate.argv_value(argv, "--speculative-num-draft-tokens") == "8"
    assert gate.argv_value(argv, "--port") == "30001"
    assert gate.argv_value(argv, "--model-path") == "/srv/models/m/current"


def test_an_empty_or_single_word_command_line_stays_as_it_is():
    assert gate.cmdline_words(b"") == []
    assert gate.cmdline_words(b"sglang::scheduler\0") == ["sglang::scheduler"]
    assert gate.cmdline_words(b"python\0-m\0x\0") == ["python", "-m", "x"]


def test_bad_probe_settings_name_each_key():
    with pytest.raises(SettingsError) as exc:
        settings_from_dict({"probe": {"min_correct": 9, "min_accept_length": 0.5,
                                      "questions": [{"prompt": "2+2?", "answer": "("},
                                                    {"prompt": "3+3?", "answer": ".*"}]}}, "h1")
    text = exc.value.render()
    for key in ("probe.questions[0].answer", "probe.questions[1].answer", "probe.min_correct",
                "probe.min_accept_length"):
        assert key in text
    assert "[h1]" in text and "Traceback" not in text


def test_a_probe_file_replaces_the_defaults(tmp_path):
    mine = {"questions": [{"prompt": "What is 6 * 7?", "answer": r"\b42\b"},
                          {"prompt": "What is the capital of Japan?", "answer": "Tokyo"}],
            "min_correct": 2, "min_accept_length": 1.5}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(mine))
    spec = probe_spec(settings_from_dict({"probe": {"file": str(path)}}).probe)
    assert spec["questions"] == mine["questions"]
    assert (spec["min_correct"], spec["min_accept_length"], spec["max_tokens"]) == (2, 1.5, 64)


@pytest.mark.parametrize("text, words", [
    ("{not json", "is not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"questions": [], "extra": 1}', "unknown key(s) 'extra'"),
    ('{"questions": [{"prompt": "x"}]}', "questions[0].answer' is required"),
    ('{"questions": [{"prompt": "x", "answer": "y"}], "min_correct": 3}', "min_correct"),
])
def test_a_malformed_probe_file_is_a_settings_error(tmp_path, text, words):
    probe = settings_from_dict({}).probe
    with pytest.raises(SettingsError) as exc:
        probe_from_file(probe, text, "/srv/probe.json", "h1")
    assert words in exc.value.render() and "/srv/probe.json" in exc.value.render()
    assert exc.value.fix


def test_a_missing_probe_file_is_a_settings_error(tmp_path):
    probe = settings_from_dict({"probe": {"file": str(tmp_path / "none.json")}}).probe
    with pytest.raises(SettingsError, match="cannot be read on the control machine"):
        probe_spec(probe)


# --------------------------------------------------------------------------------------------------
# The probe bounded (issue #55): on stdin with the gate, not one argv word; a short regex, matched
# on a bounded slice of the answer, for a bounded time
# --------------------------------------------------------------------------------------------------


def test_an_answer_regex_over_the_cap_is_a_settings_error_naming_the_key(tmp_path):
    assert schema.ANSWER_PATTERN_MAX == gate.ANSWER_PATTERN_MAX == 200
    fits = {"prompt": "What is 6 * 7?", "answer": "4" * 200}
    long = {"prompt": "What is 6 * 7?", "answer": "4" * 201}
    settings_from_dict({"probe": {"questions": [fits], "min_correct": 1}})
    with pytest.raises(SettingsError) as exc:
        settings_from_dict({"probe": {"questions": [fits, long], "min_correct": 1}}, "h1")
    text = exc.value.render()
    assert "probe.questions[1].answer" in text and "at most 200 characters" in text, text
    assert "probe.questions[0]" not in text and "fix: fix the regex of that answer" in text
    # A probe file's too.
    with pytest.raises(SettingsError) as exc:
        probe_from_file(settings_from_dict({}).probe, json.dumps({"questions": [long]}),
                        "/srv/probe.json", "h1")
    assert "questions[0].answer" in exc.value.render() and "/srv/probe.json" in exc.value.render()


def test_the_gate_refuses_a_long_answer_regex_given_on_its_command_line():
    long = json.dumps({"questions": [{"prompt": "x", "answer": "x" * 201}]})
    probe, problem = gate.read_probe(argparse.Namespace(probe=long, probe_on_stdin=False))
    assert probe is None and "question 0's answer must be a regex of at most 200" in problem
    fits = json.dumps(SPEC)
    assert gate.read_probe(argparse.Namespace(probe=fits, probe_on_stdin=False)) == (SPEC, None)
    assert gate.read_probe(argparse.Namespace(probe=None, probe_on_stdin=False)) == (None, None)
    probe, problem = gate.read_probe(argparse.Namespace(probe=None, probe_on_stdin=True))
    assert probe is None and "no PROBE_JSON came ahead of the script" in problem


def test_an_answer_is_matched_on_its_first_characters_only():
    right = answers(8, 3.2)
    assert gate.judge(right, SPEC, True, 8)[0]
    # The right words only past the bounded slice: not found, so the answer is wrong.
    padded = [{**a, "content": "x" * gate.ANSWER_TEXT_MAX + a["content"]} for a in right]
    passed, lines = gate.judge(padded, SPEC, True, 8)
    assert not passed and "0/8 answers right" in lines[0], lines
    assert gate.answer_matches("Paris", "x" * (gate.ANSWER_TEXT_MAX - 5) + "Paris")
    assert not gate.answer_matches("Paris", "x" * (gate.ANSWER_TEXT_MAX - 4) + "Paris")


def test_a_regex_that_backtracks_without_end_is_stopped_and_named(monkeypatch):
    # The caller's own alarm (pytest-timeout's, under --timeout) must survive the gate's.
    callers_timer = signal.getitimer(signal.ITIMER_REAL)
    evil = "(a+)+$"
    text = "a" * 40 + "!"
    began = time.monotonic()
    assert gate.answer_matches(evil, text, seconds=0.2) is None
    assert time.monotonic() - began < 5
    monkeypatch.setattr(gate, "ANSWER_MATCH_S", 0.2)
    spec = {**SPEC, "min_correct": 1,
            "questions": [{"prompt": "Say a lot of a.", "answer": evil}]}
    one = [{"prompt": "Say a lot of a.", "answer": evil, "content": text,
            "meta": {"spec_accept_length": 3.0, "spec_verify_ct": 16}}]
    passed, lines = gate.judge(one, spec, True, 8)
    assert not passed and "the regex ran past 0.2 s on the answer" in lines[-1], lines
    # The clock is put back: a later match runs as ever, and no alarm of the gate's is left
    # behind: none where the caller had none, the caller's own (running down) where it had one.
    assert gate.answer_matches(r"\bParis\b", "It is Paris.") is True
    delay, interval = signal.getitimer(signal.ITIMER_REAL)
    if callers_timer[0] == 0:
        assert (delay, interval) == (0.0, 0.0)
    else:
        assert 0 < delay <= callers_timer[0] and interval == callers_timer[1]


def _large_probe_file(tmp_path) -> Path:
    """A probe file of about 600 KB: 60 questions of 10 KB each (Linux caps one argv word at
    128 KiB, so as one ``--probe`` word it could never reach the gate)."""
    questions = [{"prompt": f"Question {i}: " + "tell me more. " * 700 + "What is 6 * 7?",
                  "answer": r"\b42\b"} for i in range(60)]
    path = tmp_path / "probe.json"
    path.write_text(json.dumps({"questions": questions, "min_correct": 50}))
    assert path.stat().st_size > 4 * 131072
    return path


def test_the_probe_goes_on_stdin_with_the_gate_not_on_its_command_line(tmp_path):
    s = settings_from_dict({"probe": {"file": str(_large_probe_file(tmp_path))}})
    argv, probe = gate_command(s, "h1", 600.0)
    assert "--probe-on-stdin" in argv and "--probe" not in argv
    assert max(len(word) for word in argv) < 200, argv
    assert probe == probe_spec(s.probe) and len(probe["questions"]) == 60
    source = gate_source(probe)
    space: dict = {"__name__": "gate_from_stdin"}
    exec(compile(source, "<stdin>", "exec"), space)  # noqa: S102 - our own source
    args = argparse.Namespace(probe=None, probe_on_stdin=True)
    assert space["read_probe"](args) == (probe, None)
    # Without the probe, the shipped gate has no PROBE_JSON.
    assert "\nPROBE_JSON = " not in gate_source() and argv[:2] == ["python3", "-"]
    off = settings_from_dict({"probe": {"enable": False}})
    argv, probe = gate_command(off, "h1", 600.0)
    assert probe is None and "--probe-on-stdin" not in argv


@pytest.mark.local
def test_a_large_probe_starts_the_gate_as_a_host_runs_it(tmp_path):
    """``python3 - ARGS`` with the gate on stdin, as ``run_gate`` runs it: a 600 KB probe reaches
    the gate (which then waits on the unit: a stand-in systemctl says it is not loaded). As one
    ``--probe`` word, the same probe cannot even start a process (E2BIG)."""
    s = settings_from_dict({"probe": {"file": str(_large_probe_file(tmp_path))}})
    argv, probe = gate_command(s, "h1", 30.0)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho LoadState=not-found\n")
    (bin_dir / "systemctl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    done = subprocess.run([sys.executable, *argv[1:]], input=gate_source(probe), env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "is not loaded (not-found)" in done.stdout and "probe" not in done.stdout
    with pytest.raises(OSError) as exc:
        subprocess.run([sys.executable, "-c", "pass", "--probe", json.dumps(probe)],
                       capture_output=True, timeout=60, check=False)
    assert exc.value.errno == errno.E2BIG


# --------------------------------------------------------------------------------------------------
# The stand-in's broken-verify state, from the installed tree
# --------------------------------------------------------------------------------------------------

ARGV = ["python", "-m", "sglang.launch_server", "--speculative-algorithm", "DFLASH",
        "--speculative-num-draft-tokens", "8", "--attention-backend", "triton"]
SWITCHES = {"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_DFLASH_SPEC_V2": "1"}


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """The 0.5.11 wheel as released, and with the PR#20547 port built by tests.harness.port_build
    from the shared fixtures: as it was before issue #29 (``unfixed``), the fixed port less its
    verify-mask fix (``stale-mask``: what the fleet's broken-verify tests deploy), and the fixed
    port (``fixed``: what the deploy applies)."""
    root = tmp_path_factory.mktemp("trees")
    with zipfile.ZipFile(sglang_wheel("0.5.11")) as zf:
        zf.extractall(root / "v1", [n for n in zf.namelist() if n.startswith("sglang/")])
    built = {"unfixed": port_build.build_unfixed(root / "v1"),
             "stale-mask": port_build.build_stale_mask(),
             "fixed": port_build.build_fixed()}
    for name, files in built.items():
        shutil.copytree(root / "v1", root / name)
        for path, text in files.items():
            (root / name / path).parent.mkdir(parents=True, exist_ok=True)
            (root / name / path).write_text(text)
    return {k: str(root / k / "sglang") for k in ("v1", *built)}


@pytest.mark.local
@pytest.mark.parametrize("tree", ["unfixed", "stale-mask"])
def test_the_port_without_its_mask_fix_with_triton_and_cuda_graphs_serves_a_stale_mask(trees,
                                                                                       tree):
    why = standin.stale_verify_mask(ARGV, SWITCHES, trees[tree])
    assert why is not None and "TritonAttnBackend" in why


@pytest.mark.local
def test_the_fixed_port_with_triton_and_cuda_graphs_does_not(trees):
    # The same v2 worker wired in: only the skip set differs from the stale-mask tree.
    for tree in ("fixed", "stale-mask"):
        assert (Path(trees[tree]) / "srt" / "speculative" / "dflash_worker_v2.py").is_file()
    assert standin.stale_verify_mask(ARGV, SWITCHES, trees["fixed"]) is None


@pytest.mark.local
@pytest.mark.parametrize("tree", ["unfixed", "stale-mask"])
@pytest.mark.parametrize("change", ["v1 tree", "no graphs", "flashinfer", "switch off",
                                    "switch unset", "no tree"])
def test_no_stale_mask_where_the_tree_or_flags_say_otherwise(trees, tree, change):
    argv, env, tree = list(ARGV), dict(SWITCHES), trees[tree]
    if change == "v1 tree":
        tree = trees["v1"]
    elif change == "no graphs":
        argv.append("--disable-cuda-graph")
    elif change == "flashinfer":
        argv[-1] = "flashinfer"
    elif change == "switch off":
        env["SGLANG_ENABLE_DFLASH_SPEC_V2"] = "0"
    elif change == "switch unset":
        del env["SGLANG_ENABLE_DFLASH_SPEC_V2"]  # the patched environ.py's default: off
    else:
        tree = None
    assert standin.stale_verify_mask(argv, env, tree) is None


@pytest.mark.local
def test_the_fixed_port_has_triton_in_the_skip_set_as_0_5_14_has_it(trees):
    import ast

    with zipfile.ZipFile(sglang_wheel("0.5.14")) as zf:
        newer = zf.read("sglang/srt/speculative/dflash_utils.py").decode()
    skip = "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS"
    assert "TritonAttnBackend" in standin._assigned_strings(ast.parse(newer), skip)
    mine = (Path(trees["fixed"]) / "srt" / "speculative" / "dflash_utils.py").read_text()
    stale = (Path(trees["stale-mask"]) / "srt" / "speculative" / "dflash_utils.py").read_text()
    assert "TritonAttnBackend" in standin._assigned_strings(ast.parse(mine), skip)
    assert "TritonAttnBackend" not in standin._assigned_strings(ast.parse(stale), skip)


def test_the_test_recipe_is_the_shipped_one_less_the_mask_file(tmp_path):
    path = port_build.write_stale_mask_recipe(tmp_path / "recipe.json")
    shipped, variant = port_build.load_recipe(), json.loads(path.read_text())
    assert set(shipped["files"]) - set(variant["files"]) == {port_build.MASK_FILE}
    assert variant["sources"] == shipped["sources"]
    assert {p: v for p, v in shipped["files"].items() if p != port_build.MASK_FILE} \
        == variant["files"]


def test_the_standin_answers_from_its_own_table_and_wrong_when_stale():
    body = {"messages": [{"role": "user", "content": SPEC["questions"][4]["prompt"]}]}
    assert standin.answer_tokens(body, 64, stale=False) == ["Paris"]
    assert "Paris" not in standin.answer_tokens(body, 64, stale=True)
    assert len(standin.answer_tokens(body, 64, stale=True)) == 64


def test_a_probe_files_own_questions_without_a_count_need_seven_eighths_of_them():
    probe = settings_from_dict({}).probe
    text = json.dumps({"questions": [{"prompt": f"q{i}", "answer": "a"} for i in range(3)]})
    assert probe_from_file(probe, text, "/p.json").min_correct == 3
    text = json.dumps({"questions": [{"prompt": f"q{i}", "answer": "a"} for i in range(16)]})
    assert probe_from_file(probe, text, "/p.json").min_correct == 14


@pytest.mark.parametrize("release, names", [
    ("0.5.11", (("spec_accepted_drafts", "spec_proposed_drafts"),)),
    ("0.5.12", (("spec_num_correct_drafts", "spec_num_proposed_drafts"),
                ("spec_accepted_drafts", "spec_proposed_drafts"))),
    ("0.5.23", (("spec_num_correct_drafts", "spec_num_proposed_drafts"),)),
])
@pytest.mark.local
def test_the_standin_writes_the_draft_counts_its_trees_release_writes(tmp_path, release, names):
    member = "sglang/srt/managers/tokenizer_manager.py"
    with zipfile.ZipFile(sglang_wheel(release)) as zf:
        zf.extract(member, tmp_path)
    assert standin.draft_count_names(str(tmp_path / "sglang")) == names
    # No tree (a stand-in outside a venv): 0.5.11's.
    assert standin.draft_count_names(None) == tuple(NAMES["0.5.11"])


def test_the_standin_makes_the_first_token_in_prefill_as_sglang_does():
    # A stale mask accepts every draft: block 7 over 64 tokens is 1 + 9 verify steps of 7.
    text, completion, steps, accepted = standin.decode_answer(None, [], 64, 7, True, True)
    assert (completion, steps, accepted) == (64, 9, 9 * 6)
    meta = {"spec_accept_length": completion / steps, "spec_verify_ct": steps,
            "completion_tokens": completion}
    assert round(meta["spec_accept_length"], 2) == 7.11
    assert gate.accept_ceiling(meta, 7) == pytest.approx(7 + 1 / 9)
    # Block 8 over 64 tokens: 1 + 7 steps of 8, and an eighth step cut to 7 tokens at
    # max_tokens; its drafts were all accepted all the same (what the fleet's broken verify sees).
    _, completion, steps, accepted = standin.decode_answer(None, [], 64, 8, True, True)
    assert (completion, steps, accepted) == (64, 8, 8 * 7)


# --------------------------------------------------------------------------------------------------
# Acceptance on the chat-templated probe, to the model's own end of turn
# --------------------------------------------------------------------------------------------------

STANDIN_TRANSFORMERS = Path(__file__).parents[1] / "harness" / "standin_transformers"
# A chat template shaped like Kimi K2's (user and assistant turns between <|im_...|> markers, an
# empty think block when thinking is off); written here, not the model's file.
TEMPLATE = (
    "{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>{{ m.content }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>"
    "{% if thinking is defined and not thinking %}<think></think>{% endif %}{% endif %}"
)


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TEMPLATE, "auto_map": {"AutoTokenizer": ["tokenization_kimi.X", None]}}))
    monkeypatch.setenv("PYTHONPATH", str(STANDIN_TRANSFORMERS))
    return tmp_path


def server_argv(model: Path) -> list[str]:
    import sys

    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
            "--trust-remote-code", "--speculative-algorithm", "DFLASH",
            "--speculative-num-draft-tokens", "8"]


@pytest.mark.local
def test_the_probe_is_templated_by_the_servers_own_interpreter_and_tokenizer(model_dir):
    ids, why = gate.chat_prompts(server_argv(model_dir), ["What is 6 * 7?", "Capital of Japan?"])
    assert why == "" and len(ids) == 2
    assert "".join(map(chr, ids[0])) == (
        "<|im_user|>user<|im_middle|>What is 6 * 7?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>")


@pytest.mark.local
def test_where_the_template_cannot_be_applied_the_gate_says_why(model_dir, monkeypatch):
    argv = server_argv(model_dir)
    # No --trust-remote-code on the server: the tokenizer will not load, and the error is said.
    ids, why = gate.chat_prompts([a for a in argv if a != "--trust-remote-code"], ["q"])
    assert ids is None and "needs trust_remote_code=True" in why
    # An interpreter without transformers: the venv's base Python (the test venv has the real
    # transformers, which SGLang 0.5.11 pins, for test_dflash_rope.py).
    monkeypatch.delenv("PYTHONPATH")
    import sys

    bare = str(Path(sys.base_prefix) / "bin" / "python3")
    ids, why = gate.chat_prompts([bare, *argv[1:]], ["q"])
    assert ids is None and "No module named 'transformers'" in why
    assert gate.chat_prompts(["python3", "-m", "x"], ["q"])[0] is None  # not an absolute path


def _capture_server(bodies: list):
    """A loopback HTTP server that records each POST and answers as SGLang's two endpoints do."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append((self.path, body))
            if self.path == "/generate":
                out = {"text": "x", "meta_info": {
                    "completion_tokens": 4, "spec_verify_ct": 1, "spec_accept_length": 4.0,
                    "spec_num_correct_drafts": 3, "spec_num_proposed_drafts": 7}}
            else:
                out = {"choices": [{"message": {"content": "Paris 42 144 63 72 Au 7 Jupiter"}}]}
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.local
def test_acceptance_is_measured_on_the_templated_probe_to_the_models_end_of_turn(model_dir):
    bodies: list = []
    server = _capture_server(bodies)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        spec = {**SPEC, "questions": SPEC["questions"][:2], "min_correct": 2}
        passed, lines = gate.run_probe(base, None, spec, True, 8, server_argv(model_dir))
        # No tokenizer for the interpreter: the raw question, for max_tokens, said so.
        raw: list = []
        bodies_raw = _capture_server(raw)
        base_raw = f"http://127.0.0.1:{bodies_raw.server_address[1]}"
        _, raw_lines = gate.run_probe(base_raw, None, spec, True, 8, ["python3"])
        bodies_raw.shutdown()
    finally:
        server.shutdown()
    assert passed, lines
    assert lines[1] == ("probe: acceptance measured on the chat-templated questions, each to the "
                        "model's own end of turn")
    generate = [b for path, b in bodies if path == "/generate"]
    assert len(generate) == 2
    for body in generate:
        assert "text" not in body and "ignore_eos" not in body["sampling_params"]
        text = "".join(map(chr, body["input_ids"]))
        assert text.startswith("<|im_user|>user<|im_middle|>")
        assert text.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    chat = [b for path, b in bodies if path == "/v1/chat/completions"]
    assert all(b["chat_template_kwargs"] == {"thinking": False} for b in chat)
    assert raw_lines[1].startswith("probe: acceptance measured on the raw questions for 64 "
                                   "tokens (ignore_eos), not through the chat template: ")
    assert all(b["sampling_params"]["ignore_eos"] for path, b in raw if path == "/generate")
