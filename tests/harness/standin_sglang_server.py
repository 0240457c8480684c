#!/usr/bin/env python3
"""STAND-IN for `python -m sglang.launch_server`, for tests only (no GPU here, so the real one
cannot come up). Python 3 stdlib only: it is uploaded to fleet hosts, which have no packages.

It speaks the part of SGLang's HTTP API that specfleet's readiness gate and users probe:
GET /health, /health_generate (503 while "loading", then 200), /get_model_info, /model_info,
/v1/models, /get_server_info. It honours --host, --port, --model-path, --api-key, --log-level and
SGLang's --config FILE.yaml (the way specfleet passes the API key), and ignores every other flag.

It logs as SGLang does: through `logging`, configured by a stand-in of SGLang's
`configure_logger` (SGLANG_LOGGING_CONFIG_PATH: a JSON dictConfig, else basicConfig), then logs
its ServerArgs, API key included, on the logger `sglang.srt.entrypoints.engine`.

Its own options come first and are named --standin-*:
  --standin-record PATH   write {"argv": [exact argv from /proc/self/cmdline], "env": {...},
                          "cwd": ..., "pid": ...} to PATH (JSON) at start, then once SGLang's
                          rules were tried, with "sglang_rules": {"tree", "ran", "refusal",
                          "why_not"} added (sglang_verdict below)
  --standin-load-s N      answer 503 on /health_generate for N seconds ("loading the model")
  --standin-exit N        exit with status N right after recording (a server that crashes)
  --standin-exit-after-s S  with --standin-exit: "load" (503) for S seconds first, then exit
                          (a server that dies while loading its weights, e.g. out of memory)
  --standin-perf-seed N   the seed of the performance model (standin_perf.py, beside this file:
                          /v1/completions with streaming, acceptance length and tokens/s that
                          depend on the speculative flags)

Across hosts (SGLang's --nnodes N --node-rank R --dist-init-addr HOST:PORT --dist-timeout S), it
does what SGLang does at start-up (srt/entrypoints/engine.py _launch_subprocesses; the schedulers'
torch.distributed init over a TCPStore at --dist-init-addr): rank 0 listens on the rendezvous
port and serves HTTP only once every rank has joined; a rank >= 1 connects to rank 0 until the
distributed timeout, then serves SGLang's dummy health server (launch_dummy_health_check_server:
/health and /health_generate answer 200 whatever the state). A rank that cannot join, or rank 0
that waits for one that never comes, exits 1 at the timeout with torch's message; a lost peer
afterwards ends every rank, as an NCCL error would. The rendezvous protocol itself is this
stand-in's own (one line per rank), not torch's.
  --standin-hang-file P   alive but not generating while P holds this process's pid (a wedged
                          scheduler, sgl-project/sglang #6624): /health answers, /health_generate
                          waits SGLANG_HEALTH_CHECK_TIMEOUT and answers 503, no tokens are made
  --standin-busy-file P   while P exists: busy (tokens rise, /health_generate fails as under load,
                          #22511)

With SGLang's --enable-metrics it serves /metrics with SGLang's metric names (DayTwo below).

It refuses to start where the installed SGLang would (sglang_verdict below): the tree this
interpreter would import runs its own parser and rule methods on the flags (sglang_rules.py,
uploaded beside this file), and "Not enough memory" is modelled from the fraction that code chose,
nvidia-smi's GPU memory and the model folders' weights. No tree (or no sglang_rules.py, or a tree
whose rules cannot run here, e.g. 0.5.23's without msgspec): no check, and the record says why.

The readiness gate's correctness probe gets SGLang's native /generate (meta_info with the
per-request acceptance length) and non-streaming /v1/chat/completions answers from this stand-in's
own table (STANDIN_ANSWERS, never the gate's expected answers). On a tree where the target's
verify would read a stale custom mask (stale_verify_mask: decided from the installed SGLang files
this interpreter would import, the process's flags and environment, as 0.5.11 with the unfixed
PR#20547 port, triton and CUDA graphs) every draft is "accepted" and the answers are wrong.
  --standin-slowdown F    decode F times slower (standin_perf.py; a host made slow)
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Beside this file where it was uploaded with it (python puts the script's folder first on
# sys.path); a host given this file alone serves everything but the completions.
try:
    import standin_perf as perf_module
except ImportError:
    perf_module = None

# As in SGLang's modules (srt/entrypoints/engine.py: `logger = logging.getLogger(__name__)`): made
# at import, before the logging is configured, so a dictConfig that disables existing loggers
# silences it here as it would silence SGLang's.
logger = logging.getLogger("sglang.srt.entrypoints.engine")


def configure_logger(log_level: str, prefix: str = "") -> None:
    """STAND-IN for SGLang's `sglang.srt.utils.common.configure_logger` (0.5.11 ~L1206; the same
    in 0.5.14 ~L1357 and 0.5.23 ~L2618): SGLANG_LOGGING_CONFIG_PATH names a JSON file handed to
    `logging.config.dictConfig` as it is (SGLang parses it with orjson, this with json), and
    nothing else is set up; without it, `basicConfig(force=True)` with SGLang's format."""
    config_path = os.getenv("SGLANG_LOGGING_CONFIG_PATH")
    if config_path:
        if not os.path.exists(config_path):
            raise Exception(
                "Setting SGLANG_LOGGING_CONFIG_PATH from env with "
                f"{config_path} but it does not exist!"
            )
        with open(config_path, encoding="utf-8") as file:
            custom_config = json.loads(file.read())
        logging.config.dictConfig(custom_config)
        return
    # SGLang's envs.SGLANG_LOG_MS (an EnvBool).
    log_ms = os.environ.get("SGLANG_LOG_MS", "").lower() in ("true", "1", "yes", "y")
    maybe_ms = ".%(msecs)03d" if log_ms else ""
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format=f"[%(asctime)s{maybe_ms}{prefix}] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def exact_argv() -> list[str]:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [w.decode() for w in f.read().split(b"\0")[:-1]]
    except OSError:
        return [sys.executable, *sys.argv]


