"""Preflight checks and the per-host run lock, before anything on a host changes."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import socket
import sys
import time
import uuid
import weakref
from typing import Any

import gevent
import gevent.event
from paramiko import SSHException
from pyinfra import host, logger, state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.state import BaseStateCallback
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_host
from pyinfra.facts.files import File

from facts import cache
from facts.cache import cached_fact, cached_gather
from facts.net import NetworkInterfaces, RdmaPorts, TcpReach
from facts.preflight import RunLock, SGLangWheel, WritableByOthers
from facts.probe import MARK as PROBE_MARK
from facts.probe import default_specs
from facts.serving import ServiceState, UnitFiles
from facts.weights import WeightsState
from operations.probe import deploy_specs
from operations.readiness import probe_spec
from operations.server_facts import (
    group_peers,
    host_address,
    service_state_args,
    trust_args,
    unit_files_args,
)
from operations.util import fails_host, record_failure
from operations.weights import control_token, control_token_path
from specfleet.core import preflight as pure
from specfleet.core import runlock
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import lock_path, model_root, sglang_python
from specfleet.core.plan.group import NET, RDMA, GroupMember
from specfleet.core.resources import hostside_path
from specfleet.core.settings import Settings
from specfleet.hostside.run_lock import MARK

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


# --------------------------------------------------------------------------------------------------
# The run lock: who this run is (the control machine, the process, the run), and the lease
# --------------------------------------------------------------------------------------------------

RUN_ID_ENV = runlock.RUN_ID_ENV
LEASE_ENV = runlock.LEASE_ENV
_RUN_ID: list[str] = []


def _first_line(*paths: str) -> str | None:
    for path in paths:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            return text
    return None


def _pid_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a recycled pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_namespace() -> int | None:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``): a pid means one
    process only within it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def run_id() -> str:
    """This run's id: ``SPECFLEET_RUN_ID`` (a controller sets it, so its steps are one owner),
    else one made for this process."""
    env = os.environ.get(RUN_ID_ENV, "").strip()
    if env:
        return env
    if not _RUN_ID:
        _RUN_ID.append(runlock.new_run_id())
    return _RUN_ID[0]


def lease_seconds() -> float:
    """The lease: ``SPECFLEET_LOCK_LEASE_S`` (tests shorten it), else 180 s."""
    try:
        value = float(os.environ.get(LEASE_ENV, ""))
    except ValueError:
        return runlock.DEFAULT_LEASE_S
    return value if value > 0 and value == value else runlock.DEFAULT_LEASE_S


def _me() -> dict[str, Any]:
    """The owner this run writes into the lock (``specfleet.core.runlock``)."""
    return {**_this_process(os.getpid()), "run_id": run_id(), "started": time.time()}


@functools.lru_cache(maxsize=4)
def _this_process(pid: int) -> dict[str, Any]:
    # Read once per process (keyed by pid: a fork is another owner), not once per host.
    return {
        "owner": f"{os.environ.get('USER', 'root')}@{socket.gethostname()}",
        "control_host": socket.gethostname(),
        "machine_id": _first_line("/etc/machine-id", "/var/lib/dbus/machine-id"),
        "boot_id": _first_line("/proc/sys/kernel/random/boot_id"),
        "pid_ns": _pid_namespace(),
        "pid": pid,
        "pid_start": _pid_start(pid),
        "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)),
    }


def _alive(pid: int, pid_start: int | None = None) -> bool:
    """Whether ``pid`` is a live process on this machine, and the one that started at
    ``pid_start`` where both start times are known."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if pid_start is not None:
        now = _pid_start(pid)
        if now is not None and now != pid_start:
            return False
    return True


def lock_verdict(held: dict | None, me: dict, alive,
                 host_now: float | None = None) -> tuple[str, str | None]:
    """``specfleet.core.runlock.lock_verdict`` with this run's lease (pure)."""
    if host_now is None and held:
        host_now = held.get("host_now")
    return runlock.lock_verdict(held, me, alive, host_now, lease_seconds())


def _lock_source() -> str:
    text = hostside_path("run_lock.py").read_text()
    if text.startswith('"""'):  # the docstring is for readers here, not bytes on every run
        text = text[text.index('"""', 3) + 3 :].lstrip("\n")
    return text


LOCK_SOURCE = _lock_source()


