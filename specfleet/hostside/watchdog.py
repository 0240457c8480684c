"""specfleet's health watchdog for one SGLang server, run on the host as a systemd unit of its own.

    python3 -I -S watchdog.py CONFIG.json

systemd's ``Restart=`` sees only a dead process; SGLang's ``--watchdog-timeout`` only a stuck
scheduler. A server can stay alive while generating nothing (sgl-project/sglang #6624, #4191),
so every ``interval_s`` this asks the server for a token the way SGLang's own
``/health_generate`` does (it runs a one-token generate and answers 503 when nothing came back
within ``SGLANG_HEALTH_CHECK_TIMEOUT``, 20 s by default), on the loopback, and restarts the
server's unit after ``failures`` failed probes in a row, never:

- while the server is loading after a (re)start (no probe has passed since this start and the
  start is younger than ``load_grace_s``);
- while ``sglang:generation_tokens_total`` (its own ``/metrics``) still rises: a busy server can
  fail a health probe (#22511) and is not stuck;
- while a deploy or rollout holds the run lock (``<state_dir>/run.lock``, a lease read with
  ``run_lock.py``'s own rules: that file lies beside this one);
- more often than the back-off allows (``backoff_s``, doubling up to ``backoff_max_s``), nor more
  than ``max_restarts`` times within ``window_s`` (then it says so once and waits).

Each restart is one line in the journal (``restarting UNIT: REASON``) and counted in its state
file, which outlives the watchdog. Every tick it writes a node-exporter textfile (``textfile``)
with its counters, the server's readiness, the run lock's holder and what the deploy recorded
(``deploy_state``: versions, revisions, plan hash, weights check). With ``relay`` set it also
serves the server's ``/metrics`` (that path only, read-only, no auth) on ``relay.listen``
(127.0.0.1 unless the settings open it to a scraper), since the server itself listens on
127.0.0.1; each connection has ``RELAY_CONNECTION_TIMEOUT_S`` and there are at most
``RELAY_MAX_CONNECTIONS`` at once, so a flood cannot take the watchdog's threads.

Stdlib only; it imports nothing of specfleet. ``decide`` is pure: the unit tests drive it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKENS_METRIC = "sglang:generation_tokens_total"
# What decide() answers.
WAIT, PROBE_OK, RESTART = "wait", "ok", "restart"


def new_state() -> dict:
    """The watchdog's memory: kept in ``state_path`` across its own restarts."""
    return {"invocation": None, "started_at": None, "loading": True, "failures": 0,
            "tokens": None, "restarts": [], "restarts_total": 0, "last_reason": None,
            "next_restart_at": 0.0, "capped": False}  # fmt: skip


def decide(state: dict, obs: dict, cfg: dict) -> tuple[str, str, dict]:
    """One tick: ``(action, reason, new_state)``. Pure.

    ``obs``: ``now`` (s), ``invocation`` (the unit's InvocationID), ``active`` (its ActiveState),
    ``probe_ok`` (bool), ``probe`` (what the probe saw), ``tokens`` (the summed
    ``sglang:generation_tokens_total``, or None), ``lock`` (the run lock's holder, or None).
    """
    st = dict(state, restarts=list(state.get("restarts") or []))
    now = obs["now"]
    tokens, last_tokens = obs.get("tokens"), st.get("tokens")
    st["tokens"] = tokens
    rising = tokens is not None and last_tokens is not None and tokens > last_tokens
    if obs.get("invocation") != st.get("invocation"):
        # A (re)start, ours or anyone's: it loads first.
        st.update(invocation=obs.get("invocation"), started_at=now, loading=True, failures=0)
    if obs.get("lock"):
        st["failures"] = 0
        return WAIT, f"the run lock is held by {obs['lock']}: a deploy is in charge", st
    if obs.get("active") != "active":
        # Not running is not loading (the not-ready alert holds back only for a loading server).
        st.update(failures=0, loading=False)
        return WAIT, (f"the unit is {obs.get('active') or 'unknown'}: systemd's Restart= and the "
                      "deploy handle a server that is not running"), st  # fmt: skip
    if obs.get("probe_ok"):
        st.update(loading=False, failures=0, capped=False)
        return PROBE_OK, "generation probe passed", st
    if st.get("loading") and now - (st.get("started_at") or now) < cfg["load_grace_s"]:
        return WAIT, (f"loading since its start {now - st['started_at']:.0f} s ago "
                      f"(grace {cfg['load_grace_s']:g} s): {obs.get('probe')}"), st  # fmt: skip
    if rising:
        st["failures"] = 0
        return WAIT, (f"busy, not stuck: {TOKENS_METRIC} rose {last_tokens:g} -> {tokens:g} "
                      f"({obs.get('probe')})"), st  # fmt: skip
    st["failures"] = st.get("failures", 0) + 1
    flat = "unknown (no metrics)" if tokens is None else f"flat at {tokens:g}"
    why = (f"{st['failures']} failed generation probes in a row ({obs.get('probe')}); "
           f"{TOKENS_METRIC} {flat}")  # fmt: skip
    if st["failures"] < cfg["failures"]:
        return WAIT, f"{why}; restart at {cfg['failures']}", st
    recent = [t for t in st["restarts"] if now - t < cfg["window_s"]]
    st["restarts"] = recent
    if len(recent) >= cfg["max_restarts"]:
        st["capped"] = True
        return WAIT, (f"{why}; not restarting: {len(recent)} restarts in the last "
                      f"{cfg['window_s']:g} s (max_restarts {cfg['max_restarts']})"), st
    if now < st.get("next_restart_at", 0.0):
        return WAIT, f"{why}; backing off until {st['next_restart_at'] - now:.0f} s from now", st
    backoff = min(cfg["backoff_s"] * 2 ** len(recent), cfg["backoff_max_s"])
    st["restarts"] = recent + [now]
    st.update(failures=0, next_restart_at=now + backoff, last_reason=why,
              restarts_total=st.get("restarts_total", 0) + 1, last_restart_at=now)
    return RESTART, why, st


