#!/usr/bin/env python3
"""specfleet readiness gate, run ON the host (the server binds 127.0.0.1). Python 3 stdlib only.

Waits until the unit's server answers GET /health_generate with 200 and GET /get_model_info
reports the model path the unit was started with, printing a progress line now and then.
Fails fast when systemd reports the unit failed (start-limit-hit included) or stopped, or when
the port is served by a process outside the unit. With --journal-lines N it then prints the last
N lines of the unit's journal since the gate began (API keys redacted), each starting "| ".

With --started-at EPOCH (a server an earlier run restarted, waited on now instead of restarted
again) the budget counts from the server's start, not from the gate's, and the journal from then.

With --probe JSON (or --probe-on-stdin: the JSON in ``PROBE_JSON``, an assignment sent ahead of
this script on stdin, so that a large probe is no argv word; ``operations.readiness.gate_source``),
a healthy server must then also answer right: the correctness probe sends each
question at temperature 0, several at once, to /v1/chat/completions (thinking off, the answer is
`content`) and to SGLang's native /generate, whose meta_info gives each request's acceptance
length: the question through the model's chat template (token ids made by the server's own
interpreter and tokenizer), decoded to the model's own end of turn, as users' requests are; where
the template cannot be applied here, the raw question for max_tokens tokens (ignore_eos), said.
It passes when at least min_correct answers match their regex and the mean acceptance length
is at least min_accept_length (at most halfway from 1.0 to the server's
--speculative-num-draft-tokens) and no request's is above that block size plus the prefill
token's share (SGLang's spec_accept_length counts the first output token, which prefill makes,
over the verify steps). An answer's regex is at most ANSWER_PATTERN_MAX characters, matched
against the answer's first ANSWER_TEXT_MAX characters for at most ANSWER_MATCH_S seconds.

Exit status: 0 ready; 1 the unit failed or serves the wrong model; 2 out of time; 3 bad usage;
4 the server serves, but the probe found wrong answers or a wrong acceptance length.
Every other line starts with "gate:"; the first says "since @EPOCH", the host time the gate began
(with --started-at: a little before the server's start).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

# The probe's answers, bounded (issue #55): a regex of at most this many characters (the settings
# refuse longer ones, ``specfleet.core.settings.schema.ANSWER_PATTERN_MAX``), matched against the
# first ANSWER_TEXT_MAX characters of an answer, for at most ANSWER_MATCH_S seconds.
ANSWER_PATTERN_MAX = 200
ANSWER_TEXT_MAX = 8192
ANSWER_MATCH_S = 2.0

PROPS = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ExecMainStatus")

# API keys in journal lines: ``redact_lines`` and ``read_secrets`` of
# specfleet/hostside/specfleet_log_redact.py, the one home of the redaction rules. On a host this
# script runs from stdin with that module's source ahead of it
# (``operations.readiness.gate_source``); run from a checkout, it loads the module from beside it.
if "redact_lines" not in globals():
    import importlib.util as _importlib_util

    _spec = _importlib_util.spec_from_file_location(
        "specfleet_log_redact",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "specfleet_log_redact.py"))
    _redaction = _importlib_util.module_from_spec(_spec)
    _spec.loader.exec_module(_redaction)
    redact, redact_lines = _redaction.redact, _redaction.redact_lines
    read_secrets, REDACTED = _redaction.read_secrets, _redaction.REDACTED

# Who listens on the port, before any request carries the API key: ``key_guard`` of
# specfleet/hostside/port_owner.py. On a host its source comes ahead of this script
# (``PORT_OWNER_SOURCE``, ``operations.readiness.gate_source``); from a checkout, from beside it.
if "PORT_OWNER_SOURCE" not in globals():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "port_owner.py")) as _f:
        PORT_OWNER_SOURCE = _f.read()
_port_owner: dict = {"__name__": "port_owner"}
exec(compile(PORT_OWNER_SOURCE, "port_owner.py", "exec"), _port_owner)
key_guard = _port_owner["key_guard"]
listener_pids = _port_owner["listener_pids"]
in_unit = _port_owner["in_unit"]


def say(text: str) -> None:
    print(f"gate: {text}", flush=True)


def unit_state(unit: str) -> dict[str, str]:
    cmd = ["systemctl", "show", unit] + [f"-p{p}" for p in PROPS]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def cmdline(pid: str) -> list[str]:
    """The words of ``pid``'s command line, as /proc shows it now."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return cmdline_words(raw)