def lock_command(mode: str, path: str, lease_s: float, *args: str) -> StringCommand:
    """The host-side lock script (``specfleet/hostside/run_lock.py``) for one ``mode``."""
    return StringCommand(
        "python3", "-I", "-S", "-c", QuoteString(LOCK_SOURCE), mode, QuoteString(path),
        f"{lease_s:g}", *(QuoteString(a) for a in args),
    )


def parse_lock_output(lines: list[str]) -> tuple[str, dict] | None:
    """``(status, value)`` from the lock script's line, or None when it printed none."""
    for line in lines:
        if line.startswith(MARK + " "):
            _, status, text = line.split(" ", 2)
            try:
                value = json.loads(text)
            except ValueError:
                return None
            return status, value if isinstance(value, dict) else {}
    return None


@dataclasses.dataclass
class _Holding:
    """A lock this process holds on one host, and its heartbeat."""

    path: str
    token: str
    lease_s: float
    args: dict[str, Any]
    stop: Any = None
    beat: Any = None
    # Kept for the whole run (``lock(keep=True)``, a controller's): its steps re-enter it, and
    # only the end of the run (pyinfra's disconnect) releases it.
    kept: bool = False
    # Joined: the lock of another process of this run (its token): renewed, never released.
    joined: bool = False


# host -> what this process holds there (weak: a host dies with its State).
_HELD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Connector arguments that would be wrong for the lock's own commands.
_NOT_FOR_LOCK = {"_stdin", "_timeout", "_success_exit_codes", "_get_pty", "_retries"}


def _connector_args() -> dict[str, Any]:
    args = getattr(host, "current_op_global_arguments", None) or {}
    return {k: v for k, v in args.items() if k in CONNECTOR_ARGUMENT_KEYS and
            k not in _NOT_FOR_LOCK}


# A renewal or release waits at most this long: on a host cut off mid-run (its SSH channel
# would wait for paramiko's hour-long channel timeout) the lease then simply runs out.
LOCK_IO_TIMEOUT_S = 20.0


def _run_lock(h: Any, holding: _Holding, mode: str) -> tuple[str, dict] | None:
    try:
        with gevent.Timeout(LOCK_IO_TIMEOUT_S, TimeoutError):
            _, output = h.run_shell_command(
                lock_command(mode, holding.path, holding.lease_s, holding.token),
                print_output=False, print_input=False, **holding.args,
            )
    except Exception as exc:  # noqa: BLE001 - a lost connection: the lease ends by itself
        logger.warning(f"{h.print_prefix}run lock {mode} failed ({exc or type(exc).__name__}): "
                       "its lease runs out by itself")
        return None
    return parse_lock_output(output.stdout_lines)


def _heartbeat(h: Any, holding: _Holding) -> None:
    """Renew the lease every ``lease_s / 4`` while this run holds the lock (a greenlet of this
    control process, over the host's own pyinfra connection)."""
    interval = holding.lease_s / runlock.RENEWALS_PER_LEASE
    while not holding.stop.wait(interval):
        result = _run_lock(h, holding, "renew")
        if holding.stop.is_set() or result is None:
            continue
        status, value = result
        if status == "lost":
            message = runlock.lost_message(holding.path, value.get("held"), value.get("now"),
                                           holding.lease_s)
            # From now on every command to this host fails with this (``_hook_host``).
            h._specfleet_lock_lost = SpecfleetError(message, host=h.name,
                                                    fix=runlock.LOST_FIX).render()
            logger.error(f"{h.print_prefix}{message}")
            _forget(h)
            return


def _forget(h: Any) -> _Holding | None:
    holding = _HELD.pop(h, None)
    if holding is not None and holding.stop is not None:
        holding.stop.set()
    return holding


def release_held(h: Any, why: str = "") -> None:
    """Release the lock this process holds on ``h`` (if any): one command, only then."""
    holding = _forget(h)
    if holding is None or holding.joined:  # a joined lock is its holder's to release
        return
    result = _run_lock(h, holding, "release")
    if result is not None and result[0] == "released" and why:
        logger.info(f"{h.print_prefix}run lock {holding.path} released ({why})")