def read_config(path: str) -> dict[str, str]:
    """The flat `key: value` subset of YAML that SGLang's --config takes (values may be JSON)."""
    if not path.endswith((".yaml", ".yml")):
        raise SystemExit(f"Config file must be YAML format, got: {path}")
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            value = value.strip()
            out[key.strip()] = json.loads(value) if value.startswith('"') else value
    return out


# --------------------------------------------------------------------------------------------------
# Multi-node: the rendezvous (STAND-IN for torch.distributed's TCPStore as SGLang uses it)
# --------------------------------------------------------------------------------------------------

# torch's default for init_process_group when SGLang's --dist-timeout is unset (30 min).
DEFAULT_DIST_TIMEOUT_S = 1800


def _die_with_peers(peers: list[socket.socket], what: str) -> None:
    """Exit the whole process when any peer's connection ends (an NCCL error ends every rank)."""

    def watch(sock: socket.socket) -> None:
        try:
            while sock.recv(64):
                pass
        except OSError:
            pass
        print(f"standin: {what}: a peer's connection ended (as an NCCL error would end this "
              "rank); exiting", flush=True)
        os._exit(1)

    for sock in peers:
        threading.Thread(target=watch, args=(sock,), daemon=True).start()


def rendezvous(nnodes: int, rank: int, addr: str, timeout_s: float) -> None:
    host, _, port_text = addr.rpartition(":")
    host, port = host.strip("[]"), int(port_text)
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        server = socket.create_server(("", port), reuse_port=False)
        print(f"standin: rank 0 of {nnodes}: rendezvous listening on port {port}", flush=True)
        joined: dict[int, socket.socket] = {}
        while len(joined) < nnodes - 1:
            server.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                conn, peer = server.accept()
            except TimeoutError:
                print("torch.distributed.DistStoreError: Timed out after "
                      f"{int(timeout_s)} seconds waiting for clients. {len(joined) + 1}/{nnodes} "
                      f"clients joined. (missing node ranks: "
                      f"{sorted(set(range(1, nnodes)) - set(joined))})", flush=True)
                raise SystemExit(1) from None
            conn.settimeout(10)
            try:
                line = conn.makefile().readline().split()
            except OSError:
                conn.close()
                continue
            if len(line) == 2 and line[0] == "rank" and line[1].isdigit():
                joined[int(line[1])] = conn
                print(f"standin: node rank {line[1]} joined from {peer[0]}", flush=True)
            else:
                conn.close()
        for conn in joined.values():
            conn.settimeout(None)
            conn.sendall(b"go\n")
        print(f"standin: all {nnodes} node ranks joined", flush=True)
        _die_with_peers(list(joined.values()), "rank 0")
        return
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=2)
            break
        except OSError:
            if time.monotonic() >= deadline:
                print("torch.distributed.DistNetworkError: The client socket has timed out after "
                      f"{int(timeout_s)}s while trying to connect to ({host}, {port}).",
                      flush=True)
                raise SystemExit(1) from None
            time.sleep(0.5)
    conn.sendall(f"rank {rank}\n".encode())
    conn.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        go = conn.makefile().readline().strip()
    except OSError:
        go = ""
    if go != "go":
        print(f"torch.distributed.DistStoreError: rank {rank}: rank 0 at {addr} did not start "
              f"the group within {int(timeout_s)} seconds", flush=True)
        raise SystemExit(1)
    conn.settimeout(None)
    print(f"standin: node rank {rank} joined rank 0 at {addr}", flush=True)
    _die_with_peers([conn], f"rank {rank}")


