"""Download once per fleet, spread host to host over the LAN: the host side of a fan-out.

A fan-out plan (``specfleet.fleet.fanout``) names, per model, one **seed** host that downloads from
upstream (the Hub or ``HF_ENDPOINT``) with ``weights.model``, and **peers** that copy from hosts
that already hold verified files (over ssh), pipelined behind the seed's download and in a
tree. The ops here:

- ``agent``: the fan-out agent (``specfleet/hostside/fanout_agent.py``) next to the weights agent;
- ``serve``: an ephemeral sshd on a serving peer (its own port, host key and authorized keys,
  a transient ``systemd-run`` unit with a lifetime limit, ``rollout.fanout_serve_hours``); the
  rollout's public key may only run ``fanout_agent.py serve`` (a send of named files under
  the revision folders being fanned out, regular files only, no symlink followed, no path
  out of the folder; and a status), and only from the receivers' addresses (``from=``);
  ``present=False`` stops it and removes every file;
- ``model``: a seed runs ``weights.model`` (``wait=False``: it only starts the download, which
  a later run attaches to); a peer uploads its copy of the rollout's private key
  (0600, from memory), runs ``fanout_agent.py pull`` detached and shows its progress (watched
  on the host: one round trip per change, ``fanout_agent.py wait``). The key is
  removed by the agent when the pull ends. Whatever the peers could not give (a failed or
  corrupt copy) is left to ``weights.model``, run next on every host: it verifies the copy and
  fetches the rest from upstream;
- ``cleanup``: remove a pull's leftovers (keys, jobs) and stop its units.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import time
from io import StringIO
from pathlib import Path
from typing import Any

import gevent
import jinja2
from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.facts.files import Sha256File

from facts.fanout import FanoutLeftovers, FanoutServe
from facts.weights import WeightsState, job_command, parse_job
from operations import weights
from specfleet.core.errors import SpecfleetError
from specfleet.core.fanout import FANOUT_PORT, PLAN_ENV
from specfleet.core.layout import (
    TOOLS_PATH,
    control_token_path,
    fanout_dir,
    join,
    model_root,
    serve_dir,
    tools_program,
    tools_python,
    venv_python,
)
from specfleet.core.resources import hostside_path, template_path
from specfleet.core.settings import RolloutOptions, Settings
from specfleet.core.text import printable
from specfleet.hostside.fanout_agent import pull_progress_path, weights_progress_path
from specfleet.hostside.weights_agent import fmt_gib, job_id

AGENT_NAME = "fanout_agent.py"
AGENT_SOURCE_PATH = hostside_path(AGENT_NAME)
SSHD_TEMPLATE = template_path("fanout_sshd_config.j2")
# Units are named per run (``-<rollout id>``): a stopped transient unit may stay loaded (seen on
# nspawn hosts when its cgroup cannot be killed), and systemd-run refuses a loaded name.
SERVE_UNIT = "specfleet-fanout-sshd"
PULL_UNIT = "specfleet-fanout-pull"
# The ephemeral sshd stops by itself after this long, whatever happens to the control machine
# (the default of the setting ``rollout.fanout_serve_hours``: a fan-out's expected time plus a
# margin; a receiver whose source stopped serving gets the rest from upstream).
SERVE_MAX_SECONDS = int(RolloutOptions().fanout_serve_hours * 3600)
_UNIT_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


# ----------------------------------------------------------------------------------------------
# Pure: paths and the files of the ephemeral sshd
# ----------------------------------------------------------------------------------------------


def serve_unit(rollout_id: str) -> str:
    return f"{SERVE_UNIT}-{_UNIT_SAFE.sub('_', rollout_id)}"


def pull_unit(dir_name: str, rollout_id: str) -> str:
    return f"{PULL_UNIT}-{_UNIT_SAFE.sub('_', dir_name)}-{_UNIT_SAFE.sub('_', rollout_id)}"


def control_dir(dir_name: str) -> str:
    """The pull unit's RuntimeDirectory, for ssh's connection sharing (short: a socket path)."""
    return "/run/sf-fanout-" + hashlib.sha256(dir_name.encode()).hexdigest()[:8]


def serve_command(tools_path: str, models_root: str, state_dir: str,
                  models: dict[str, str | None] | None = None) -> str:
    """The only command the rollout's key may run on a serving peer. ``models``: the revision
    folders it serves, ``{dir_name: commit}``, or ``{dir_name: None}`` for a followed branch (the
    revision this host resolves); none: it serves nothing but refusals."""
    served = []
    for d, rev in sorted((models or {}).items()):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,200}", d) or ".." in d:
            raise ValueError(f"model folder {d!r} cannot be served")
        if rev is not None and not re.fullmatch(r"[0-9a-f]{40}", rev):
            raise ValueError(f"revision {rev!r} of {d} is not a commit (None: a followed branch)")
        served.append(f"{d}={rev}" if rev else d)
    return shlex.join([venv_python(tools_path), join(tools_path, AGENT_NAME), "serve",
                       models_root.rstrip("/"), state_dir.rstrip("/"), *served])


def served_models(s: Settings, which: list[str] | tuple[str, ...]) -> dict[str, str | None]:
    """The revision folders a host serves for the models ``which`` it has receivers for: its
    pinned commit, or None where it follows a branch."""
    out: dict[str, str | None] = {}
    for w in which:
        src = getattr(s, w)
        out[src.dir_name] = src.revision if src.revision and not src.follow_branch else None
    return out


def authorized_keys(public_key: str, from_addresses: list[str], command: str) -> str:
    """One ``authorized_keys`` line: the rollout's key, from the receivers only, forced to
    ``command``, with every forwarding and the pty off (``restrict``)."""
    if not from_addresses:
        raise ValueError("a served key needs at least one receiver address")
    for a in from_addresses:
        if not re.fullmatch(r"[0-9A-Za-z.:_-]+", a):
            raise ValueError(f"receiver address {a!r} cannot go into from=")
    if '"' in command or "\\" in command:
        raise ValueError("the forced command must not hold quotes or backslashes")
    return (f'from="{",".join(from_addresses)}",restrict,command="{command}" '
            f"{public_key.strip()}\n")


def sshd_config(port: int, directory: str, command: str, address: str | None = None) -> str:
    """The ephemeral sshd's whole configuration (``templates/fanout_sshd_config.j2``): key-only
    root login forced to ``command``, listening on ``address`` only (the one its receivers connect
    to) when given."""
    template = jinja2.Template(
        SSHD_TEMPLATE.read_text(), trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
    )
    return template.render(port=int(port), directory=directory, command=command, address=address)


def known_hosts(servers: dict[str, dict]) -> str:
    """``known_hosts`` of a receiver: each serving peer's ephemeral host key, at its port."""
    lines = []
    for info in servers.values():
        lines.append(f"[{info['address']}]:{int(info['port'])} {info['host_public_key'].strip()}")
    return "".join(line + "\n" for line in sorted(lines))