# --------------------------------------------------------------------------------------------------
# Reading the host
# --------------------------------------------------------------------------------------------------


def _sibling(name: str):
    """``run_lock.py``, shipped beside this file: one set of rules for the lock's lease."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"specfleet_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lock_holder(path: str, lease_s: float, run_lock) -> str | None:
    """Who holds the run lock (its owner and command), or None when it is free or expired."""
    held, _ = run_lock._read(path)
    if held is None or run_lock._expires(held, lease_s) <= time.time():
        return None
    owner = str(held.get("owner") or "unknown")
    command = str(held.get("command") or "").strip()
    return f"{owner} ({command})" if command else owner


def unit_state(service: str) -> tuple[str, str]:
    """``(ActiveState, InvocationID)`` of ``service``."""
    out = subprocess.run(
        ["systemctl", "show", service, "-p", "ActiveState", "-p", "InvocationID"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return props.get("ActiveState", ""), props.get("InvocationID", "")


def http_get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def probe(base: str, timeout: float) -> tuple[bool, str]:
    """SGLang's ``/health_generate``: 200 once a token came back."""
    try:
        code, _ = http_get(f"{base}/health_generate", timeout)
    except (OSError, ValueError) as exc:
        return False, f"/health_generate: {getattr(exc, 'reason', None) or exc}"
    return code == 200, f"/health_generate: HTTP {code}"


