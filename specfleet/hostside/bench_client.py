#!/usr/bin/env python3
"""The smoke benchmark, run ON the host against its own SGLang server (stdlib only).

    python3 bench_client.py --url http://127.0.0.1:30000 --concurrency 1,4 --out FILE.json
        [--api-key-file /etc/specfleet/secrets/NAME.yaml --unit NAME.service] [--requests N]
        [--max-tokens M]
        [--prompt-words W] [--sglang-python VENV/bin/python --tokenizer MODEL_DIR] [--meta K=V ...]

A short, bounded load: at each concurrency, N streaming ``/v1/completions`` requests (OpenAI's
API, as SGLang serves it) from that many threads. Per level it measures output tokens/s (the
completion tokens of the level over its wall time), time to first token (request sent -> first
streamed text) and the requests' decode rate. The acceptance length is what the server reports
(OpenAI responses do not carry it): ``internal_states[0].avg_spec_accept_length`` of
``/server_info`` (as ``sglang.bench_serving`` reads it), else the ``sglang:spec_accept_length``
gauge on ``/metrics`` (served with ``--enable-metrics``).

With ``--sglang-python`` naming an interpreter that imports ``sglang.bench_serving`` and its
dependencies (transformers, numpy, aiohttp) and ``--tokenizer`` a model folder, each level runs
SGLang's own client instead (``--dataset-name random``); hosts without them (a ``--no-deps``
install) use this file's client.

The result is written atomically to ``--out``; an earlier result there is kept as
``previous.json`` beside it, and its figures are copied into the new result as ``previous``
(the rollout's speed gate compares the two), unless ``--no-previous``. Exit 0 with a result,
2 when the server cannot be benchmarked (the error is in the JSON, written beside as
``NAME.json.failed``, and on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

SCHEMA = 1


def read_api_key(path: str | None) -> str | None:
    """The key from SGLang's ``--config`` YAML that specfleet writes (``api-key: "..."``)."""
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        for line in f:
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("api-key", "api_key"):
                value = value.strip()
                return json.loads(value) if value.startswith('"') else value
    return None


def _request(url: str, key: str | None, body: dict | None = None, timeout: float = 30):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    return urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                  timeout=timeout)


def get_json(url: str, key: str | None) -> dict | None:
    try:
        with _request(url, key, timeout=10) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def served_model(base: str, key: str | None) -> str:
    models = get_json(f"{base}/v1/models", key) or {}
    data = models.get("data") or []
    return str(data[0].get("id")) if data else "default"