class _ReleaseOnFailure(BaseStateCallback):
    """Releases the lock of a host as soon as an operation fails it: pyinfra runs none of the
    host's later operations, "Release the run lock" among them."""

    @staticmethod
    def operation_host_error(state: Any, h: Any, op_hash: Any, retry_count: int = 0,
                             max_retries: int = 0) -> None:
        try:
            ignored = state.get_op_data_for_host(h, op_hash).global_arguments.get(
                "_ignore_errors")
        except Exception:  # noqa: BLE001 - unknown: the host may go on, keep the lock
            ignored = True
        holding = _HELD.get(h)
        if not ignored and not (holding is not None and holding.kept):
            release_held(h, "the host failed")


class ConnectionLost(SpecfleetError, SSHException):
    """The SSH connection to a host broke under a command (the link cut, sshd gone)."""

    def __init__(self, cause: BaseException, host_name: str) -> None:
        detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        super().__init__(
            f"the SSH connection to the host was lost ({detail}); the step was not done",
            host=host_name,
            fix="check that the host is reachable (network, sshd) and run again: the deploy "
            "goes on from where the host is",
        )
        # pyinfra shows a failed command's SSHException as ClassName(args): one line, its host
        # already in pyinfra's prefix.
        self.args = (f"{self.problem}; fix: {self.fix}",)


def _hook_host(h: Any) -> None:
    """Release the lock when pyinfra disconnects from the host: the CLI does that in a
    ``finally`` on every exit path (success, failed hosts, an error, Ctrl-C). And once the run
    lost its lock (the heartbeat found another run's lock, or none), every command and upload
    to the host fails with why: the run stops changing a host it no longer holds, and pyinfra
    fails the host at the operation that tried."""
    if getattr(h, "_specfleet_lock_hooked", False):
        return
    disconnect, run_shell_command, put_file = h.disconnect, h.run_shell_command, h.put_file

    def release_then_disconnect() -> None:
        try:
            release_held(h, "the run ends")
        finally:
            disconnect()

    def run_unless_lost(*args: Any, **kwargs: Any):
        said = getattr(h, "_specfleet_lock_lost", None)
        if said is None:
            try:
                return run_shell_command(*args, **kwargs)
            except ConnectionLost:
                raise
            except (EOFError, SSHException, ConnectionError) as exc:
                # paramiko's EOFError on a dead link, raised while an operation reads a fact,
                # reaches pyinfra as a traceback: said as the host's lost connection instead
                # (an SSHException: pyinfra fails the command; a SpecfleetError: fails_host
                # fails the step; the readiness gate says it its own way).
                raise ConnectionLost(exc, h.name) from None
        record_failure(h.state, h, said, styled=True)
        return False, CommandOutput([OutputLine("stderr", said)])

    def put_unless_lost(*args: Any, **kwargs: Any) -> bool:
        said = getattr(h, "_specfleet_lock_lost", None)
        if said is None:
            return put_file(*args, **kwargs)
        record_failure(h.state, h, said, styled=True)
        return False

    h.disconnect = release_then_disconnect
    h.run_shell_command = run_unless_lost
    h.put_file = put_unless_lost
    h._specfleet_lock_hooked = True
    st = h.state
    if not any(isinstance(c, _ReleaseOnFailure) for c in st.callback_handlers):
        st.add_callback_handler(_ReleaseOnFailure())


def _hold(h: Any, path: str, mine: dict, lease_s: float, args: dict[str, Any],
          joined: bool = False) -> None:
    """Remember the lock taken (or ``joined``) on host ``h`` (the Host itself, not pyinfra's
    context proxy: the heartbeat and the exit path run outside any context), renew it while the
    run lives, release it at exit (a taken one only)."""
    old = _forget(h)
    if old is not None and old.path != path and not old.joined:
        _run_lock(h, old, "release")
    holding = _Holding(path, mine["token"], lease_s, args, stop=gevent.event.Event(),
                       joined=joined)
    _HELD[h] = holding
    holding.beat = gevent.spawn(_heartbeat, h, holding)
    _hook_host(h)


