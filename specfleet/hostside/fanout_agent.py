"""specfleet fan-out agent: copy a model revision from a peer host over the LAN, verified.

Uploaded next to ``weights_agent.py`` (the specfleet tools venv) and run on fleet hosts:

    fanout_agent.py serve MODELS_ROOT STATE_DIR DIR=REVISION|DIR ...
        The forced command of the rollout's ephemeral ssh key on a serving peer; it serves the
        revision folders named (``MODELS_ROOT/DIR/REVISION``; a bare ``DIR``, for a swarm that
        follows a branch: the revision this host's own download or pull resolved) and nothing
        else. With ``SSH_ORIGINAL_COMMAND`` = ``specfleet-status DIR REVISION`` it prints one
        JSON object (what the peer holds of that revision and how its own download or pull is
        going). With ``... KNOWN WAIT stream`` the channel stays open for the whole copy: a
        status line at once and at each change (at least every WAIT seconds), and for each
        request read on stdin, ``{"send": [PATH, ...]}``, each file of that revision folder as
        a JSON header line ``{"file", "size"}`` and its bytes. A path with ``..``, an absolute
        path, a symlink or anything but a regular file is not sent, nor anything of a folder
        holding a symlink that leads out of it (``{"file", "error"}`` instead). Anything else is
        refused.
    fanout_agent.py pull JOB
        On a receiving host (a transient ``systemd-run`` unit, started by ``operations.fanout``):
        ask the Hub (``HF_ENDPOINT``) for the revision's file list and hashes, then take every
        file a source peer has *verified* (its ``verified.jsonl``) over ssh, as soon as the peer
        has it (pipelined behind the peer's own download; only names and bytes: no owner, mode,
        device or link of the peer is kept), hash it against the Hub's sha256 / git blob id as
        it comes and record it in this host's ``verified.jsonl``, as the weights agent does. The
        Hub's file names are checked first, as the weights agent does (``hub_name_problem``, no
        symlink in the way): a bad one fails the pull before anything is copied or deleted. A
        file whose hash does not match is deleted: the weights agent, run next, fetches it from
        upstream. A source that fails, stalls or is unreachable gives way to the next one in
        ``sources``, then to upstream. The private key file is removed at the end.

    fanout_agent.py wait PROGRESS UPDATED_AT|none SECONDS
        Wait (at most SECONDS) until the pull's progress says it ended, or was written again
        since UPDATED_AT at least ``PROGRESS_SETTLE_SECONDS`` ago: the control machine's watch
        of a pull.

Progress of a pull goes to ``<state_dir>/fanout/<dir>.pull.json``.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import select
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import NamedTuple

SCHEMA = 1
STATUS_VERB = "specfleet-status"
STREAM_WORD = "stream"
# The most bytes one sendfile call moves.
SEND_CHUNK = 8 << 20
# What a receiver reads, hashes and writes at a time: large enough to cost little per byte,
# small enough that a file on its way grows on disk as it comes.
RECEIVE_CHUNK = 1 << 20
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


# How long a receiver's status request waits for news from its source: it asks again after
# that, so a stalled source is noticed (``stall_seconds``) with a delay of at most this.
STATUS_WAIT = 10.0
# A file on its way from a peer, next to where it goes (removed when a pull starts).
PART_SUFFIX = ".sf-part"
# The longest a status request may wait for news (a receiver asks again after it).
STATUS_WAIT_MAX = 30.0
# How often a waiting status request looks at the files it reports (a stat of each).
STATUS_LOOK_SECONDS = 0.1
# A status stream that says nothing for this long is dead (it answers every STATUS_WAIT).
STATUS_SILENT_SECONDS = 3 * STATUS_WAIT
# What a receiver keeps of a source's ssh client's stderr: its last lines, each cut short.
STDERR_LINES = 20
STDERR_LINE_BYTES = 4096
# The longest request line a status stream takes.
REQUEST_MAX_BYTES = 4 << 20
# The longest one status stream runs (the receiver opens another one after it).
STATUS_STREAM_SECONDS = 1800.0
# The least time between two answers of ``wait`` about a pull's progress (not its end).
PROGRESS_SETTLE_SECONDS = 10.0


class StatusRequest(NamedTuple):
    dir_name: str
    revision: str
    known: int = -1  # the verified files the receiver knows of; -1: answer at once
    wait: float = 0.0  # seconds to wait for news, at most
    stream: bool = False  # answer at each change, and send files, until the receiver hangs up


def parse_status_request(command: str) -> StatusRequest | None:
    """``specfleet-status DIR REVISION [KNOWN WAIT stream]`` -> StatusRequest; None for
    anything else (WAIT is capped at ``STATUS_WAIT_MAX``)."""
    parts = command.split()
    # A status at once (3 words), or a stream (6 words, the last ``stream``).
    stream = len(parts) == 6 and parts[5] == STREAM_WORD
    if stream:
        parts = parts[:5]
    if len(parts) != (5 if stream else 3) or parts[0] != STATUS_VERB:
        return None
    if not _DIR_RE.match(parts[1]) or ".." in parts[1] or not _REV_RE.match(parts[2]):
        return None
    if len(parts) == 3:
        return StatusRequest(parts[1], parts[2])
    if not re.fullmatch(r"[0-9]{1,9}", parts[3]) or not re.fullmatch(r"[0-9]{1,4}(\.[0-9]{1,3})?",
                                                                         parts[4]):
        return None
    return StatusRequest(parts[1], parts[2], int(parts[3]), min(float(parts[4]), STATUS_WAIT_MAX),
                         stream)


def parse_served(specs: list[str]) -> dict[str, str | None]:
    """``DIR=REVISION`` (a pinned commit) or ``DIR`` (a followed branch) -> {DIR: REVISION|None}.
    A spec that is neither is ignored (it serves nothing)."""
    out: dict[str, str | None] = {}
    for spec in specs:
        d, eq, rev = spec.rpartition("=") if "=" in spec else (spec, "", "")
        if not _DIR_RE.match(d) or ".." in d or (eq and not _REV_RE.match(rev)):
            continue
        out[d] = rev or None
    return out


# What of a peer's string is shown in a note (its journal line and the pull's progress).
SHOWN_MAX = 200
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def shown(value) -> str:
    """A string that came from a peer (a file name, an error), safe to print: control characters
    escaped (no terminal escape, no forged journal line), cut at ``SHOWN_MAX``; anything but a
    string as its ``repr``."""
    text = value if isinstance(value, str) else repr(value)
    text = _CONTROL_RE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX] + "..."


def bad_path(path) -> str | None:
    """Why a requested path is not even a name (None: it is a string to check further): a NUL
    byte or another control character, or no string at all."""
    if not isinstance(path, str):
        return "not a path"
    if _CONTROL_RE.search(path):
        return f"{shown(path)} holds a control character"
    return None


class Refused(Exception):
    """A request the serving side does not answer (the message goes to the client)."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _line(**fields) -> bytes:
    return (json.dumps(fields) + "\n").encode()


