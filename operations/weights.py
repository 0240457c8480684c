"""Fetch model weights onto hosts: pinned, disk-checked, verified, resumable, detached."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import time
from collections.abc import Mapping
from io import StringIO
from typing import Any

import gevent
from pyinfra import host, logger
from pyinfra.api import (
    FileUploadCommand,
    FunctionCommand,
    QuoteString,
    StringCommand,
    deploy,
    operation,
)
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import File, Sha256File

from facts.cache import cached_fact
from facts.disk import FreeSpace
from facts.weights import (
    WeightsDeepCheck,
    WeightsJob,
    WeightsPlan,
    WeightsState,
    WeightsTools,
    job_command,
    parse_job,
)
from operations.util import fails_host, read_secret_file
from specfleet.core.errors import PROGRESS_ATTR, SpecfleetError
from specfleet.core.layout import (
    TOOLS_PATH,
    control_token_path,
    join,
    model_root,
    venv_pip,
    venv_python,
    weights_job_paths,
)
from specfleet.core.resources import hostside_path
from specfleet.core.secrets import control_token_source
from specfleet.core.settings import Settings, WeightsOptions
from specfleet.hostside.weights_agent import GIB, disk_preflight, fmt_gib, job_id

# The hosts' huggingface_hub: a range the weights agent is tested with (HfApi.model_info and
# list_repo_tree, get_hf_file_metadata, hf_hub_url, hf_hub_download to a local_dir: there from 0.26
# through 2.x; the fleet tests run 2.4.0). The next major release may change them: not before it
# is tested.
HUB_REQUIREMENT = "huggingface_hub>=0.26,<3"
AGENT_NAME = "weights_agent.py"
AGENT_SOURCE_PATH = hostside_path(AGENT_NAME)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_UNIT_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


# ----------------------------------------------------------------------------------------------
# Paths and small pure helpers
# ----------------------------------------------------------------------------------------------


def read_control_token(
    token_file: str | None, environ: Mapping[str, str] | None = None, token_env: str | None = None
) -> str | None:
    """The token given on the control machine, read now (at deploy time), from where
    ``control_token_source`` says; None when that is an unset ``HF_TOKEN``.

    A file or a variable named in the settings that gives no token is an error, not "no token":
    the settings said where the token is.
    """
    env = os.environ if environ is None else environ
    source = control_token_source(token_file, token_env, env)
    if source.kind == "file":
        return read_secret_file(source.name, "weights.token_file", "the token")
    if source.is_set:
        return env[source.name].strip()
    if source.named:
        raise SpecfleetError(
            f"weights.token_env names {source.name}, which is not set (or empty) in the control "
            "machine's environment",
            fix=f"export {source.name} with the token before the run, or unset weights.token_env",
        )
    return None


def control_token(w: WeightsOptions, environ: Mapping[str, str] | None = None) -> str | None:
    """``read_control_token`` with the host's ``weights`` settings (token_file, token_env)."""
    return read_control_token(w.token_file, environ, w.token_env)


def unit_name(root: str) -> str:
    """The name every download unit of the model at ``root`` starts with."""
    return "specfleet-weights-" + _UNIT_SAFE.sub("_", os.path.basename(root.rstrip("/")))


def unit_pattern(root: str) -> str:
    """A glob over the model's download units (a few other models' too: see ``own_units``)."""
    return unit_name(root) + "*"


def run_unit(root: str) -> str:
    """A new name for each download run: a transient unit that ended may stay loaded (seen on
    nspawn hosts when its cgroup cannot be removed), and systemd-run refuses a loaded name, so
    a fixed name could block every later download of the model."""
    return f"{unit_name(root)}-run-{secrets.token_hex(4)}.service"


def own_units(root: str, units: list[str]) -> list[str]:
    """The model's download units among ``units`` (matched by ``unit_pattern``), including
    the fixed name of earlier specfleet versions."""
    base = re.escape(unit_name(root))
    own = re.compile(rf"{base}(-run-[0-9a-f]{{8}})?\.service")
    return sorted(u for u in units if own.fullmatch(u))


