"""STAND-IN performance model of a speculative-decoding SGLang server, for tests only.

There is no GPU here, so nothing real can decode. This module gives the stand-in server
(``standin_sglang_server.py``, which imports it from the same folder on the host) an
OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` with streaming, and the speed
and acceptance length figures SGLang reports, all made up from the speculative flags the server
was started with. Python 3 stdlib only: it is uploaded to fleet hosts.

What it copies from SGLang 0.5.11 (the wheel in the wheelhouse):
- streaming (``srt/entrypoints/openai/serving_completions.py``): ``data: {chunk}\\n\\n`` lines of
  ``text_completion`` chunks, then, with ``stream_options.include_usage``, a chunk with no
  choices and the ``usage``, then ``data: [DONE]``;
- the acceptance length: ``internal_states[0].avg_spec_accept_length`` in ``/server_info`` (and
  the deprecated ``/get_server_info``), the accepted tokens over the forward steps since start,
  present only after a decode step (``srt/managers/scheduler.py`` ``get_internal_state``); the
  gauge ``sglang:spec_accept_length`` (and ``sglang:gen_throughput``) on ``/metrics``, which
  SGLang serves only with ``--enable-metrics`` (``srt/observability/metrics_collector.py``).

The model (not SGLang's, and not any GPU's): throughput and acceptance peak at one point of the
speculative settings, drawn from a seed (``--standin-perf-seed N``, else the environment's
``SPECFLEET_STANDIN_PERF_SEED``, else 0). The best number of draft tokens and draft window are
drawn from the INNER values of ``BLOCKS`` and ``WINDOWS``, so the best point of a grid over them is
never at a corner; every step away from it (a power of two, or another draft backend) costs at
least 20 % of the throughput, so a benchmark on a busy 2-core machine still ranks points right.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass

SEED_ENV = "SPECFLEET_STANDIN_PERF_SEED"
# The axes the best point is drawn on (inner values only: never a corner of a grid over them).
BLOCKS = (2, 4, 8, 16)
WINDOWS = (1024, 2048, 4096, 8192)
DRAFT_BACKENDS = ("flashinfer", "fa3", "fa4", "triton")
WINDOW_FLAGS = ("--speculative-dflash-draft-window-size", "--speculative-draft-window-size")
# Output tokens/s of one request alone at the best point; each further concurrent request adds
# 1/(1 + CONTENTION) of that (a batch shares the GPU).
PEAK_TPS = 160.0
CONTENTION = 0.3
BLOCK_STEP, WINDOW_STEP, BACKEND_MISS, TARGET_MISS = 0.75, 0.8, 0.78, 0.9


@dataclass(frozen=True)
class Point:
    """The speculative settings the server was started with."""

    algorithm: str | None
    block: int
    window: int
    draft_backend: str
    attention_backend: str | None


def flag_value(argv: list[str], *names: str) -> str | None:
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def point_from_argv(argv: list[str]) -> Point:
    def as_int(text: str | None, default: int) -> int:
        try:
            return int(text) if text is not None else default
        except ValueError:
            return default

    return Point(
        algorithm=flag_value(argv, "--speculative-algorithm"),
        block=as_int(flag_value(argv, "--speculative-num-draft-tokens"), 8),
        window=as_int(flag_value(argv, *WINDOW_FLAGS), 4096),
        draft_backend=flag_value(argv, "--speculative-draft-attention-backend") or "flashinfer",
        attention_backend=flag_value(argv, "--attention-backend"),
    )


@dataclass(frozen=True)
class Best:
    block: int
    window: int
    draft_backend: str


def best_point(seed: int) -> Best:
    """The stand-in's best settings for ``seed``: inner values of BLOCKS and WINDOWS."""
    rng = random.Random(f"specfleet-standin-perf-{seed}")
    return Best(rng.choice(BLOCKS[1:-1]), rng.choice(WINDOWS[1:-1]), rng.choice(DRAFT_BACKENDS))


def _steps(value: int, best: int) -> float:
    return abs(math.log2(max(value, 1) / best))