def metric_sum(text: str, name: str) -> float | None:
    """The sum of every series of ``name`` in a Prometheus exposition, or None without one."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except ValueError:
                continue
    return total if seen else None


def tokens(base: str, timeout: float) -> float | None:
    try:
        code, body = http_get(f"{base}/metrics", timeout)
    except (OSError, ValueError):
        return None
    return metric_sum(body.decode("utf-8", "replace"), TOKENS_METRIC) if code == 200 else None


# --------------------------------------------------------------------------------------------------
# Writing: the journal, the state file, the textfile
# --------------------------------------------------------------------------------------------------


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def read_json(path: str | None) -> dict:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def textfile(cfg: dict, st: dict, ready: bool, lock: str | None, deployed: dict,
             deployed_at: float | None) -> str:  # fmt: skip
    """specfleet's state of this host for node-exporter's textfile collector."""
    svc = f'service="{_label(cfg["service_name"])}"'
    lines = [
        "# HELP specfleet_watchdog_restarts_total Restarts of the server made by the watchdog.",
        "# TYPE specfleet_watchdog_restarts_total counter",
        f"specfleet_watchdog_restarts_total{{{svc}}} {st.get('restarts_total', 0)}",
        "# HELP specfleet_watchdog_consecutive_failures Failed generation probes in a row.",
        "# TYPE specfleet_watchdog_consecutive_failures gauge",
        f"specfleet_watchdog_consecutive_failures{{{svc}}} {st.get('failures', 0)}",
        "# HELP specfleet_watchdog_capped 1 while max_restarts stops further restarts.",
        "# TYPE specfleet_watchdog_capped gauge",
        f"specfleet_watchdog_capped{{{svc}}} {int(bool(st.get('capped')))}",
        "# HELP specfleet_server_ready 1 when the last generation probe passed.",
        "# TYPE specfleet_server_ready gauge",
        f"specfleet_server_ready{{{svc}}} {int(ready)}",
        "# HELP specfleet_server_loading 1 while the server loads after a (re)start.",
        "# TYPE specfleet_server_loading gauge",
        f"specfleet_server_loading{{{svc}}} {int(bool(st.get('loading')) and not ready)}",
        "# HELP specfleet_run_lock_held 1 while a deploy or rollout holds the run lock.",
        "# TYPE specfleet_run_lock_held gauge",
        f'specfleet_run_lock_held{{{svc},holder="{_label(lock or "")}"}} {int(bool(lock))}',
    ]
    if deployed:
        build = ",".join(f'{key}="{_label(deployed.get(key, ""))}"' for key in
                         ("sglang_version", "pr20547", "target_revision", "drafter_revision",
                          "plan_hash"))  # fmt: skip
        lines += [
            "# HELP specfleet_build_info What the last deploy set up (value 1).",
            "# TYPE specfleet_build_info gauge",
            f"specfleet_build_info{{{svc},{build}}} 1",
            "# HELP specfleet_last_deploy_timestamp_seconds When the last deploy wrote its state.",
            "# TYPE specfleet_last_deploy_timestamp_seconds gauge",
            f"specfleet_last_deploy_timestamp_seconds{{{svc}}} {deployed_at or 0:.0f}",
            "# HELP specfleet_last_deploy_success 1 when the last deploy passed its gate.",
            "# TYPE specfleet_last_deploy_success gauge",
            f"specfleet_last_deploy_success{{{svc}}} {int(deployed.get('result') == 'ok')}",
            "# HELP specfleet_weights_manifest_ok 1 when a model's files matched its manifest.",
            "# TYPE specfleet_weights_manifest_ok gauge",
        ]
        for model, ok in sorted((deployed.get("weights_ok") or {}).items()):
            lines.append(f'specfleet_weights_manifest_ok{{{svc},model="{_label(model)}"}} '
                         f"{int(bool(ok))}")  # fmt: skip
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# The relay: the server's /metrics, and nothing else, on the fleet interface
# --------------------------------------------------------------------------------------------------


# A scraper's request must be whole within this many seconds, and the answer taken: a
# connection that sends half a request (or reads nothing) holds a thread no longer than that.
RELAY_CONNECTION_TIMEOUT_S = 10.0
# The most connections the relay serves at once (one thread each); more are closed at once.
# A Prometheus or two scrape one at a time: a flood cannot hold the watchdog's task budget,
# which its own probes and ``systemctl`` need.
RELAY_MAX_CONNECTIONS = 16


class BoundedRelayServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with at most ``max_connections`` threads: a connection over the
    cap is closed unanswered (a scraper tries again at its next interval)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address, handler, max_connections: int = RELAY_MAX_CONNECTIONS,
                 deadline_s: float = RELAY_CONNECTION_TIMEOUT_S):
        self._slots = threading.BoundedSemaphore(max_connections)
        # Each connection's whole life is bounded (a client that trickles a byte now and then
        # never trips the socket's timeout): one reaper cuts those past ``deadline_s``.
        self.deadline_s = deadline_s
        self._open: dict = {}
        self._open_lock = threading.Lock()
        super().__init__(address, handler)
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        while True:
            time.sleep(min(1.0, self.deadline_s / 4))
            now = time.monotonic()
            with self._open_lock:
                late = [r for r, began in self._open.items() if now - began > self.deadline_s]
            for request in late:
                try:
                    request.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:  # noqa: BLE001 - no thread to be had: this connection only
            self._slots.release()
            self.shutdown_request(request)

    def process_request_thread(self, request, client_address) -> None:
        with self._open_lock:
            self._open[request] = time.monotonic()
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.pop(request, None)
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        pass  # a scraper that hung up or timed out is not news for the journal


def serve_relay(listen: str, port: int, base: str, timeout: float,
                max_connections: int = RELAY_MAX_CONNECTIONS,
                connection_timeout: float = RELAY_CONNECTION_TIMEOUT_S) -> ThreadingHTTPServer:
    class Relay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] != "/metrics":
                return self._send(404, b"only /metrics is relayed\n")
            try:
                code, body = http_get(f"{base}/metrics", timeout)
            except (OSError, ValueError) as exc:
                return self._send(502, f"the server did not answer: {exc}\n".encode())
            return self._send(200 if code == 200 else 502, body)

        def _send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: object) -> None:
            pass  # a scrape every few seconds is not news

    Relay.timeout = connection_timeout  # StreamRequestHandler: the socket's timeout
    server = BoundedRelayServer((listen, port), Relay, max_connections, connection_timeout)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------


def tick(cfg: dict, st: dict, run_lock) -> dict:
    base = cfg["server_url"]
    active, invocation = unit_state(cfg["unit"])
    lock = lock_holder(cfg["lock_path"], cfg["lock_lease_s"], run_lock)
    ok, seen, count = False, "not probed", None
    if active == "active" and not lock:
        count = tokens(base, cfg["probe_timeout_s"])
        ok, seen = probe(base, cfg["probe_timeout_s"])
        if not ok:
            # Read again after the probe's wait: tokens made meanwhile show a busy server.
            later = tokens(base, cfg["probe_timeout_s"])
            count = later if later is not None else count
    obs = {"now": time.monotonic(), "invocation": invocation, "active": active, "probe_ok": ok,
           "probe": seen, "tokens": count, "lock": lock}  # fmt: skip
    was_capped = st.get("capped")
    action, reason, st = decide(st, obs, cfg)
    if action == RESTART:
        say(f"restarting {cfg['unit']}: {reason} (restart {st['restarts_total']})")
        # The unit's StartLimitBurst guards against a crash loop; this restart is deliberate and
        # capped by max_restarts, so it must not be refused by the starts of a recent deploy.
        subprocess.run(["systemctl", "reset-failed", cfg["unit"]], capture_output=True,
                       check=False)  # fmt: skip
        res = subprocess.run(["systemctl", "restart", "--no-block", cfg["unit"]],
                             capture_output=True, text=True, check=False)  # fmt: skip
        if res.returncode != 0:
            say(f"systemctl restart {cfg['unit']} failed: {res.stderr.strip()}")
    elif action == WAIT and (seen != "not probed" or (st.get("capped") and not was_capped)):
        # A failed probe, and why it did not restart (loading, busy, counting, back-off, cap).
        say(f"{cfg['unit']}: {reason}")
    write_atomic(cfg["state_path"], json.dumps(_persisted(st), sort_keys=True) + "\n")
    if cfg.get("textfile"):
        deployed = read_json(cfg.get("deploy_state"))
        try:
            deployed_at = os.stat(cfg["deploy_state"]).st_mtime if deployed else None
        except OSError:
            deployed_at = None
        write_atomic(cfg["textfile"], textfile(cfg, st, ok, lock, deployed, deployed_at))
    return st


def _persisted(st: dict) -> dict:
    # Monotonic times mean nothing after a reboot; the counters and the last reason do.
    return {"restarts_total": st.get("restarts_total", 0), "last_reason": st.get("last_reason")}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    cfg = read_json(argv[1])
    if not cfg.get("unit"):
        sys.stderr.write(f"watchdog: {argv[1]} is missing or not a specfleet watchdog config\n")
        return 2
    run_lock = _sibling("run_lock")
    st = dict(new_state(), **{k: v for k, v in read_json(cfg["state_path"]).items()
                              if k in ("restarts_total", "last_reason")})  # fmt: skip
    relay = cfg.get("relay")
    if relay:
        where = f"{relay['listen']}:{relay['port']}"
        try:
            serve_relay(relay["listen"], relay["port"], cfg["server_url"], cfg["probe_timeout_s"])
            say(f"relaying {cfg['server_url']}/metrics on {where}/metrics")
        except OSError as exc:
            # The watchdog matters more than the relay: it goes on without it.
            say(f"cannot relay /metrics on {where}: {exc}; fix: set metrics.relay_port to a "
                "free port (each server on a host needs its own)")
    say(f"watching {cfg['unit']} at {cfg['server_url']} every {cfg['interval_s']:g} s "
        f"(restart after {cfg['failures']} failed probes)")  # fmt: skip
    while True:
        started = time.monotonic()
        st = safe_tick(cfg, st, run_lock)
        time.sleep(max(0.0, cfg["interval_s"] - (time.monotonic() - started)))


def safe_tick(cfg: dict, st: dict, run_lock, tick=tick) -> dict:
    """One tick; an error in it (no fork at the unit's task limit, a full disk for the state
    file) is one journal line, and the watchdog goes on with what it knew: a watchdog that
    dies stops restarting a stuck server."""
    try:
        return tick(cfg, st, run_lock)
    except Exception as exc:  # noqa: BLE001 - the next tick tries again
        say(f"{cfg['unit']}: this check failed ({type(exc).__name__}: {exc}); "
            "the watchdog goes on")
        return st


if __name__ == "__main__":
    sys.exit(main(sys.argv))
