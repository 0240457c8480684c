"""specfleet weights agent: fetch one Hugging Face repository revision onto this host, verified.

This file is two things:
- a module the control machine imports for its pure helpers (``disk_preflight``, ``job_id``,
  ``git_blob_id``...): they need nothing but the standard library;
- a script uploaded to each host and run there by a Python that has ``huggingface_hub``
  (the specfleet tools venv). ``operations/weights.py`` starts it detached as a transient
  ``systemd-run`` unit, so a dropped SSH session does not stop a 595 GB download.

Commands (JOB is a JSON file written by ``operations.weights``; it never holds a secret, only
the *path* of a token file):

    agent.py plan JOB     print one JSON object: the resolved revision, the files, the bytes
                          still missing, the free space; or {"error": {...}} (exit 0 either way)
    agent.py run JOB      supervise a download: plan, disk preflight, start ``fetch`` children,
                          watch for stalls (retry without Xet), write the progress file, the
                          manifest, the ``current`` link, prune
    agent.py fetch JOB    (child of ``run``) hash or download every file still missing; print
                          one JSON event per line on stdout
    agent.py check DIR    re-hash a complete revision against its manifest (no Hub needed);
                          print {"checked": N, "bad": {path: why}}

On the host, revisions live side by side:

    <root>/<revision>/...files...                  the snapshot (hf ``local_dir``)
    <root>/<revision>/.specfleet/verified.jsonl    one line per file verified (resume state)
    <root>/<revision>/.specfleet/manifest.json     written once every file is verified
    <root>/current -> <revision>                   flipped only after a complete verification
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import unicodedata

SCHEMA = 1
GIB = 1024**3
STATE_DIR = ".specfleet"
MANIFEST = "manifest.json"
VERIFIED = "verified.jsonl"
CURRENT = "current"
HASH_CHUNK = 8 * 1024 * 1024

# Exit codes of `fetch`.
EXIT_OK = 0
EXIT_FAILED = 3


# ----------------------------------------------------------------------------------------------
# Pure helpers (imported by the control machine; no I/O)
# ----------------------------------------------------------------------------------------------


def fmt_gib(n: float) -> str:
    """Bytes for people: GiB from 1 GiB up, MiB below."""
    if abs(n) >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / 1024**2:.1f} MiB"


def free_bytes_at(path: str) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def disk_preflight(
    missing_bytes: int,
    free_bytes: int,
    *,
    margin_percent: float = 2.0,
    margin_min_gib: float = 10.0,
    warn_headroom_percent: float = 10.0,
    host: str = "",
    path: str = "",
) -> dict:
    """Whether ``missing_bytes`` fit into ``free_bytes`` with a margin of max(P %, M GiB).

    The margin is ``margin_percent`` of the bytes still missing, at least ``margin_min_gib``.
    Headroom is what is left after the download, as a share of the free space now; under
    ``warn_headroom_percent`` it is a warning, not an error. Pure: returns

    .. code:: python

        {"ok": True, "missing_bytes": ..., "free_bytes": ..., "margin_bytes": ...,
         "needed_bytes": ..., "headroom_bytes": ..., "headroom_percent": 5.4,
         "warnings": ["..."], "problem": None | "...", "fix": None | "..."}
    """
    missing = max(int(missing_bytes), 0)
    free = max(int(free_bytes), 0)
    margin = int(max(missing * margin_percent / 100.0, margin_min_gib * GIB)) if missing else 0
    needed = missing + margin
    headroom = free - missing
    headroom_percent = (100.0 * headroom / free) if free else 0.0
    where = f"{host}:{path}" if host else path
    result = {
        "ok": needed <= free,
        "missing_bytes": missing,
        "free_bytes": free,
        "margin_bytes": margin,
        "needed_bytes": needed,
        "headroom_bytes": headroom,
        "headroom_percent": round(headroom_percent, 2),
        "warnings": [],
        "problem": None,
        "fix": None,
    }
    if not missing:
        return result
    if not result["ok"]:
        result["problem"] = (
            f"not enough disk space at {where}: {fmt_gib(missing)} still to download "
            f"+ {fmt_gib(margin)} margin = {fmt_gib(needed)} needed, {fmt_gib(free)} free "
            f"(short by {fmt_gib(needed - free)})"
        )
        result["fix"] = (
            f"free at least {fmt_gib(needed - free)} on the filesystem of {path}, point "
            "models_root at a larger disk, or lower weights.margin_percent/margin_min_gib"
        )
    elif headroom_percent < warn_headroom_percent:
        result["warnings"].append(
            f"low disk headroom at {where}: after {fmt_gib(missing)} of weights only "
            f"{fmt_gib(headroom)} ({headroom_percent:.1f} % of {fmt_gib(free)} free) will be left"
        )
    return result


def git_blob_id(data: bytes) -> str:
    """The git blob id (sha1 of ``blob <size>\\0`` + content) of ``data``."""
    h = hashlib.sha1(b"blob %d\0" % len(data))  # noqa: S324 - git's object id, not a security hash
    h.update(data)
    return h.hexdigest()


def job_id(job: dict) -> str:
    """A short stable id of a job: the same wish gives the same id."""
    blob = json.dumps(job, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def select_files(paths: list[str], allow: list[str] | None, ignore: list[str] | None) -> list[str]:
    """huggingface_hub's allow/ignore semantics (fnmatch; a trailing "/" means the folder)."""

    def norm(pats: list[str] | None) -> list[str] | None:
        if pats is None:
            return None
        return [p + "*" if p.endswith("/") else p for p in pats]

    allow_n, ignore_n = norm(allow), norm(ignore)
    out = []
    for p in paths:
        if allow_n is not None and not any(fnmatch.fnmatch(p, a) for a in allow_n):
            continue
        if ignore_n is not None and any(fnmatch.fnmatch(p, i) for i in ignore_n):
            continue
        out.append(p)
    return out