def cmdline_words(raw: bytes) -> list[str]:
    """/proc/PID/cmdline's bytes as words. Normally NUL-separated; but a process that sets its
    title (setproctitle, which SGLang imports) rewrites that memory with its argv joined by
    spaces, padded with NULs: one word ``python -m sglang.launch_server --port 30000 ...``, in
    which no flag would be found. That form is split on spaces (as psutil reads it); a word with
    a space in it is then split too, which no flag the gate reads has."""
    words = [w.decode(errors="replace") for w in raw.split(b"\0")]
    if words and words[-1] == "":
        words.pop()  # the NUL that ends the last word
    text = [w for w in words if w]
    if len(text) == 1 and " " in text[0]:
        return text[0].split()
    return words


def argv_value(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in argv (``--flag V`` or ``--flag=V``), the last one winning (as
    argparse reads it): the one home of this rule, read by ``specfleet.core.unit`` too."""
    value = None
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(name + "="):
            value = word[len(name) + 1 :]
    return value


def read_api_key(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("api-key", "api_key") and value.strip():
                value = value.strip()
                return json.loads(value) if value.startswith('"') else value
    return None


def http_get(url: str, key: str | None, timeout: float) -> tuple[int | None, str]:
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback)
            return resp.status, resp.read(65536).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(4096).decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason)


def http_post(url: str, body: dict, key: str | None, timeout: float) -> tuple[int | None, object]:
    """POST ``body`` as JSON; (status, parsed JSON or the error text)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback)
            raw = resp.read(1 << 20).decode(errors="replace")
            code = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(4096).decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, str(getattr(exc, "reason", exc))
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw[:200]


# The probe's chat-template kwargs: thinking off, as the chat request asks (SGLang passes
# chat_template_kwargs to the template; serving_chat.py _apply_jinja_template).
CHAT_TEMPLATE_KWARGS = {"thinking": False}

# Run by the server's own interpreter (its venv has transformers, as SGLang's chat API uses it):
# the probe's questions as the chat API turns them into tokens (apply_chat_template with the
# generation prompt, the chat_template_kwargs), the request on stdin, the ids as JSON on stdout.
TEMPLATE_SCRIPT = """
import json, sys
spec = json.load(sys.stdin)
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(spec["model"], trust_remote_code=spec["trust_remote_code"])
out = []
for prompt in spec["prompts"]:
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                  add_generation_prompt=True, **spec["kwargs"])
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    out.append([int(i) for i in ids])
print(json.dumps(out))
"""


def chat_prompts(argv: list[str], prompts: list[str],
                 timeout: float = 300.0) -> tuple[list | None, str]:
    """Each prompt as the chat API's template makes it (token ids), by the server's own
    interpreter and tokenizer (argv[0], --model-path); (None, why not) when that cannot run."""
    python = argv[0] if argv else ""
    model = argv_value(argv, "--model-path")
    if not (os.path.isabs(python) and os.access(python, os.X_OK)) or not model:
        return None, f"the server's interpreter or --model-path is not on its command line " \
                     f"({python or 'no argv'})"
    request = {"model": model, "prompts": prompts, "kwargs": CHAT_TEMPLATE_KWARGS,
               "trust_remote_code": "--trust-remote-code" in argv}
    try:
        res = subprocess.run([python, "-c", TEMPLATE_SCRIPT], input=json.dumps(request),
                             capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python} could not apply the chat template ({exc})"
    try:
        ids = json.loads(res.stdout)
    except ValueError:
        ids = None
    if res.returncode != 0 or not isinstance(ids, list) or len(ids) != len(prompts):
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{python} could not apply the chat template: {last[:160]}"
    return ids, ""