def agent_source() -> str:
    return AGENT_SOURCE_PATH.read_text()


def format_pull(p: dict) -> str:
    line = (f"{p.get('repo_id')}@{(p.get('revision') or p.get('requested') or '?')[:12]} "
            f"{p.get('state')}: {p.get('files_done', 0)}/{p.get('files_total', 0)} files, "
            f"{fmt_gib(p.get('bytes_from_peers') or 0)} from peers")
    by = p.get("by_source") or {}
    if by:
        line += " (" + ", ".join(f"{h} {fmt_gib(n)}" for h, n in sorted(by.items())) + ")"
    if p.get("corrupt"):
        line += f", {len(p['corrupt'])} corrupt copies left for upstream"
    return line


# Writes a private file from stdin, 0600 (umask 077) before a byte lands, in a 0700 folder.
_SECRET_SCRIPT = ('umask 077 && install -d -m 700 "$(dirname "$1")" && cat > "$1.tmp" '
                  '&& chmod 600 "$1.tmp" && mv -f "$1.tmp" "$1"')


def _secret_upload(path: str, content: str):
    """Write ``path`` (0600, its folder 0700) through the stdin of a root shell: never through
    pyinfra's upload, whose ``--sudo`` form puts the bytes in a temporary file in /tmp with
    default permissions before it copies them; never in an argv or a diff."""
    yield StringCommand("sh", "-c", QuoteString(_SECRET_SCRIPT), "specfleet", QuoteString(path),
                        _stdin=content)