# ----------------------------------------------------------------------------------------------
# Hub file names: not trusted. Each becomes a path under the revision folder only after these
# checks, before anything is written, linked or deleted there.
# ----------------------------------------------------------------------------------------------


def hub_name_problem(path: object) -> str | None:
    """Why a file name of the Hub's listing cannot be a path under the revision folder, or None.

    A name is a relative POSIX path of plain components: no absolute path, no ``..`` or ``.``
    component, no empty component (``a//b``, a trailing ``/``), no backslash, no control
    character (NUL, newline, DEL...), and nothing under specfleet's own ``.specfleet/``.
    """
    if not isinstance(path, str) or not path:
        return "an empty name"
    if any(unicodedata.category(c) == "Cc" for c in path):
        return "a control character"
    if "\\" in path:
        return "a backslash"
    if path.startswith("/"):
        return "an absolute path"
    parts = path.split("/")
    if "" in parts:
        return "an empty component"
    if ".." in parts:
        return "a '..' component"
    if "." in parts:
        return "a '.' component"
    if parts[0] == STATE_DIR:
        return f"a name in specfleet's own state folder {STATE_DIR}/"
    return None


class UnsafeName(Exception):
    """The Hub listed file names that cannot be written under the revision folder."""

    def __init__(self, repo_id: str, revision: str, bad: list[tuple[str, str]]):
        self.repo_id, self.revision, self.bad = repo_id, revision, bad
        path, why = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        super().__init__(
            f"{repo_id}@{revision[:12]} lists a file name that is not safe to write under the "
            f"revision folder: {path!r} ({why}){more}; nothing was written"
        )

    def error(self) -> dict:
        return {
            "kind": "unsafe_name",
            "message": str(self),
            "fix": f"check the repository {self.repo_id} at its endpoint (weights.hf_endpoint for "
            "a mirror): a file name must be a relative path inside the repository; no "
            "symlink may stand in the revision folder",
        }


def check_names(repo_id: str, revision: str, files: list[dict]) -> None:
    """Raise ``UnsafeName`` for the listing's bad names (all of them, the first one named)."""
    bad = [(f.get("path"), why) for f in files if (why := hub_name_problem(f.get("path")))]
    if bad:
        raise UnsafeName(repo_id, revision, bad)


def local_path(rev_dir: str, path: str, repo_id: str = "", revision: str = "") -> str:
    """``rev_dir/path`` for a Hub name, once the name is safe and no symlink on the way takes it
    out of ``rev_dir`` (the resolved path stays inside); else ``UnsafeName``."""
    revision = revision or os.path.basename(rev_dir.rstrip("/"))
    why = hub_name_problem(path)
    if why:
        raise UnsafeName(repo_id, revision, [(path, why)])
    full = os.path.join(rev_dir, path)
    base = os.path.realpath(rev_dir)
    real = os.path.realpath(full)
    if not real.startswith(base + os.sep):
        raise UnsafeName(repo_id, revision, [(path, f"a symlink in the way leads it to {real}, "
                                                    "out of the revision folder")])
    return full


def classify_error(exc: BaseException, repo_id: str, revision: str, endpoint: str,
                   has_token: bool) -> dict:
    """A huggingface_hub exception as {"kind", "message", "fix"}; names the repository."""
    if isinstance(exc, UnsafeName):
        return exc.error()
    name = type(exc).__name__
    status = getattr(getattr(exc, "response", None), "status_code", None)
    where = f"{endpoint}/{repo_id}"
    if name == "GatedRepoError" or status == 403:
        return {
            "kind": "gated",
            "message": f"repository {repo_id} is gated and the token used has no access to it "
            f"(HTTP {status or 403})",
            "fix": f"request access at {where} with the account of the token, or give a token "
            "that has it (HF_TOKEN or weights.token_file on the control machine)",
        }
    if name == "RevisionNotFoundError":
        return {
            "kind": "revision_not_found",
            "message": f"revision {revision} of {repo_id} does not exist at {endpoint}",
            "fix": f"pin a commit that exists in {repo_id} (see {where}/commits)",
        }
    if name in ("RepositoryNotFoundError",) or status == 401:
        token_hint = (
            "the token used may lack access to it"
            if has_token
            else "no token was given; if it is private or gated, give one"
        )
        return {
            "kind": "not_found",
            "message": f"repository {repo_id} was not found at {endpoint} or needs access "
            f"(HTTP {status or 401}; {token_hint})",
            "fix": f"check the repo id and revision, and that the account of the token has been "
            f"granted access at {where}",
        }
    if name in ("RemoteEntryNotFoundError", "EntryNotFoundError"):
        return {
            "kind": "entry_not_found",
            "message": f"a file listed in {repo_id}@{revision} is missing at {endpoint}: {exc}",
            "fix": "check the mirror is complete for this revision",
        }
    if status is not None:
        return {
            "kind": "http",
            "message": f"HTTP {status} from {endpoint} for {repo_id}: {str(exc).splitlines()[0]}",
            "fix": "check the endpoint (weights.hf_endpoint) and retry; a re-run resumes",
        }
    return {
        "kind": "network",
        "message": f"cannot reach {endpoint} for {repo_id}: {name}: "
        f"{(str(exc).splitlines() or [''])[0]}",
        "fix": "check the host's route to the endpoint (weights.hf_endpoint for a mirror); "
        "a re-run resumes",
    }


