"""specfleet fan-out agent: copy a model revision from a peer host over the LAN, verified.

Uploaded next to ``weights_agent.py`` (the specfleet tools venv) and run on fleet hosts:

    fanout_agent.py serve MODELS_ROOT STATE_DIR
        The forced command of the rollout's ephemeral ssh key on a serving peer. With
        ``SSH_ORIGINAL_COMMAND`` = ``specfleet-status DIR REVISION`` it prints one JSON object
        (what the peer holds of that revision and how its own download or pull is going);
        anything else goes to ``rrsync -ro MODELS_ROOT`` (rsync, read-only, under the models
        root; nothing else is reachable with the key).
    fanout_agent.py pull JOB
        On a receiving host (a transient ``systemd-run`` unit, started by ``operations.fanout``):
        ask the Hub (``HF_ENDPOINT``) for the revision's file list and hashes, then take every
        file a source peer has *verified* (its ``verified.jsonl``) with rsync over ssh, as soon
        as the peer has it (pipelined behind the peer's own download), hash it against the Hub's
        sha256 / git blob id and record it in this host's ``verified.jsonl``, as the weights agent
        does. A file whose hash does not match is deleted: the weights agent, run next, fetches
        it from upstream. A source that fails, stalls or is unreachable gives way to the next
        one in ``sources``, then to upstream. The private key file is removed at the end.

Progress of a pull goes to ``<state_dir>/fanout/<dir>.pull.json``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

SCHEMA = 1
STATUS_VERB = "specfleet-status"
_DIR_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,200}$")
_REV_RE = re.compile(r"^[0-9a-f]{40}$")


def _weights_agent():
    """The weights agent module, next to this file (on a host: the tools folder; here: the
    ``specfleet.hostside`` folder). Host-side programs import nothing of the project."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import weights_agent  # type: ignore[import-not-found]

    return weights_agent


# ----------------------------------------------------------------------------------------------
# Pure helpers (also used by the control machine and the tests)
# ----------------------------------------------------------------------------------------------


def pull_progress_path(state_dir: str, dir_name: str) -> str:
    return f"{state_dir.rstrip('/')}/fanout/{dir_name}.pull.json"


def weights_progress_path(state_dir: str, dir_name: str) -> str:
    """Where ``operations.weights.downloaded`` has the weights agent write its progress."""
    return f"{state_dir.rstrip('/')}/weights/{dir_name}.progress.json"


def parse_status_request(command: str) -> tuple[str, str] | None:
    """``specfleet-status DIR REVISION`` -> (DIR, REVISION); None for anything else."""
    parts = command.split()
    if len(parts) != 3 or parts[0] != STATUS_VERB:
        return None
    if not _DIR_RE.match(parts[1]) or ".." in parts[1] or not _REV_RE.match(parts[2]):
        return None
    return parts[1], parts[2]


def source_finished(status: dict, revision: str, rollout_id: str) -> bool:
    """Whether a source peer will get no more files of ``revision`` in this rollout: its copy is
    complete (manifest), its own download of that revision ended (done or failed), or its own
    pull of this rollout ended."""
    if status.get("complete"):
        return True
    w = status.get("weights") or {}
    if w.get("revision") == revision and w.get("state") in ("done", "failed"):
        return True
    p = status.get("pull") or {}
    return p.get("rollout_id") == rollout_id and p.get("state") in ("done", "partial", "failed")


def available(status: dict, wanted: dict[str, dict], expected_hash) -> list[str]:
    """The wanted files a source has verified with the hash the Hub gives (sorted)."""
    out = []
    for path, entry in (status.get("verified") or {}).items():
        f = wanted.get(path)
        if f is not None and entry.get("size") == f["size"] and (
            entry.get("hash") == expected_hash(f)[1]
        ):
            out.append(path)
    return sorted(out)