def format_progress(p: dict) -> str:
    """One progress line from the agent's progress file."""
    total = p.get("bytes_total") or 0
    done = p.get("bytes_done") or 0
    pct = f" ({100 * done / total:.0f} %)" if total else ""
    rev = (p.get("revision") or p.get("requested") or "?")[:12]
    line = f"{p.get('repo_id')}@{rev} {p.get('state')}"
    # Starting or listing the repo, no size is known yet: zeros would say one.
    if total or done or p.get("files_total"):
        line += (
            f": {fmt_gib(done)} of {fmt_gib(total)}{pct}, "
            f"{p.get('files_done', 0)}/{p.get('files_total', 0)} files"
        )
    rate = p.get("rate_bps") or 0
    if rate and p.get("state") == "downloading":
        line += f", {rate / 1e6:.1f} MB/s"
        if total > done:
            line += f", ETA {int((total - done) / rate // 60)} min"
    if p.get("xet_disabled"):
        line += ", HF_HUB_DISABLE_XET=1"
    return line


def agent_source() -> str:
    return AGENT_SOURCE_PATH.read_text()


def hub_fits(installed: str | None, requirement: str) -> bool:
    """Whether the installed huggingface_hub version is within ``requirement``'s range (an
    unreadable requirement: any installed version does, as before the range)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    if not installed:
        return False
    try:
        spec = Requirement(requirement).specifier
    except InvalidRequirement:
        return True
    try:
        return spec.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return False


# ----------------------------------------------------------------------------------------------
# Operations
# ----------------------------------------------------------------------------------------------


@operation()
def tools(
    path: str = TOOLS_PATH,
    python: str = "python3",
    index_url: str | None = None,
    find_links: str | None = None,
    trusted_hosts: list[str] | None = None,
    requirement: str = HUB_REQUIREMENT,
):
    """
    Install the weights agent and ``huggingface_hub`` into a small venv on the host; a
    huggingface_hub outside ``requirement``'s range is installed again, within it.

    + path: the tools venv
    + python: the Python that creates it
    + index_url/find_links/trusted_hosts: where pip finds ``huggingface_hub`` (a fleet's
      wheelhouse); with ``find_links`` and no ``index_url`` pip uses no index
    + requirement: the pip requirement for huggingface_hub (a tested range)

    **Example:**

    .. code:: python

        weights.tools(name="Weights tools", find_links="http://10.250.1.1:8000/")
    """
    info = cached_fact(host, WeightsTools, path=path)
    changed = False
    if info is None:
        yield StringCommand(QuoteString(python), "-m", "venv", QuoteString(path))
        changed = True
    if info is None or not hub_fits(info.get("huggingface_hub"), requirement):
        pip = [QuoteString(venv_pip(path)), "install", "--quiet", "--disable-pip-version-check"]
        if index_url:
            pip += ["--index-url", QuoteString(index_url)]
        elif find_links:
            pip += ["--no-index"]
        if find_links:
            pip += ["--find-links", QuoteString(find_links)]
        for trusted in trusted_hosts or []:
            pip += ["--trusted-host", QuoteString(trusted)]
        yield StringCommand(*pip, QuoteString(requirement))
        changed = True
    source = agent_source()
    if (info or {}).get("agent_sha256") != hashlib.sha256(source.encode()).hexdigest():
        yield FileUploadCommand(StringIO(source), join(path, AGENT_NAME))
        changed = True
    if not changed:
        host.noop(f"weights tools in {path} are installed (huggingface_hub "
                  f"{info['huggingface_hub']})")


@operation()
@fails_host(raise_while_planning=True)
def token(path: str, token_file: str | None = None, token_env: str | None = None):
    """
    Put the token given on the control machine into its own 0600 file on the host.

    + path: the file on the host (never huggingface_hub's default path: the host's own token
      there is left alone)
    + token_file: a file on the control machine holding the token
    + token_env: else the environment variable on the control machine holding it; else
      ``HF_TOKEN``

    The token goes through stdin: it appears in no command line, no output at any verbosity
    and no ``--diff`` (only its sha256 is compared). With no token given, nothing.
    """
    secret = read_control_token(token_file, token_env=token_env)
    if secret is None:
        host.noop("no Hugging Face token given on the control machine")
        return
    content = secret + "\n"
    digest = hashlib.sha256(content.encode()).hexdigest()
    info = cached_fact(host, File, path=path)
    if info and info.get("mode") == 600 and cached_fact(host, Sha256File, path=path) == digest:
        host.noop(f"token file {path} is up to date")
        return
    folder = os.path.dirname(path)
    yield StringCommand("install", "-d", "-m", "700", QuoteString(folder))
    # The token goes through the command's stdin (never logged, unlike argv), into a file that
    # is 0600 before its first byte, then renamed over the old one: no temporary file in /tmp
    # as a sudo upload would use.
    tmp = f"{path}.new"
    script = (f"umask 077 && cat > {shlex.quote(tmp)} && chmod 600 {shlex.quote(tmp)} "
              f"&& mv -f {shlex.quote(tmp)} {shlex.quote(path)}")
    yield StringCommand("sh", "-c", QuoteString(script), _stdin=content)


@operation()
@fails_host(raise_while_planning=True)
def downloaded(
    repo_id: str,
    root: str,
    revision: str | None = None,
    follow_branch: bool = False,
    allow_patterns: list[str] | None = None,
    ignore_patterns: list[str] | None = None,
    verify: str = "fast",
    endpoint: str | None = None,
    token_path: str | None = None,
    tools_path: str = TOOLS_PATH,
    stall_minutes: float = 10.0,
    margin_percent: float = 2.0,
    margin_min_gib: float = 10.0,
    prune: bool = False,
    keep: list[str] | None = None,
    poll_seconds: float = 5.0,
    state_dir: str = "/var/lib/specfleet",
    max_workers: int = 4,
    wait: bool = True,
):
    """
    Fetch one revision of a Hugging Face repository into ``root/<revision>``, verified.

    + repo_id: the repository, e.g. ``moonshotai/Kimi-K2.6``
    + root: the folder of this model's revisions (``root/current`` links the verified one)
    + revision: a 40-hex commit; a branch or tag only with ``follow_branch=True``
    + follow_branch: follow a branch; a branch that moved shows as a change with its size
    + allow_patterns/ignore_patterns: huggingface_hub's file patterns
    + verify: ``fast`` (size + mtime against the manifest) or ``deep`` (re-hash every file on
      the host; a clean deep check is no change, a corrupt file is fetched again)
    + endpoint: ``HF_ENDPOINT`` (a mirror), else the Hub
    + token_path: the token file the agent uses on the host (``HF_TOKEN_PATH``); else
      huggingface_hub's default path there (the host's own token)
    + tools_path: the venv of ``weights.tools``
    + stall_minutes: no progress for this long: retry without Xet, then fail
    + margin_percent/margin_min_gib: the disk margin, max(P % of the bytes missing, M GiB)
    + prune: remove other revisions of this model under ``root`` (never ``revision`` or ``keep``)
    + poll_seconds: how often the progress file is read
    + wait: wait until the download ends (``False``: start it and go on; a later run of the same
      operation attaches to it and waits: the fan-out's seed starts its upstream download before
      the fleet's other preparations)

    The download runs detached on the host (a transient ``systemd-run`` unit), so a dropped
    SSH session does not stop it; a re-run attaches to it. Every finished file is verified
    (sha256 for LFS files, the git blob id for others) and kept: a re-run resumes.

    **Example:**

    .. code:: python

        weights.downloaded(
            name="Fetch the drafter",
            repo_id="z-lab/Kimi-K2.6-DFlash",
            revision="0123456789abcdef0123456789abcdef01234567",
            root="/srv/models/z-lab--Kimi-K2.6-DFlash",
            token_path="/var/lib/specfleet/hf/token",
        )
    """
    problem = _arguments_problem(repo_id, revision, follow_branch, verify)
    if problem:
        raise SpecfleetError(problem[0], fix=problem[1])
    revision = revision or "main"
    root = root.rstrip("/")
    keep = list(keep or [])
    paths = weights_job_paths(state_dir, root)
    python, agent = venv_python(tools_path), join(tools_path, AGENT_NAME)
    job: dict[str, Any] = {
        "repo_id": repo_id, "revision": revision, "root": root,
        "allow_patterns": allow_patterns, "ignore_patterns": ignore_patterns,
        "verify": verify, "endpoint": endpoint, "token_path": token_path,
        "stall_minutes": stall_minutes, "margin_percent": margin_percent,
        "margin_min_gib": margin_min_gib, "prune": prune, "keep": keep,
        "max_workers": max_workers, "progress_path": paths.progress, "host": host.name,
    }
    job["job_id"] = job_id(job)

    yield from _fetch(job, paths, python, agent, verify, follow_branch, wait, poll_seconds)


def _fetch(job: dict[str, Any], paths, python: str, agent: str, verify: str,
           follow_branch: bool, wait: bool, poll_seconds: float):
    """Converge, attach to the running download of this very job, or start one; then wait."""
    root, repo_id, revision = job["root"], job["repo_id"], job["revision"]
    state = cached_fact(host, WeightsState, path=root, in_use=job["prune"])
    running = cached_fact(host, WeightsJob, pattern=unit_pattern(root),
                          progress_path=paths.progress)
    active_units = own_units(root, running["units"])
    attach = (len(active_units) == 1
              and (running["progress"] or {}).get("job_id") == job["job_id"])

    if not attach:
        done = yield from _converged(job, state, python, agent, follow_branch)
        if done:
            return
        done = yield from _planned(job, state, python, agent, verify, follow_branch,
                                   active_units)
        if done:
            return
    if attach:
        unit = active_units[0]
        if not wait:
            host.noop(f"the download of {repo_id}@{revision[:12]} runs ({unit})")
            return
        host.log_styled(f"attaching to the running download {unit}", fg="cyan")
    else:
        unit = run_unit(root)
        yield from _start(job, unit, active_units, paths, python, agent)
        if not wait:
            return
    yield FunctionCommand(_wait, (), {
        "unit": unit, "progress_path": paths.progress, "job_id": job["job_id"],
        "poll_seconds": poll_seconds,
    })


def _arguments_problem(repo_id: str, revision: str | None, follow_branch: bool,
                       verify: str) -> tuple[str, str] | None:
    """What is wrong with ``downloaded``'s arguments, as (problem, fix); None when nothing."""
    if verify not in ("fast", "deep"):
        return f"weights verify={verify!r} for {repo_id}", 'use verify="fast" or verify="deep"'
    if revision is None and not follow_branch:
        return (f"no revision is pinned for {repo_id}",
                "pin the revision to a 40-hex commit, or set follow_branch=True to follow main "
                "on purpose")  # fmt: skip
    if not follow_branch and not _COMMIT.match(revision or ""):
        return (f"revision {revision!r} of {repo_id} is not a commit",
                "pin a 40-hex commit, or set follow_branch=True to follow the branch on purpose")
    return None


def _converged(job: dict[str, Any], state: dict, python: str, agent: str, follow_branch: bool):
    """A pinned revision already complete on the host: its links converged (True). A deep
    check re-hashes it while executing (not while planning: it reads every byte); a clean check
    is no change, so nothing restarts for it; corrupt files go into ``job`` as suspects."""
    if follow_branch:
        return False
    root, revision = job["root"], job["revision"]
    allow, ignore = job["allow_patterns"], job["ignore_patterns"]
    prune, keep, repo_id = job["prune"], job["keep"], job["repo_id"]
    rev = state["revisions"].get(revision)
    if not _is_fast_ok(rev, allow, ignore):
        return False
    if job["verify"] == "fast":
        yield from _converge_links(root, revision, state, prune, keep, repo_id, rev)
        return True
    if not host.state.is_executing:
        return False
    check = host.get_fact(WeightsDeepCheck, python=python, agent=agent,
                          path=join(root, revision))
    if check and check["checked"] and not check["bad"]:
        yield from _converge_links(root, revision, state, prune, keep, repo_id, rev,
                                   "every file re-hashed and matches the manifest")
        return True
    if check and check["bad"]:
        for path, why in sorted(check["bad"].items()):
            host.log_styled(f"{path}: corrupt ({why}), fetching it again",
                            fg="yellow", log_func=logger.warning)
        job.update(verify="fast", suspect=sorted(check["bad"]))
        job["job_id"] = job_id({k: v for k, v in job.items() if k != "job_id"})
    return False


def _planned(job: dict[str, Any], state: dict, python: str, agent: str, verify: str,
             follow_branch: bool, active_units: list[str]):
    """The agent's plan of the download (what is missing, the revision a branch resolves to):
    converged when that revision is complete already and ``verify`` (as asked: a deep check
    that found corrupt files set the job's to fast) is fast (True), failed on too little disk,
    said while planning."""
    plan = host.get_fact(WeightsPlan, python=python, agent=agent, job_json=json.dumps(job))
    if plan is not None and "error" in plan:
        raise SpecfleetError(plan["error"]["message"], fix=plan["error"].get("fix"))
    if plan is None:
        if active_units:
            host.log_styled(f"{active_units[0]} is running another job; it will be replaced",
                            fg="yellow")
        return False
    repo_id, revision, root = job["repo_id"], job["revision"], job["root"]
    resolved = plan["revision"]
    rev = state["revisions"].get(resolved)
    if verify == "fast" and _is_fast_ok(rev, job["allow_patterns"], job["ignore_patterns"]):
        yield from _converge_links(root, resolved, state, job["prune"], job["keep"], repo_id,
                                   rev)
        return True
    if follow_branch and state["current"] and state["current"] != resolved:
        host.log_styled(
            f"{repo_id}: {revision} moved from {state['current'][:12]} to "
            f"{resolved[:12]}: {fmt_gib(plan['missing_bytes'])} to download",
            fg="yellow", log_func=logger.warning,
        )
    problem = _preflight(plan, root, job["margin_percent"], job["margin_min_gib"])
    if problem:
        raise SpecfleetError(problem[0], fix=problem[1])
    if not host.state.is_executing:  # --dry / the prompt: say what would move
        host.log_styled(
            f"{repo_id}@{resolved[:12]}: would fetch or check {len(plan['missing'])} of "
            f"{len(plan['files'])} files, {fmt_gib(plan['missing_bytes'])} to download",
            fg="cyan",
        )
    return False


def _start(job: dict[str, Any], unit: str, active_units: list[str], paths, python: str,
           agent: str):
    """Start the download detached (a transient unit), replacing another job's."""
    if active_units:
        yield StringCommand("systemctl", "stop", *map(QuoteString, active_units))
    yield StringCommand("install", "-d", "-m", "755", QuoteString(paths.work))
    yield FileUploadCommand(StringIO(json.dumps(job, indent=1, sort_keys=True)), paths.job)
    start = [
        "systemd-run", "--quiet", "--collect", QuoteString(f"--unit={unit}"),
        QuoteString(f"--description=specfleet weights {job['repo_id']}"),
        "--property=TimeoutStopSec=30", "--property=Nice=5",
        "--", QuoteString(python), QuoteString(agent), "run", QuoteString(paths.job),
    ]
    yield StringCommand("rm", "-f", QuoteString(paths.progress), "&&", *start)


def _is_fast_ok(rev: dict | None, allow: list[str] | None, ignore: list[str] | None) -> bool:
    return bool(
        rev
        and rev["complete"]
        and not rev["changed"]
        and not rev["missing"]
        and rev.get("allow_patterns") == allow
        and rev.get("ignore_patterns") == ignore
    )


def _converge_links(root: str, revision: str, state: dict, prune: bool, keep: list[str],
                    repo_id: str, rev: dict,
                    how: str = "sizes and mtimes match the manifest"):
    changed = False
    if state["current"] != revision:
        yield StringCommand(
            "ln", "-sfn", QuoteString(revision), QuoteString(join(root, "current.tmp")), "&&",
            "mv", "-T", QuoteString(join(root, "current.tmp")), QuoteString(join(root, "current")),
        )
        changed = True
    kept = []
    if prune:
        for other, info in sorted(state["revisions"].items()):
            if other == revision or other in keep:
                continue
            if info.get("in_use"):
                kept.append(f"{other[:12]} (in use by pid {info['in_use'][0]})")
                continue
            yield StringCommand("rm", "-rf", QuoteString(join(root, other)))
            changed = True
    if not changed:
        also = f"; keeping {', '.join(kept)}" if kept else ""
        host.noop(f"{repo_id}@{revision[:12]} is complete ({rev['files']} files, "
                  f"{fmt_gib(rev['bytes'])}; {how}){also}")


def _free_space(root: str, plan: dict) -> int:
    """Free bytes on root's filesystem: facts.disk.FreeSpace, else the agent's own statvfs."""
    info = host.get_fact(FreeSpace, path=root)
    if info and info.get("free_bytes") is not None:
        return int(info["free_bytes"])
    return int(plan["free_bytes"])


def _preflight(plan: dict, root: str, margin_percent: float,
               margin_min_gib: float) -> tuple[str, str] | None:
    free = _free_space(root, plan) + int(plan.get("reclaimable_bytes") or 0)
    result = disk_preflight(
        plan["missing_bytes"], free, margin_percent=margin_percent,
        margin_min_gib=margin_min_gib, host=host.name, path=root,
    )
    for warning in result["warnings"]:
        host.log_styled(warning, fg="yellow", log_func=logger.warning)
    if not result["ok"]:
        return result["problem"], result["fix"]
    return None


def _wait(state, host, unit: str, progress_path: str, job_id: str, poll_seconds: float) -> bool:
    """Poll the agent's progress file until its job ends; show progress; fail with its error."""
    last_line, last_key, last_at = "", None, 0.0
    events_seen = 0
    gone_since = None
    while True:
        try:
            ok, output = host.run_shell_command(job_command(unit, progress_path),
                                                print_output=False, print_input=False)
        except Exception as e:  # noqa: BLE001 - a lost SSH session, say: the unit goes on
            msg = SpecfleetError(
                f"lost the connection while watching {unit} ({type(e).__name__}: {e}); the "
                "download goes on on the host",
                fix="re-run the deploy: it attaches to the running download",
            ).render()
            host.log_styled(msg, fg="red", log_func=logger.error)
            return False
        info = parse_job([line.line for line in output if line.buffer_name == "stdout"])
        p = info["progress"] if (info["progress"] or {}).get("job_id") == job_id else None
        if p is not None:
            seen = getattr(host, PROGRESS_ATTR, None)
            if not isinstance(seen, dict):
                seen = {}
                setattr(host, PROGRESS_ATTR, seen)
            seen[str(p.get("repo_id"))] = p
            events = p.get("events") or []
            for ev in events[events_seen:]:
                host.log_styled(ev["text"], fg="cyan")
            events_seen = len(events)
            # A line when the state or the count of files changes, else every 30 s at most.
            line = format_progress(p)
            key = (p.get("state"), p.get("files_done"))
            if line != last_line and (key != last_key or time.monotonic() - last_at >= 30):
                host.log(line)
                last_line, last_key, last_at = line, key, time.monotonic()
            if p.get("state") == "done":
                return True
            if p.get("state") == "failed":
                err = p.get("error") or {}
                msg = SpecfleetError(err.get("message", "download failed"),
                                     fix=err.get("fix")).render()
                host.log_styled(msg, fg="red", log_func=logger.error)
                return False
        if not info["active"]:
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > max(3 * poll_seconds, 10):
                msg = SpecfleetError(
                    f"the download unit {unit} ended without a result",
                    fix=f"see `journalctl -u {unit}` on the host; a re-run resumes",
                ).render()
                host.log_styled(msg, fg="red", log_func=logger.error)
                return False
        else:
            gone_since = None
        gevent.sleep(poll_seconds)


@operation()
@fails_host(raise_while_planning=True)
def model(settings: Settings, which: str = "target", verify: str | None = None,
          wait: bool = True):
    """
    Fetch the target or the drafter of ``settings``.

    + settings: the deploy's ``Settings``
    + which: ``target`` or ``drafter``
    + verify: override ``weights.verify`` (``fast`` or ``deep``)
    + wait: wait until the download ends (``False``: start it; see ``downloaded``)

    Uses the token given on the control machine (put there by ``weights.token``) when there is
    one, else the host's own token file. Run ``weights.tools`` and ``weights.token`` first
    (``tools_from_settings`` and ``token_from_settings``).
    """
    if which not in ("target", "drafter"):
        raise SpecfleetError(f"weights.model which={which!r}",
                             fix='use which="target" or which="drafter"')
    s = settings
    src = getattr(s, which)
    w = s.weights
    token_path = w.host_token_path
    # The control machine's token (weights.token copies it), else the copy an earlier run
    # left on the host, else the host's own token file.
    if control_token(w) is not None or cached_fact(host, File, path=control_token_path(s)):
        token_path = control_token_path(s)
    yield from downloaded._inner(
        repo_id=src.repo_id,
        root=model_root(s, which),
        revision=src.revision,
        follow_branch=src.follow_branch,
        allow_patterns=src.allow_patterns,
        ignore_patterns=src.ignore_patterns,
        verify=verify or w.verify,
        endpoint=w.hf_endpoint,
        token_path=token_path,
        stall_minutes=w.stall_minutes,
        margin_percent=w.margin_percent,
        margin_min_gib=w.margin_min_gib,
        prune=w.prune_other_revisions,
        poll_seconds=w.poll_seconds,
        state_dir=s.state_dir,
        wait=wait,
    )


@deploy("Weights tools")
def tools_from_settings(settings: Settings) -> OperationMeta:
    """``weights.tools`` from the pip sources of ``settings.sglang``."""
    sg = settings.sglang
    return tools(name="weights agent and huggingface_hub", index_url=sg.index_url,
                 find_links=sg.find_links, trusted_hosts=sg.trusted_hosts)


@deploy("Hugging Face token")
def token_from_settings(settings: Settings) -> OperationMeta:
    """``weights.token`` from ``settings.weights``: the control machine's token, if any, in
    its 0600 file on the host."""
    w = settings.weights
    return token(name="token file on the host", path=control_token_path(settings),
                 token_file=w.token_file, token_env=w.token_env)


__all__ = [
    "GIB", "downloaded", "model", "token", "token_from_settings",
    "tools", "tools_from_settings",
]