def ask(base: str, key: str | None, question: dict, spec: dict,
        prompt_ids: list | None = None) -> dict:
    """One question, twice: the chat API for the answer (thinking off; SGLang's chat template
    kwargs), the native /generate for the acceptance length. With ``prompt_ids`` (the question
    through the chat template, ``chat_prompts``) /generate decodes the same request the chat API
    does, to the model's own end of turn; without, the raw text for max_tokens (ignore_eos)."""
    timeout = float(spec["timeout_s"])
    out: dict = {"prompt": question["prompt"], "answer": question["answer"]}
    code, body = http_post(base + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": question["prompt"]}],
        "temperature": 0, "max_tokens": int(spec["max_tokens"]),
        "chat_template_kwargs": CHAT_TEMPLATE_KWARGS,
    }, key, timeout)
    try:
        out["content"] = body["choices"][0]["message"]["content"] or ""  # type: ignore[index]
    except (TypeError, KeyError, IndexError):
        out["error"] = f"/v1/chat/completions gave {code}: {str(body)[:120]}"
    params = {"temperature": 0, "max_new_tokens": int(spec["max_tokens"])}
    if prompt_ids is not None:
        request: dict = {"input_ids": prompt_ids, "sampling_params": params}
    else:
        request = {"text": question["prompt"], "sampling_params": {**params, "ignore_eos": True}}
    code, body = http_post(base + "/generate", request, key, timeout)
    meta = body.get("meta_info") if isinstance(body, dict) else None
    if isinstance(meta, dict):
        out["meta"] = {k: meta[k] for k in META_KEYS if k in meta}
    else:
        out.setdefault("error", f"/generate gave {code}: {str(body)[:120]}")
    return out


# meta_info's draft counts (srt/managers/tokenizer_manager.py _calculate_spec_decoding_metrics):
# (correct, proposed) under each release's names, newest first. 0.5.11 has only the old pair;
# 0.5.12 added the new one beside it (the old kept as aliases); 0.5.21 dropped the old.
DRAFT_COUNT_NAMES = (("spec_num_correct_drafts", "spec_num_proposed_drafts"),
                     ("spec_accepted_drafts", "spec_proposed_drafts"))
META_KEYS = ("spec_accept_length", "spec_verify_ct", "completion_tokens",
             *(name for pair in DRAFT_COUNT_NAMES for name in pair))


def draft_counts(meta: dict) -> tuple[object, object]:
    """(drafts accepted, drafts proposed) from one request's meta_info, under whichever names
    its release writes; (None, None) when it writes neither."""
    for correct, proposed in DRAFT_COUNT_NAMES:
        if proposed in meta:
            return meta.get(correct), meta[proposed]
    return None, None


def accept_ceiling(meta: dict, block: int) -> float:
    """The highest spec_accept_length one request can report at this block size. SGLang divides
    every output token by the verify steps (``completion_tokens / spec_verify_ct``), and the
    first output token comes from prefill, not from a verify: a request that accepts every draft
    reads up to block + 1 / spec_verify_ct (7.11 at block 7 over 64 tokens). Without the step
    count (nor the tokens to work it out), one step: block + 1."""
    steps = meta.get("spec_verify_ct")
    if not steps and meta.get("completion_tokens") and meta.get("spec_accept_length"):
        steps = meta["completion_tokens"] / meta["spec_accept_length"]
    return block + 1 / steps if steps else block + 1.0


def accept_floor(configured: float, block: int | None) -> tuple[float, str]:
    """The acceptance floor the probe applies, and how to name it. A small block (e.g. 2 draft
    tokens) could never reach probe.min_accept_length's default 2.0 except with every draft
    accepted, which the probe calls suspicious: the floor is at most halfway between a verify
    that accepts nothing (1.0) and one that accepts everything (the block size)."""
    if block is None or configured <= (1 + block) / 2:
        return configured, f"probe.min_accept_length {configured:g}"
    low = (1 + block) / 2
    return low, (f"the floor {low:g} (probe.min_accept_length {configured:g}, capped halfway to "
                 f"the block size {block})")