def standin_perf(seed: int | None, served: str):
    """The performance model (standin_perf.py, uploaded beside this file) with this process's
    exact argv: its speculative flags decide the speed and acceptance length it reports."""
    return perf_module.Perf(exact_argv(), seed, served) if perf_module else None


class DayTwo:
    """STAND-IN for what the watchdog and Prometheus see of a real server: /metrics (SGLang's
    names and labels, from srt/observability/metrics_collector.py of 0.5.11 and 0.5.23: gauges
    and counters labelled ``model_name``; prometheus_client writes a Counter named ``x_total`` as
    ``x_total``) and /health_generate under the hang and busy knobs. ``sglang:`` names used here
    are checked against the wheels by tests/unit/test_monitoring.py."""

    def __init__(self, args: argparse.Namespace, model_name: str):
        self.args = args
        self.model = model_name
        self.lock = threading.Lock()
        self.generated = 0.0
        self.prompt = 0.0
        self.requests = 0.0
        threading.Thread(target=self._busy_loop, daemon=True).start()

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--standin-hang-file")
        p.add_argument("--standin-busy-file")
        p.add_argument("--enable-metrics", action="store_true")

    def hung(self) -> bool:
        path = self.args.standin_hang_file
        try:
            with open(path) as f:
                return f.read().strip() == str(os.getpid())
        except (OSError, TypeError):
            return False

    def busy(self) -> bool:
        return bool(self.args.standin_busy_file) and os.path.exists(self.args.standin_busy_file)

    def _busy_loop(self) -> None:
        while True:
            time.sleep(0.5)
            if self.busy() and not self.hung():
                with self.lock:
                    self.generated += 37
                    self.prompt += 120
                    self.requests += 1

    def health_generate(self) -> int:
        """As SGLang's /health_generate: a one-token generate, 200 once anything came back, else
        503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s by default)."""
        if self.hung() or self.busy():
            time.sleep(float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")))
            return 503
        with self.lock:
            self.generated += 1
            self.prompt += 1
        return 200

    def metrics(self, perf=None) -> str | None:
        """The /metrics text; with the performance model (standin_perf.py), its throughput and
        acceptance length gauges stand for the fixed ones here."""
        if not self.args.enable_metrics:
            return None
        label = f'{{model_name="{self.model}"}}'
        busy = self.busy()
        with self.lock:
            gen, prompt, reqs = self.generated, self.prompt, self.requests
        rows = [
            ("sglang:num_running_reqs", "gauge", 8.0 if busy else 0.0),
            ("sglang:num_queue_reqs", "gauge", 3.0 if busy else 0.0),
            ("sglang:gen_throughput", "gauge", 74.0 if busy else 0.0),
            ("sglang:spec_accept_length", "gauge", 3.4 if busy else 0.0),
            ("sglang:prompt_tokens_total", "counter", prompt),
            ("sglang:generation_tokens_total", "counter", gen),
            ("sglang:num_requests_total", "counter", reqs),
        ]
        if perf is not None:
            rows = [r for r in rows
                    if r[0] not in ("sglang:gen_throughput", "sglang:spec_accept_length")]
        out = []
        # prometheus_client's text format (0.0.4): a Counter's HELP and TYPE carry the _total name.
        for name, kind, value in rows:
            out += [f"# HELP {name} {name}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        return "\n".join(out) + "\n" + (perf.metrics_text() if perf is not None else "")


def sglang_verdict(argv: list) -> tuple[str | None, dict]:
    """(SGLang's own message for these flags on the installed tree, or None; what was judged):
    the second is {"tree", "ran", "refusal", "why_not"}, written to --standin-record, so a test
    that expects a verdict can tell "the rules ran and it starts" from "no rules ran"."""
    import importlib.util

    judged = {"tree": None, "ran": False, "refusal": None, "why_not": None}
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    tree = list(spec.submodule_search_locations or [None])[0] if spec else None
    judged["tree"] = tree
    if tree is None:
        judged["why_not"] = f"no sglang package importable by {sys.executable}"
        return None, judged
    try:
        import sglang_rules
    except ImportError:
        judged["why_not"] = "sglang_rules.py is not beside the stand-in"
        return None, judged
    machine = sglang_rules.machine_from_nvidia_smi()
    if machine is None:
        judged["why_not"] = "nvidia-smi reported no GPUs"
        return None, judged
    flags, args = [], iter(argv)
    for arg in args:  # the flags SGLang would get: this stand-in's own --standin-* X go
        if arg.startswith("--standin-"):
            if "=" not in arg:
                next(args, None)
            continue
        flags.append(arg)
    try:
        refusal = sglang_rules.tree_refusal(tree, flags, machine)
    except sglang_rules.RulesNotRun as exc:
        print(f"standin: {exc}", file=sys.stderr, flush=True)
        judged["why_not"] = str(exc)
        return None, judged
    judged.update(ran=True, refusal=refusal)
    return refusal, judged


def write_record(path: str, record: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# Answers: what the readiness gate's correctness probe sees (SGLang's /generate and
# /v1/chat/completions), right on a healthy tree, wrong where the verify mask would be stale
# --------------------------------------------------------------------------------------------------

# The stand-in's own answers, keyed by the question (lower case, spaces collapsed). Never the
# gate's expected answers: those are regexes in specfleet's settings, this is what "the model" says.
STANDIN_ANSWERS = {
    "what is 17 + 25? answer with the number only.": "42",
    "what is 12 * 12? answer with the number only.": "144",
    "what is 100 - 37? answer with the number only.": "63",
    "what is 9 * 8? answer with the number only.": "72",
    "what is the capital of france? answer with one word.": "Paris",
    "what is the chemical symbol for gold? answer with the symbol only.": "Au",
    "how many days are in a week? answer with the number only.": "7",
    "what is the largest planet in the solar system? answer with one word.": "Jupiter",
    # Beyond the gate's defaults: a user's own probe file in the tests asks these.
    "what is 6 * 7? answer with the number only.": "42",
    "what colour is the sky on a clear day? answer with one word.": "Blue",
    "what is the capital of japan? answer with one word.": "Tokyo",
}
# What a verify step with a stale mask emits: the drafter's own guesses, every one "accepted".
STALE_TOKENS = ("the", "the", "of", "1", "1", "and", ",", "the")
V2_SWITCHES = ("SGLANG_ENABLE_SPEC_V2", "SGLANG_ENABLE_DFLASH_SPEC_V2")


def _module_source(tree: str, relpath: str):
    """The source of ``sglang/<relpath>`` in the installed tree, parsed, or None."""
    import ast

    try:
        with open(os.path.join(tree, relpath), encoding="utf-8") as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _assigned_strings(module, name: str):
    """The string constants of ``name = frozenset({...})`` (or a set/tuple/list) in a module."""
    import ast

    for node in getattr(module, "body", []):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return {n.value for n in ast.walk(node.value)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return None


def _env_bool_defaults(module) -> dict:
    """``NAME = EnvBool(DEFAULT)`` of SGLang's srt/environ.py ``Envs`` class."""
    import ast

    out = {}
    for node in ast.walk(module) if module is not None else ():
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "EnvBool" and node.value.args
                and isinstance(node.value.args[0], ast.Constant)):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = bool(node.value.args[0].value)
    return out


def _env_bool(name: str, default: bool, environ) -> bool:
    """SGLang's EnvBool.parse: true/1/yes/y, false/0/no/n; unset: the default."""
    value = environ.get(name)
    if value is None:
        return default
    return value.lower() in ("true", "1", "yes", "y")


def _backend_classes(registry, name: str) -> set:
    """The classes SGLang's attention registry's function for ``name`` returns (by name)."""
    import ast

    for node in getattr(registry, "body", []):
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if (isinstance(deco, ast.Call) and getattr(deco.func, "id", None)
                    == "register_attention_backend" and deco.args
                    and isinstance(deco.args[0], ast.Constant) and deco.args[0].value == name):
                return {r.value.func.id for r in ast.walk(node) if isinstance(r, ast.Return)
                        and isinstance(r.value, ast.Call) and isinstance(r.value.func, ast.Name)}
    return set()


def installed_sglang_tree():
    """The folder of the ``sglang`` package this interpreter would import (not imported: the
    real server runs from its venv's interpreter, and so does the stand-in in a venv)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else None


def stale_verify_mask(argv: list, environ, tree) -> str | None:
    """Why the target's verify would read a stale custom mask on this tree, or None.

    As SGLang 0.5.11 with PR#20547's v2 worker (sgl-project/sglang#20547; specfleet issue 29):
    the CUDA-graph runner captures the verify graph in custom-mask mode for every attention
    backend class outside ``_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS`` (srt/speculative/
    dflash_utils.py), and the v2 worker verifies with ``custom_mask=None``, so a replay reads
    the buffer captured at start. Everything is read from the installed files and the process's
    flags and environment: the v2 worker, the switches and their defaults (srt/environ.py), the
    backend's class (srt/layers/attention/attention_registry.py), the skip set, and whether
    CUDA graphs run (``--disable-cuda-graph``)."""
    if tree is None:
        return None
    if _argv_value(argv, "--speculative-algorithm") != "DFLASH" or "--disable-cuda-graph" in argv:
        return None
    if not os.path.exists(os.path.join(tree, "srt/speculative/dflash_worker_v2.py")):
        return None
    defaults = _env_bool_defaults(_module_source(tree, "srt/environ.py"))
    if not all(_env_bool(n, defaults.get(n, False), environ) for n in V2_SWITCHES):
        return None
    skip = _assigned_strings(_module_source(tree, "srt/speculative/dflash_utils.py"),
                             "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS")
    classes = _backend_classes(_module_source(tree, "srt/layers/attention/attention_registry.py"),
                               _argv_value(argv, "--attention-backend") or "")
    if skip is None or not classes or classes & skip:
        return None
    return (f"DFLASH v2 verify with CUDA graphs on {'/'.join(sorted(classes))}, which "
            "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS leaves out: the captured mask is stale")


def _argv_value(argv: list, name: str):
    value = None
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


def _question(body: dict) -> str:
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages") or []
                        if m.get("role") == "user")
    else:
        text = body.get("text", "")
        text = text[0] if isinstance(text, list) and text else str(text)
    return " ".join(str(text).lower().split())


def answer_tokens(body: dict, max_tokens: int, stale: bool) -> list:
    """The words "the model" writes: its answer then an end (healthy), or the drafter's guesses
    (stale mask); never more than ``max_tokens``."""
    if stale:
        return [STALE_TOKENS[i % len(STALE_TOKENS)] for i in range(max_tokens)]
    answer = STANDIN_ANSWERS.get(_question(body), "I do not know.")
    return answer.split()[:max_tokens]


def decode_answer(perf, words: list, max_tokens: int, block: int, stale: bool,
                  ignore_eos: bool) -> tuple:
    """Decode as a speculative server does: the first token from prefill, the rest in verify
    steps (each its accepted drafts plus one); returns (text, completion tokens, verify steps,
    accepted drafts). A stale mask accepts every draft of each block."""
    total = max_tokens if ignore_eos else len(words) + 1  # + the end-of-sequence token
    total = max(1, min(total, max_tokens))
    accept = float(block) if stale else (
        perf_module.accept_length(perf.point, perf.seed) if perf is not None else 3.0)
    rate = perf_module.single_tps(perf.point, perf.seed) if perf is not None else 160.0
    done, steps, carry, accepted = 1, 0, 0.0, 0  # prefill's token
    while done < total:
        carry += accept
        verified = max(1, int(carry))  # this step's accepted drafts + the bonus token
        step = min(verified, total - done)  # the request ends at max_tokens: the rest is cut
        carry -= verified
        time.sleep(step / max(rate, 1.0))
        done, steps, accepted = done + step, steps + 1, accepted + min(verified, block) - 1
    # The end-of-sequence token is counted, never written; past the answer (ignore_eos), filler.
    filler = words + ["tok"] * max(0, total - len(words)) if ignore_eos else words
    return " ".join(filler[:total]), total, steps, accepted


# meta_info's draft counts, (correct, proposed), as 0.5.11 names them; a tree's own are read from
# its srt/managers/tokenizer_manager.py (0.5.12 added spec_num_correct_drafts /
# spec_num_proposed_drafts beside these, 0.5.21 dropped these).
DRAFT_COUNT_NAMES_0_5_11 = (("spec_accepted_drafts", "spec_proposed_drafts"),)


def draft_count_names(tree) -> tuple:
    """The (correct, proposed) meta_info name pairs the tree's tokenizer manager writes, in the
    order it writes them: ``meta_info["spec_..._drafts"] = <correct> / <proposed>`` read from
    its ``_calculate_spec_decoding_metrics``; 0.5.11's names without a tree."""
    if tree is None:
        return DRAFT_COUNT_NAMES_0_5_11
    try:
        with open(os.path.join(tree, "srt/managers/tokenizer_manager.py"), encoding="utf-8") as f:
            source = f.read()
    except OSError:
        return DRAFT_COUNT_NAMES_0_5_11
    names = re.findall(r'meta_info\["(spec_\w+_drafts)"\]\s*=\s*(\w+)', source)
    correct = [n for n, _ in names if "proposed" not in n]
    proposed = [n for n, _ in names if "proposed" in n]
    pairs = tuple(zip(correct, proposed, strict=False))
    return pairs or DRAFT_COUNT_NAMES_0_5_11


def handle_answer_post(handler, path: str, argv: list, perf, served: str) -> bool:
    """SGLang's native ``/generate`` (0.5.11 srt/entrypoints/http_server.py; the per-request
    ``meta_info`` of srt/managers/tokenizer_manager.py ``_calculate_spec_decoding_metrics``) and a
    non-streaming ``/v1/chat/completions``; False for anything else (streams stay perf's)."""
    if path not in ("/generate", "/v1/chat/completions"):
        return False
    import io

    raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        handler._send(400, {"object": "error", "message": "invalid JSON body", "code": 400})
        return True
    if not hasattr(handler.server, "stale_reason"):
        handler.server.stale_reason = stale_verify_mask(argv, os.environ, installed_sglang_tree())
    stale = handler.server.stale_reason is not None
    chat = path.endswith("completions")
    if chat and (body.get("stream") or not (stale or _question(body) in STANDIN_ANSWERS)):
        handler.rfile = io.BytesIO(raw)  # perf's completions read the body again
        return False
    try:
        block = int(_argv_value(argv, "--speculative-num-draft-tokens") or 8)
    except ValueError:
        block = 8
    speculative = _argv_value(argv, "--speculative-algorithm") is not None
    params = body.get("sampling_params") or {}
    max_tokens = int(params.get("max_new_tokens") or body.get("max_tokens") or 16)
    words = answer_tokens(body, max_tokens, stale)
    text, completion, steps, accepted = decode_answer(
        perf, words, max_tokens, block, stale, bool(params.get("ignore_eos")))
    prompt_tokens = max(1, len(_question(body).split()))
    if path == "/generate":
        meta = {"id": os.urandom(8).hex(), "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "finish_reason": {"type": "length", "length": completion}}
        proposed = steps * (block - 1)
        if speculative and proposed > 0:
            meta.update(spec_accept_rate=accepted / proposed,
                        spec_accept_length=completion / steps, spec_verify_ct=steps)
            if not hasattr(handler.server, "draft_count_names"):
                handler.server.draft_count_names = draft_count_names(installed_sglang_tree())
            for correct, total in handler.server.draft_count_names:
                meta.update({correct: accepted, total: proposed})
        handler._send(200, {"text": text, "output_ids": list(range(completion)),
                            "meta_info": meta})
        return True
    handler._send(200, {
        "id": os.urandom(8).hex(), "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model") or served,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                             "reasoning_content": None, "tool_calls": None},
                     "finish_reason": "length" if completion >= max_tokens else "stop",
                     "matched_stop": None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                  "total_tokens": prompt_tokens + completion},
    })
    return True


def main() -> int:
    p = argparse.ArgumentParser(prog="standin_sglang_server")
    p.add_argument("--standin-record")
    p.add_argument("--standin-load-s", type=float, default=0.0)
    p.add_argument("--standin-exit", type=int)
    p.add_argument("--standin-perf-seed", type=int)
    p.add_argument("--standin-exit-after-s", type=float)
    # Exit 1 at start when this environment variable is "1": a server that crashes with the
    # DFlash v2 worker on this host (what a real failing port would look like to the gate).
    p.add_argument("--standin-fail-if-env")
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key")
    p.add_argument("--config")
    p.add_argument("--served-model-name")
    p.add_argument("--log-level", default="info")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr")
    p.add_argument("--dist-timeout", type=int)
    DayTwo.add_arguments(p)
    args, _rest = p.parse_known_args()

    api_key = args.api_key
    if args.config:
        conf = read_config(args.config)
        api_key = conf.get("api-key", conf.get("api_key", api_key))

    if args.standin_record:
        record = {
            "argv": exact_argv(),
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "pid": os.getpid(),
            "api_key_sha_prefix": None,
        }
        if api_key:
            import hashlib

            record["api_key_sha_prefix"] = hashlib.sha256(api_key.encode()).hexdigest()[:12]
        write_record(args.standin_record, record)

    # As SGLang does at start (srt/entrypoints/engine.py, _launch_subprocesses: configure_logger,
    # then `logger.info(f"{server_args=}")`, the dataclass repr), API key included.
    configure_logger(args.log_level)
    logger.info(
        f"server_args=ServerArgs(model_path={args.model_path!r}, host={args.host!r}, "
        f"port={args.port}, api_key={api_key!r}, admin_api_key=None)"
    )

    refusal, judged = sglang_verdict(sys.argv[1:])
    if args.standin_record:
        # Written again once judged: the record exists from the start, as before the check.
        write_record(args.standin_record, {**record, "sglang_rules": judged})
    if refusal:
        print(refusal, file=sys.stderr, flush=True)
        return 2 if ": error: " in refusal else 1

    if args.standin_exit is not None and args.standin_exit_after_s:
        import threading

        def crash() -> None:
            time.sleep(args.standin_exit_after_s)
            print(f"standin: exiting with status {args.standin_exit} while loading, as asked",
                  flush=True)
            os._exit(args.standin_exit)

        threading.Thread(target=crash, daemon=True).start()
        args.standin_load_s = max(args.standin_load_s, args.standin_exit_after_s + 3600)
    elif args.standin_exit is not None:
        print(f"standin: exiting with status {args.standin_exit} as asked", flush=True)
        return args.standin_exit
    if args.standin_fail_if_env and os.environ.get(args.standin_fail_if_env) == "1":
        print(f"standin: {args.standin_fail_if_env}=1: crashing at start as asked", flush=True)
        return 1

    if args.nnodes > 1:
        if not args.dist_init_addr:
            # SGLang's NetworkAddress.parse(None) fails the same way: multi-node needs the address.
            print("standin: --nnodes > 1 needs --dist-init-addr", flush=True)
            return 1
        rendezvous(args.nnodes, args.node_rank, args.dist_init_addr,
                   args.dist_timeout or DEFAULT_DIST_TIMEOUT_S)
    dummy_health = args.nnodes > 1 and args.node_rank >= 1

    started = time.monotonic()
    served = args.served_model_name or args.model_path
    perf = standin_perf(args.standin_perf_seed, served)
    day_two = DayTwo(args, served)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: object | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send_text(self, code: int, text: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            loading = time.monotonic() - started < args.standin_load_s
            if dummy_health:
                # launch_dummy_health_check_server: health only, 200 whatever the state.
                return self._send(200 if path in ("/health", "/health_generate") else 404)
            # As SGLang's auth middleware: /health* is always open, the rest needs the key.
            if path.startswith("/health"):
                if path == "/health_generate" and not loading:
                    return self._send(day_two.health_generate())
                return self._send(503 if loading else 200)
            # As SGLang's auth middleware: /metrics is open too.
            if path == "/metrics" and day_two.metrics(perf) is not None:
                return self._send_text(200, day_two.metrics(perf))
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                return self._send(401, {"error": "Unauthorized"})
            if path in ("/get_model_info", "/model_info"):
                return self._send(
                    200,
                    {
                        "model_path": args.model_path,
                        "tokenizer_path": args.model_path,
                        "is_generation": True,
                        "weight_version": "default",
                    },
                )
            if path == "/v1/models":
                return self._send(
                    200,
                    {"object": "list", "data": [{"id": served, "object": "model",
                                                 "owned_by": "sglang", "root": served}]},
                )
            if path in ("/get_server_info", "/server_info"):
                return self._send(200, {"version": "standin", "model_path": args.model_path,
                                        **(perf.server_info() if perf else {})})
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if dummy_health:
                return self._send(404, {"detail": "Not Found"})
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                return self._send(401, {"error": "Unauthorized"})
            if time.monotonic() - started < args.standin_load_s:
                return self._send(503, {"detail": "the server is loading"})
            if handle_answer_post(self, path, exact_argv(), perf, served):
                return None
            if perf is None or not perf_module.handle_post(self, path, perf):
                self._send(404, {"detail": "Not Found"})

        def log_message(self, fmt: str, *a: object) -> None:
            print(f"standin: {self.address_string()} {fmt % a}", flush=True)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"standin: serving {args.model_path} on {args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
