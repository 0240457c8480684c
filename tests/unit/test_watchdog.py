"""specfleet/hostside/watchdog.py: the pure decision of each tick, and its textfile."""

from __future__ import annotations

import subprocess

import pytest

from specfleet.hostside import watchdog as w

CFG = {"failures": 3, "load_grace_s": 60.0, "backoff_s": 10.0, "backoff_max_s": 25.0,
       "max_restarts": 3, "window_s": 1000.0, "service_name": "sf"}  # fmt: skip


def obs(now, ok=False, tokens=5.0, invocation="a", active="active", lock=None):
    return {"now": now, "probe_ok": ok, "probe": "/health_generate: HTTP 503", "tokens": tokens,
            "invocation": invocation, "active": active, "lock": lock}  # fmt: skip


def run(observations, st=None):
    st = st or w.new_state()
    out = []
    for o in observations:
        action, reason, st = w.decide(st, o, CFG)
        out.append((action, reason))
    return out, st


def ready_state():
    _, st = run([obs(0, ok=True)])
    return st


def test_restarts_after_n_consecutive_failures_and_says_why():
    out, st = run([obs(1), obs(2), obs(3)], ready_state())
    assert [a for a, _ in out] == [w.WAIT, w.WAIT, w.RESTART]
    assert "3 failed generation probes in a row (/health_generate: HTTP 503)" in out[-1][1]
    assert "sglang:generation_tokens_total flat at 5" in out[-1][1]
    assert st["restarts_total"] == 1 and st["failures"] == 0


def test_a_passed_probe_resets_the_count():
    out, _ = run([obs(1), obs(2), obs(3, ok=True), obs(4), obs(5)], ready_state())
    assert w.RESTART not in [a for a, _ in out]


def test_a_loading_server_is_never_restarted_within_the_grace():
    # A new invocation: loading; its failed probes do not count until the grace is over.
    out, st = run([obs(t, invocation="b") for t in range(1, 50)], ready_state())
    assert {a for a, _ in out} == {w.WAIT}
    assert all("loading since its start" in r for _, r in out)
    out, _ = run([obs(t, invocation="b") for t in (62, 63, 64)], st)
    assert out[-1][0] == w.RESTART


def test_a_server_that_was_ready_is_not_loading():
    out, _ = run([obs(1), obs(2), obs(3)], ready_state())
    assert "loading" not in out[0][1]


def test_rising_tokens_mean_busy_not_stuck():
    out, _ = run([obs(t, tokens=10.0 * t) for t in range(1, 10)], ready_state())
    assert {a for a, _ in out} == {w.WAIT}
    assert "busy, not stuck: sglang:generation_tokens_total rose" in out[-1][1]


def test_the_run_lock_holds_every_restart_back():
    out, st = run([obs(t, lock="ops@laptop (pyinfra)") for t in range(1, 10)], ready_state())
    assert {a for a, _ in out} == {w.WAIT}
    assert "held by ops@laptop" in out[-1][1] and st["failures"] == 0


def test_a_server_that_is_not_running_is_left_to_systemd():
    out, st = run([obs(t, active="failed", invocation="") for t in range(1, 10)], ready_state())
    assert {a for a, _ in out} == {w.WAIT}
    assert "systemd's Restart=" in out[-1][1] and not st["loading"]


def test_back_off_doubles_up_to_its_max_and_the_cap_stops_restarts():
    st = ready_state()
    times = []
    for t in range(1, 200):
        action, reason, st = w.decide(st, obs(float(t), invocation=f"i{len(times)}"), CFG)
        if action == w.RESTART:
            times.append(t)
        # Each restart is a new invocation that loaded at once: make it ready again.
        if action == w.RESTART:
            _, _, st = w.decide(st, obs(t + 0.5, ok=True, invocation=f"i{len(times)}"), CFG)
    assert len(times) == 3  # max_restarts in window_s
    assert times[1] - times[0] >= 10 and times[2] - times[1] >= 20  # 10, then 20 (<= 25)
    assert st["capped"] and "not restarting: 3 restarts" in reason