def judge(answers: list, spec: dict, speculative: bool,
          block: int | None) -> tuple[bool, list[str]]:
    """The probe's verdict on the answers (pure): (passed, lines to print; on failure the last
    one starts "probe FAILED: "). ``speculative``: the server decodes speculatively; ``block``:
    its --speculative-num-draft-tokens (None: not on its command line, no upper bound)."""
    right, wrong = 0, []
    for a in answers:
        content = a.get("content")
        found = answer_matches(a["answer"], content) if content is not None else False
        if found:
            right += 1
        else:
            got = a.get("error") or f"said {shorten(content or '')!r}"
            if found is None:
                got = (f"the regex ran past {ANSWER_MATCH_S:g} s on the answer (it backtracks "
                       "without end: simplify it, e.g. no repeat inside a repeat)")
            wrong.append(f"{a['prompt']!r} (expected /{a['answer']}/): {got}")
    need = int(spec["min_correct"])
    lines = [f"probe: {right}/{len(answers)} answers right (need {need})"]
    problems = []
    if right < need:
        more = f"; and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        problems.append(f"{right}/{len(answers)} answers right (need {need}); wrong: "
                        + "; ".join(wrong[:3]) + more)
    elif wrong:
        lines.append("probe: wrong, within the allowance: " + "; ".join(wrong))
    if not speculative:
        lines.append("probe: no speculative decoding on this server: acceptance not checked")
        return _verdict(lines, problems)
    metas = [a.get("meta") or {} for a in answers]
    lengths = [m["spec_accept_length"] for m in metas if "spec_accept_length" in m]
    if not lengths:
        problems.append("/generate reported no spec_accept_length (meta_info) for any question")
        return _verdict(lines, problems)
    mean = sum(lengths) / len(lengths)
    low, floor_named = accept_floor(float(spec["min_accept_length"]), block)
    seen = (f"mean acceptance length {mean:.2f} (per question: "
            + ", ".join(f"{x:.2f}" for x in lengths) + ")")
    over = [] if block is None else [
        (m["spec_accept_length"], accept_ceiling(m, block)) for m in metas
        if "spec_accept_length" in m and m["spec_accept_length"] > accept_ceiling(m, block) + 1e-6]
    if mean < low:
        problems.append(f"{seen} is below {floor_named}")
    elif over:
        problems.append(
            f"{seen}: {over[0][0]:.2f} is above {over[0][1]:.2f}, the block size {block} plus "
            "the one token prefill gives: not a real acceptance")
    elif problems:
        problems.append(seen)
    else:
        top = f"{block} + prefill's 1/spec_verify_ct" if block else "block size"
        lines.append(f"probe: {seen}, within [{low:g}, {top}]")
    counts = [draft_counts(m) for m in metas]
    all_accepted = len(lengths) == len(metas) and all(
        proposed and accepted == proposed for accepted, proposed in counts)
    if all_accepted and (block is None or mean >= block - 1e-6):
        note = ("SUSPICIOUS: every draft token was accepted on every question (the length is "
                "the block size): a verify that does not check the drafts, such as one reading "
                "a stale attention mask, looks like this")
        (problems if problems else lines).append(note if problems else f"probe: {note}")
    return _verdict(lines, problems)


class _MatchExpired(Exception):
    """Raised by SIGALRM's handler inside ``re``, which checks for signals as it goes."""