# ----------------------------------------------------------------------------------------------
# Operations
# ----------------------------------------------------------------------------------------------


@operation()
def agent(tools_path: str = TOOLS_PATH):
    """
    Put the fan-out agent next to the weights agent (``weights.tools`` first).

    + tools_path: the weights tools venv
    """
    dest = join(tools_path, AGENT_NAME)
    source = agent_source()
    if host.get_fact(Sha256File, path=dest) == hashlib.sha256(source.encode()).hexdigest():
        host.noop(f"fan-out agent {dest} is installed")
        return
    yield FileUploadCommand(StringIO(source), dest)


@operation()
def serve(
    present: bool = True,
    rollout_id: str = "",
    port: int = FANOUT_PORT,
    public_key: str | None = None,
    host_private_key: str | None = None,
    receivers: list[str] | None = None,
    address: str | None = None,
    models_root: str = "/srv/models",
    state_dir: str = "/var/lib/specfleet",
    tools_path: str = TOOLS_PATH,
    max_seconds: int = SERVE_MAX_SECONDS,
    models: dict[str, str | None] | None = None,
):
    """
    An ephemeral sshd that serves this host's verified weights to its peers, read-only: only the
    revision folders in ``models``.

    + present: run it (``False``: stop it and remove its keys and config)
    + rollout_id: the fan-out it serves (names its unit)
    + port: its TCP port (not the host's own sshd)
    + public_key: the rollout's public key (OpenSSH format)
    + host_private_key: its own host key, made for the rollout (receivers pin its public half)
    + receivers: the addresses the key is accepted from (``from=``)
    + address: listen on this address only (the one receivers connect to); else on all
    + models_root/state_dir/tools_path: what the forced command serves and where it runs
    + max_seconds: the unit stops by itself after this long (``RuntimeMaxSec``)
    + models: the revision folders served, ``{dir_name: commit}`` (``None``: the revision this
      host resolves for a followed branch); nothing outside them is sent
    """
    directory = serve_dir(state_dir)
    info = host.get_fact(FanoutServe, pattern=f"{SERVE_UNIT}-*",
                         digest_path=join(directory, "digest"))
    if not present:
        there = host.get_fact(Sha256File, path=join(directory, "sshd_config"))
        if not info["active"] and there is None:
            host.noop("no fan-out sshd on this host")
            return
        for unit in info["active"]:
            yield StringCommand("systemctl", "stop", QuoteString(unit))
        yield StringCommand("rm", "-rf", QuoteString(directory))
        return
    if not (public_key and host_private_key and receivers and models):
        raise ValueError("fanout.serve needs public_key, host_private_key, receivers and models")
    command = serve_command(tools_path, models_root, state_dir, models)
    config = sshd_config(port, directory, command, address)
    keys = authorized_keys(public_key, receivers, command)
    digest = hashlib.sha256((config + keys + host_private_key + f"\n{int(max_seconds)}"
                             ).encode()).hexdigest()
    unit = serve_unit(rollout_id)
    if info["active"] == [f"{unit}.service"] and info["digest"] == digest:
        host.noop(f"fan-out sshd serves {len(receivers)} peers on port {port}")
        return
    for other in info["active"]:
        yield StringCommand("systemctl", "stop", QuoteString(other))
    yield StringCommand("rm", "-rf", QuoteString(directory))
    yield from _secret_upload(join(directory, "host_key"), host_private_key.strip() + "\n")
    yield FileUploadCommand(StringIO(keys), join(directory, "authorized_keys"))
    yield FileUploadCommand(StringIO(config), join(directory, "sshd_config"))
    yield FileUploadCommand(StringIO(digest + "\n"), join(directory, "digest"))
    yield StringCommand("chmod", "600", QuoteString(join(directory, "authorized_keys")),
                        QuoteString(join(directory, "sshd_config")))
    # A peer that cannot serve still gets its own weights: its receivers copy from another
    # source or from upstream. So neither a bad config nor a taken port fails the host.
    cfg = QuoteString(join(directory, "sshd_config"))
    yield StringCommand(
        "if", "/usr/sbin/sshd", "-t", "-f", cfg, ";", "then",
        "mkdir", "-p", "-m", "755", "/run/sshd", "&&",
        "systemd-run", "--quiet", "--collect", QuoteString(f"--unit={unit}"),
        QuoteString("--description=specfleet fan-out: serve weights to peers"),
        f"--property=RuntimeMaxSec={int(max_seconds)}",
        "--", "/usr/sbin/sshd", "-D", "-e", "-f", cfg, "||", "true", ";", "fi",
    )
    yield FunctionCommand(_check_serving, (), {"unit": unit, "port": int(port)})