# ----------------------------------------------------------------------------------------------
# Local state
# ----------------------------------------------------------------------------------------------


def now() -> float:
    return round(time.time(), 3)


def write_json_atomic(path: str, data: dict, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_verified(rev_dir: str, since: float = 0.0) -> dict[str, dict]:
    """The last entry per file of verified.jsonl (only those recorded at or after ``since``)."""
    out: dict[str, dict] = {}
    try:
        with open(os.path.join(rev_dir, STATE_DIR, VERIFIED)) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                if e.get("at", 0) >= since:
                    out[e["path"]] = e
    except OSError:
        pass
    return out


def still_matches(rev_dir: str, entry: dict) -> bool:
    """The fast rule: the file verified is still there, unchanged, as far as its stat tells:
    same size and mtime, and the same inode (a file put in its place, whatever its size and
    mtime, is another file). An entry recorded before inodes were (no ``ino``) is held to
    size and mtime."""
    try:
        st = os.stat(os.path.join(rev_dir, entry["path"]))
    except OSError:
        return False
    return (st.st_size == entry["size"] and st.st_mtime_ns == entry["mtime_ns"]
            and entry.get("ino", st.st_ino) == st.st_ino)


def new_digest(kind: str, size: int):
    """A hash to feed a file's bytes: sha256 (``kind="sha256"``) or its git blob id
    (``kind="git"``, which hashes a header with the size first). The fan-out agent's too."""
    if kind == "sha256":
        return hashlib.sha256()
    return hashlib.sha1(b"blob %d\0" % size)  # noqa: S324 - git object id


def hash_file(path: str, kind: str, size: int, on_bytes=None) -> str:
    """sha256 (``kind="sha256"``) or git blob id (``kind="git"``) of a file, streamed."""
    h = new_digest(kind, size)
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Hub access (huggingface_hub is imported lazily, after the environment is set)
# ----------------------------------------------------------------------------------------------


def setup_env(job: dict, disable_xet: bool = False) -> None:
    if job.get("endpoint"):
        os.environ["HF_ENDPOINT"] = job["endpoint"].rstrip("/")
    if job.get("token_path"):
        os.environ["HF_TOKEN_PATH"] = job["token_path"]
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "120")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "120")
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if disable_xet:
        os.environ["HF_HUB_DISABLE_XET"] = "1"


