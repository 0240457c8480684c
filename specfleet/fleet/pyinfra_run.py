"""Running deploy files with pyinfra for the fleet controllers, and reading what each host did.

The controllers run deploy files by path, as pyinfra's own CLI does: from the checkout (the
current directory, or ``SPECFLEET_CHECKOUT``), never by importing ``deploys``/``operations``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from specfleet.core.errors import SpecfleetError

CHECKOUT_ENV = "SPECFLEET_CHECKOUT"
# Operations that check rather than change (serving.ready always runs its gate, so pyinfra counts
# it as a change): they do not make a host "changed".
CHECK_OP = re.compile(r"\breadiness\b", re.IGNORECASE)
OK, CHANGED, FAILED, ROLLED_BACK, NOT_STARTED = (
    "ok", "changed", "failed", "rolled back", "not started",
)  # fmt: skip
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def checkout_dir(checkout: str | None = None) -> Path:
    """The deploy repository: ``checkout``, else ``$SPECFLEET_CHECKOUT``, else the current
    directory, else the checkout this package was installed editable from."""
    candidates = [checkout, os.environ.get(CHECKOUT_ENV), os.getcwd(),
                  str(Path(__file__).resolve().parents[2])]
    for c in candidates:
        if c and (Path(c) / "deploys" / "kimi_k26.py").is_file():
            return Path(c).resolve()
    raise SpecfleetError(
        "no specfleet checkout here: the fleet commands run the deploy files of a checkout "
        "(deploys/kimi_k26.py not found in the current directory)",
        fix=f"run from the checkout, or pass --checkout PATH (or set {CHECKOUT_ENV})",
    )


def _absolute(path: str) -> str:
    """A file given relative to where the user stands, for a run in the checkout."""
    return os.path.abspath(path) if os.path.exists(path) else path


def deploy_path(name: str, checkout: str | None = None) -> Path:
    """A deploy file of the checkout, by name (``deploys/<name>``)."""
    return checkout_dir(checkout) / "deploys" / name


@dataclass
class HostStep:
    """One host in one pyinfra run."""

    status: str  # "ok", "changed", "failed", "unreachable"
    changed_ops: list[str] = field(default_factory=list)
    error_ops: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status in (OK, CHANGED)


def _clean(line: str) -> str:
    return ANSI.sub("", line).rstrip()


def _host_lines(lines: list[str], host: str) -> list[str]:
    tag = f"[{host}]"
    return [ln.strip() for ln in lines if tag in ln]


def parse_step(stdout: str, stderr_lines: list[str], hosts: Sequence[str]) -> dict[str, HostStep]:
    """Per-host results of ``pyinfra -y --json ... --limit h ...`` from its JSON (stdout) and log
    (stderr). Without JSON (pyinfra stops with "No hosts remaining!" when every host failed), each
    host failed; a host that never connected is "unreachable"."""
    lines = [_clean(ln) for ln in stderr_lines]
    unreachable: dict[str, str] = {}
    connecting = False
    for ln in lines:
        if ln.startswith("--> "):
            connecting = ln.startswith("--> Connecting")
            continue
        if connecting:
            m = re.search(r"\[([^\]]+)\]\s+(.*)", ln)
            if m and m.group(1) in hosts and not m.group(2).startswith("Connected"):
                unreachable[m.group(1)] = m.group(2).strip()
    try:
        payload = json.loads(stdout) if stdout.strip() else None
    except json.JSONDecodeError:
        payload = None
    results = (payload or {}).get("results") or None
    out: dict[str, HostStep] = {}
    for host in hosts:
        if host in unreachable:
            out[host] = HostStep("unreachable", why=[f"unreachable: {unreachable[host]}"])
            continue
        if results is None:
            why = _why(lines, host) or _general_error(lines) or ["pyinfra gave no result"]
            out[host] = HostStep(FAILED, why=why)
            continue
        step = HostStep(OK)
        for op in results.get("operations", []):
            if host in op.get("success", []) and not CHECK_OP.search(op.get("name", "")):
                step.changed_ops.append(op["name"])
            if host in op.get("error", []):
                step.error_ops.append(op["name"])
        if host in results.get("failed_hosts", []) or step.error_ops:
            step.status = FAILED
            step.why = _why(lines, host) or [f"failed in {', '.join(step.error_ops) or 'pyinfra'}"]
        elif step.changed_ops:
            step.status = CHANGED
        out[host] = step
    return out


STATUS_WORDS = ("Success", "No changes", "Connected", "Skipped", "Ready:", "Loading:")


def _why(lines: list[str], host: str) -> list[str]:
    """Why ``host`` failed, from pyinfra's log: the name of the operation that failed and the last
    lines the host printed in it (progress lines of the readiness gate left out), with the fix a
    specfleet error gives on the line after it."""
    tag = f"[{host}]"
    op: str | None = None
    said: list[str] = []
    failed: tuple[str | None, list[str]] | None = None
    last: str | None = None  # the host that printed the last tagged line
    for ln in lines:
        if ln.startswith("--> Starting operation:"):
            op, said = ln.split(":", 1)[1].strip(), []
            continue
        m = re.search(r"\[([^\]]+)\]", ln)
        if m is None or ln.lstrip().startswith("|"):
            # A specfleet error's fix is on a line of its own, after the journal excerpt.
            if last == host and ln.strip().startswith("fix:"):
                said.append(ln.strip()[:300])
            continue
        last = m.group(1)
        if tag not in ln:
            continue
        text = ln.split(tag, 1)[1].strip()
        if text.startswith("Error"):
            failed = (op, said if said else [text])
            continue
        if text.startswith(STATUS_WORDS) or text.startswith("gate: ") or not text:
            continue
        said.append(text[:300])
    if failed is None:
        return []
    name, texts = failed
    texts = texts[-3:]
    if name:
        texts[0] = f"in '{name}': {texts[0]}"
    return texts


def _general_error(lines: list[str]) -> list[str]:
    """pyinfra's own error, when it names no host ("--> An internal exception occurred:" ...)."""
    for i, ln in enumerate(lines):
        if ln.startswith(("--> An internal exception occurred", "--> pyinfra error")):
            rest = [x.strip() for x in lines[i + 1 :] if x.strip() and not x.startswith("-->")]
            return rest[-1:] or [ln[4:]]
    return []


