"""The API key goes only to the unit's own process (issue 55, finding 2): the readiness gate, the
status fact and the benchmark client check who listens on the server's port before they send
anything. A real listener here (a thread of this test, a process outside any specfleet unit) is
the squatter; it records every request it gets. The one stand-in is where a unit's cgroup is
needed: ``in_unit`` is replaced by "this pid" in the gate's copy of the checker."""

from __future__ import annotations

import http.server
import importlib.util
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from facts.status import Health
from operations.readiness import gate_source
from specfleet.core.resources import hostside_path

KEY = "sk-squatted-0123456789"
UNIT = "specfleet-sglang.service"


def _load(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gate = _load("readiness_gate_port_owner", hostside_path("readiness_gate.py"))
owner = _load("port_owner_under_test", hostside_path("port_owner.py"))
bench = _load("bench_client_port_owner", hostside_path("bench_client.py"))


@contextmanager
def squatter() -> Iterator[tuple[int, list[str]]]:
    """An HTTP listener on a free loopback port that answers 200 and records each request's path
    and Authorization header."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(f"{self.path} {self.headers.get('Authorization')}")
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"model_path": "/srv/models/m", "data": [{"id": "m"}]}')

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.local
def test_key_guard_names_who_listens():
    assert owner.key_guard(_free_port(), UNIT) == ("none", None)
    with squatter() as (port, _):
        state, problem = owner.key_guard(port, UNIT)
        assert state is None
        assert f"port {port} is held by " in problem and f"(pid {os.getpid()}, uid " in problem
        assert f"outside {UNIT}: the API key was not sent" in problem
        assert owner.listener_pids(port) == {os.getpid()}
    # As a program (the status fact runs it): exit 4 and the words; 3 when nothing listens.
    with squatter() as (port, _):
        res = subprocess.run(["python3", "-I", str(hostside_path("port_owner.py")), str(port),
                              UNIT], capture_output=True, text=True, timeout=30)
        assert res.returncode == 4 and f"port {port} is held by" in res.stdout
    res = subprocess.run(["python3", "-I", str(hostside_path("port_owner.py")),
                          str(_free_port()), UNIT], capture_output=True, text=True, timeout=30)
    assert (res.returncode, res.stdout.strip()) == (3, "none")


def test_the_gate_sends_nothing_to_a_squatter():
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "/srv/models/m"]
    with squatter() as (port, seen):
        status, served, problem = gate.check_server(f"http://127.0.0.1:{port}", KEY, argv, port,
                                                    UNIT, None)
        assert (status, served) == (None, None)
        assert f"port {port} is held by" in problem and "the API key was not sent" in problem
        assert seen == []  # before: /health_generate with the key, then the refusal
    # Nothing listens yet: still loading, nothing sent.
    port = _free_port()
    assert gate.check_server(f"http://127.0.0.1:{port}", KEY, argv, port, UNIT, None) == (
        f"nothing listens on port {port} yet", None, None)


def test_the_gate_asks_its_own_unit(monkeypatch):
    """The unit's own process listening (the stand-in: in_unit is "this pid"): the gate asks,
    with the key."""
    monkeypatch.setitem(gate._port_owner, "in_unit", lambda pid, unit: pid == os.getpid())
    monkeypatch.setattr(gate, "in_unit", lambda pid, unit: pid == os.getpid())
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "/srv/models/m"]
    with squatter() as (port, seen):
        status, served, problem = gate.check_server(f"http://127.0.0.1:{port}", KEY, argv, port,
                                                    UNIT, None)
        assert problem is None and served == "/srv/models/m", (status, problem)
        assert seen[0] == f"/health_generate Bearer {KEY}"


def test_the_shipped_gate_carries_the_checker():
    """On a host the gate runs from stdin: the checker's source travels inside it."""
    source = gate_source()
    namespace: dict = {"__name__": "gate_from_stdin"}
    exec(compile(source, "<stdin>", "exec"), namespace)
    assert namespace["key_guard"](_free_port(), UNIT) == ("none", None)


@pytest.mark.local
def test_the_status_fact_sends_no_key_to_a_squatter(tmp_path):
    secret = tmp_path / "secret.yaml"
    secret.write_text(f'api-key: "{KEY}"\n')
    with squatter() as (port, seen):
        cmd = Health().command(host="127.0.0.1", port=port, secret_file=str(secret), unit=UNIT)
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
        value = Health().process(out.stdout.splitlines())
        assert value["health_code"] is None and f"port {port} is held by" in value["port_held"]
        assert seen == []
    # Nothing listens: nothing is asked, the server is down.
    cmd = Health().command(host="127.0.0.1", port=_free_port(), secret_file=str(secret),
                           unit=UNIT)
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert Health().process(out.stdout.splitlines()) == Health.default()


def test_the_bench_client_sends_no_key_to_a_squatter(tmp_path):
    secret = tmp_path / "secret.yaml"
    secret.write_text(f'api-key: "{KEY}"\n')
    with squatter() as (port, seen):
        rc = bench.main(["--url", f"http://127.0.0.1:{port}", "--api-key-file", str(secret),
                         "--unit", UNIT, "--out", str(tmp_path / "r.json"), "--requests", "1",
                         "--concurrency", "1"])
        assert rc != 0 and seen == []
        assert "the API key was not sent" in (tmp_path / "r.json.failed").read_text()


def test_an_fd_closed_while_a_process_is_read_hides_none_of_its_sockets(tmp_path, monkeypatch):
    """A busy server closes files while its fds are read: the socket after a vanished fd is still
    found (before: the first fd gone dropped the whole process, so the unit's own server looked
    like a stranger and was refused the key)."""
    fd_dir = tmp_path / "4242" / "fd"
    fd_dir.mkdir(parents=True)
    (fd_dir / "4").symlink_to("socket:[777]")
    listings = {str(tmp_path): ["4242", "self"], str(fd_dir): ["3", "4"]}  # "3": closed meanwhile
    monkeypatch.setattr(owner.os, "listdir", lambda path: listings[str(path)])
    assert owner.socket_owners({"777"}, proc=str(tmp_path)) == {"777": {4242}}
