"""The port's upstream fetch is bounded (issue 55, lower items): a source that sends more than its
cap is refused as not the pinned file, and one that trickles is cut at the fetch's deadline. A
real HTTP server on the loopback plays the hostile mirror."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from operations import sglang_sources as src


@contextmanager
def server(body: bytes, pause: float = 0.0, length: bool = True) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            if length:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(0, len(body), 1 << 16):
                self.wfile.write(body[i:i + (1 << 16)])
                self.wfile.flush()
                time.sleep(pause)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/sglang.whl"
    finally:
        httpd.shutdown()


def test_a_source_past_its_cap_is_refused():
    with server(b"x" * (3 << 20)) as url:
        with pytest.raises(src.UpstreamTooLarge, match="more than the 1048576 its source"):
            src._read_url(url, max_bytes=1 << 20)
        # No Content-Length: counted as it comes.
    with server(b"x" * (3 << 20), length=False) as url:
        with pytest.raises(src.UpstreamTooLarge, match="at least"):
            src._read_url(url, max_bytes=1 << 20)
    with server(b"pinned") as url:
        assert src._read_url(url, max_bytes=1 << 20) == b"pinned"


def test_a_trickling_source_is_cut_at_the_deadline():
    with server(b"y" * (1 << 20), pause=0.2) as url:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="not whole within 1 s"):
            src._read_url(url, max_bytes=8 << 20, deadline_s=1)
        assert time.monotonic() - began < 3


def test_a_mirror_folder_past_the_cap_is_refused(tmp_path):
    big = tmp_path / "big.whl"
    big.write_bytes(b"z" * (2 << 20))
    with pytest.raises(src.UpstreamTooLarge):
        src.UpstreamSources._try(str(big), [], 1 << 20)