def _check_serving(state, host, unit: str, port: int) -> bool:
    """Wait until the unit's own sshd listens on ``port`` (a receiver may connect at once);
    if it does not (a taken port, no sshd), say so and go on."""
    command = (f"systemctl show -p MainPID --value {shlex.quote(unit)}; "
               f"ss -Hltnp {shlex.quote(f'sport = :{port}')}")
    for attempt in range(100):
        _ok, output = host.run_shell_command(command, print_output=False, print_input=False)
        lines = [line.line for line in output if line.buffer_name == "stdout"]
        pid = lines[0].strip() if lines else "0"
        if pid not in ("", "0") and any(f"pid={pid}," in line for line in lines[1:]):
            return True
        if pid in ("", "0") and attempt >= 10:
            break
        gevent.sleep(0.1)
    host.log_styled(
        f"the fan-out sshd does not listen on port {port} (see journalctl -u {unit}; is the "
        "port taken?): its peers copy from another source or from upstream",
        fg="yellow", log_func=logger.warning,
    )
    return True


# Which hosts still want weights, per fan-out: written by ``needs`` on each host, read by the
# servers' ``serve(_if=...)``. pyinfra runs one operation on every host before the next, in this
# one process, so every host's answer is here when the servers decide.
NEEDS: dict[tuple[str, str], bool] = {}


def wants_weights(rollout_id: str, hosts: list[str]) -> bool:
    """Whether any of ``hosts`` wants a copy in this fan-out (unknown counts as yes)."""
    return any(NEEDS.get((rollout_id, h), True) for h in hosts)


@operation()
def needs(settings: Settings, rollout_id: str = "",
          models: tuple[str, ...] = ("target", "drafter")):
    """
    Note whether this host already holds a complete, unchanged copy of each model (its pinned
    revision; a followed branch always counts as wanted). Changes nothing on the host.

    + settings: the deploy's ``Settings``
    + rollout_id: the fan-out the answer is for
    + models: ``target`` and/or ``drafter``
    """
    s = settings
    missing = []
    for which in models:
        src = getattr(s, which)
        state = host.get_fact(WeightsState, path=model_root(s, which))
        rev = state["revisions"].get(src.revision or "")
        if src.follow_branch or not _fast_ok(rev, src.allow_patterns, src.ignore_patterns):
            missing.append(which)
    NEEDS[(rollout_id, host.name)] = bool(missing)
    host.noop(f"wants {', '.join(missing)} from peers" if missing else
              "holds every model already")
    return
    yield  # an operation is a generator


def _fast_ok(rev: dict | None, allow: list[str] | None, ignore: list[str] | None) -> bool:
    return bool(rev and rev["complete"] and not rev["changed"] and not rev["missing"]
                and rev.get("allow_patterns") == allow and rev.get("ignore_patterns") == ignore)