class ServeChannel:
    """The serving side of a status stream: requests come on stdin, one JSON object a line;
    answers go to stdout (statuses, and files: a header line and the bytes)."""

    def __init__(self, inp: int = 0, out: int = 1):
        self.inp, self.out, self._buf, self._hung_up = inp, out, b"", False

    def write(self, data: bytes) -> None:
        _write_all(self.out, data)

    def requests(self, timeout: float) -> list | None:
        """The requests that came within ``timeout`` seconds (maybe none); None once the
        receiver has hung up (its end of stdin closed) and every request was taken."""
        if self._hung_up:
            return None
        ready, _, _ = select.select([self.inp], [], [], timeout)
        if ready:
            data = os.read(self.inp, 1 << 16)
            self._buf += data
            # A line longer than any request (a list of a repository's file names) ends it too.
            self._hung_up = not data or len(self._buf) > REQUEST_MAX_BYTES
        *lines, self._buf = self._buf.split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except (ValueError, RecursionError):
                out.append(None)  # not JSON, or nested past the parser's depth: not a request
        return out


def open_under(root: str, parts: list[str]) -> int:
    """An fd of ``root/parts...`` read-only, each component opened from its parent's fd with
    ``O_NOFOLLOW`` (folders also ``O_DIRECTORY``): a symlink anywhere on the way, swapped in
    after any check, is refused (``ELOOP``/``ENOTDIR``), never followed. ``root`` itself is the
    trusted models root. ``O_NONBLOCK``: a FIFO does not hang the open."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        last = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=fd)
    finally:
        os.close(fd)
    return last


def send_file(root: str, parts: list[str], path: str, channel: ServeChannel) -> bool:
    """Send ``path`` (``root/parts...``: the models root, then DIR, REVISION and each component
    of the path, checked by ``served_folder``): a JSON line ``{"file", "size"}``, then exactly
    that many bytes (``sendfile``: no copy through Python); a path that is not a regular file
    reached through folders only (``open_under``: no symlink followed) gets ``{"file",
    "error"}`` instead. False if the file shrank while it was sent: the channel is out of
    step."""
    try:
        fd = open_under(root, parts)
    except OSError as e:
        channel.write(_line(file=path, error=e.strerror or "cannot open"))
        return True
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            channel.write(_line(file=path, error="not a regular file"))
            return True
        channel.write(_line(file=path, size=st.st_size))
        sent = 0
        while sent < st.st_size:
            n = os.sendfile(channel.out, fd, sent, min(SEND_CHUNK, st.st_size - sent))
            if n == 0:
                return False
            sent += n
    finally:
        os.close(fd)
    return True


def served_folder(path: str, served: dict[str, str | None],
                  resolved: dict[str, set[str]]) -> tuple[str, str, str]:
    """``DIR/REVISION[/PATH]`` as sent -> (DIR, REVISION, PATH as sent, or "."), when DIR is
    served and REVISION is its pinned commit (or, for a followed branch, one in ``resolved``)."""
    plain = re.sub(r"\\(.)", r"\1", path)
    parts = plain.split("/")
    if len(parts) < 2:
        raise Refused(f"{plain!r} is not served: ask for DIR/REVISION/")
    d, rev, rest = parts[0], parts[1], parts[2:]
    if rest and rest[-1] == "":
        rest = rest[:-1]
    want = {served[d]} if served.get(d) else resolved.get(d, set())
    if d not in served or not _REV_RE.match(rev) or rev not in want:
        raise Refused(f"{d}/{rev} is not served here (only the revision folders being fanned "
                      "out)")
    if any(x in ("", ".", "..") for x in rest):
        raise Refused(f"{plain!r} is not served: no '.', '..' or empty component")
    head = f"{d}/{rev}"
    if not path.startswith(head):
        raise Refused(f"{plain!r} is not served")
    tail = path[len(head):].lstrip("/")
    return d, rev, tail or "."


def symlink_out(folder: str) -> tuple[str, str] | None:
    """The first symlink under ``folder`` that resolves out of it: (its path, its target)."""
    base = os.path.realpath(folder)
    for dirpath, dirs, files in os.walk(folder):
        for n in sorted(dirs + files):
            full = os.path.join(dirpath, n)
            if os.path.islink(full):
                real = os.path.realpath(full)
                if real != base and not real.startswith(base + os.sep):
                    return os.path.relpath(full, folder), os.readlink(full)
    return None


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


def remove_parts(rev_dir: str) -> None:
    """Delete the files a killed pull left on their way (``PART_SUFFIX``)."""
    _weights_agent().remove_partial_files(rev_dir, PART_SUFFIX)


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
        if wa.hub_name_problem(path) is None and wa.still_matches(rev_dir, e):
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


def status_files(models_root: str, state_dir: str, dir_name: str, revision: str) -> list[str]:
    """The files a status is read from (a waiting request looks for a change in them)."""
    wa = _weights_agent()
    state = os.path.join(models_root, dir_name, revision, wa.STATE_DIR)
    return [os.path.join(state, wa.VERIFIED), os.path.join(state, wa.MANIFEST),
            weights_progress_path(state_dir, dir_name), pull_progress_path(state_dir, dir_name)]


def _stamp(paths: list[str]) -> tuple:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


def status_key(status: dict) -> tuple:
    """What of a status a receiver acts on: the files verified, and whether the copy ended."""
    w, p = status.get("weights") or {}, status.get("pull") or {}
    files = status.get("verified") or {}
    return (tuple(sorted((path, e.get("size"), e.get("hash")) for path, e in files.items())),
            bool(status.get("complete")), w.get("revision"), w.get("state"),
            p.get("rollout_id"), p.get("revision"), p.get("state"))


def stream_status(models_root: str, state_dir: str, req: StatusRequest, channel: ServeChannel,
                  send, clock=time.monotonic) -> int:
    """Answer ``req`` on one channel, a status line at once and then at each change a receiver
    acts on (``status_key``), or after ``req.wait`` seconds without one (so a silent channel
    means a dead one); and send the files the receiver asks for on it (``send(request)``; False:
    the channel is out of step, it ends). It ends when the receiver hangs up or after
    ``STATUS_STREAM_SECONDS``. One process per receiver and source for the whole copy, where a
    request each costs a connection and an interpreter start."""
    paths = status_files(models_root, state_dir, req.dir_name, req.revision)
    end = clock() + STATUS_STREAM_SECONDS
    stamp, key, sent_key, sent_at = None, None, None, float("-inf")
    status: dict = {}
    try:
        while clock() < end:
            now_stamp = _stamp(paths)
            if now_stamp != stamp:
                stamp = now_stamp
                status = status_of(models_root, state_dir, req.dir_name, req.revision)
                key = status_key(status)
            if key != sent_key or clock() - sent_at >= req.wait:
                channel.write((json.dumps(status) + "\n").encode())
                sent_key, sent_at = key, clock()
            requests = channel.requests(STATUS_LOOK_SECONDS)
            if requests is None:
                return 0
            for request in requests:
                if not send(request):
                    return 1
    except BrokenPipeError:
        return 0
    return 0


def request_sender(folder: str, dir_name: str, revision: str, served: dict[str, str | None],
                   resolved: dict[str, set[str]], channel: ServeChannel):
    """``send(request)`` for ``stream_status``: ``{"send": [PATH, ...]}``, each path under the
    revision folder (``served_folder``), none while the folder holds a symlink out of it. The
    file is then opened component by component from the models root (``open_under``), so a
    folder swapped for a symlink after this check is not followed either."""
    models_root = os.path.dirname(os.path.dirname(folder.rstrip("/")))

    def send(request) -> bool:
        paths = request.get("send") if isinstance(request, dict) else None
        if not isinstance(paths, list) or any(bad_path(p) for p in paths):
            why = next((bad_path(p) for p in paths or [] if bad_path(p)), None)
            channel.write(_line(file=None, error='not a request: {"send": [PATH, ...]}'
                                + (f" ({why})" if why else "")))
            return True
        plain = os.path.isdir(folder) and not os.path.islink(folder)
        link = symlink_out(folder) if plain else None
        for path in paths:
            try:
                if not plain:
                    raise Refused(f"{dir_name}/{revision} is not here (or not a plain folder)")
                if link is not None:
                    raise Refused(f"{dir_name}/{revision} is not served: it holds a symlink out "
                                  f"of it ({link[0]} -> {link[1]})")
                _d, _rev, tail = served_folder(f"{dir_name}/{revision}/{path}", served, resolved)
                if tail == ".":
                    raise Refused(f"{dir_name}/{revision} is a folder, not a file")
            except Refused as e:
                channel.write(_line(file=path, error=str(e)))
                continue
            parts = [dir_name, revision, *tail.split("/")]  # as sent: what the old open took
            if not send_file(models_root, parts, path, channel):
                return False
        return True

    return send


def resolved_revisions(state_dir: str, served: dict[str, str | None]) -> dict[str, set[str]]:
    """For each served folder that follows a branch: the revisions this host resolved (its own
    download's, its own pull's)."""
    wa = _weights_agent()
    out: dict[str, set[str]] = {}
    for d, rev in served.items():
        if rev is None:
            found = {(wa.read_json(path) or {}).get("revision")
                     for path in (weights_progress_path(state_dir, d),
                                  pull_progress_path(state_dir, d))}
            out[d] = {r for r in found if isinstance(r, str) and _REV_RE.match(r)}
    return out


def cmd_serve(models_root: str, state_dir: str, specs: list[str]) -> int:
    command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    served = parse_served(specs)
    resolved = resolved_revisions(state_dir, served)
    try:
        req = parse_status_request(command)
        if req is None:
            raise Refused("only status requests are allowed")
        served_folder(f"{req.dir_name}/{req.revision}/", served, resolved)
    except Refused as e:
        sys.stderr.write(f"specfleet fan-out: {e}\n")
        return 1
    if not req.stream:
        print(json.dumps(status_of(models_root, state_dir, req.dir_name, req.revision)),
              flush=True)  # fmt: skip
        return 0
    channel = ServeChannel()
    folder = os.path.join(models_root, req.dir_name, req.revision)
    return stream_status(models_root, state_dir, req, channel, request_sender(
        folder, req.dir_name, req.revision, served, resolved, channel))


# ----------------------------------------------------------------------------------------------
# pull: a receiving host
# ----------------------------------------------------------------------------------------------


def now() -> float:
    return round(time.time(), 3)


class Received(NamedTuple):
    """One answer of a source to a file asked for, as ``Pull.receive`` took it."""

    path: str  # the path asked for (as shown, for an answer to nothing asked)
    entry: dict | None  # for verified.jsonl: size, mtime_ns, ino of the file written, its hash
    problem: str = ""  # why it was not taken ("" when ``entry``)
    broken: bool = False  # the channel is out of step: nothing after it can be read
    corrupt: bool = False  # it came whole with other bytes than the Hub's: upstream's
    hostile: bool = False  # an answer to nothing asked (or a second one): take nothing more


class SourceChannel:
    """A receiver's end of a source's ``stream_status``: the ssh client, and a thread that reads
    what comes on it: statuses, and the files asked for with ``send`` (each handed to
    ``receive(stream, header, asked)`` as it comes, which writes it and gives a ``Received``).
    ``asked``: the files asked for on this channel and not answered yet, ``{path: Hub entry}``;
    an answer for anything else means the source is out of step or hostile (``hostile``)."""

    def __init__(self, argv: list[str], receive):
        self.asked: dict[str, dict] = {}
        self.hostile = ""
        # A file asked for did not come within the stall time while the channel stayed open.
        self.stalled = False
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        # Bounded whatever the source sends: the newest status alone (a new one replaces it),
        # and the last lines of the client's stderr, each cut short.
        self._status_lock = threading.Condition()
        self._status: dict | None = None
        self._fresh = False
        self._done = False
        self._err: collections.deque = collections.deque(maxlen=STDERR_LINES)
        self._files: queue.Queue = queue.Queue()
        self._receive = receive
        self._ended = False
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_err(self) -> None:
        try:
            while line := self.proc.stderr.readline(STDERR_LINE_BYTES):
                self._err.append(line.decode("utf-8", "replace").rstrip("\n"))
        except (OSError, ValueError):
            pass

    def _put_status(self, msg: dict | None) -> None:
        with self._status_lock:
            if msg is None:
                self._done = True
            else:
                self._status, self._fresh = msg, True
            self._status_lock.notify_all()

    def _read(self) -> None:
        try:
            while line := self.proc.stdout.readline(1 << 20):
                try:
                    msg = json.loads(line)
                except (ValueError, RecursionError):
                    break  # out of step: nothing after it can be trusted
                if not isinstance(msg, dict):
                    break
                if "file" not in msg:
                    self._put_status(msg)
                    continue
                event = self._receive(self.proc.stdout, msg, self.asked)
                if event.hostile:
                    self.hostile = event.problem
                self._files.put(event)
                if event.broken:
                    break
        except (OSError, ValueError):
            pass
        finally:
            self._put_status(None)  # the channel ended
            self._files.put(None)

    def send(self, paths: list[str]) -> bool:
        """Ask for ``paths``; False if the channel is closed."""
        try:
            self.proc.stdin.write((json.dumps({"send": paths}) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    def latest(self, timeout: float) -> dict | None:
        """The newest status: at once if some came since the last call, else the next one
        within ``timeout`` seconds; None once the channel ended or went silent that long."""
        if self._ended:
            return None
        with self._status_lock:
            self._status_lock.wait_for(lambda: self._fresh or self._done, timeout)
            self._ended = self._done
            if not self._fresh:
                return None
            self._fresh = False
            return self._status

    def next_file(self, timeout: float) -> tuple | None:
        """The next file asked for, as ``receive`` gave it; None if the channel ended first or
        nothing came for ``timeout`` seconds."""
        try:
            return self._files.get(timeout=timeout)
        except queue.Empty:
            return None

    def error(self) -> str:
        """Why the channel ended or went silent, from the ssh client."""
        if self._ended:
            # Its output closed: the client's exit follows at once, but may not be reaped yet.
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            return f"no answer for {STATUS_SILENT_SECONDS:g} s"
        lines = [line for line in list(self._err) if line.strip()]
        return shown(lines[-1]) if lines else f"ssh exit {self.proc.returncode}"

    def close(self) -> None:
        """Hang up (the source's end sees its stdin close and exits), then make sure."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


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

    def channel(self, source: dict, dir_name: str, revision: str, rev_dir: str
                ) -> SourceChannel:
        """One ssh channel to ``source`` for the whole copy from it: its status at once and at
        each change (``stream_status``), and the files this pull asks for."""
        request = f"{STATUS_VERB} {dir_name} {revision} 0 {STATUS_WAIT:g} {STREAM_WORD}"
        return SourceChannel(self.ssh(source) + [f"root@{source['address']}", request],
                             lambda stream, head, asked: self.receive(stream, head, rev_dir,
                                                                      asked))

    def copy(self, channel: SourceChannel, source: dict, paths: list[str], rev_dir: str,
             wanted: dict[str, dict], timeout: float) -> tuple[int, list[str], str]:
        """Ask ``source`` for ``paths`` and record each as it lands (hashed as it came, while
        the next one comes): (files recorded, paths it could not give, what broke the
        channel or "")."""
        for p in paths:
            channel.asked[p] = wanted[p]
        if not channel.send(paths):
            return 0, [], channel.error()
        got, failed = 0, []
        for _ in paths:
            event = channel.next_file(timeout)
            if event is None:
                # A request left unanswered for ``timeout`` (the stall clock, from the first
                # unanswered request): this source is given no further round.
                channel.stalled = channel.proc.poll() is None
                return got, failed, channel.error()
            if event.problem:
                self.note(f"{shown(event.path)}: from {source['host']}: {event.problem}")
                if event.corrupt:
                    wanted.pop(event.path, None)
                    self.data["corrupt"].append(event.path)
                elif event.path in wanted and not event.hostile:
                    failed.append(event.path)
                if event.broken:
                    return got, failed, event.problem
                continue
            got += self.record(source, event, rev_dir, wanted)
        return got, failed, ""

    def receive(self, stream, head: dict, rev_dir: str, asked: dict[str, dict]) -> Received:
        """One file on a channel (in its reading thread), only one asked for on it and not
        answered yet (it is answered now: a second copy is refused). Written under a temporary
        name of its own (created exclusively), hashed as it comes (one pass), synced, and
        renamed into place only when its hash is the Hub's; what verified.jsonl gets (size,
        mtime, inode) is read from that same open file, never from the path again. Nothing of
        the peer is kept but names and bytes: no owner, mode, device or link."""
        path = head.get("file")
        f = asked.pop(path, None) if isinstance(path, str) else None
        if f is None:
            return Received(shown(path), None, "sent a file it was not asked for (or a second "
                            "copy of one); nothing more is taken from this source", True,
                            hostile=True)
        if "error" in head:
            return Received(path, None, f"not sent ({shown(head['error'])})")
        size = head.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return Received(path, None, "an unreadable answer", True)
        if f["size"] != size:
            left = size  # read past it: the channel stays in step
            while left and (chunk := stream.read(min(RECEIVE_CHUNK, left))):
                left -= len(chunk)
            return Received(path, None, f"{size} bytes sent, the Hub lists {f['size']}",
                            bool(left))
        try:
            local = self.wa.local_path(rev_dir, path, self.job["repo_id"])
        except self.wa.UnsafeName as e:  # never after run()'s check; nothing is written
            left = size  # read past it: the channel stays in step
            while left and (chunk := stream.read(min(RECEIVE_CHUNK, left))):
                left -= len(chunk)
            return Received(path, None, f"{e}; not taken", bool(left))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        kind, want = self.wa.expected_hash(f)
        digest = self.wa.new_digest(kind, size)
        # mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW, a name no one else has.
        fd, part = tempfile.mkstemp(prefix=f".{os.path.basename(local)}.",
                                    suffix=PART_SUFFIX, dir=os.path.dirname(local))
        try:
            with os.fdopen(fd, "wb") as out:
                left = size
                while left:
                    chunk = stream.read(min(RECEIVE_CHUNK, left))
                    if not chunk:
                        return Received(path, None, "the channel ended in the middle of it", True)
                    out.write(chunk)
                    digest.update(chunk)
                    left -= len(chunk)
                got = digest.hexdigest()
                if got != want:
                    return Received(path, None, f"does not match the Hub's {kind} ({got[:16]} "
                                    f"!= {want[:16]}); left for upstream", corrupt=True)
                out.flush()
                os.fchmod(out.fileno(), 0o644)
                os.fsync(out.fileno())
                st = os.fstat(out.fileno())
            os.replace(part, local)
            part = ""
        finally:
            if part:
                os.unlink(part)
        return Received(path, {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                               "ino": st.st_ino, "hash_kind": kind, "hash": got})

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> int:
        wa, j = self.wa, self.job
        wa.setup_env(j)
        try:
            sha, files = wa.remote_files(j)
            rev_dir = os.path.join(j["root"], sha)
            # Every name, before anything is copied, written or deleted under the revision.
            wa.check_names(j["repo_id"], sha, files)
            for f in files:
                wa.local_path(rev_dir, f["path"], j["repo_id"], sha)
        except Exception as e:  # noqa: BLE001 - every hub error becomes a clear message
            self.data["error"] = wa.classify_error(e, j["repo_id"], j["revision"],
                                                   wa.endpoint_of(j), wa.has_token(j))
            self.data["state"] = "failed"
            self.note(f"failed: {self.data['error']['message']}")
            return 1
        dir_name = os.path.basename(j["root"].rstrip("/"))
        os.makedirs(os.path.join(rev_dir, wa.STATE_DIR), exist_ok=True)
        remove_parts(rev_dir)
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
        not_given: set[str] = set()  # files this source could not send: the next source's
        channel = None
        try:
            while wanted:
                if channel is None:
                    channel = self.channel(source, dir_name, sha, rev_dir)
                st = channel.latest(STATUS_SILENT_SECONDS)
                if st is None:
                    failures += 1
                    error = channel.error()
                    channel.close()
                    channel = None
                    if failures >= 3 or time.monotonic() - last_progress > stall_s:
                        self.note(f"{source['host']} unreachable for the peer copy "
                                  f"({error}); trying the next source")
                        return
                    time.sleep(poll)
                    continue
                failures = 0
                paths = [p for p in available(st, wanted, wa.expected_hash) if p not in not_given]
                if paths:
                    got, failed, broke = self.copy(channel, source, paths, rev_dir, wanted,
                                                   stall_s)
                    not_given.update(failed)
                    if channel.hostile:
                        self.note(f"{source['host']} answered what was not asked of it; "
                                  "trying the next source")
                        return
                    if channel.stalled:
                        # One file a round then silence would hold this receiver files x the
                        # stall time: a stall ends this source, whatever it sent before.
                        self.note(f"{source['host']} left a file asked for unanswered for "
                                  f"{stall_s:.0f} s ({got} came); trying the next source")
                        return
                    if not got and (broke or failed):
                        self.note(f"the copy from {source['host']} failed "
                                  f"({broke or 'nothing came'}); trying the next source")
                        return
                    if broke:
                        channel.close()
                        channel = None
                    last_progress = time.monotonic()
                    continue
                if source_finished(st, sha, j["rollout_id"]):
                    return
                if time.monotonic() - last_progress > stall_s:
                    self.note(f"{source['host']} made no progress for {stall_s:.0f} s; trying "
                              "the next source")
                    return
        finally:
            if channel is not None:
                channel.close()

    def record(self, source: dict, event: Received, rev_dir: str,
               wanted: dict[str, dict]) -> int:
        """Record a file ``receive`` took whole, hashed and renamed into place: what it read of
        the file it wrote (the path is not looked at again: a file put there since does not
        match the inode, and no fast check trusts it)."""
        wa = self.wa
        p, e = event.path, event.entry
        entry = {"path": p, **e, "at": now(), "from": source["host"]}
        with open(os.path.join(rev_dir, wa.STATE_DIR, wa.VERIFIED), "a") as out:
            out.write(json.dumps(entry) + "\n")
            out.flush()
            os.fsync(out.fileno())
        wanted.pop(p, None)
        self.data["files_done"] += 1
        self.data["files_from_peers"] += 1
        self.data["bytes_from_peers"] += e["size"]
        by = self.data["by_source"]
        by[source["host"]] = by.get(source["host"], 0) + e["size"]
        self.write()
        return 1

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


PULL_ENDED = ("done", "partial", "failed")


def progress_news(progress: dict | None, seen: float | None) -> bool:
    """Whether a pull's progress is news to a watcher that saw ``seen`` (its ``updated_at``;
    None: no progress yet): it was written again, or the pull has ended."""
    progress = progress or {}
    return progress.get("updated_at") != seen or progress.get("state") in PULL_ENDED


def cmd_wait(progress_path: str, seen: float | None, seconds: float, clock=time.monotonic,
             sleep=time.sleep, settle: float = PROGRESS_SETTLE_SECONDS) -> int:
    """Return once the pull has ended, or its progress is news (``progress_news``) and at least
    ``settle`` seconds have passed (at once on the first look, ``seen`` None); at most after
    ``seconds`` (capped at ``STATUS_WAIT_MAX``). The control machine's watch of a pull costs a
    round trip per ``settle`` seconds of progress, and sees its end at once."""
    wa = _weights_agent()
    start = clock()
    deadline = start + min(seconds, STATUS_WAIT_MAX)
    stamp: tuple | None = ()
    while clock() < deadline:
        now_stamp = _stamp([progress_path])
        if now_stamp != stamp:  # read again only when the pull wrote it
            stamp = now_stamp
            progress = wa.read_json(progress_path)
            if (progress or {}).get("state") in PULL_ENDED:
                break
            news = progress_news(progress, seen)
        if news and (seen is None or clock() - start >= settle):
            break
        sleep(STATUS_LOOK_SECONDS)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "serve":
        return cmd_serve(argv[1], argv[2], argv[3:])
    if len(argv) == 4 and argv[0] == "wait":
        seen = None if argv[2] == "none" else float(argv[2])
        return cmd_wait(argv[1], seen, float(argv[3]))
    if len(argv) == 2 and argv[0] == "pull":
        with open(argv[1]) as f:
            return cmd_pull(json.load(f))
    sys.stderr.write("usage: fanout_agent.py serve MODELS_ROOT STATE_DIR DIR=REV|DIR ... | "
                     "pull JOB.json | wait PROGRESS.json UPDATED_AT|none SECONDS\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