def single_tps(point: Point, seed: int) -> float:
    """Output tokens/s of one request alone at ``point`` (no speculation: a third of the peak)."""
    if point.algorithm is None:
        return PEAK_TPS / 3
    best = best_point(seed)
    rate = PEAK_TPS * BLOCK_STEP ** _steps(point.block, best.block)
    rate *= WINDOW_STEP ** _steps(point.window, best.window)
    if point.draft_backend != best.draft_backend:
        rate *= BACKEND_MISS
    if point.attention_backend not in (None, "triton", "fa3", "trtllm_mla", "flashmla"):
        rate *= TARGET_MISS
    return rate


def accept_length(point: Point, seed: int) -> float:
    """Tokens accepted per verify step at ``point`` (1.0 without speculation)."""
    if point.algorithm is None:
        return 1.0
    best = best_point(seed)
    top = 1 + 0.6 * (best.block - 1)
    value = top * 0.8 ** _steps(point.block, best.block) * 0.85 ** _steps(point.window, best.window)
    return max(1.0, min(value, float(point.block)))


class Perf:
    """The server's decoding state: the model, the counters SGLang reports, the live requests."""

    def __init__(self, argv: list[str], seed: int | None, served_model: str):
        if seed is None:
            seed = int(os.environ.get(SEED_ENV, "0") or 0)
        self.seed = seed
        self.point = point_from_argv(argv)
        # --standin-slowdown F: this server decodes F times slower (a host made slow, for the
        # rollout's speed gate).
        self.slowdown = float(flag_value(argv, "--standin-slowdown") or 1.0)
        self.ddtree = ddtree_from_argv(argv)
        self.metrics_enabled = "--enable-metrics" in argv
        self.model = served_model
        self.lock = threading.Lock()
        self.active = 0
        self.accepted = 0
        self.forward_ct = 0
        self.recent_tps = 0.0

    # -- what SGLang reports ---------------------------------------------------------------------

    def internal_state(self) -> dict:
        with self.lock:
            state: dict = {"effective_max_running_requests_per_dp": 64}
            if self.point.algorithm is not None and self.forward_ct > 0:
                state["avg_spec_accept_length"] = self.accepted / self.forward_ct
            return state

    def server_info(self) -> dict:
        p = self.point
        return {
            "speculative_algorithm": p.algorithm,
            "speculative_num_draft_tokens": p.block,
            "speculative_dflash_draft_window_size": p.window,
            "speculative_draft_attention_backend": p.draft_backend,
            "attention_backend": p.attention_backend,
            "internal_states": [self.internal_state()],
            **ddtree_server_info(self.ddtree),
        }

    def metrics_text(self) -> str:
        labels = f'model_name="{self.model}",engine_type="unified",tp_rank="0",pp_rank="0"'
        accept = self.internal_state().get("avg_spec_accept_length", 0.0)
        lines = [
            "# HELP sglang:gen_throughput The generation throughput (token/s).",
            "# TYPE sglang:gen_throughput gauge",
            f"sglang:gen_throughput{{{labels}}} {self.recent_tps}",
            "# HELP sglang:spec_accept_length The average acceptance length of speculative "
            "decoding.",
            "# TYPE sglang:spec_accept_length gauge",
            f"sglang:spec_accept_length{{{labels}}} {accept}",
        ]
        return "\n".join(lines) + "\n"

    # -- decoding --------------------------------------------------------------------------------

    def stream(self, max_tokens: int, prompt_tokens: int):
        """Yield chunks of generated words, as a speculative decode step yields its accepted
        tokens, each after the time the model gives that step."""
        accept = (ddtree_accept_length(self.ddtree, self.seed) if self.ddtree
                  else accept_length(self.point, self.seed))
        with self.lock:
            self.active += 1
        try:
            # Prefill: a fixed cost plus the prompt, longer while others decode.
            time.sleep(0.02 + prompt_tokens * 2e-5)
            done, carry = 0, 0.0
            # Each step is due at a deadline, not after a fixed sleep: a late wake-up on a loaded
            # machine is made up by the next step, so the measured speed is the model's and not
            # the model's less the scheduler's delay per step (which favoured the budgets with
            # the fewest steps).
            due = time.monotonic()
            while done < max_tokens:
                carry += accept
                step = min(max(1, int(carry)), max_tokens - done)
                carry -= step
                with self.lock:
                    busy = max(1, self.active)
                alone = (ddtree_single_tps(self.point, self.ddtree, self.seed) if self.ddtree
                         else single_tps(self.point, self.seed))
                rate = alone / (1 + CONTENTION * (busy - 1)) / self.slowdown
                due += step / rate
                time.sleep(max(0.0, due - time.monotonic()))
                with self.lock:
                    self.accepted += step
                    self.forward_ct += 1
                    self.recent_tps = rate * busy
                done += step
                yield " ".join(["tok"] * step) + " "
        finally:
            with self.lock:
                self.active -= 1