def weights_job(s: Settings, which: str, token_path: str | None, host_name: str) -> dict:
    """The weights agent's job for ``which``, as ``weights.downloaded`` makes it, for the pull
    agent to finish a complete copy with (``verify`` fast: the pull hashed every byte)."""
    src, w = getattr(s, which), s.weights
    root = model_root(s, which)
    job: dict[str, Any] = {
        "repo_id": src.repo_id, "revision": src.revision or "main", "root": root,
        "allow_patterns": src.allow_patterns, "ignore_patterns": src.ignore_patterns,
        "verify": "fast", "endpoint": w.hf_endpoint, "token_path": token_path,
        "stall_minutes": w.stall_minutes, "margin_percent": w.margin_percent,
        "margin_min_gib": w.margin_min_gib, "prune": w.prune_other_revisions, "keep": [],
        "max_workers": 4, "host": host_name,
        "progress_path": weights_progress_path(s.state_dir, os.path.basename(root)),
    }
    job["job_id"] = job_id(job)
    return job


def model_job(s: Settings, which: str, *, rollout_id: str, sources: list[dict], port: int,
              token_path: str | None, host_name: str = "") -> dict[str, Any]:
    """The pull agent's job for ``which`` (no secret: the key is a path)."""
    src = getattr(s, which)
    root = model_root(s, which)
    dir_name = os.path.basename(root)
    fdir = fanout_dir(s.state_dir)
    return {
        "weights_job": weights_job(s, which, token_path, host_name),
        "rollout_id": rollout_id, "repo_id": src.repo_id,
        "revision": src.revision or "main", "root": root,
        "allow_patterns": src.allow_patterns, "ignore_patterns": src.ignore_patterns,
        "endpoint": s.weights.hf_endpoint, "token_path": token_path,
        "sources": sources, "port": port,
        "key_path": join(fdir, f"{dir_name}.key"),
        "known_hosts": join(fdir, f"{dir_name}.known_hosts"),
        "control_dir": control_dir(dir_name),
        "progress_path": pull_progress_path(s.state_dir, dir_name),
        "stall_seconds": s.weights.stall_minutes * 60, "poll_seconds": min(
            s.weights.poll_seconds, 1.0),
    }


@operation()
def model(
    settings: Settings,
    which: str = "target",
    role: str = "seed",
    rollout_id: str = "",
    sources: list[dict] | None = None,
    port: int = FANOUT_PORT,
    private_key: str | None = None,
    servers: dict[str, dict] | None = None,
    wait: bool = True,
):
    """
    The target or the drafter of ``settings``, from upstream or from peers.

    + settings: the deploy's ``Settings``
    + which: ``target`` or ``drafter``
    + role: ``seed`` (``weights.model``: from upstream) or ``peer`` (copy from ``sources``)
    + rollout_id: the fan-out this pull belongs to
    + sources: the peers to copy from, in order: ``[{"host", "address"}]``
    + port: the port of the peers' ephemeral sshd
    + private_key: the rollout's private key (put in a 0600 file for this pull only)
    + servers: ``{host: {"address", "port", "host_public_key"}}``, pinned in known_hosts
    + wait: ``False``: a seed only starts its download (a later run of this operation attaches
      to it and waits); a peer does nothing yet

    A peer that already holds a complete, unchanged copy does nothing. Run ``weights.model``
    after it on every host: it verifies the copy, fetches what peers could not give from
    upstream, writes the manifest and flips ``current``.
    """
    if role not in ("seed", "peer"):
        raise ValueError(f"fanout.model role={role!r}: use seed or peer")
    if role == "seed":
        yield from weights.model._inner(settings=settings, which=which, wait=wait)
        return
    if not wait:
        host.noop(f"the {which} comes from peers once they have it")
        return
    s = settings
    src = getattr(s, which)
    root = model_root(s, which)
    state = host.get_fact(WeightsState, path=root)
    if src.revision and not src.follow_branch:
        rev = state["revisions"].get(src.revision)
        if _fast_ok(rev, src.allow_patterns, src.ignore_patterns):
            host.noop(f"{src.repo_id}@{src.revision[:12]} is already here ({rev['files']} files, "
                      f"{fmt_gib(rev['bytes'])})")
            return
    if not (sources and private_key and servers):
        raise ValueError("fanout.model role=peer needs sources, private_key and servers")
    token_path = s.weights.host_token_path
    if weights.control_token(s.weights) is not None:
        token_path = control_token_path(s)
    job = model_job(s, which, rollout_id=rollout_id, sources=sources, port=port,
                    token_path=token_path, host_name=host.name)
    dir_name = os.path.basename(root)
    unit = pull_unit(dir_name, rollout_id)
    job_path = join(fanout_dir(s.state_dir), f"{dir_name}.pull-job.json")
    python = tools_python()
    agent_path = tools_program(AGENT_NAME)
    for other in host.get_fact(FanoutServe, pattern=pull_unit(dir_name, "*"),
                               digest_path="/dev/null")["active"]:
        yield StringCommand("systemctl", "stop", QuoteString(other))
    yield from _secret_upload(job["key_path"], private_key.strip() + "\n")
    yield FileUploadCommand(StringIO(known_hosts(servers)), job["known_hosts"])
    yield FileUploadCommand(StringIO(json.dumps(job, indent=1, sort_keys=True)), job_path)
    yield pull_start_command(unit, job, src.repo_id, python, agent_path, job_path)
    yield FunctionCommand(_wait, (), {
        "unit": unit, "progress_path": job["progress_path"], "rollout_id": rollout_id,
        "poll_seconds": job["poll_seconds"], "agent": (python, agent_path),
        # No longer than its sources serve (their sshd's lifetime).
        "deadline_s": s.rollout.fanout_serve_hours * 3600,
    })