@operation()
@fails_host
def lock(settings: Settings, present: bool = True, probe: bool = True,
         keep: bool = False):
    """
    Hold the per-host run lock, so that two runs never change one host at once.

    + settings: the deploy's ``Settings``
    + present: take the lock (``True``) or release it (``False``)
    + probe: take the deploy's probe (``operations.probe``) in the same command
    + keep: hold it for the whole run (a fleet controller's first step): later ``lock`` steps of
      the run re-enter it and their releases leave it held; pyinfra's disconnect releases it

    One lock model for every run that changes a host (the deploy, each rollout and fan-out
    step): ``specfleet.core.runlock``. The owner is this run, not a host name: the control
    machine's machine id and boot id, the pid and the run id (``SPECFLEET_RUN_ID``, which the
    rollout and fan-out controllers set so their steps are one owner and re-enter a lock an
    earlier step left). The lock is a lease on the host's clock that this process renews every
    quarter lease (a greenlet over the host's own connection) while it lives, so the lock of a
    run that died, anywhere, expires by itself within the lease (180 s; ``SPECFLEET_LOCK_LEASE_S``).
    Taking it is one compare-and-swap on the host under ``flock``: of two runs, one wins.

    Released on every exit path: by the "Release the run lock" step; when an operation fails
    the host (a state callback: pyinfra runs none of a failed host's later operations); and
    when pyinfra disconnects from the host, which the CLI does in a ``finally`` whatever
    happened (an error, no hosts left, Ctrl-C). Only a killed control process (SIGKILL, a
    lost machine) leaves it, until its lease runs out. Why from the control process: pyinfra
    runs no operation for a failed host, a ``@deploy`` has no ``finally``, and ``atexit`` runs
    after the CLI has disconnected; the state callback and the disconnect hook run while the
    host's connection is still open. A renewal or release waits at most 20 s (a host cut off
    mid-run), then leaves it to the lease. The operations of a converged deploy stay 2 commands
    per host: the take (with the probe) and the release; the failure and exit paths run one
    command only while the lock is still held, and no renewal falls within a converged run.

    Taking and releasing the lock is run bookkeeping, not a change to the host, so it never
    shows as one: a converged host reports no change.
    """
    s = settings
    path = lock_path(s)
    # Taking the lock also takes the run's probe (facts.cache), in the same command.
    specs = _probe_specs(s, path) if present and probe else []
    if not state.is_executing:
        _lock_planned(path, present, specs)
        return
    me_host = ctx_host.get() or host
    kept = _HELD.get(me_host)
    if kept is not None and (not kept.kept or kept.path != path):
        kept = None
    if not present:
        if kept is not None:
            host.noop(f"run lock {path} is kept by this run until it ends")
            return
        release_held(me_host)
        host.noop(f"run lock {path} is released")
        return
    args = _connector_args()
    if kept is not None:  # a step of the run that keeps it: re-entered, nothing to write
        if specs:
            _, output = host.run_shell_command(cache.command(specs), print_output=False,
                                               print_input=False, **args)
            cache.store(host, specs, output.stdout_lines)
    else:
        _take_lock(me_host, path, specs, keep, args)
    host.noop(f"run lock {path} is held by this run")
    yield from ()


def _lock_planned(path: str, present: bool, specs: list) -> None:
    """While planning: whether the lock could be taken (a live run's lock fails the host), and
    the run's probe from the same command."""
    if present and specs:
        cache.load(host, specs)
    held = cached_fact(host, RunLock, path=path)
    verdict, message = lock_verdict(held, _me(), _alive)
    if verdict == runlock.BUSY:
        raise SpecfleetError(message, host=host.name, fix=runlock.busy_fix(path))
    if verdict in (runlock.STALE, runlock.EXPIRED):
        host.log(f"would take over: {message}", logger.warning)
    host.noop(f"run lock {path} is free" if present else f"run lock {path} is released")


def _take_lock(me_host: Any, path: str, specs: list, keep: bool, args: dict) -> None:
    """Take the lock (with the probe) in one command; a stale lock by compare-and-swap; then
    hold it (renewed from this process) and keep the probe's facts."""
    me = _me()
    lease_s = lease_seconds()
    me["token"] = uuid.uuid4().hex
    take = lock_command("take", path, lease_s, json.dumps(me))
    command = StringCommand(take, ";", cache.command(specs)) if specs else take
    _, output = host.run_shell_command(command, print_output=False, print_input=False, **args)
    lines = output.stdout_lines
    cut = next((i for i, line in enumerate(lines) if line.startswith(PROBE_MARK)), len(lines))
    result = parse_lock_output(lines[:cut])
    if result is None:
        said = "\n".join([*lines[:cut], *output.stderr_lines][-6:])
        raise SpecfleetError(
            f"could not take the run lock {path}: {said or 'no answer'}", host=host.name,
            fix="check that the host has python3 and that the lock's folder is writable",
        )
    status, value = _won(result, path, me, lease_s, args)
    if value.get("why") == "expired":
        prior = value.get("held") or {}
        host.log(f"a lock left by {runlock.holder(prior)} "
                 f"{runlock.lease_words(prior, value.get('now'), lease_s)}: its run stopped "
                 "renewing it; taken over", logger.warning)
    joined = status == "joined"
    if joined:
        host.log(f"run lock {path}: joined the lock of this run held by "
                 f"{runlock.holder(value.get('held') or {})}; renewed here, released by it")
    _hold(me_host, path, value.get("mine") or me, lease_s, args, joined=joined)
    if keep:
        _HELD[me_host].kept = True
    if specs:
        cache.store(host, specs, lines[cut:])