# --------------------------------------------------------------------------------------------------
# Pure: the per-host report
# --------------------------------------------------------------------------------------------------


@dataclass
class StepRun:
    name: str
    hosts: list[str]
    rc: int
    seconds: float
    results: dict[str, HostStep]


def say(text: str) -> None:
    print(f"rollout: {text}", file=sys.stderr, flush=True)


_HANDED_DOWN: list[int] = []


def handed_down() -> tuple[int, ...]:
    """The file descriptors a pyinfra run started now inherits (the fan-out's in-memory plan)."""
    return tuple(_HANDED_DOWN)


@contextmanager
def hand_down(fd: int) -> Iterator[None]:
    """The pyinfra runs started in the block inherit ``fd`` (a file their deploy reads)."""
    _HANDED_DOWN.append(fd)
    try:
        yield
    finally:
        _HANDED_DOWN.remove(fd)


_RUNNING: set[subprocess.Popen] = set()


@contextmanager
def tracked(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``stop_runs`` stops ``proc`` while the block runs."""
    _RUNNING.add(proc)
    try:
        yield proc
    finally:
        _RUNNING.discard(proc)


def stop_runs() -> None:
    """Ask every pyinfra run of this process to stop (SIGTERM; safe in a signal handler): each
    ``run_pyinfra`` then returns what its hosts did so far."""
    for proc in list(_RUNNING):
        if proc.poll() is None:
            proc.terminate()


def _stop(proc: subprocess.Popen) -> None:
    """End a pyinfra run this process started (the controller is stopping)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_pyinfra(inventory: str, deploy: str, hosts: Sequence[str], name: str) -> StepRun:
    """``pyinfra -y --json INVENTORY DEPLOY --limit h ...``: its log streams to our stderr. It runs
    in the checkout, as pyinfra puts the working directory on sys.path for the deploy's imports."""
    argv = [sys.executable, "-m", "pyinfra", "-y", "--json"]
    for host in hosts:
        argv += ["--limit", host]
    argv += [_absolute(inventory), _absolute(deploy)]
    say(f"{name}: {', '.join(hosts)}")
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
        cwd=checkout_dir(), pass_fds=handed_down(),
    )
    stderr_lines: list[str] = []

    def pump() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            stderr_lines.append(line)
            sys.stderr.write(f"  {name} | {line}")
        sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        with tracked(proc):
            stdout = proc.stdout.read()  # type: ignore[union-attr]
            rc = proc.wait()
    except BaseException:  # Ctrl-C, SIGTERM (the fan-out's handler), anything: no run left over
        _stop(proc)
        raise
    reader.join(timeout=30)
    seconds = time.monotonic() - start
    results = parse_step(stdout, stderr_lines, hosts)
    return StepRun(name, list(hosts), rc, seconds, results)