# The most memory a pull's unit may take (systemd's MemoryMax=): a receiver keeps a source's
# newest status and the last lines of its stderr, and streams files in 1 MiB chunks, so a
# source that floods it is cut off here rather than growing the host's memory.
PULL_MEMORY_MAX = "1G"


def pull_start_command(unit: str, job: dict[str, Any], repo_id: str, python: str,
                       agent_path: str, job_path: str) -> StringCommand:
    """Start the pull as a transient unit, its memory capped (``PULL_MEMORY_MAX``)."""
    return StringCommand(
        "rm", "-f", QuoteString(job["progress_path"]), "&&",
        "systemd-run", "--quiet", "--collect", QuoteString(f"--unit={unit}"),
        QuoteString(f"--description=specfleet fan-out: {repo_id} from peers"),
        "--property=TimeoutStopSec=30", "--property=Nice=5",
        f"--property=MemoryMax={PULL_MEMORY_MAX}", "--property=MemorySwapMax=0",
        f"--property=RuntimeDirectory={os.path.basename(job['control_dir'])}",
        "--property=RuntimeDirectoryMode=0700",
        "--", QuoteString(python), QuoteString(agent_path), "pull", QuoteString(job_path),
    )


# How long one look at a pull's progress may wait on the host for its end (progress on the way
# is told at most every ``fanout_agent.PROGRESS_SETTLE_SECONDS``; the end at once).
PROGRESS_WAIT_SECONDS = 30


def watch_command(unit: str, progress_path: str, agent: tuple[str, str] | None,
                  seen: float | None):
    """The pull's units and progress, after waiting on the host (``fanout_agent.py wait``)
    until the progress is news to a watcher that saw ``seen`` (its ``updated_at``): one round
    trip per change of the pull, not one per poll, from the control machine to every host."""
    look = job_command(f"{unit}.service", progress_path)
    if agent is None:
        return look
    return StringCommand(
        QuoteString(agent[0]), QuoteString(agent[1]), "wait", QuoteString(progress_path),
        "none" if seen is None else repr(float(seen)), str(PROGRESS_WAIT_SECONDS),
        ">/dev/null", "2>&1", ";", look,
    )