def _won(result: tuple[str, dict], path: str, me: dict, lease_s: float,
         args: dict) -> tuple[str, dict]:
    """The take's answer, a lock another run holds settled: a stale one replaced only if it is
    still the lock judged dead (a compare-and-swap); a live one fails the host."""
    status, value = result
    if status != "held":
        return status, value
    held = dict(value.get("held") or {"owner": "unknown"})
    verdict, message = lock_verdict(held, me, _alive, value.get("now"))
    if verdict == runlock.STALE:
        seen = value.get("fingerprint") or ""
        cas = lock_command("take", path, lease_s, json.dumps(me), seen)
        _, again = host.run_shell_command(cas, print_output=False, print_input=False, **args)
        status, value = parse_lock_output(again.stdout_lines) or ("held", value)
        if status == "taken":
            host.log(message, logger.warning)
        else:  # another run took it first
            held = dict(value.get("held") or held)
            message = runlock.busy_message(held, value.get("now"), lease_s)
    if status not in ("taken", "joined"):
        raise SpecfleetError(message or runlock.busy_message(held, value.get("now"), lease_s),
                             host=host.name, fix=runlock.busy_fix(path))
    return status, value


def _probe_specs(s: Settings, path: str) -> list:
    """The run's probe (``operations.probe``); without it every step asks its facts live."""
    try:
        return deploy_specs(s, path)
    except Exception as exc:  # noqa: BLE001 - an optimisation only: never fail the run for it
        host.log(f"no probe for this run ({exc}): each step asks its own facts", logger.warning)
        return []


@functools.lru_cache(maxsize=64)
def _hub_files(endpoint: str | None, repo_id: str, revision: str, token: str | None, allow, ignore):
    """(resolved commit, {path: size}) of a repo at a revision, asked from the control machine."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi(endpoint=endpoint, token=token or False)
    sha = api.model_info(repo_id, revision=revision).sha
    entries = [e for e in api.list_repo_tree(repo_id, revision=sha, recursive=True)
               if getattr(e, "size", None) is not None and hasattr(e, "lfs")]
    kept = filter_repo_objects(
        entries, allow_patterns=list(allow) if allow else None,
        ignore_patterns=list(ignore) if ignore else None, key=lambda e: e.path,
    )
    return sha, {e.path: e.size for e in kept}


def missing_weights_bytes(s: Settings) -> int | None:
    """Bytes the weights step would still fetch, from the Hub's metadata; None if unknown."""

    token = control_token(s.weights)
    total = 0
    for which in ("target", "drafter"):
        src = getattr(s, which)
        if src.revision is None:
            return None
        state = cached_fact(host, WeightsState, path=model_root(s, which))
        if _COMMIT.match(src.revision) and (
            (state.get("revisions") or {}).get(src.revision) or {}
        ).get("complete"):
            continue  # pinned and complete on the host: nothing to fetch, no Hub to ask
        try:
            sha, files = _hub_files(
                s.weights.hf_endpoint, src.repo_id, src.revision, token,
                tuple(src.allow_patterns or ()), tuple(src.ignore_patterns or ()),
            )
        except Exception:  # noqa: BLE001 - any Hub trouble: the weights step checks again
            return None
        have = (state.get("revisions") or {}).get(sha) or {}
        if not have.get("complete"):
            total += sum(files.values())
    return total


def _pip_source_args(s: Settings) -> list[str]:
    args: list[str] = []
    if s.sglang.index_url:
        args += ["--index-url", s.sglang.index_url]
    if s.sglang.find_links:
        args += ["--find-links", s.sglang.find_links]
        if not s.sglang.index_url:
            args.append("--no-index")
    for trusted in s.sglang.trusted_hosts:
        args += ["--trusted-host", trusted]
    return args