def answer_matches(pattern: str, text: str, seconds: float | None = None) -> bool | None:
    """Whether ``pattern`` (case-insensitive, ``.`` matching newlines) is found in the first
    ANSWER_TEXT_MAX characters of ``text``; None when the search ran past ``seconds`` (default
    ANSWER_MATCH_S: a regex that backtracks without end). The clock is SIGALRM, in the main
    thread only (where signals are delivered; the gate judges there); the caller's timer and
    handler are put back."""
    seconds = ANSWER_MATCH_S if seconds is None else seconds
    text = text[:ANSWER_TEXT_MAX]
    if threading.current_thread() is not threading.main_thread():
        return re.search(pattern, text, re.I | re.S) is not None

    def expire(signum, frame):
        raise _MatchExpired()

    began = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, expire)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return re.search(pattern, text, re.I | re.S) is not None
    except _MatchExpired:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay:
            left = max(old_delay - (time.monotonic() - began), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)


def _verdict(lines: list[str], problems: list[str]) -> tuple[bool, list[str]]:
    if problems:
        return False, lines + ["probe FAILED: " + " | ".join(problems)]
    return True, lines


def shorten(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def run_probe(base: str, key: str | None, spec: dict, speculative: bool,
              block: int | None, argv: list[str] | None = None) -> tuple[bool, list]:
    """Every question at once, ``concurrency`` in flight; then ``judge``. Acceptance is measured
    on the questions through the chat template (``chat_prompts``, with the server's ``argv``),
    or, where that cannot run, on the raw questions, said in the first line."""
    from concurrent.futures import ThreadPoolExecutor

    questions = spec["questions"]
    ids, why = (None, "") if not speculative else chat_prompts(
        argv or [], [q["prompt"] for q in questions])
    with ThreadPoolExecutor(max_workers=max(1, int(spec["concurrency"]))) as pool:
        answers = list(pool.map(lambda i: ask(base, key, questions[i], spec,
                                              ids[i] if ids else None), range(len(questions))))
    passed, lines = judge(answers, spec, speculative, block)
    if speculative:
        lines.insert(1, "probe: acceptance measured on the chat-templated questions, each to "
                     "the model's own end of turn" if ids else
                     f"probe: acceptance measured on the raw questions for {spec['max_tokens']} "
                     f"tokens (ignore_eos), not through the chat template: {why}")
    return passed, lines


def journal_tail(unit: str, since: float, lines: int, secrets: list) -> list[str]:
    time.sleep(0.5)  # let journald take the dying process's last lines
    # With --since, journalctl's -n counts from the start of the range: cut the tail here.
    cmd = ["journalctl", "-u", unit, "--no-pager", "-o", "cat", f"--since=@{int(since)}"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    # Redacted as one text: a key split over two journal lines is found too.
    out = [line for line in redact_lines(res.stdout.splitlines(), secrets) if line.strip()]
    out = out[-lines:]
    return out or [f"(journalctl printed nothing: {res.stderr.strip() or 'no lines'})"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--unit", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model-path", help="expected model_path; default: the running --model-path")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--poll", type=float, default=2.0)
    p.add_argument("--report-every", type=float, default=15.0)
    p.add_argument("--secret-file")
    p.add_argument("--journal-lines", type=int, default=0)
    p.add_argument("--journal-since", type=float, help="only print the journal tail since EPOCH")
    p.add_argument("--started-at", type=float,
                   help="the server's start (host EPOCH): the budget counts from then")
    p.add_argument("--probe", help="the correctness probe as JSON (questions, thresholds)")
    p.add_argument("--probe-on-stdin", action="store_true",
                   help="the probe is PROBE_JSON, assigned ahead of this script on stdin")
    return p.parse_args()


def read_probe(args: argparse.Namespace) -> tuple[dict | None, str | None]:
    """The correctness probe of ``--probe JSON`` or ``--probe-on-stdin`` (``PROBE_JSON``, sent
    ahead of this script: a large probe is no argv word, which Linux caps at 128 KiB), checked:
    (the probe or None, why it is unusable)."""
    text = args.probe
    if args.probe_on_stdin:
        text = globals().get("PROBE_JSON")
        if not isinstance(text, str):
            return None, "--probe-on-stdin, but no PROBE_JSON came ahead of the script"
    if not text:
        return None, None
    try:
        probe = json.loads(text)
    except ValueError as exc:
        return None, f"bad probe JSON: {exc}"
    questions = probe.get("questions") if isinstance(probe, dict) else None
    if not isinstance(questions, list):
        return None, "bad probe JSON: no list of questions"
    for i, q in enumerate(questions):
        answer = q.get("answer") if isinstance(q, dict) else None
        if not isinstance(answer, str) or len(answer) > ANSWER_PATTERN_MAX:
            return None, (f"bad probe: question {i}'s answer must be a regex of at most "
                          f"{ANSWER_PATTERN_MAX} characters")
    return probe, None


def unit_problem(unit: str, st: dict) -> str | None:
    """Why the unit will not come up (systemd's word for it), or None while it may."""
    active, sub, result = st.get("ActiveState"), st.get("SubState"), st.get("Result")
    if st.get("LoadState") != "loaded":
        return f"{unit} is not loaded ({st.get('LoadState')})"
    if active == "failed" or result == "start-limit-hit":
        return (f"systemd reports {unit} {active} (result {result}, exit status "
                f"{st.get('ExecMainStatus')}, {st.get('NRestarts', '0')} restarts)")
    if active in ("inactive", "deactivating"):
        return f"{unit} is {active} ({sub}); nothing is starting it"
    return None


def server_base(host: str, port: int) -> str:
    """The URL the gate reaches the server on, from the address it listens on."""
    if host in ("0.0.0.0", "", "*"):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def listener_refusal(port: int, unit: str) -> tuple[str | None, None, str | None] | None:
    """``check_server``'s answer when the port is not the unit's alone, before any request (and
    the API key with it) goes out: still loading when nothing listens, a failure naming who
    listens when a process outside the unit does; None: the unit's own process listens."""
    state, problem = key_guard(port, unit)
    if problem:
        return None, None, problem
    if state == "none":
        return f"nothing listens on port {port} yet", None, None
    return None


def check_server(base: str, key: str | None, argv: list[str], port: int, unit: str,
                 model_path: str | None) -> tuple[str | None, str | None, str | None]:
    """One look at the server: (status while it loads, the model it serves once ready, why it
    fails). Ready means ``/health_generate`` answers and ``/get_model_info`` names the expected
    model, served from inside the unit. Nothing is sent (nor the API key) unless the unit's own
    process alone listens on the port."""
    refused = listener_refusal(port, unit)
    if refused is not None:
        return refused
    code, body = http_get(base + "/health_generate", key, timeout=60)
    if code != 200:
        return f"/health_generate {code if code is not None else body}", None, None
    code, body = http_get(base + "/get_model_info", key, timeout=30)
    if code == 404:
        code, body = http_get(base + "/model_info", key, timeout=30)
    try:
        info = json.loads(body) if code == 200 else None
    except ValueError:
        info = None
    if info is None:
        return f"/get_model_info gave {code}: {body[:120]}", None, None
    want = model_path or argv_value(argv, "--model-path")
    got = info.get("model_path")
    owners = listener_pids(port)
    if owners and not any(in_unit(pid, unit) for pid in owners):
        return None, None, (f"port {port} is served by pid {sorted(owners)}, a process outside "
                            f"{unit}; another server holds the port")
    if want is not None and got != want:
        return None, None, f"the server serves model_path {got!r}, expected {want!r}"
    return None, got, None


def main() -> int:
    args = parse_args()
    # Every key of the key file, the admin key too, is kept out of the journal excerpt.
    secrets = read_secrets([args.secret_file])
    if args.journal_since is not None:
        for line in journal_tail(args.unit, args.journal_since, args.journal_lines or 30,
                                 secrets):
            print(f"| {line}", flush=True)
        return 0
    probe, problem = read_probe(args)
    if problem:
        say(problem)
        return 3
    return wait_ready(args, secrets, probe)


def probe_server(base: str, key: str | None, probe: dict, argv: list[str], served: str | None,
                 elapsed: float) -> str | None:
    """The correctness probe on a healthy server: why it failed, or None when it passed."""
    say(f"healthy after {elapsed:.0f} s; probing {len(probe['questions'])} "
        f"questions, {probe['concurrency']} at once")
    began = time.monotonic()
    block = argv_value(argv, "--speculative-num-draft-tokens")
    speculative = argv_value(argv, "--speculative-algorithm") is not None
    passed, lines = run_probe(base, key, probe, speculative,
                              int(block) if block and block.isdigit() else None, argv)
    for line in lines[:-1] if not passed else lines:
        say(line)
    if not passed:
        return (f"{base} serves {served}, but the correctness probe "
                f"({time.monotonic() - began:.1f} s) failed: {lines[-1][len('probe FAILED: '):]}")
    say(f"probe passed in {time.monotonic() - began:.1f} s")
    return None


def wait_ready(args: argparse.Namespace, secrets: list[str], probe: dict | None = None) -> int:
    """Poll until the server serves (0), fails (1) or the budget runs out (2)."""
    since = time.time() - 3
    start = time.monotonic()
    key = read_api_key(args.secret_file)
    if args.started_at is not None:
        age = max(0.0, time.time() - args.started_at)
        since, start = min(since, args.started_at - 3), start - age
        say(
            f"waiting for {args.unit} to serve, started {age:.0f} s ago; budget {args.timeout:.0f}"
            f" s from its start, {max(0.0, args.timeout - age):.0f} s left; since @{since:.0f}"
        )
    else:
        say(f"waiting for {args.unit} to serve; budget {args.timeout:.0f} s; since @{since:.0f}")
    last_report = -1e9
    last_status = None

    def fail(problem: str, status: int = 1) -> int:
        say(f"FAILED after {time.monotonic() - start:.0f} s: {problem}")
        if args.journal_lines:
            say(f"last journal lines of {args.unit}:")
            for line in journal_tail(args.unit, since, args.journal_lines, secrets):
                print(f"| {line}", flush=True)
        return status

    while True:
        elapsed = time.monotonic() - start
        st = unit_state(args.unit)
        problem = unit_problem(args.unit, st)
        if problem:
            # A server that died at once may have found its port taken (address in use): say
            # by whom, as the check before the key would have.
            holder = key_guard(args.port, args.unit)[1]
            return fail(f"{problem}; {holder}" if holder else problem)
        sub, restarts = st.get("SubState"), st.get("NRestarts", "0")
        argv = cmdline(st.get("MainPID", "0")) if st.get("MainPID", "0") != "0" else []
        port = int(argv_value(argv, "--port") or args.port)
        base = server_base(argv_value(argv, "--host") or args.host, port)
        status = "process restarting" if sub == "auto-restart" or not argv else None
        if status is None:
            status, served, problem = check_server(base, key, argv, port, args.unit,
                                                   args.model_path)
            if problem:
                return fail(problem)
            if served is not None or status is None:
                problem = probe_server(base, key, probe, argv, served, elapsed) if probe else None
                if problem:
                    return fail(problem, status=4)
                say(f"READY after {time.monotonic() - start:.0f} s: {base} serves {served} "
                    f"({restarts} restarts)")
                return 0
        if elapsed > args.timeout and args.started_at is not None:
            return fail(
                f"still loading {elapsed:.0f} s after its start, past the budget of "
                f"{args.timeout:.0f} s (last: {status}); it was not restarted; raise "
                f"settings.readiness_timeout_s if the model needs longer",
                status=2,
            )
        if elapsed > args.timeout:
            return fail(
                f"not ready within the budget of {args.timeout:.0f} s (last: {status}); "
                f"raise settings.readiness_timeout_s if the model needs longer",
                status=2,
            )
        if status != last_status or elapsed - last_report >= args.report_every:
            say(f"{elapsed:4.0f} s: {args.unit} {st.get('ActiveState')}/{sub}, {status}, "
                f"{restarts} restarts")
            last_report, last_status = elapsed, status
        time.sleep(args.poll)


if __name__ == "__main__":
    sys.exit(main())