def ssh_command(key_path: str, known_hosts: str, port: int, control_dir: str) -> list[str]:
    """The ssh client of a pull: the rollout's key only, the peer's pinned host key only."""
    return [
        "ssh", "-i", key_path, "-p", str(port),
        "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
        "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
        "-o", "LogLevel=ERROR",
        "-o", "Ciphers=aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr",
        "-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/%C",
        "-o", "ControlPersist=30",
    ]


# ----------------------------------------------------------------------------------------------
# serve: the forced command on a serving peer
# ----------------------------------------------------------------------------------------------


def status_of(models_root: str, state_dir: str, dir_name: str, revision: str) -> dict:
    wa = _weights_agent()
    rev_dir = os.path.join(models_root, dir_name, revision)
    verified = {}
    for path, e in wa.read_verified(rev_dir).items():
        if wa.still_matches(rev_dir, e):
            verified[path] = {"size": e["size"], "hash": e["hash"]}
    manifest = wa.read_json(os.path.join(rev_dir, wa.STATE_DIR, wa.MANIFEST)) or {}
    weights = wa.read_json(weights_progress_path(state_dir, dir_name)) or {}
    pull = wa.read_json(pull_progress_path(state_dir, dir_name)) or {}
    return {
        "schema": SCHEMA,
        "revision": revision,
        "complete": bool(manifest.get("complete")) and manifest.get("revision") == revision,
        "verified": verified,
        "weights": {k: weights.get(k) for k in ("revision", "state", "updated_at")},
        "pull": {k: pull.get(k) for k in ("rollout_id", "revision", "state", "updated_at")},
    }


def cmd_serve(models_root: str, state_dir: str) -> int:
    command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    req = parse_status_request(command)
    if req is not None:
        print(json.dumps(status_of(models_root, state_dir, *req)), flush=True)
        return 0
    if not command.startswith("rsync --server --sender "):
        sys.stderr.write("specfleet fan-out: only read-only rsync and status are allowed\n")
        return 1
    os.execvp("rrsync", ["rrsync", "-ro", models_root])
    return 1  # not reached


# ----------------------------------------------------------------------------------------------
# pull: a receiving host
# ----------------------------------------------------------------------------------------------


def now() -> float:
    return round(time.time(), 3)