@operation()
@fails_host
def checks(settings: Settings):
    """
    Check that this host can take the deploy, before anything on it changes.

    + settings: the deploy's ``Settings``, its ``venv`` the one this run uses
      (``operations.venvs.effective_settings``, which the deploy resolves once)

    Fails the host with what is wrong and how to fix it: no GPU or a broken nvidia-smi (quoting
    it), fewer GPUs than the TP size, an arch with no usable backend, too little GPU memory,
    GPUs busy or the port taken by a process outside our unit, too little disk for the weights
    still missing, no token for a gated repo, an SGLang without DFLASH, no SGLang wheel for this
    interpreter or glibc. Warnings (low disk headroom) are printed and do not fail.
    """
    s = settings
    if s.probe.enable:
        # The gate's probe file (control machine) is read here too: a malformed one fails the
        # host before anything changes, not at the gate after a restart.
        probe_spec(s.probe, host.name)
    specs = default_specs(
        python=sglang_python(s), models_path=s.models_root, token_path=s.weights.host_token_path
    )
    specs[pure.SERVICE] = (ServiceState, service_state_args(s))
    specs[pure.UNIT_FILES] = (UnitFiles, unit_files_args(s))
    specs[pure.UNTRUSTED] = (WritableByOthers, trust_args(s))
    if s.group is not None:
        specs[NET] = (NetworkInterfaces, {})
        specs[RDMA] = (RdmaPorts, {})
    facts = cached_gather(host, specs)
    group = _group_members(s, facts)
    wheel_error = None
    python = wheel_check_python(s, facts)
    if python is not None:
        wheel_error = host.get_fact(
            SGLangWheel, python=python, requirement=f"sglang=={s.sglang.version}",
            pip_args=_pip_source_args(s),
        )
    result = pure.check(
        facts,
        s,
        control_token=control_token(s.weights) is not None,
        host_copy=_host_token_copy(s),
        missing_weights_bytes=missing_weights_bytes(s),
        wheel_error=wheel_error,
        group=group,
    )
    for warning in result.warnings:
        host.log(f"preflight: {warning}", logger.warning)
    if result.problems:
        # The host fails here and runs nothing more: ``lock`` releases its lock (a state
        # callback on the failed operation), so the next run from anywhere goes at once.
        first, *rest = result.problems
        more = "".join(f"\n{p.render()}" for p in rest)
        raise SpecfleetError(f"{first.render()}{more}", host=host.name, fix=None)
    host.noop(f"preflight passes ({len(result.passed)} checks)")
    yield from ()


def wheel_check_python(s: Settings, facts: dict[str, Any]) -> str | None:
    """The interpreter whose pip checks that the release has a wheel for this host (the venv's,
    or ``settings.python`` where the venv has none yet), or None: no check (not an index
    install, or the release is installed). Never the pip of a venv a user other than root can
    change (``pure.UNTRUSTED``): it would run that user's code (its ``.pth`` files, pip itself)
    as root before preflight refuses the venv, at ``--dry`` too."""
    install = facts.get(pure.SGLANG)
    if s.sglang.kind != "index" or (install or {}).get("version") == s.sglang.version:
        return None
    if not (facts.get("facts.python.Packages") or {}).get("python_version"):
        return s.python
    return None if s.venv in (facts.get(pure.UNTRUSTED) or {}) else sglang_python(s)


def _group_members(s: Settings, facts: dict) -> list[GroupMember] | None:
    """Every member of this host's serving group with its facts (this host first), and whether
    this member reaches rank 0's rendezvous; None for a host that serves alone."""
    g = s.group
    if g is None:
        return None
    peers = group_peers(s) or {}
    rank0 = g.members[0]
    if host.name != rank0:
        address = g.addresses.get(rank0) or peers[rank0].address
        facts[pure.REACH] = host.get_fact(TcpReach, address=address, port=g.rendezvous_port)
    return [GroupMember(host.name, facts, s, host_address(host))] + [
        GroupMember(name, p.facts, p.settings, p.address) for name, p in peers.items()
    ]


def _host_token_copy(s: Settings) -> str | None:
    """The token copy an earlier run left on the host (``weights.token``), if it is there: a
    converged host needs no token exported on the control machine."""
    path = control_token_path(s)
    return path if cached_fact(host, File, path=path) else None
