"""A STAND-IN for the Hugging Face Hub, for tests only.

It serves small git repositories (``<root>/models/<org>/<name>``) over the Hub's HTTP API, for
what the real mirror used in the tests (olah, offline) cannot do: LFS sha256 metadata, gated
repositories (401/403 with ``X-Error-Code: GatedRepo``), the Hub's real error codes
(RepoNotFound, RevisionNotFound, EntryNotFound), and Range requests. It also has knobs for
failure tests: a per-connection rate limit and a stall (send part of a file, then hang).

Config (a JSON file, re-read on every request so a test can change it while it runs):

    {"lfs": ["*.safetensors"],               # files served as LFS (sha256 + X-Linked-Etag)
     "gated": {"org/name": ["<sha256 of an allowed token>"]},
     "rate_bps": 0,                          # 0 = unlimited
     "stall": ["shard-2.safetensors"],       # hang after half of these files...
     "stall_count": 1,                       # ...for this many GETs in all (then serve them)
     "truncate": ["shard-1.safetensors"],    # send half of these files, then close the connection
     "truncate_count": 1,                    # ...for this many GETs in all (then serve them)
     "corrupt": ["shard-1.safetensors"],     # serve these with one byte flipped (full length)
     "corrupt_count": 1,                     # ...for this many GETs in all (then serve them)
     "epoch": 3,                             # stalls, truncations, corruptions counted per epoch
     "aliases": {"org/name": {"../x.json": "config.json"}}}
                                             # a hostile listing: extra names (any string) listed
                                             # and served with the bytes of a real file

Usage: python -m tests.harness.standin_hub --root ROOT --host IP --port PORT --config CFG --log LOG
The log has one line per request (method, path, status, "auth" when a token was sent; never the
token itself) and, for every file GET, a line when its body ends:
``SENT <repo_id> <revision sha> <path> <bytes sent>/<bytes due> <client ip> <full|partial>``
(the drills in bench/drills count lost work from it).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

_stall_lock = threading.Lock()
_stalls_done: dict[str, int] = {}  # per knob and "epoch" of the config: a new config starts at 0
_tree_cache: dict[tuple[str, str], dict[str, tuple[str, int]]] = {}
_sha_cache: dict[tuple[str, str], str] = {}


def git(repo: str, *args: str) -> bytes:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, check=True).stdout


class Hub:
    def __init__(self, root: str, config_path: str | None, log_path: str | None):
        self.root = root
        self.config_path = config_path
        self.log_path = log_path
        self.log_lock = threading.Lock()

    def config(self) -> dict:
        if not self.config_path or not os.path.exists(self.config_path):
            return {}
        with open(self.config_path) as f:
            return json.load(f)

    def log(self, line: str) -> None:
        if self.log_path:
            with self.log_lock, open(self.log_path, "a") as f:
                f.write(line + "\n")

    def repo_dir(self, kind: str, repo_id: str) -> str | None:
        path = os.path.join(self.root, kind, repo_id)
        return path if os.path.isdir(path) else None

    def commit(self, repo: str, rev: str) -> str | None:
        try:
            out = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        except subprocess.CalledProcessError:
            return None
        return out.decode().strip() or None

    def tree(self, repo: str, sha: str) -> dict[str, tuple[str, int]]:
        # A commit's tree never changes: listed once, as the Hub serves it from its index.
        if (repo, sha) not in _tree_cache:
            _tree_cache[(repo, sha)] = self.ls_tree(repo, sha)
        return dict(_tree_cache[(repo, sha)])

    def ls_tree(self, repo: str, sha: str) -> dict[str, tuple[str, int]]:
        files = {}
        for rec in git(repo, "ls-tree", "-r", "-l", "-z", sha).split(b"\0"):
            if not rec:
                continue
            meta, path = rec.split(b"\t", 1)
            _mode, kind, oid, size = meta.split()
            if kind == b"blob":
                files[path.decode()] = (oid.decode(), int(size))
        return files

    def listing(self, repo_id: str, repo: str, sha: str) -> dict[str, tuple[str, int]]:
        """The tree, plus the config's ``aliases`` of ``repo_id`` (a crafted, hostile listing)."""
        files = self.tree(repo, sha)
        for alias, real in (self.config().get("aliases", {}).get(repo_id) or {}).items():
            if real in files:
                files[alias] = files[real]
        return files

    def sha256(self, repo: str, oid: str) -> str:
        key = (repo, oid)
        if key not in _sha_cache:
            _sha_cache[key] = hashlib.sha256(git(repo, "cat-file", "blob", oid)).hexdigest()
        return _sha_cache[key]

    def is_lfs(self, path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) for p in self.config().get("lfs", []))

    def entry_json(self, repo: str, path: str, oid: str, size: int) -> dict:
        e = {"type": "file", "oid": oid, "size": size, "path": path}
        if self.is_lfs(path):
            e["lfs"] = {"oid": self.sha256(repo, oid), "size": size, "pointerSize": 134}
        return e


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: Hub

    def log_message(self, fmt: str, *args) -> None:  # the access log goes to self.hub.log
        pass

    def reply(self, code: int, body: bytes = b"", headers: dict | None = None,
              ctype: str = "application/json") -> None:
        self.send_response(code)
        hdrs = {"Content-Type": ctype, "Content-Length": str(len(body)), **(headers or {})}
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.hub.log(f"{self.command} {self.path} {code}{' auth' if self.token() else ''}")

    def error(self, code: int, error_code: str, message: str) -> None:
        self.reply(code, json.dumps({"error": message}).encode(),
                   {"X-Error-Code": error_code, "X-Error-Message": message})

    def token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:] if auth.startswith("Bearer ") else None

    def gate(self, repo_id: str) -> bool:
        """True when access is allowed; otherwise the 401/403 was sent."""
        allowed = self.hub.config().get("gated", {}).get(repo_id)
        if allowed is None:
            return True
        tok = self.token()
        if not tok:
            self.error(401, "GatedRepo", f"Access to model {repo_id} is restricted. "
                       "You must have access to it and be authenticated to access it.")
            return False
        if hashlib.sha256(tok.encode()).hexdigest() not in allowed:
            self.error(403, "GatedRepo", f"Access to model {repo_id} is restricted and you "
                       "are not in the authorized list.")
            return False
        return True

    def locate(self, kind: str, repo_id: str, rev: str,
               files: bool = False) -> tuple[str, str] | None:
        repo = self.hub.repo_dir(kind, repo_id)
        if repo is None:
            # The Hub answers 401 for a repo that does not exist (or that you cannot see).
            self.error(401, "RepoNotFound", "Repository not found")
            return None
        # As on the Hub, a gated repo's metadata and listing are open; its files are not.
        if files and not self.gate(repo_id):
            return None
        sha = self.hub.commit(repo, rev)
        if sha is None:
            self.error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            return None
        return repo, sha

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        path = unquote(urlsplit(self.path).path)
        m = re.fullmatch(r"/api/(models|datasets)/(.+?)/paths-info/([^/]+)", path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode()
        if not m:
            return self.error(404, "NotFound", "not found")
        kind, repo_id, rev = m.groups()
        loc = self.locate(kind, repo_id, rev)
        if loc is None:
            return None
        repo, sha = loc
        if "json" in (self.headers.get("Content-Type") or ""):
            wanted = json.loads(raw or "{}").get("paths", [])
        else:
            wanted = parse_qs(raw).get("paths", [])
        files = self.hub.listing(repo_id, repo, sha)
        body = [self.hub.entry_json(repo, p, *files[p]) for p in wanted if p in files]
        return self.reply(200, json.dumps(body).encode())

    def do_GET(self) -> None:
        path = unquote(urlsplit(self.path).path)
        m = re.fullmatch(r"/api/(models|datasets)/(.+?)/auth-check", path)
        if m:
            # huggingface_hub's auth_check: 200 when the token may read the repo's files, the
            # gate's 401/403 GatedRepo when not, 401 RepoNotFound for an unknown repo.
            kind, repo_id = m.groups()
            if self.hub.repo_dir(kind, repo_id) is None:
                return self.error(401, "RepoNotFound", "Repository not found")
            if self.gate(repo_id):
                self.reply(200, b"{}")
            return None
        m = re.fullmatch(r"/api/(models|datasets)/(.+?)/(revision|tree)/([^/]+)(/.*)?", path)
        if m:
            kind, repo_id, what, rev, sub = m.groups()
            loc = self.locate(kind, repo_id, rev)
            if loc is None:
                return None
            repo, sha = loc
            files = self.hub.listing(repo_id, repo, sha)
            if what == "revision":
                body = {
                    "id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                    "gated": "manual" if repo_id in self.hub.config().get("gated", {}) else False,
                    "siblings": [{"rfilename": p} for p in files],
                }
            else:
                prefix = (sub or "").strip("/")
                prefix = prefix + "/" if prefix else ""
                body = [self.hub.entry_json(repo, p, o, s) for p, (o, s) in sorted(files.items())
                        if p.startswith(prefix)]
            return self.reply(200, json.dumps(body).encode())
        m = re.fullmatch(r"/(?:(datasets)/)?(.+?)/resolve/([^/]+)/(.+)", path)
        if m:
            kind, repo_id, rev, fpath = m.groups()
            loc = self.locate(kind or "models", repo_id, rev, files=True)
            if loc is None:
                return None
            repo, sha = loc
            entry = self.hub.listing(repo_id, repo, sha).get(fpath)
            if entry is None:
                return self.error(404, "EntryNotFound", f"{fpath} does not exist at {rev}")
            return self.send_file(repo, sha, fpath, *entry)
        return self.error(404, "NotFound", "not found")

    def send_file(self, repo: str, sha: str, fpath: str, oid: str, size: int) -> None:
        etag = self.hub.sha256(repo, oid) if self.hub.is_lfs(fpath) else oid
        headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if self.hub.is_lfs(fpath):
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(size)})
        start, end = 0, size - 1
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        code = 200
        if rng and self.command == "GET":
            start = int(rng.group(1))
            end = int(rng.group(2)) if rng.group(2) else size - 1
            if start >= size:
                return self.error(416, "RangeNotSatisfiable", "bad range")
            code = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        headers["Content-Length"] = str(end - start + 1)
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.hub.log(f"{self.command} {self.path} {code}{' auth' if self.token() else ''}")
        if self.command == "HEAD":
            return None
        cfg = self.hub.config()

        def fault(knob: str) -> bool:
            if not any(fnmatch.fnmatch(fpath, p) for p in cfg.get(knob, [])):
                return False
            key = f"{knob}:{cfg.get('epoch')}"
            with _stall_lock:
                if _stalls_done.get(key, 0) < int(cfg.get(f"{knob}_count", 1)):
                    _stalls_done[key] = _stalls_done.get(key, 0) + 1
                    return True
            return False

        half = (end - start + 1) // 2
        stall_at = half if fault("stall") else None
        cut_at = half if fault("truncate") else None
        rate = float(cfg.get("rate_bps") or 0)
        # Streamed from git as the Hub streams from its storage: the first bytes go out at once,
        # not after the whole blob is read.
        length = max(0, min(end + 1, size) - start)
        flip = length // 2 if length and fault("corrupt") else None
        if flip is not None:
            self.hub.log(f"CORRUPT {fpath} at {start + flip}")
        blob = subprocess.Popen(["git", "-C", repo, "cat-file", "blob", oid],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        sent, t0, chunk = 0, time.monotonic(), 64 * 1024
        repo_id = unquote(urlsplit(self.path).path).split("/resolve/", 1)[0].lstrip("/")

        def sent_line() -> None:
            done = "full" if start == 0 and sent == size else "partial"
            self.hub.log(f"SENT {repo_id} {sha} {fpath} {sent}/{length} "
                         f"{self.client_address[0]} {done}")

        try:
            skip = start
            while skip:
                skip -= len(blob.stdout.read(min(skip, 1 << 20)) or b"\0" * skip)
            while sent < length:
                if stall_at is not None and sent >= stall_at:
                    self.hub.log(f"STALL {fpath} at {sent}")
                    sent_line()
                    time.sleep(3600)
                    return None
                if cut_at is not None and sent >= cut_at:
                    self.hub.log(f"TRUNCATE {fpath} at {sent}")
                    sent_line()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return None
                piece = blob.stdout.read(min(chunk, length - sent))
                if not piece:
                    break
                if flip is not None and sent <= flip < sent + len(piece):
                    at = flip - sent
                    piece = piece[:at] + bytes([piece[at] ^ 0xFF]) + piece[at + 1:]
                self.wfile.write(piece)
                sent += len(piece)
                if rate:
                    ahead = sent / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            sent_line()
            return None
        finally:
            blob.stdout.close()
            blob.kill()
            blob.wait()
        sent_line()
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--config")
    ap.add_argument("--log")
    ap.add_argument("--port-file", help="write the bound port here once listening")
    a = ap.parse_args()
    Handler.hub = Hub(a.root, a.config, a.log)
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True
    if a.port_file:
        with open(a.port_file + ".tmp", "w") as f:
            f.write(str(server.server_address[1]))
        os.replace(a.port_file + ".tmp", a.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