# --------------------------------------------------------------------------------------------------
# DDTree (STAND-IN): acceptance and speed against the tree budget
# --------------------------------------------------------------------------------------------------
# From the published results and the designs' own code, not from any GPU:
# - acceptance rises with the budget with diminishing returns (DDTree, arXiv 2604.12989: a
#   best-first tree under a node budget; "2.13x on top of DFlash" at its best, sglang #22887):
#   1 + ACCEPT_GAIN * (1 - 2^(-budget / (best / 2))), at most the budget;
# - each step costs a plain DFlash step plus the verify of the whole tree, growing faster than
#   linearly in the budget (ancestor-only mask, attention over every node: VERIFY_POWER), plus the
#   draft: in the fork's design the drafter runs over the whole budget (dflash_worker.py sets
#   block_size = num_draft_tokens: DRAFT_PER_TOKEN x budget), in PR#29907's over its block;
# - the verify cost's scale is solved per run so that the best budget is one of the INNER values
#   of BUDGETS, drawn from the seed: never a corner of a sweep over them; its neighbours are
#   more than 10 % slower.
BUDGETS = (8, 16, 32, 64, 128)
ACCEPT_GAIN = 6.0
VERIFY_POWER = 1.5
DRAFT_PER_TOKEN = 0.004
# The best DDTree budget's speed over the best plain DFlash point's (below the paper's 2.13x).
DDTREE_SPEEDUP = 1.5
FORK_SWITCH = "--speculative-dflash-enable-ddtree"
PR29907_BUDGET = "--speculative-ddtree-budget"


@dataclass(frozen=True)
class DDTreeRun:
    design: str  # "fork" (the DFLASH switch) or "pr29907" (algorithm DDTREE)
    budget: int
    block: int  # the drafter's positions per step outside the tree (PR#29907)


def ddtree_from_argv(argv: list[str]) -> DDTreeRun | None:
    """DDTree as the server was started: the fork's switch (the budget is the draft tokens) or
    PR#29907's algorithm with its budget flag; None for plain DFlash."""
    tokens = flag_value(argv, "--speculative-num-draft-tokens")
    try:
        if FORK_SWITCH in argv:
            return DDTreeRun("fork", int(tokens or 16), int(tokens or 16))
        if flag_value(argv, "--speculative-algorithm") == "DDTREE":
            return DDTreeRun("pr29907", int(flag_value(argv, PR29907_BUDGET) or 64),
                             int(tokens or 16))
    except ValueError:
        return None
    return None


def best_budget(seed: int) -> int:
    return random.Random(f"specfleet-standin-ddtree-{seed}").choice(BUDGETS[1:-1])


def _ddtree_accept(budget: int, best: int) -> float:
    return min(float(budget), 1 + ACCEPT_GAIN * (1 - 2 ** (-budget / (best / 2))))


def _ddtree_cost(run: DDTreeRun, budget: int, verify: float) -> float:
    drafted = budget if run.design == "fork" else run.block
    return 1 + verify * budget**VERIFY_POWER + DRAFT_PER_TOKEN * drafted


