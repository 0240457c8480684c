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
                          "cwd": ..., "pid": ...} to PATH (JSON) at start
  --standin-load-s N      answer 503 on /health_generate for N seconds ("loading the model")
  --standin-exit N        exit with status N right after recording (a server that crashes)
  --standin-hang-file P   alive but not generating while P holds this process's pid (a wedged
                          scheduler, sgl-project/sglang #6624): /health answers, /health_generate
                          waits SGLANG_HEALTH_CHECK_TIMEOUT and answers 503, no tokens are made
  --standin-busy-file P   while P exists: busy (tokens rise, /health_generate fails as under load,
                          #22511)

With SGLang's --enable-metrics it serves /metrics with SGLang's metric names (DayTwo below).
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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

    def metrics(self) -> str | None:
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
        out = []
        # prometheus_client's text format (0.0.4): a Counter's HELP and TYPE carry the _total name.
        for name, kind, value in rows:
            out += [f"# HELP {name} {name}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(prog="standin_sglang_server")
    p.add_argument("--standin-record")
    p.add_argument("--standin-load-s", type=float, default=0.0)
    p.add_argument("--standin-exit", type=int)
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
        tmp = args.standin_record + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, args.standin_record)

    # As SGLang does at start (srt/entrypoints/engine.py, _launch_subprocesses: configure_logger,
    # then `logger.info(f"{server_args=}")`, the dataclass repr), API key included.
    configure_logger(args.log_level)
    logger.info(
        f"server_args=ServerArgs(model_path={args.model_path!r}, host={args.host!r}, "
        f"port={args.port}, api_key={api_key!r}, admin_api_key=None)"
    )

    if args.standin_exit is not None:
        print(f"standin: exiting with status {args.standin_exit} as asked", flush=True)
        return args.standin_exit
    if args.standin_fail_if_env and os.environ.get(args.standin_fail_if_env) == "1":
        print(f"standin: {args.standin_fail_if_env}=1: crashing at start as asked", flush=True)
        return 1

    started = time.monotonic()
    served = args.served_model_name or args.model_path
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
            # As SGLang's auth middleware: /health* is always open, the rest needs the key.
            if path.startswith("/health"):
                if path == "/health_generate" and not loading:
                    return self._send(day_two.health_generate())
                return self._send(503 if loading else 200)
            # As SGLang's auth middleware: /metrics is open too.
            if path == "/metrics" and day_two.metrics() is not None:
                return self._send_text(200, day_two.metrics())
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
                return self._send(200, {"version": "standin", "model_path": args.model_path})
            return self._send(404, {"detail": "Not Found"})

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