class Pull:
    def __init__(self, job: dict):
        self.job = job
        self.wa = _weights_agent()
        self.path = job["progress_path"]
        self.started = now()
        self.data = {
            "schema": SCHEMA, "rollout_id": job["rollout_id"], "repo_id": job["repo_id"],
            "requested": job["revision"], "revision": None, "state": "starting",
            "started_at": self.started, "updated_at": self.started, "files_total": 0,
            "files_done": 0, "files_from_peers": 0, "bytes_from_peers": 0, "by_source": {},
            "corrupt": [], "left": [], "events": [], "error": None,
        }
        self.write()

    def write(self) -> None:
        self.data["updated_at"] = now()
        self.wa.write_json_atomic(self.path, self.data)

    def note(self, text: str) -> None:
        self.data["events"] = (self.data["events"] + [{"at": now(), "text": text}])[-50:]
        print(text, flush=True)  # to the journal
        self.write()

    # -- talking to a source ------------------------------------------------------------
    def ssh(self, source: dict) -> list[str]:
        j = self.job
        return ssh_command(j["key_path"], j["known_hosts"], int(source.get("port", j["port"])),
                           j["control_dir"])

    def status(self, source: dict, dir_name: str, revision: str) -> dict | None:
        argv = self.ssh(source) + [f"root@{source['address']}",
                                   f"{STATUS_VERB} {dir_name} {revision}"]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            self.last_error = (r.stderr.strip().splitlines() or [f"ssh exit {r.returncode}"])[-1]
            return None
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.last_error = "unreadable status"
            return None

    def rsync(self, source: dict, dir_name: str, revision: str, paths: list[str],
              rev_dir: str) -> tuple[bool, str]:
        lst = os.path.join(rev_dir, self.wa.STATE_DIR, "fanout-files")
        with open(lst, "w") as f:
            f.write("".join(p + "\n" for p in paths))
        argv = ["rsync", "-a", "--whole-file", "--files-from", lst,
                "-e", shlex.join(self.ssh(source)),
                f"root@{source['address']}:{dir_name}/{revision}/", rev_dir + "/"]
        r = subprocess.run(argv, capture_output=True, text=True)
        os.unlink(lst)
        return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> int:
        wa, j = self.wa, self.job
        wa.setup_env(j)
        try:
            sha, files = wa.remote_files(j)
        except Exception as e:  # noqa: BLE001 - every hub error becomes a clear message
            self.data["error"] = wa.classify_error(e, j["repo_id"], j["revision"],
                                                   wa.endpoint_of(j), wa.has_token(j))
            self.data["state"] = "failed"
            self.note(f"failed: {self.data['error']['message']}")
            return 1
        dir_name = os.path.basename(j["root"].rstrip("/"))
        rev_dir = os.path.join(j["root"], sha)
        os.makedirs(os.path.join(rev_dir, wa.STATE_DIR), exist_ok=True)
        by_path = {f["path"]: f for f in files}
        verified = wa.read_verified(rev_dir)
        wanted = {}
        for p, f in by_path.items():
            v = verified.get(p)
            if not (v and v.get("hash") == wa.expected_hash(f)[1] and wa.still_matches(rev_dir, v)):
                wanted[p] = f
        self.data.update(revision=sha, state="pulling", files_total=len(files),
                         files_done=len(files) - len(wanted))
        w = j.get("weights_job") or {}
        vfs = os.statvfs(rev_dir)
        pre = wa.disk_preflight(sum(f["size"] for f in wanted.values()),
                                vfs.f_bavail * vfs.f_frsize,
                                margin_percent=w.get("margin_percent", 2.0),
                                margin_min_gib=w.get("margin_min_gib", 10.0),
                                host=w.get("host", ""), path=j["root"])
        if not pre["ok"]:
            # Nothing is copied; the weights step fails with the same numbers before a byte moves.
            self.data["left"] = sorted(wanted)
            self.data["state"] = "partial"
            self.data["error"] = {"kind": "disk", "message": pre["problem"], "fix": pre["fix"]}
            self.note(pre["problem"])
            return 0
        self.note(f"{len(wanted)} of {len(files)} files of {j['repo_id']}@{sha[:12]} to take "
                  f"from peers ({', '.join(s['host'] for s in j['sources'])})")
        for source in j["sources"]:
            if not wanted:
                break
            self.from_source(source, dir_name, sha, rev_dir, wanted)
        self.data["left"] = sorted(set(wanted) | set(self.data["corrupt"]))
        if self.data["left"]:
            self.data["state"] = "partial"
            left = self.data["left"]
            self.note(f"{len(left)} files left for upstream: {', '.join(left[:5])}")
            return 0
        self.note(f"every file of {j['repo_id']}@{sha[:12]} came from peers, verified")
        self.finish(j.get("weights_job"))
        self.data["state"] = "done"
        return 0

    def finish(self, wjob: dict | None) -> None:
        """Every file is here and verified: let the weights agent itself write the manifest and
        flip ``current`` (its ``run`` finds nothing missing), so ``weights.model`` next is a
        no-op."""
        if not wjob:
            return
        wa = self.wa
        path = os.path.join(os.path.dirname(self.path), f"{os.path.basename(wjob['root'])}"
                            ".weights-job.json")
        wa.write_json_atomic(path, wjob)
        rc = wa.cmd_run(wjob, path)
        self.note("manifest written, current flipped" if rc == 0 else
                  "the weights agent could not finish; the weights step will")

    def from_source(self, source: dict, dir_name: str, sha: str, rev_dir: str,
                    wanted: dict[str, dict]) -> None:
        wa, j = self.wa, self.job
        stall_s = float(j.get("stall_seconds", 600))
        poll = float(j.get("poll_seconds", 1.0))
        last_progress = time.monotonic()
        failures = 0
        self.last_error = ""
        while wanted:
            st = self.status(source, dir_name, sha)
            if st is None:
                failures += 1
                if failures >= 3 or time.monotonic() - last_progress > stall_s:
                    self.note(f"{source['host']} unreachable for the peer copy "
                              f"({self.last_error}); trying the next source")
                    return
                time.sleep(poll)
                continue
            failures = 0
            paths = available(st, wanted, wa.expected_hash)
            if paths:
                ok, err = self.rsync(source, dir_name, sha, paths, rev_dir)
                got = self.check(source, paths, rev_dir, wanted)
                if not ok and not got:
                    self.note(f"rsync from {source['host']} failed ({err}); trying the next "
                              "source")
                    return
                last_progress = time.monotonic()
                continue
            if source_finished(st, sha, j["rollout_id"]):
                return
            if time.monotonic() - last_progress > stall_s:
                self.note(f"{source['host']} made no progress for {stall_s:.0f} s; trying the "
                          "next source")
                return
            time.sleep(poll)

    def check(self, source: dict, paths: list[str], rev_dir: str,
              wanted: dict[str, dict]) -> int:
        """Hash each copied file; record the good ones, delete the bad (upstream gets them)."""
        wa = self.wa
        vpath = os.path.join(rev_dir, wa.STATE_DIR, wa.VERIFIED)
        good = 0
        for p in paths:
            f = wanted[p]
            local = os.path.join(rev_dir, p)
            kind, want = wa.expected_hash(f)
            try:
                size = os.path.getsize(local)
                got = wa.hash_file(local, kind, f["size"]) if size == f["size"] else f"size {size}"
            except OSError:
                continue  # not copied; stays wanted
            if got != want:
                os.unlink(local)
                del wanted[p]
                self.data["corrupt"].append(p)
                self.note(f"{p} from {source['host']} does not match the Hub's {kind} "
                          f"({got[:16]} != {want[:16]}); deleted, left for upstream")
                continue
            st = os.stat(local)
            entry = {"path": p, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                     "hash_kind": kind, "hash": want, "at": now(), "from": source["host"]}
            with open(vpath, "a") as out:
                out.write(json.dumps(entry) + "\n")
                out.flush()
                os.fsync(out.fileno())
            del wanted[p]
            good += 1
            self.data["files_done"] += 1
            self.data["files_from_peers"] += 1
            self.data["bytes_from_peers"] += st.st_size
            by = self.data["by_source"]
            by[source["host"]] = by.get(source["host"], 0) + st.st_size
        self.write()
        return good

    def close(self) -> None:
        j = self.job
        for source in j["sources"]:
            subprocess.run(self.ssh(source) + ["-O", "exit", f"root@{source['address']}"],
                           capture_output=True)
        try:
            os.unlink(j["key_path"])  # this pull's own copy of the rollout's key
        except OSError:
            pass


def cmd_pull(job: dict) -> int:
    pull = Pull(job)
    try:
        return pull.run()
    except Exception as e:  # noqa: BLE001 - a crash is a partial pull, never a broken host
        pull.data["state"] = "failed"
        pull.data["error"] = {"kind": "crash", "message": f"{type(e).__name__}: {e}",
                              "fix": "see journalctl for the unit; the weights agent fetches "
                              "the rest from upstream"}
        pull.note(f"failed: {type(e).__name__}: {e}")
        return 1
    finally:
        pull.close()
        pull.write()


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "serve":
        return cmd_serve(argv[1], argv[2])
    if len(argv) == 2 and argv[0] == "pull":
        with open(argv[1]) as f:
            return cmd_pull(json.load(f))
    sys.stderr.write("usage: fanout_agent.py serve MODELS_ROOT STATE_DIR | pull JOB.json\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