def endpoint_of(job: dict) -> str:
    return (job.get("endpoint") or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip(
        "/"
    )


def has_token(job: dict) -> bool:
    p = job.get("token_path")
    return bool(p and os.path.isfile(p) and os.path.getsize(p) > 0)


def remote_files(job: dict) -> tuple[str, list[dict]]:
    """Resolve the revision and list the selected files with their sizes and hashes."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint_of(job))
    info = api.model_info(job["repo_id"], revision=job["revision"])
    sha = info.sha
    entries = [
        e
        for e in api.list_repo_tree(job["repo_id"], revision=sha, recursive=True)
        if isinstance(e, RepoFile)
    ]
    by_path = {e.path: e for e in entries}
    wanted = select_files(sorted(by_path), job.get("allow_patterns"), job.get("ignore_patterns"))
    files = []
    for p in wanted:
        e = by_path[p]
        f = {"path": p, "size": int(e.size), "blob_id": e.blob_id}
        if e.lfs is not None:
            f["sha256"] = e.lfs.sha256
            f["size"] = int(e.lfs.size)
        files.append(f)
    check_names(job["repo_id"], sha, files)
    if files:
        # The Hub shows a gated repo's metadata and listing to anyone; only its files need the
        # access. Ask for the smallest file's headers now, so that a 401/403 comes before any
        # disk check or download, not at the first shard.
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        probe = min(files, key=lambda f: f["size"])["path"]
        get_hf_file_metadata(hf_hub_url(job["repo_id"], probe, revision=sha,
                                        endpoint=endpoint_of(job)))
    return sha, files


def expected_hash(f: dict) -> tuple[str, str]:
    if f.get("sha256"):
        return "sha256", f["sha256"]
    return "git", f["blob_id"]


def reusable_files(root: str, sha: str) -> dict[tuple[int, str], str]:
    """Verified files of the other revisions under ``root`` that still match in size and mtime,
    by (size, hash): a new revision hard-links the files it shares with them."""
    out: dict[tuple[int, str], str] = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        d = os.path.join(root, name)
        if name == sha or len(name) != 40 or os.path.islink(d) or not os.path.isdir(d):
            continue
        for path, e in read_verified(d).items():
            if hub_name_problem(path) is None and still_matches(d, e):
                out.setdefault((e["size"], e["hash"]), os.path.join(d, path))
    return out


def plan(job: dict, since: float | None = None, listing: tuple[str, list] | None = None) -> dict:
    """What is there, what is missing, how much space there is. Never raises for hub errors.

    With ``verify="deep"`` only files verified at or after ``since`` (this run) count as there.
    ``listing`` (revision, files) skips asking the Hub again.
    """
    try:
        sha, files = listing or remote_files(job)
        rev_dir = os.path.join(job["root"], sha)
        # Every name, before anything is written, linked or deleted under the revision.
        check_names(job["repo_id"], sha, files)
        for f in files:
            local_path(rev_dir, f["path"], job["repo_id"], sha)
    except Exception as e:  # noqa: BLE001 - every hub error becomes a clear message
        return {"error": classify_error(e, job["repo_id"], job["revision"], endpoint_of(job),
                                        has_token(job))}
    if job.get("verify") == "deep":
        verified = read_verified(rev_dir, since) if since else {}
    else:
        verified = read_verified(rev_dir)
        # Files a deep check found bad: their old entries no longer count (until re-verified).
        for path in job.get("suspect") or []:
            if path in verified and not (since and verified[path].get("at", 0) >= since):
                del verified[path]
    missing = []
    missing_bytes = 0
    reuse: dict[str, str] = {}
    others = reusable_files(job["root"], sha) if job.get("verify") != "deep" else {}
    for f in files:
        v = verified.get(f["path"])
        ok = (
            v is not None
            and v.get("size") == f["size"]
            and v.get("hash") == expected_hash(f)[1]
            and still_matches(rev_dir, v)
        )
        if not ok:
            missing.append(f["path"])
            src = others.get((f["size"], expected_hash(f)[1]))
            if src and not os.path.exists(os.path.join(rev_dir, f["path"])):
                reuse[f["path"]] = src  # the same bytes in another revision: a hard link
            else:
                missing_bytes += f["size"]
    probe = job["root"]
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return {
        "repo_id": job["repo_id"],
        "revision": sha,
        "requested": job["revision"],
        "files": files,
        "total_bytes": sum(f["size"] for f in files),
        "missing": missing,
        "missing_bytes": missing_bytes,
        "reuse": reuse,
        "free_bytes": st.f_bavail * st.f_frsize,
        "total_disk_bytes": st.f_blocks * st.f_frsize,
        # partial files of an interrupted run, deleted before a download starts
        "reclaimable_bytes": incomplete_bytes(rev_dir),
    }


# ----------------------------------------------------------------------------------------------
# fetch: the child that moves bytes
# ----------------------------------------------------------------------------------------------


_EMIT_LOCK = threading.Lock()


def emit(event: dict) -> None:
    with _EMIT_LOCK:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def cmd_fetch(job: dict, disable_xet: bool, since: float | None,
              listing_path: str | None = None) -> int:
    setup_env(job, disable_xet)
    # Imported here: the fan-out's serve and wait import this module on every call.
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from huggingface_hub import hf_hub_download

    listing = None
    if listing_path:
        data = read_json(listing_path)
        if data and data.get("revision") and data.get("files") is not None:
            listing = (data["revision"], data["files"])
    p = plan(job, since, listing)
    if "error" in p:
        emit({"event": "error", **p["error"]})
        return EXIT_FAILED
    sha = p["revision"]
    fetcher = Fetcher(job, p, hf_hub_download)
    failures: list[dict] = []
    with ThreadPoolExecutor(max_workers=int(job.get("max_workers") or 4)) as pool:
        futs = {pool.submit(fetcher.one, path): path for path in p["missing"]}
        for fut in as_completed(futs):
            exc = fut.exception()
            if exc is None:
                continue
            if isinstance(exc, ChecksumError):
                failures.append({"kind": "checksum", "message": f"checksum mismatch after 2 "
                                 f"downloads of {job['repo_id']}@{sha[:12]} {exc}",
                                 "fix": "the mirror or the network corrupts this file; check "
                                 "weights.hf_endpoint, then re-run"})
            else:
                failures.append(classify_error(exc, job["repo_id"], sha, endpoint_of(job),
                                               has_token(job)))
    if failures:
        emit({"event": "error", **failures[0], "count": len(failures)})
        return EXIT_FAILED
    emit({"event": "fetched", "revision": sha})
    return EXIT_OK


class Fetcher:
    """The files of one revision, each made present and verified (``one``, from worker
    threads): hard-linked from a verified copy, kept when it hashes right, or downloaded (twice
    at most); each verified file recorded in the revision's ``verified.jsonl``."""

    def __init__(self, job: dict, p: dict, download):
        self.job, self.sha, self.reuse, self.download = job, p["revision"], p["reuse"], download
        self.rev_dir = os.path.join(job["root"], self.sha)
        os.makedirs(os.path.join(self.rev_dir, STATE_DIR), exist_ok=True)
        self.files = {f["path"]: f for f in p["files"]}
        self.vpath = os.path.join(self.rev_dir, STATE_DIR, VERIFIED)
        self.vlock = threading.Lock()

    def local(self, path: str) -> str:
        return local_path(self.rev_dir, path, self.job["repo_id"], self.sha)

    def record(self, f: dict, kind: str, digest: str) -> None:
        st = os.stat(os.path.join(self.rev_dir, f["path"]))
        entry = {"path": f["path"], "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                 "ino": st.st_ino, "hash_kind": kind, "hash": digest, "at": now()}
        with self.vlock, open(self.vpath, "a") as out:
            out.write(json.dumps(entry) + "\n")
            out.flush()
            os.fsync(out.fileno())
        emit({"event": "verified", "path": f["path"], "size": f["size"]})

    def check(self, f: dict) -> str | None:
        """Why the file on disk is not the Hub's (size, then hash); None when it is."""
        kind, want = expected_hash(f)
        local = self.local(f["path"])
        if os.path.getsize(local) != f["size"]:
            return f"size {os.path.getsize(local)} != {f['size']}"
        last = [time.monotonic()]

        def beat(n: int) -> None:
            if time.monotonic() - last[0] > 1.0:
                last[0] = time.monotonic()
                emit({"event": "hashing", "path": f["path"]})

        got = hash_file(local, kind, f["size"], beat)
        return None if got == want else f"{kind} {got} != {want}"

    def linked(self, path: str) -> bool:
        """Hard-linked from another revision's verified copy (same size and mtime: the fast
        rule); False on another filesystem, say, or when the file is there already."""
        src, local = self.reuse.get(path), self.local(path)
        if not src or os.path.exists(local):
            return False
        try:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            os.link(src, local)
        except OSError:
            return False
        emit({"event": "linked", "path": path, "from": src})
        return True

    def one(self, path: str) -> None:
        f = self.files[path]
        kind, want = expected_hash(f)
        local = self.local(path)
        if self.linked(path):
            self.record(f, kind, want)
            return
        if os.path.isfile(local) and os.path.getsize(local) == f["size"]:
            emit({"event": "hashing", "path": path})
            bad = self.check(f)
            if bad is None:
                self.record(f, kind, want)
                return
            emit({"event": "corrupt", "path": path, "detail": bad})
        for attempt in (1, 2):
            emit({"event": "download", "path": path, "attempt": attempt})
            self.download(self.job["repo_id"], path, revision=self.sha, local_dir=self.rev_dir,
                          force_download=True)
            bad = self.check(f)
            if bad is None:
                self.record(f, kind, want)
                return
            emit({"event": "mismatch", "path": path, "attempt": attempt, "detail": bad})
        raise ChecksumError(f"{path}: {bad}")


class ChecksumError(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# run: the supervisor (the systemd unit's main process)
# ----------------------------------------------------------------------------------------------


class Progress:
    def __init__(self, job: dict):
        self.path = job["progress_path"]
        self.data = {
            "schema": SCHEMA, "job_id": job["job_id"], "repo_id": job["repo_id"],
            "requested": job["revision"], "revision": None, "state": "starting",
            "pid": os.getpid(), "started_at": now(), "updated_at": now(),
            "bytes_total": 0, "bytes_done": 0, "files_total": 0, "files_done": 0,
            "attempt": 0, "xet_disabled": False, "warnings": [], "events": [],
            "error": None,
        }
        self.write()

    def update(self, **kw) -> None:
        if "state" in kw and kw["state"] != self.data.get("state"):
            # seconds since the start at which each state began
            self.data.setdefault("timeline", {})[kw["state"]] = round(
                time.time() - self.data["started_at"], 3)
        self.data.update(kw)
        self.data["updated_at"] = now()
        self.write()

    def note(self, text: str) -> None:
        ev = self.data["events"]
        ev.append({"at": now(), "text": text})
        del ev[:-50]
        print(text, flush=True)  # to the journal
        self.update()

    def write(self) -> None:
        write_json_atomic(self.path, self.data)


def partial_files(base: str, suffix: str) -> list[tuple[str, int]]:
    """(path, size) of every file under ``base`` whose name ends in ``suffix``: a download's
    parts left by a killed process (huggingface_hub's ``.incomplete``, the fan-out's)."""
    found = []
    for dirpath, _dirs, names in os.walk(base):
        for n in names:
            if n.endswith(suffix):
                full = os.path.join(dirpath, n)
                try:
                    found.append((full, os.path.getsize(full)))
                except OSError:
                    pass
    return found


def remove_partial_files(base: str, suffix: str) -> tuple[int, int]:
    """Delete ``partial_files(base, suffix)``: (files, bytes freed)."""
    count = freed = 0
    for full, size in partial_files(base, suffix):
        try:
            os.unlink(full)
        except OSError:
            continue
        count += 1
        freed += size
    return count, freed


def _hub_partials(rev_dir: str) -> str:
    return os.path.join(rev_dir, ".cache", "huggingface", "download")


def incomplete_bytes(rev_dir: str) -> int:
    return sum(size for _, size in partial_files(_hub_partials(rev_dir), ".incomplete"))


def remove_incomplete(rev_dir: str) -> tuple[int, int]:
    """Delete huggingface_hub's partial downloads under a revision: (files, bytes freed)."""
    return remove_partial_files(_hub_partials(rev_dir), ".incomplete")


class ForkedFetch:
    """A `fetch` child forked from the supervisor, with what `run_fetch_child` uses of a Popen.

    The first attempt runs with the supervisor's own environment, and the plan has already
    imported the Hub client: a fork starts downloading at once, where a new interpreter spends
    longer importing huggingface_hub than the whole plan takes. huggingface_hub drops its pooled
    connections in a forked child (its ``os.register_at_fork``), so none is shared.
    """

    def __init__(self, fetch) -> None:
        sys.stdout.flush()
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read_fd)
            os.dup2(write_fd, 1)
            os.close(write_fd)
            code = EXIT_FAILED
            try:
                code = fetch()
            except BaseException as e:  # noqa: BLE001 - the child must never return into run
                sys.stderr.write(f"fetch: {type(e).__name__}: {e}\n")
            finally:
                sys.stdout.flush()
                os._exit(code)
        os.close(write_fd)
        self.stdout = os.fdopen(read_fd, "r")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                # os.waitstatus_to_exitcode is Python 3.9; hosts may have 3.8.
                self.returncode = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                                   else os.WEXITSTATUS(status))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("weights_agent.py fetch", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run_fetch_child(job: dict, job_path: str, disable_xet: bool, prog: Progress, sizes: dict,
                    done: set, rev_dir: str, fork: bool = False) -> tuple[str, dict | None]:
    """One `fetch` child; returns ("ok"|"stall"|"error", error). Watches for stalls.

    ``fork``: the child is a fork of this process, which must run with ``disable_xet``'s
    environment already (the Hub client reads it when it is imported)."""
    child = start_fetch_child(job, job_path, disable_xet, prog, fork)
    events = ChildEvents(child)
    stall_s = float(job.get("stall_minutes", 10)) * 60
    last_change = time.monotonic()
    last_seen = -1
    error = None
    poll = min(1.0, max(stall_s / 10, 0.2))
    last_rate = (time.monotonic(), prog.data["bytes_done"])
    while True:
        batch = events.take()
        if batch:
            last_change = time.monotonic()
        error = apply_events(batch, done, prog) or error
        seen = sum(sizes.get(p, 0) for p in done) + incomplete_bytes(rev_dir)
        if seen != last_seen:
            last_seen = seen
            last_change = time.monotonic()
        t_now = time.monotonic()
        rate = prog.data.get("rate_bps", 0)
        if t_now - last_rate[0] >= 2.0:
            rate = max(0, (seen - last_rate[1]) / (t_now - last_rate[0]))
            last_rate = (t_now, seen)
        prog.update(bytes_done=min(seen, prog.data["bytes_total"]), files_done=len(done),
                    rate_bps=int(rate))
        rc = child.poll()
        if rc is not None:
            events.thread.join(timeout=5)
            error = apply_events(events.take(), done, None) or error
            if rc == 0:
                return "ok", None
            return "error", error or {"kind": "crash", "message": f"fetch exited {rc}",
                                      "fix": "see journalctl for the unit; a re-run resumes"}
        if t_now - last_change > stall_s:
            stop_child(child)
            return "stall", None
        try:
            child.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            pass


def start_fetch_child(job: dict, job_path: str, disable_xet: bool, prog: Progress, fork: bool):
    """The `fetch` child: a fork of this process, or this program run again (without Xet)."""
    since = prog.data["started_at"]
    listing = f"{prog.path}.listing"
    if fork:
        return ForkedFetch(lambda: cmd_fetch(job, disable_xet, since, listing))
    env = dict(os.environ)
    if disable_xet:
        env["HF_HUB_DISABLE_XET"] = "1"
    argv = [sys.executable, os.path.abspath(__file__), "fetch", job_path,
            f"--since={since}", f"--listing={listing}"]
    if disable_xet:
        argv.append("--no-xet")
    return subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, text=True)


class ChildEvents:
    """The JSON events a `fetch` child prints, read by a thread as they come."""

    def __init__(self, child):
        self.child, self.events, self.lock = child, [], threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.child.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.events.append(ev)

    def take(self) -> list[dict]:
        with self.lock:
            batch, self.events[:] = list(self.events), []
        return batch


def apply_events(batch: list[dict], done: set, prog: Progress | None) -> dict | None:
    """The files verified go into ``done``, re-fetches are noted; the last error, if any."""
    error = None
    for ev in batch:
        kind = ev.get("event")
        if kind == "verified":
            done.add(ev["path"])
        elif kind in ("corrupt", "mismatch") and prog is not None:
            prog.note(f"{ev['path']}: {kind} ({ev.get('detail')}), fetching it again")
        elif kind == "error":
            error = {k: ev[k] for k in ("kind", "message", "fix") if k in ev}
    return error


def stop_child(child) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def flip_current(root: str, sha: str) -> None:
    link = os.path.join(root, CURRENT)
    tmp = f"{link}.tmp.{os.getpid()}"
    os.symlink(sha, tmp)
    os.replace(tmp, link)


def pids_using(rev_dir: str) -> list[int]:
    """Processes that use a revision: a file open or mapped under it, their cwd in it, or its
    commit in their argv or environment (an SGLang unit names the revision it serves)."""
    import os as _os

    rev_dir = _os.path.realpath(rev_dir)
    sha = _os.path.basename(rev_dir).encode()
    users = []
    for pid in _os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == _os.getpid():
            continue
        base = f"/proc/{pid}"
        found = False
        for name in ("cmdline", "environ"):
            try:
                with open(f"{base}/{name}", "rb") as f:
                    found = found or sha in f.read()
            except OSError:
                pass
        try:
            links = [_os.readlink(f"{base}/cwd")]
            links += [_os.readlink(f"{base}/fd/{fd}") for fd in _os.listdir(f"{base}/fd")]
        except OSError:
            links = []
        found = found or any(x == rev_dir or x.startswith(rev_dir + "/") for x in links)
        if not found:
            try:
                with open(f"{base}/maps") as f:
                    found = (" " + rev_dir + "/") in f.read()
            except OSError:
                pass
        if found:
            users.append(int(pid))
    return users


def prune(root: str, keep: set[str], note) -> None:
    for name in sorted(os.listdir(root)):
        full = os.path.join(root, name)
        if name in keep or name == CURRENT or os.path.islink(full) or not os.path.isdir(full):
            continue
        if len(name) == 40 and all(c in "0123456789abcdef" for c in name):
            users = pids_using(full)
            if users:
                note(f"keeping revision {name}: in use by pid {', '.join(map(str, users))}")
                continue
            note(f"pruning revision {name}")
            shutil.rmtree(full)


def cmd_run(job: dict, job_path: str) -> int:
    setup_env(job)
    prog = Progress(job)
    prog.update(state="planning")
    p = plan(job)
    if "error" in p:
        return _failed(prog, p["error"])
    sha = p["revision"]
    write_json_atomic(f"{prog.path}.listing", {"revision": sha, "files": p["files"]})
    rev_dir = os.path.join(job["root"], sha)
    # huggingface_hub starts every download in a new temporary file (it no longer resumes
    # partial files), so those of a killed run are garbage: free their space before measuring.
    count, freed = remove_incomplete(rev_dir)
    if count:
        prog.note(f"removed {count} partial files ({fmt_gib(freed)}) left by an interrupted run")
        p["free_bytes"] += freed
    sizes = {f["path"]: f["size"] for f in p["files"]}
    done = set(sizes) - set(p["missing"])
    prog.update(revision=sha, bytes_total=p["total_bytes"], files_total=len(sizes),
                files_done=len(done), bytes_done=sum(sizes[x] for x in done))
    pre = disk_preflight(p["missing_bytes"], p["free_bytes"],
                         margin_percent=job.get("margin_percent", 2.0),
                         margin_min_gib=job.get("margin_min_gib", 10.0),
                         host=job.get("host", ""), path=job["root"])
    for w in pre["warnings"]:
        prog.data["warnings"].append(w)
        prog.note(w)
    if not pre["ok"]:
        return _failed(prog, {"kind": "disk", "message": pre["problem"], "fix": pre["fix"]})
    if p["missing"]:
        error = fetch_missing(job, job_path, p, prog, sizes, done, rev_dir)
        if error is not None:
            return _failed(prog, error)
    # Everything verified: the manifest, then the link.
    prog.update(state="verifying")
    error = write_manifest(job, p, rev_dir)
    if error is not None:
        prog.update(state="failed", error=error)
        return 1
    flip_current(job["root"], sha)
    if job.get("prune"):
        prune(job["root"], {sha, *job.get("keep", [])}, prog.note)
    prog.update(state="done", bytes_done=p["total_bytes"], files_done=len(sizes))
    print(f"done: {job['repo_id']}@{sha} {len(sizes)} files {fmt_gib(p['total_bytes'])}",
          flush=True)
    return 0


def _failed(prog: Progress, error: dict) -> int:
    prog.update(state="failed", error=error)
    print(f"failed: {error['message']}", flush=True)
    return 1


def fetch_missing(job: dict, job_path: str, p: dict, prog: Progress, sizes: dict,
                  done: set, rev_dir: str) -> dict | None:
    """Fetch the files the plan found missing: a forked child, then (after a stall) one without
    Xet. None when every file came and was verified; else the error (a stall on a full disk is
    said as one)."""
    sha = p["revision"]
    linked = f", {len(p['reuse'])} hard-linked from other revisions" if p["reuse"] else ""
    prog.note(f"{len(p['missing'])} of {len(sizes)} files to fetch or check "
              f"({fmt_gib(p['missing_bytes'])} to download{linked}) for "
              f"{job['repo_id']}@{sha[:12]}")
    prog.update(state="downloading")
    attempts = [False, True] if os.environ.get("HF_HUB_DISABLE_XET") != "1" else [True, True]
    outcome, error = "stall", None
    for i, no_xet in enumerate(attempts, start=1):
        prog.update(attempt=i, xet_disabled=no_xet)
        # The first attempt runs in this process's environment: a fork.
        outcome, error = run_fetch_child(job, job_path, no_xet, prog, sizes, done, rev_dir,
                                         fork=i == 1)
        if outcome != "stall":
            break
        prog.note(f"no progress for {job.get('stall_minutes', 10)} min (attempt {i}); "
                  "retrying with HF_HUB_DISABLE_XET=1")
    if outcome == "ok":
        return None
    if outcome != "stall":
        return error
    left = sum(n for path, n in sizes.items() if path not in done)
    free = free_bytes_at(rev_dir)
    if free < left:
        # A full disk shows as a download that stops moving (the client retries its writes):
        # say so, instead of blaming the link.
        return {
            "kind": "disk-full",
            "message": f"download of {job['repo_id']}@{sha[:12]} stopped: the disk at "
            f"{rev_dir} is full ({fmt_gib(free)} free, {fmt_gib(left)} still to download; "
            f"{len(done)}/{len(sizes)} files verified and kept)",
            "fix": f"free at least {fmt_gib(left - free)} on the disk of {job['root']} (or "
            "point models_root at a larger disk); a re-run resumes",
        }
    return {
        "kind": "stall",
        "message": f"download of {job['repo_id']}@{sha[:12]} made no progress for "
        f"{job.get('stall_minutes', 10)} min, also with HF_HUB_DISABLE_XET=1 "
        f"({len(done)}/{len(sizes)} files verified and kept)",
        "fix": f"check the host's link to {endpoint_of(job)}; a re-run resumes; raise "
        "weights.stall_minutes if the link is just slow",
    }


def write_manifest(job: dict, p: dict, rev_dir: str) -> dict | None:
    """The revision's manifest, from every file verified and unchanged since; the error of a
    file that changed while verifying (no manifest then)."""
    verified = read_verified(rev_dir)
    manifest_files = {}
    for f in p["files"]:
        v = verified.get(f["path"])
        if v is None or not still_matches(rev_dir, v) or v["hash"] != expected_hash(f)[1]:
            return {"kind": "checksum", "message": f"{f['path']} changed while verifying",
                    "fix": "re-run; nothing else should write under the models root"}
        manifest_files[f["path"]] = {k: v[k] for k in ("size", "mtime_ns", "ino", "hash_kind",
                                                        "hash") if k in v}
    write_json_atomic(os.path.join(rev_dir, STATE_DIR, MANIFEST), {
        "schema": SCHEMA, "repo_id": job["repo_id"], "revision": p["revision"],
        "requested": job["revision"], "endpoint": endpoint_of(job), "complete": True,
        "allow_patterns": job.get("allow_patterns"), "ignore_patterns": job.get("ignore_patterns"),
        "verified_at": now(), "verify": job.get("verify", "fast"),
        "bytes": p["total_bytes"], "files": manifest_files,
    })
    return None


def cmd_check(rev_dir: str) -> dict:
    """Re-hash every file of a complete revision against its manifest (no Hub needed)."""
    manifest = read_json(os.path.join(rev_dir, STATE_DIR, MANIFEST))
    if not manifest or not manifest.get("complete"):
        return {"checked": 0, "bad": {}, "error": "no complete manifest"}
    bad = {}
    for path, e in sorted(manifest["files"].items()):
        full = os.path.join(rev_dir, path)
        try:
            size = os.path.getsize(full)
        except OSError:
            bad[path] = "missing"
            continue
        if size != e["size"]:
            bad[path] = f"size {size} != {e['size']}"
            continue
        got = hash_file(full, e["hash_kind"], e["size"])
        if got != e["hash"]:
            bad[path] = f"{e['hash_kind']} {got} != {e['hash']}"
    return {"checked": len(manifest["files"]), "bad": bad, "error": None}


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "check":
        print(json.dumps(cmd_check(argv[1])))
        return 0
    if len(argv) < 2 or argv[0] not in ("plan", "run", "fetch"):
        sys.stderr.write("usage: weights_agent.py plan|run|fetch JOB.json | check REVISION_DIR\n")
        return 2
    if argv[1].startswith("{"):
        job = json.loads(argv[1])  # a job inline (plan only); it never holds a secret
    else:
        with open(argv[1]) as f:
            job = json.load(f)
    if argv[0] == "plan":
        setup_env(job)
        print(json.dumps(plan(job)))
        return 0
    if argv[0] == "fetch":
        opts = dict(a[2:].split("=", 1) for a in argv[2:] if "=" in a)
        since = float(opts["since"]) if "since" in opts else None
        return cmd_fetch(job, "--no-xet" in argv, since, opts.get("listing"))
    return cmd_run(job, argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