METRIC = re.compile(r"^sglang:spec_accept_length(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def accept_length(base: str, key: str | None) -> tuple[float | None, str | None]:
    """The server's acceptance length and where it came from."""
    for path in ("/server_info", "/get_server_info"):
        info = get_json(f"{base}{path}", key)
        if info is None:
            continue
        if "decode" in info and info["decode"]:  # disaggregated: the decode side decodes
            info = info["decode"][0]
        states = info.get("internal_states") or []
        if states and states[0].get("avg_spec_accept_length") is not None:
            return float(states[0]["avg_spec_accept_length"]), f"{path} internal_states"
        break
    try:
        with _request(f"{base}/metrics", key, timeout=10) as resp:
            m = METRIC.search(resp.read().decode("utf-8", "replace"))
            if m:
                return float(m.group(1)), "/metrics sglang:spec_accept_length"
    except OSError:
        pass
    return None, None


def one_request(base: str, key: str | None, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    with _request(f"{base}/v1/completions", key, body, timeout=300) as resp:
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            event = json.loads(payload)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter()
    end = time.perf_counter()
    tokens = int(usage["completion_tokens"]) if usage else chunks
    return {"ttft_s": (first or end) - sent, "seconds": end - sent, "tokens": tokens}


def run_level(base: str, key: str | None, model: str, concurrency: int, requests: int,
              max_tokens: int, prompt_words: int) -> dict:
    prompt = " ".join(["benchmark"] * prompt_words)
    results: list[dict] = []
    errors: list[str] = []
    todo = list(range(requests))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                todo.pop()
            try:
                r = one_request(base, key, model, prompt, max_tokens)
            except (OSError, ValueError, KeyError) as exc:
                with lock:
                    errors.append(str(exc))
                continue
            with lock:
                results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    level = {
        "concurrency": concurrency,
        "requests": requests,
        "completed": len(results),
        "errors": errors[:3],
        "output_tokens": tokens,
        "seconds": round(wall, 4),
        "output_tokens_per_s": round(tokens / wall, 3) if wall > 0 and results else 0.0,
        "mean_ttft_ms": round(1000 * statistics.mean(r["ttft_s"] for r in results), 2)
        if results else None,
        "per_request_tokens_per_s": round(statistics.mean(
            r["tokens"] / max(r["seconds"] - r["ttft_s"], 1e-6) for r in results), 3)
        if results else None,
    }
    return level


def sglang_bench_usable(python: str | None) -> bool:
    """Whether ``python`` can run ``sglang.bench_serving`` (it needs transformers, numpy,
    aiohttp and a tokenizer; a ``--no-deps`` install has none of them)."""
    if not python or not os.path.exists(python):
        return False
    probe = "import sglang.bench_serving, transformers, numpy, aiohttp"
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def run_level_sglang(python: str, base: str, key: str | None, tokenizer: str, concurrency: int,
                     requests: int, max_tokens: int, prompt_words: int) -> dict:
    """One level with SGLang's own client; its JSONL result read back."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.jsonl")
        argv = [python, "-m", "sglang.bench_serving", "--backend", "sglang-oai",
                "--base-url", base, "--dataset-name", "random", "--tokenizer", tokenizer,
                "--random-input-len", str(prompt_words), "--random-output-len", str(max_tokens),
                "--random-range-ratio", "1", "--num-prompts", str(requests),
                "--max-concurrency", str(concurrency), "--output-file", out]
        env = dict(os.environ)
        if key:
            env["OPENAI_API_KEY"] = key
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
        wall = time.perf_counter() - start
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"sglang.bench_serving failed: {proc.stderr.strip()[-300:]}")
        with open(out, encoding="utf-8") as f:
            row = json.loads(f.read().strip().splitlines()[-1])
    return {
        "concurrency": concurrency, "requests": requests, "completed": row.get("completed"),
        "errors": [], "output_tokens": row.get("total_output_tokens"),
        "seconds": round(row.get("duration", wall), 4),
        "output_tokens_per_s": round(float(row.get("output_throughput") or 0), 3),
        "mean_ttft_ms": row.get("mean_ttft_ms"),
        "per_request_tokens_per_s": round(1000 / row["mean_tpot_ms"], 3)
        if row.get("mean_tpot_ms") else None,
        "accept_length": row.get("accept_length"),
    }


def write_result(path: str, result: dict, keep_previous: bool = True) -> None:
    """Atomically; with ``keep_previous`` an earlier result becomes ``previous.json`` beside it."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if keep_previous and os.path.exists(path):
        os.replace(path, os.path.join(folder, "previous.json"))
    os.replace(tmp, path)


def previous_headline(path: str) -> dict | None:
    """The figures of the result at ``path`` (the one this run replaces), for the speed gate."""
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict) or old.get("error"):
        return None
    return {k: old.get(k) for k in ("started", "levels", "accept_length", "meta")}


def key_refusal(base: str, unit: str) -> str | None:
    """Why the API key must not go to ``base``: a process outside ``unit`` listens on its port
    (or nothing does); None when the unit's own process alone listens. The check is
    ``key_guard`` of port_owner.py, which ``operations.bench`` puts beside this file."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "port_owner.py")
    checker: dict = {"__name__": "port_owner"}
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), checker)
    port = urllib.parse.urlsplit(base).port or 80
    state, problem = checker["key_guard"](port, unit)
    if problem:
        return problem
    return f"nothing listens on port {port}" if state == "none" else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_client")
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--api-key-file")
    p.add_argument("--unit", help="the server's unit: the key goes only to its own process")
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--requests", type=int, default=0, help="per level; default 2x concurrency")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=128)
    p.add_argument("--sglang-python")
    p.add_argument("--tokenizer")
    p.add_argument("--meta", action="append", default=[], help="KEY=VALUE kept in the result")
    p.add_argument("--out", required=True)
    p.add_argument("--no-previous", action="store_true",
                   help="do not keep the result found at --out as previous.json")
    args = p.parse_args(argv)

    base = args.url.rstrip("/")
    key = read_api_key(args.api_key_file)
    levels_wanted = [int(c) for c in args.concurrency.split(",") if c.strip()]
    use_sglang = bool(args.tokenizer) and sglang_bench_usable(args.sglang_python)
    result: dict = {
        "schema": SCHEMA,
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "client": "sglang.bench_serving" if use_sglang else "specfleet stdlib",
        "max_tokens": args.max_tokens,
        "prompt_words": args.prompt_words,
        "meta": dict(m.split("=", 1) for m in args.meta if "=" in m),
        "levels": [],
    }
    try:
        refused = key_refusal(base, args.unit) if key and args.unit else None
        if refused:
            raise RuntimeError(refused)
        model = served_model(base, key)
        result["model"] = model
        for c in levels_wanted:
            n = args.requests or 2 * c
            if use_sglang:
                level = run_level_sglang(args.sglang_python, base, key, args.tokenizer, c, n,
                                         args.max_tokens, args.prompt_words)
            else:
                level = run_level(base, key, model, c, n, args.max_tokens, args.prompt_words)
            result["levels"].append(level)
            if level["completed"] == 0:
                raise RuntimeError(f"no request completed at concurrency {c}: "
                                   f"{'; '.join(level['errors']) or 'no answer'}")
        result["accept_length"], result["accept_length_source"] = accept_length(base, key)
    except (OSError, RuntimeError, ValueError) as exc:
        result["error"] = f"cannot benchmark {base}: {exc}"
        print(result["error"], file=sys.stderr)
        write_result(args.out + ".failed", result, keep_previous=False)
        return 2
    if not args.no_previous:
        result["previous"] = previous_headline(args.out)
    write_result(args.out, result, keep_previous=not args.no_previous)
    top = result["levels"][-1]
    print(f"bench: {top['output_tokens_per_s']:.1f} output tok/s at concurrency "
          f"{top['concurrency']}, TTFT {top['mean_ttft_ms']} ms, accept length "
          f"{result['accept_length']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
