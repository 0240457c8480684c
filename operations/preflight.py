"""Preflight checks and the per-host run lock, before anything on a host changes."""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
import socket
import sys
import time
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import QuoteString, StringCommand, operation

from facts import cache
from facts.cache import cached_fact, cached_gather
from facts.preflight import RunLock, SGLangWheel
from facts.probe import MARK as PROBE_MARK
from facts.probe import default_specs
from facts.serving import ServiceState
from facts.weights import WeightsState
from operations.probe import deploy_specs
from operations.serving import service_state_args
from operations.util import fails_host
from operations.venvs import effective_settings
from operations.weights import control_token
from specfleet.core import preflight as pure
from specfleet.core.errors import SpecfleetError
from specfleet.core.settings import Settings, settings_for_host

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def lock_path(settings: Settings) -> str:
    return posixpath.join(settings.state_dir, "run.lock")


def _me() -> dict[str, Any]:
    return {
        "owner": f"{os.environ.get('USER', 'root')}@{socket.gethostname()}",
        "control_host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)),
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_verdict(held: dict | None, me: dict, alive) -> tuple[str, str | None]:
    """What to do with the lock a host holds: ("take"|"ours"|"stale"|"busy", message). Pure."""
    if not held:
        return "take", None
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held.get("started") or 0))
    who = f"{held.get('owner', 'unknown')} (pid {held.get('pid', '?')}, since {since})"
    if held.get("control_host") == me["control_host"] and held.get("pid") == me["pid"]:
        return "ours", None
    if held.get("control_host") == me["control_host"] and isinstance(held.get("pid"), int):
        if not alive(held["pid"]):
            return "stale", f"a lock left by a dead run of {who} is cleared and taken over"
    return "busy", f"another specfleet run holds this host: {who}: {held.get('command', '')}"


TAKEN = "specfleet-lock-taken"


def _take_command(path: str, me: dict) -> StringCommand:
    # noclobber makes the create atomic: of two runs, exactly one writes the file. The echo after
    # cat ends a lock written without a final newline, which would otherwise run into the first
    # line of the probe that follows in the same command (and read as an unknown owner).
    return StringCommand(
        "mkdir", "-p", QuoteString(posixpath.dirname(path)), "&&",
        "(", "set", "-C;", "echo", QuoteString(json.dumps(me)), ">", QuoteString(path), ")",
        "2>/dev/null", "&&", "echo", TAKEN, "||", "{", "cat", QuoteString(path), ";", "echo;", "}",
    )


def _holder(lines: list[str]) -> dict | None:
    if any(line.strip() == TAKEN for line in lines):
        return None
    return RunLock().process(lines) or {"owner": "unknown"}


@operation()
@fails_host
def lock(settings: Settings | None = None, present: bool = True):
    """
    Hold the per-host run lock, so that two runs never change one host at once.

    + settings: the deploy's ``Settings``; default: the host's ``specfleet`` data
    + present: take the lock (``True``) or release it (``False``)

    The lock file records the owner, control machine, pid, time and command. A lock left by a
    run on this control machine whose process is gone is reported and taken over; one held from
    elsewhere fails the host with the way to clear it. Taking and releasing the lock is run
    bookkeeping, not a change to the host, so it never shows as one: a converged host reports
    no change.
    """
    s = settings or settings_for_host(host)
    path = lock_path(s)
    me = _me()
    # Taking the lock also takes the run's probe (facts.cache), in the same command.
    specs = _probe_specs(s, path) if present else []
    if not state.is_executing:
        if present:
            cache.load(host, specs)
        verdict, message = lock_verdict(cached_fact(host, RunLock, path=path), me, _alive)
        if verdict == "busy":
            raise SpecfleetError(message, host=host.name, fix=_clear_fix(path))
        host.noop(f"run lock {path} is free" if present else f"run lock {path} is released")
        return
    if not present:
        host.run_shell_command(_release_command(path, me["pid"]))
        host.noop(f"run lock {path} is released")
        return
    _, output = host.run_shell_command(
        StringCommand(_take_command(path, me), ";", cache.command(specs)),
        print_output=False, print_input=False,
    )
    lines = output.stdout_lines
    cut = next((i for i, line in enumerate(lines) if line.startswith(PROBE_MARK)), len(lines))
    held = _holder(lines[:cut])
    verdict, message = lock_verdict(held, me, _alive)
    if verdict == "busy":
        raise SpecfleetError(message, host=host.name, fix=_clear_fix(path))
    if verdict == "stale":
        host.log(message, logger.warning)
        host.run_shell_command(
            StringCommand("echo", QuoteString(json.dumps(me)), ">", QuoteString(path))
        )
    cache.store(host, specs, lines[cut:])
    host.noop(f"run lock {path} is held by this run")
    yield from ()


