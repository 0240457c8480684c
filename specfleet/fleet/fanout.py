"""Download once per fleet, spread host to host over the LAN: the rollout's prefetch with fan-out.

    specfleet fanout INVENTORY [--order h1,h2,...] [--degree N] [--sshd-port 22113]
        [--limit h1 --limit h2 ...] [--report FILE.json] [pyinfra's connection options]

For each model (target, drafter), the hosts that want the same revision from the same place, at the
same site (``rollout.fanout_site``, unset: one site), form a **swarm**. Its first host
(``--order``, else inventory order; the drafter's swarm starts one host further on, so that two
hosts share the upstream work) is the **seed**: it downloads from upstream (the Hub or
``weights.hf_endpoint``) as ``weights.model`` always does. The others copy from peers, in a tree of
``degree`` children per host (by default the smallest, from 2, that keeps every host within two
hops of the seed: 2 up to 7 hosts, 4 at 16; ``specfleet.core.fanout.auto_degree``): host *i* of
the swarm copies from host ``(i-1)//degree``, then from that one's own source, up to the seed.
A copy is pipelined: a peer takes each file as soon as its
source has verified it, so the fleet finishes a little after the seed, and the upstream link
carries each byte once.

The copy goes over ssh with keys made for this run on the control machine, kept in memory
only: the plan with its keys reaches the prefetch deploy as an inherited descriptor of an anonymous
in-memory file (``SPECFLEET_FANOUT_PLAN`` = ``fd:N:ROLLOUT_ID``; ``memfd_create``), never a named
file, so no kill of this process can leave a key on its disk:
- one client key pair: its private half goes to each receiver in a 0600 file for the one pull,
  deleted when the pull ends; its public half is accepted by each serving peer's **ephemeral
  sshd** (its own port, its own host key made here, a ``systemd-run`` unit that stops itself
  after ``rollout.fanout_serve_hours``, 2 h by default), only from that peer's receivers
  (``from=``) and only for reading the revision folders it fans out (``restrict``, forced
  command ``fanout_agent.py serve``: a status, or a send of named regular files under that
  revision folder, no symlink followed, no path out of it);
- a host key per serving peer: receivers pin it (``StrictHostKeyChecking=yes``), no trust on
  first use.

Every copied file is hashed on the receiver against the Hub's sha256 (LFS) or git blob id, as
the weights agent does; a mismatch is deleted and fetched from upstream by ``weights.model``,
which runs on every host after the copy, writes the manifest and flips ``current``. At the end
the sshd units stop and every key, known_hosts and job file is removed: by the prefetch deploy,
and by a cleanup run on every exit path that did not get every host through it: a failed host,
an exception, Ctrl-C or SIGTERM (the cleanup runs first, then the run ends: ``Interrupted``,
exit 128 + the signal).

The rollout (``specfleet/fleet/rollout.py``) runs this as its prefetch stage when
``rollout.fanout`` is
set (the default) or ``--fanout`` is given: ``run_prefetch(inventory, hosts, order, runner)``.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specfleet.core.errors import SpecfleetError
from specfleet.core.fanout import (
    FANOUT_PORT,
    MODELS,
    PLAN_ENV,
    plan_fanout,
    swarm_key,
)
from specfleet.core.runlock import RUN_ID_ENV, controller_run_id
from specfleet.core.settings import settings_for_host
from specfleet.fleet.pyinfra_run import (
    PyinfraOptions,
    deploy_path,
    hand_down,
    host_address,
    inventory_groups,
    run_pyinfra,
    select_hosts,
    stop_runs,
)
from specfleet.fleet.pyinfra_run import load_inventory as read_inventory

PREFETCH_DEPLOY = "fanout_prefetch.py"
CLEANUP_DEPLOY = "fanout_cleanup.py"


# --------------------------------------------------------------------------------------------------
# Keys (made here, for one run)
# --------------------------------------------------------------------------------------------------


def make_keypair(comment: str) -> tuple[str, str]:
    """A new ed25519 key pair: (private key in OpenSSH PEM, public key line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    return private, f"{public} {comment}"


def add_keys(plan: dict[str, Any], port: int, rollout_id: str) -> dict[str, Any]:
    """The plan with this run's keys: one client pair, one host key per serving peer."""
    plan = json.loads(json.dumps(plan))
    plan["rollout_id"] = rollout_id
    plan["port"] = port
    plan["private_key"], plan["public_key"] = make_keypair(f"specfleet-fanout-{rollout_id}")
    plan["servers"] = {}
    for h, info in plan["hosts"].items():
        if info["receivers"]:
            priv, pub = make_keypair(f"specfleet-fanout-host-{h}-{rollout_id}")
            info["host_private_key"] = priv
            plan["servers"][h] = {"address": info["address"], "port": port,
                                  "host_public_key": pub}
    return plan


# --------------------------------------------------------------------------------------------------
# I/O: the inventory, the runs
# --------------------------------------------------------------------------------------------------


def load_inventory(inventory: str, only: Sequence[str] | None = None,
                   ) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """The inventory's hosts (in order), the address each is reached at, and the Settings of
    each host in ``only`` (default: all; a host not in play is never validated)."""
    inv = read_inventory(inventory)
    hosts, addresses, settings = [], {}, {}
    for host in inv:
        hosts.append(host.name)
        addresses[host.name] = resolve_address(host_address(host.name, host.data))
        if only is None or host.name in only:
            settings[host.name] = settings_for_host(host)
    return hosts, addresses, settings


def resolve_address(name: str) -> str:
    """An IP address for ``from=`` and for peers to connect to."""
    import ipaddress
    import socket

    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        raise SpecfleetError(
            f"cannot resolve {name} to an address for the fan-out", host=name,
            fix="give the host's IP as ssh_hostname in the inventory, or run with --no-fanout",
        ) from None


# --------------------------------------------------------------------------------------------------
# Every exit path cleans the hosts up: signals; the plan's keys only in memory
# --------------------------------------------------------------------------------------------------


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the fan-out; its cleanup ran on the hosts first."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


def _in_main_greenlet() -> bool:
    """Whether Python code runs in the main flow: always without gevent; under pyinfra's gevent
    (the controller imports pyinfra_cli), only in the thread's root greenlet, not in the hub or a
    reader greenlet, where a signal handler may also run."""
    greenlet = sys.modules.get("greenlet")
    if greenlet is None:
        return True
    try:
        return greenlet.getcurrent().parent is None
    except Exception:  # noqa: BLE001 - an unknown greenlet: take it as the main flow
        return True


class _Signals:
    """SIGINT and SIGTERM stop the fan-out once: the handler stops the pyinfra runs of this
    process (``pyinfra_run.stop_runs``) and raises ``Interrupted`` in the main flow (so that
    ``finally`` runs the cleanup); where it lands elsewhere (a gevent greenlet) it only records
    the signal, the stopped run returns, and ``check()`` raises it. A later signal, or one during
    the cleanup, is said and recorded, never raised. The old handlers come back at the end. Off
    the main thread nothing is installed (try/finally still cleans up after an exception)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, hours: float):
        self.hours = hours
        self.cleaning = False
        self.got: int | None = None
        self.old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.got is not None or self.cleaning:
            self.got = self.got or signum
            print(f"fanout: {signal.Signals(signum).name}: cleaning up the hosts first (their "
                  f"fan-out sshd stops by itself within {self.hours:g} h; kill -9 leaves it to "
                  "that)", file=sys.stderr, flush=True)
            return
        self.got = signum
        stop_runs()
        if _in_main_greenlet():
            raise Interrupted(signum)

    def check(self) -> None:
        """Raise the signal that came, if one did."""
        if self.got is not None:
            raise Interrupted(self.got)


def _memory_file(data: bytes) -> int:
    """A file descriptor of an anonymous file holding ``data``, at offset 0: in memory
    (``memfd_create``, Linux), else an unnamed temporary file (0600, unlinked at once, in a 0700
    folder removed at once). Either way no name on disk holds the data, and it goes when the last
    descriptor closes, whatever kills this process. (A pipe would need a writer thread, a greenlet
    under pyinfra's gevent, that a blocking write could stall.)"""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("specfleet-fanout-plan")
    else:  # pragma: no cover - macOS, the BSDs
        folder = tempfile.mkdtemp(prefix="specfleet-fanout-")
        try:
            os.chmod(folder, 0o700)
            fd = os.open(os.path.join(folder, "plan"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.unlink(os.path.join(folder, "plan"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@contextmanager
def plan_for_deploy(full: dict[str, Any]) -> Iterator[str]:
    """``SPECFLEET_FANOUT_PLAN`` names an anonymous in-memory file holding ``full`` (with its
    private keys) while the block runs; the pyinfra runs started in it inherit its descriptor
    (``pyinfra_run.hand_down``), and it is closed at the end."""
    fd = _memory_file(json.dumps(full).encode())
    ref = f"fd:{fd}:{full['rollout_id']}"
    old = os.environ.get(PLAN_ENV)
    os.environ[PLAN_ENV] = ref
    try:
        with hand_down(fd):
            yield ref
    finally:
        if old is None:
            os.environ.pop(PLAN_ENV, None)
        else:
            os.environ[PLAN_ENV] = old
        os.close(fd)


def run_prefetch(
    inventory: str,
    hosts: Sequence[str],
    order: Sequence[str] | None = None,
    runner: Callable[..., Any] | None = None,
    degree: int | None = None,
    port: int | None = None,
    name: str = "prefetch",
    plan_out: dict | None = None,
) -> Any:
    """The prefetch stage with fan-out on ``hosts``: one pyinfra run of the prefetch deploy
    (``runner(inventory, deploy, hosts, name)``, the rollout's ``run_pyinfra`` by default),
    then a cleanup run on every host if some host did not get through it, or if the run ends
    any other way: an exception, Ctrl-C or SIGTERM (raised again after the cleanup, the signals
    as ``Interrupted``). Returns the prefetch's StepRun. ``plan_out`` (a dict) receives the plan
    without its keys."""
    if runner is None:
        runner = run_pyinfra
    all_hosts, addresses, settings = load_inventory(inventory, list(hosts))
    hosts = [h for h in all_hosts if h in set(hosts)]
    keys = {w: {h: swarm_key(settings[h], w) for h in hosts} for w in MODELS}
    plan = plan_fanout(hosts, addresses, keys, order, degree)
    if plan_out is not None:
        plan_out.update(json.loads(json.dumps(plan)))
    # The fan-out's units and state on the hosts are keyed by the run that makes it (the
    # rollout's id, SPECFLEET_RUN_ID), which holds every host's run lock meanwhile.
    rollout_id = os.environ.get(RUN_ID_ENV, "").strip() or secrets.token_hex(6)
    full = add_keys(plan, port or FANOUT_PORT, rollout_id)
    for sw in plan["swarms"]:
        print(f"fanout: {sw['which']} {' -> '.join(sw['hosts'][:1])} seeds "
              f"{', '.join(sw['hosts'][1:]) or 'no peers'} (degree {sw['degree']})",
              file=sys.stderr)
    prefetch, cleanup = str(deploy_path(PREFETCH_DEPLOY)), str(deploy_path(CLEANUP_DEPLOY))
    hours = max((settings[h].rollout.fanout_serve_hours for h in hosts), default=0.0)
    guard = _Signals(hours)
    clean, why = False, None
    with guard:
        try:
            with plan_for_deploy(full):
                step = runner(inventory, prefetch, hosts, name)
            guard.check()
            clean = all(r.passed for r in step.results.values())
        except Interrupted as exc:
            why = f"stopped by {exc.signal_name}"
            raise
        except BaseException as exc:
            why = f"stopped by {type(exc).__name__}: {exc}".rstrip(": ")
            raise
        finally:
            if not clean:
                guard.cleaning = True  # a signal now is said, not raised: the cleanup goes on
                if why:
                    print(f"fanout: {why}; stopping the fan-out's sshd and pulls and removing "
                          "its keys on every host", file=sys.stderr, flush=True)
                _cleanup(runner, inventory, cleanup, hosts, f"{name} cleanup", hours)
    guard.check()  # a signal at the very end: the hosts are clean; stop here all the same
    return step


def _cleanup(runner: Callable[..., Any], inventory: str, deploy: str, hosts: Sequence[str],
             name: str, hours: float) -> None:
    """The cleanup deploy on ``hosts``; its failure is said, never raised over the run's own
    outcome."""
    try:
        step = runner(inventory, deploy, hosts, name)
        failed = [h for h, r in step.results.items() if not r.passed]
    except Exception as exc:  # noqa: BLE001 - the run's own outcome comes first
        failed = [f"{type(exc).__name__}: {exc}"]
    if failed:
        print(f"fanout: the cleanup did not get through ({', '.join(failed)}): run "
              f"`pyinfra INVENTORY deploys/{CLEANUP_DEPLOY}` there; each fan-out sshd stops by "
              f"itself within {hours:g} h", file=sys.stderr, flush=True)


def run_fanout(inventory: str, options: PyinfraOptions, order: str | None = None,
               degree: int | None = None, sshd_port: int | None = None,
               report: str | None = None) -> int:
    """``specfleet fanout``: the prefetch on the inventory's hosts in play (``--limit``), over
    pyinfra's connection options; prints each host's result, exit 0/1 (3: bad input)."""
    try:
        hosts, _, _ = load_inventory(inventory)
        if options.limit:  # host names, globs or groups, as pyinfra's --limit
            groups = inventory_groups(read_inventory(inventory, options.override_data()))
            hosts = select_hosts(hosts, groups, options.limit)
        order_list = [h.strip() for h in order.split(",") if h.strip()] if order else None
        plan: dict[str, Any] = {}
        # Its pyinfra runs (the prefetch, a cleanup) are one owner of the hosts' run locks.
        controller_run_id(os.environ)
        runner = functools.partial(run_pyinfra, options=options)
        step = run_prefetch(inventory, hosts, order_list, runner, degree, sshd_port,
                            plan_out=plan)
    except SpecfleetError as exc:
        print(exc.render(), file=sys.stderr)
        return 3
    except Interrupted as exc:
        print(f"fanout: stopped by {exc.signal_name}; the hosts were cleaned up (no fan-out sshd, "
              "pull or key left)", file=sys.stderr)
        return 128 + exc.signum
    width = max(len(h) for h in hosts)
    for h in hosts:
        r = step.results[h]
        why = "; ".join(r.why) if r.why else ""
        print(f"{h.ljust(width)}  {r.status:<11} {why}".rstrip())
    if report:
        Path(report).write_text(json.dumps({
            "seconds": step.seconds, "plan": plan,
            "hosts": {h: {"status": r.status, "why": r.why} for h, r in step.results.items()},
        }, indent=2))
    return 0 if all(r.passed for r in step.results.values()) else 1