@pytest.mark.local
def test_textfile_passes_promtool_check_metrics():
    st = dict(w.new_state(), restarts_total=2, failures=1)
    deployed = {"sglang_version": "0.5.11", "pr20547": "none", "target_revision": "a" * 40,
                "drafter_revision": "b" * 40, "plan_hash": "0123", "result": "ok",
                "weights_ok": {"target": True, "drafter": False}}  # fmt: skip
    text = w.textfile(CFG, st, True, 'ops "x"', deployed, 1700000000.0)
    res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'specfleet_watchdog_restarts_total{service="sf"} 2' in text
    assert 'specfleet_weights_manifest_ok{service="sf",model="drafter"} 0' in text
    assert 'holder="ops \\"x\\""' in text


@pytest.mark.parametrize(
    "text,value",
    [
        ('sglang:generation_tokens_total{model_name="m"} 12.0\n', 12.0),
        ('sglang:generation_tokens_total{a="1"} 2\nsglang:generation_tokens_total{a="2"} 3\n', 5.0),
        ("# HELP sglang:generation_tokens Number\nsglang:generation_tokens_created 1\n", None),
    ],
)
def test_metric_sum(text, value):
    assert w.metric_sum(text, w.TOKENS_METRIC) == value


def test_a_flood_of_half_open_connections_holds_no_more_than_the_cap(capsys):
    """The relay, for real on the loopback, before a stand-in server: 60 connections that send
    half a request hold at most the cap of threads, each for at most the connection timeout;
    a scrape after that is answered."""
    import http.server
    import socket
    import threading
    import time
    import urllib.request

    class Server(http.server.BaseHTTPRequestHandler):  # stand-in for SGLang's /metrics
        def do_GET(self):  # noqa: N802
            body = b"sglang:generation_tokens_total 7\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    upstream = http.server.HTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{upstream.server_address[1]}"
    before = threading.active_count()
    relay = w.serve_relay("127.0.0.1", 0, base, 2.0, max_connections=4, connection_timeout=1.0)
    port = relay.server_address[1]
    socks = []
    try:
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /metr")  # half a request, never finished
            socks.append(s)
        time.sleep(0.3)
        assert threading.active_count() - before <= 2 + 4  # serve_forever, the reaper, the cap
        time.sleep(1.5)  # the connection timeout has closed every half-open one
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.read() == b"sglang:generation_tokens_total 7\n"
    finally:
        for s in socks:
            s.close()
        relay.shutdown()
        upstream.shutdown()


def test_slow_clients_that_trickle_bytes_do_not_blind_the_relay():
    """Issue 55: 16 clients that each send a byte of their request every so often (never idle
    long enough for the socket's timeout) held every slot for good; the whole-connection
    deadline frees them, and a scrape after it is answered."""
    import http.server
    import socket
    import threading
    import time
    import urllib.request

    class Server(http.server.BaseHTTPRequestHandler):  # stand-in for SGLang's /metrics
        def do_GET(self):  # noqa: N802
            body = b"sglang:generation_tokens_total 7\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    upstream = http.server.HTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{upstream.server_address[1]}"
    relay = w.serve_relay("127.0.0.1", 0, base, 2.0, max_connections=4, connection_timeout=1.5)
    port = relay.server_address[1]
    stop = threading.Event()

    def trickle() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            try:
                for ch in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1000:
                    if stop.wait(0.5):
                        return
                    s.sendall(bytes([ch]))
            except OSError:
                return

    slow = [threading.Thread(target=trickle, daemon=True) for _ in range(4)]
    try:
        for t in slow:
            t.start()
        time.sleep(0.5)
        time.sleep(1.5 + 1.5)  # past the deadline, and the reaper's next look
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.read() == b"sglang:generation_tokens_total 7\n"
    finally:
        stop.set()
        relay.shutdown()
        upstream.shutdown()


def test_an_error_in_one_tick_is_logged_and_the_watchdog_goes_on(capsys):
    """A tick that raises (no fork at the unit's task limit) is one journal line; the state
    is kept and the next tick runs."""
    cfg = {"unit": "sf.service"}
    calls = []

    def tick(cfg, st, run_lock):
        calls.append(st)
        if len(calls) == 1:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return dict(st, ticked=True)

    st = w.safe_tick(cfg, {"failures": 2}, None, tick)
    assert st == {"failures": 2}
    assert "sf.service: this check failed (BlockingIOError" in capsys.readouterr().out
    assert w.safe_tick(cfg, st, None, tick) == {"failures": 2, "ticked": True}