def _probe_specs(s: Settings, path: str) -> list:
    """The run's probe (``operations.probe``); without it every step asks its facts live."""
    try:
        return deploy_specs(s, path)
    except Exception as exc:  # noqa: BLE001 - an optimisation only: never fail the run for it
        host.log(f"no probe for this run ({exc}): each step asks its own facts", logger.warning)
        return []


def _release_command(path: str, pid: int) -> StringCommand:
    """Remove the lock only if this run (``pid``) holds it."""
    return StringCommand(
        "!", "grep", "-q", QuoteString(f'"pid": {pid},'), QuoteString(path), "||",
        "rm", "-f", QuoteString(path),
    )


def _clear_fix(path: str) -> str:
    return f"wait for that run to end; if it is dead, clear the lock on the host: rm -f {path}"


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
    for src in (s.target, s.drafter):
        if src.revision is None:
            return None
        state = cached_fact(host, WeightsState, path=posixpath.join(s.models_root, src.dir_name))
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
def checks(settings: Settings | None = None):
    """
    Check that this host can take the deploy, before anything on it changes.

    + settings: the deploy's ``Settings``; default: the host's ``specfleet`` data

    Fails the host with what is wrong and how to fix it: no GPU or a broken nvidia-smi (quoting
    it), fewer GPUs than the TP size, an arch with no usable backend, too little GPU memory,
    GPUs busy or the port taken by a process outside our unit, too little disk for the weights
    still missing, no token for a gated repo, an SGLang without DFLASH, no SGLang wheel for this
    interpreter or glibc. Warnings (low disk headroom) are printed and do not fail.
    """
    s = effective_settings(settings)
    venv_python = posixpath.join(s.venv, "bin", "python")
    specs = default_specs(
        python=venv_python, models_path=s.models_root, token_path=s.weights.host_token_path
    )
    specs[pure.SERVICE] = (ServiceState, service_state_args(s))
    facts = cached_gather(host, specs)
    install = facts.get(pure.SGLANG)
    wheel_error = None
    if s.sglang.kind == "index" and (install is None or install.get("version") != s.sglang.version):
        python = venv_python if (facts.get("facts.python.Packages") or {}).get(
            "python_version") else s.python
        wheel_error = host.get_fact(
            SGLangWheel, python=python, requirement=f"sglang=={s.sglang.version}",
            pip_args=_pip_source_args(s),
        )
    result = pure.check(
        facts,
        s,
        control_token=control_token(s.weights) is not None,
        missing_weights_bytes=missing_weights_bytes(s),
        wheel_error=wheel_error,
    )
    for warning in result.warnings:
        host.log(f"preflight: {warning}", logger.warning)
    if result.problems:
        if state.is_executing:
            # The host fails here and runs nothing more: a lock left behind would block the
            # next run from another control machine until someone removed it by hand.
            host.run_shell_command(_release_command(lock_path(s), os.getpid()))
        first, *rest = result.problems
        more = "".join(f"\n{p.render()}" for p in rest)
        raise SpecfleetError(f"{first.render()}{more}", host=host.name, fix=None)
    host.noop(f"preflight passes ({len(result.passed)} checks)")
    yield from ()