def _wait(state, host, unit: str, progress_path: str, rollout_id: str,
          poll_seconds: float, agent: tuple[str, str] | None = None,
          deadline_s: float | None = None) -> bool:
    """Watch the pull's progress until it ends (on the host, ``watch_command``), at most
    ``deadline_s`` (then the pull is stopped). A pull never fails the host: what it could not
    copy, ``weights.model`` fetches from upstream. What the host's progress file says (a
    source's words among them) is shown printable only."""
    last_line, events_seen, gone_since = "", 0, None
    seen: float | None = None
    began = time.monotonic()
    while True:
        if deadline_s is not None and time.monotonic() - began > deadline_s:
            host.run_shell_command(StringCommand("systemctl", "stop", QuoteString(unit)),
                                   print_output=False, print_input=False)
            host.log_styled(f"the peer copy ran past its deadline of {deadline_s:.0f} s "
                            "(rollout.fanout_serve_hours); stopped, the weights step fetches "
                            "the rest from upstream", fg="yellow", log_func=logger.warning)
            return True
        asked = time.monotonic()
        ok, output = host.run_shell_command(watch_command(unit, progress_path, agent, seen),
                                            print_output=False, print_input=False)
        info = parse_job([line.line for line in output if line.buffer_name == "stdout"])
        seen = (info["progress"] or {}).get("updated_at")
        p = info["progress"] if (info["progress"] or {}).get("rollout_id") == rollout_id else None
        if p is not None:
            events = p.get("events") or []
            for ev in events[events_seen:]:
                host.log_styled(printable(ev.get("text", ""), 500), fg="cyan")
            events_seen = len(events)
            line = format_pull(p)
            if line != last_line:
                host.log(line)
                last_line = line
            if p.get("state") in ("done", "partial", "failed") and not info["active"]:
                if p["state"] != "done":
                    host.log_styled(
                        f"peer copy {p['state']}: "
                        f"{printable((p.get('error') or {}).get('message', ''), 500)} "
                        "the weights step fetches the rest from upstream",
                        fg="yellow", log_func=logger.warning)
                return True
        if not info["active"]:
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > max(3 * poll_seconds, 10):
                host.log_styled(f"the pull unit {unit} ended without a result (see journalctl "
                                f"-u {unit}); the weights step fetches from upstream",
                                fg="yellow", log_func=logger.warning)
                return True
        else:
            gone_since = None
        if time.monotonic() - asked < poll_seconds:
            gevent.sleep(poll_seconds)  # answered at once (an ended pull's unit still exits)


@operation()
def cleanup(state_dir: str = "/var/lib/specfleet"):
    """
    Remove what a fan-out left on this host: pull units, keys, known_hosts, jobs, the sshd.

    + state_dir: specfleet's state folder on the host
    """
    fdir = fanout_dir(state_dir)
    listing = host.get_fact(FanoutLeftovers, path=fdir)
    if not listing["units"] and not listing["files"]:
        host.noop("no fan-out leftovers")
        return
    for unit in listing["units"]:
        yield StringCommand("systemctl", "stop", QuoteString(unit))
    if listing["files"]:
        # Progress files (*.pull.json) stay: they are the record of where the bytes came from.
        yield StringCommand(
            "find", QuoteString(fdir), "-mindepth", "1", "-maxdepth", "1", "!", "-name",
            QuoteString("*.pull.json"), "-exec", "rm", "-rf", "{}", "+",
        )


__all__ = ["agent", "cleanup", "model", "needs", "serve"]


_PLANS: dict[str, dict[str, Any]] = {}


def load_plan(path: str | None = None) -> dict[str, Any]:
    """The plan of this run, for the prefetch deploy (``SPECFLEET_FANOUT_PLAN``): ``fd:N:ID``, an
    anonymous in-memory file inherited from ``specfleet.fleet.fanout`` (read once from its start,
    then kept here: the deploy file runs once per host), or the path of a JSON file."""
    path = path or os.environ.get(PLAN_ENV)
    if not path:
        raise SpecfleetError(
            f"no fan-out plan ({PLAN_ENV} is not set)",
            fix="run the fan-out prefetch through `specfleet fanout INVENTORY` or the "
            "rollout, not pyinfra directly",
        )
    if not path.startswith("fd:"):
        return json.loads(Path(path).read_text())
    if path not in _PLANS:
        fd = int(path.split(":")[1])
        chunks: list[bytes] = []
        try:
            while chunk := os.pread(fd, 1 << 20, sum(map(len, chunks))):
                chunks.append(chunk)
        except OSError as e:
            raise SpecfleetError(
                f"the fan-out plan ({path}) cannot be read: {e.strerror}",
                fix="run the fan-out prefetch through `specfleet fanout INVENTORY` or the "
                "rollout, not pyinfra directly",
            ) from None
        _PLANS[path] = json.loads(b"".join(chunks))
    return _PLANS[path]