def _ddtree_rate(run: DDTreeRun, budget: int, best: int, verify: float) -> float:
    return _ddtree_accept(budget, best) / _ddtree_cost(run, budget, verify)


def ddtree_verify_scale(run: DDTreeRun, best: int) -> float:
    """The verify cost's scale that puts the optimum of accept/cost at ``best`` (bisection on
    the sign of the slope there)."""
    lo, hi, eps = 1e-9, 1.0, best * 1e-3
    for _ in range(80):
        mid = (lo + hi) / 2
        rising = _ddtree_rate(run, best + eps, best, mid) > _ddtree_rate(run, best - eps, best, mid)
        lo, hi = (mid, hi) if rising else (lo, mid)
    return (lo + hi) / 2


def ddtree_accept_length(run: DDTreeRun, seed: int) -> float:
    return _ddtree_accept(run.budget, best_budget(seed))


def ddtree_single_tps(point: Point, run: DDTreeRun, seed: int) -> float:
    """Output tokens/s of one request alone with DDTree at ``run.budget``: DDTREE_SPEEDUP x the
    best DFlash speed at the stand-in's best budget, scaled by accept/cost elsewhere (the rest of
    the point, window and backends, costs as for DFlash)."""
    best = best_budget(seed)
    verify = ddtree_verify_scale(run, best)
    dflash = single_tps(Point(point.algorithm or "DFLASH", best_point(seed).block, point.window,
                              point.draft_backend, point.attention_backend), seed)
    return (DDTREE_SPEEDUP * dflash * _ddtree_rate(run, run.budget, best, verify)
            / _ddtree_rate(run, best, best, verify))


def ddtree_server_info(run: DDTreeRun | None) -> dict:
    if run is None:
        return {}
    return {"speculative_ddtree_design": run.design, "speculative_ddtree_budget": run.budget,
            "standin": "DDTree modelled by tests/harness/standin_perf.py, not measured"}


def _prompt_tokens(body: dict) -> int:
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
    else:
        prompt = body.get("prompt", "")
        text = " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
    return max(1, len(text.split()))


def handle_post(handler, path: str, perf: Perf) -> bool:
    """Serve ``/v1/completions`` and ``/v1/chat/completions`` on ``handler`` (a
    ``BaseHTTPRequestHandler``); False for any other path."""
    if path not in ("/v1/completions", "/v1/chat/completions"):
        return False
    chat = path.endswith("chat/completions")
    try:
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"{}")
    except (ValueError, json.JSONDecodeError):
        _json(handler, 400, {"object": "error", "message": "invalid JSON body", "code": 400})
        return True
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    prompt_tokens = _prompt_tokens(body)
    rid = uuid.uuid4().hex
    created = int(time.time())
    model = body.get("model") or perf.model
    obj = "chat.completion.chunk" if chat else "text_completion"

    def choice(text: str, finish: str | None) -> dict:
        if chat:
            return {"index": 0, "delta": {"content": text} if text else {},
                    "finish_reason": finish, "logprobs": None}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                "matched_stop": None}

    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
             "total_tokens": prompt_tokens + max_tokens}
    if not body.get("stream"):
        text = "".join(perf.stream(max_tokens, prompt_tokens))
        message = ({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        _json(handler, 200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": model,
                             "choices": [{"index": 0, **message, "finish_reason": "length"}],
                             "usage": usage})
        return True

    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.end_headers()

    def send(payload: str) -> None:
        handler.wfile.write(f"data: {payload}\n\n".encode())
        handler.wfile.flush()

    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    try:
        for text in perf.stream(max_tokens, prompt_tokens):
            send(json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                             "choices": [choice(text, None)]}))
        send(json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                         "choices": [choice("", "length")]}))
        if include_usage:
            send(json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                             "choices": [], "usage": usage}))
        send("[DONE]")
    except (BrokenPipeError, ConnectionResetError):
        pass
    handler.close_connection = True
    return True


def _json(handler, code: int, body: dict) -> None:
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
