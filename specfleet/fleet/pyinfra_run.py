"""Running deploy files with pyinfra's Python API, in this process, and reading what each host did.

The fleet controllers (the rollout, the fan-out) hold one pyinfra ``State`` for the whole run:
the inventory is loaded once, each host in play is connected once, and each step (a deploy file
of the checkout, run by path as pyinfra's CLI does, never imported) is loaded for its hosts and
run with ``run_ops``. Each host's result and error text come from pyinfra's own objects: the
connect errors and failed operations its state callbacks report, ``state.failed_hosts``, and the
``OperationMeta`` of every operation (``did_change()``, ``did_error()``, its commands and their
output), never from its log or from operation names.

pyinfra's options for a run are the ones its CLI takes (``PyinfraOptions``): ``--ssh-user``,
``--key``, ``--port``, ``--sudo``, ``--sudo-user``, ``--data k=v``, ``--config FILE``, ``-v``,
and ``--limit`` (host names, globs or groups).
"""

from __future__ import annotations

import ast
import fnmatch
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specfleet.core.errors import (
    CHECK_ATTR,
    CONDITION_ATTR,
    ERROR_ATTR,
    PLANNED_ERROR_ATTR,
    SpecfleetError,
)
from specfleet.fleet.user_code import is_user_code_error, user_code_error

CHECKOUT_ENV = "SPECFLEET_CHECKOUT"
OK, CHANGED, FAILED, ROLLED_BACK, NOT_STARTED = (
    "ok", "changed", "failed", "rolled back", "not started",
)  # fmt: skip
UNREACHABLE, BUSY = "unreachable", "busy"
# A connected host that does not answer a ``true`` within this long is connected again.
ALIVE_TIMEOUT_S = 10.0


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


def deploy_path(name: str, checkout: str | None = None) -> Path:
    """A deploy file of the checkout, by name (``deploys/<name>``)."""
    return checkout_dir(checkout) / "deploys" / name


def say(text: str) -> None:
    print(f"rollout: {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# Pure: pyinfra's options, as its CLI takes them
# --------------------------------------------------------------------------------------------------


def parse_data_value(value: str) -> Any:
    """``--data k=v``'s value as pyinfra's CLI reads it (``pyinfra_cli.util.parse_cli_arg``:
    true/false, an integer, JSON, else the text), and a Python literal too (``True``, ``None``,
    tuples: what ``bench.run_with_data`` writes)."""
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


@dataclass
class PyinfraOptions:
    """pyinfra's connection and execution options, as a user gives them to ``pyinfra`` itself."""

    ssh_user: str | None = None
    key: str | None = None
    port: int | None = None
    sudo: bool = False
    sudo_user: str | None = None
    data: list[str] = field(default_factory=list)
    config: str | None = None
    verbosity: int = 0
    limit: list[str] = field(default_factory=list)
    parallel: int | None = None

    def override_data(self) -> dict[str, Any]:
        """``--data`` and the SSH flags, over every other piece of host data (as the CLI does)."""
        out: dict[str, Any] = {}
        for item in self.data:
            if "=" not in item:
                raise SpecfleetError(f"--data {item!r} is not KEY=VALUE",
                                     fix="give --data as key=value, e.g. --data ssh_port=2222")
            key, value = item.split("=", 1)
            out[key.strip()] = parse_data_value(value)
        for key, value in (("ssh_user", self.ssh_user), ("ssh_key", self.key),
                           ("ssh_port", self.port)):
            if value:
                out[key] = value
        return out

    def argv(self) -> list[str]:
        """The same options as flags of ``pyinfra`` (to run it, or for a message telling the
        user a command); ``specfleet``'s subcommands take the same flags."""
        out: list[str] = []
        for flag, value in (("--user", self.ssh_user), ("--key", self.key),
                            ("--port", self.port), ("--sudo-user", self.sudo_user),
                            ("--config", self.config), ("--parallel", self.parallel)):
            if value:
                out += [flag, str(value)]
        if self.sudo:
            out.append("--sudo")
        for item in self.data:
            out += ["--data", item]
        for item in self.limit:
            out += ["--limit", item]
        if self.verbosity:
            out.append("-" + "v" * self.verbosity)
        return out


def select_hosts(hosts: Sequence[str], groups: dict[str, list[str]],
                 limit: Sequence[str]) -> list[str]:
    """The hosts in play, in inventory order: all of them, or those ``limit`` names (a group, a
    host name or an fnmatch glob over host names, as pyinfra's ``--limit``). A limit that matches
    nothing is an error (a typo would otherwise run on no host, or the wrong ones)."""
    if not limit:
        return list(hosts)
    chosen: set[str] = set()
    for item in limit:
        for part in (p.strip() for p in item.split(",")):
            if not part:
                continue
            if part in groups:
                matched = set(groups[part])
            else:
                matched = {h for h in hosts if fnmatch.fnmatch(h, part)}
            if not matched:
                raise SpecfleetError(
                    f"--limit {part} matches no host or group of the inventory",
                    fix=f"use a host ({', '.join(hosts)}) or a group "
                    f"({', '.join(sorted(groups))})",
                )
            chosen |= matched
    return [h for h in hosts if h in chosen]


# --------------------------------------------------------------------------------------------------
# I/O: the inventory, read by pyinfra's own CLI loader
# --------------------------------------------------------------------------------------------------


def _exec_python(path: Path) -> dict[str, Any]:
    """A pyinfra ``config.py``'s names (``Session._config_file``)."""
    names: dict[str, Any] = {"__file__": str(path)}
    try:
        code = compile(path.read_text(), str(path), "exec")
        exec(code, names)  # noqa: S102 - a config file is Python, as pyinfra's
    except SpecfleetError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's own code: said as theirs, file and line
        raise user_code_error(exc, [str(path)]) from None
    return names


def inventory_names(text: str) -> list[str] | None:
    """An inventory given as pyinfra takes one on its command line instead of a file: ``@local``,
    a host name (``@ssh/host`` too), or a comma list of them; None when ``text`` looks like a
    file path (a missing file is then said as such, not tried as a host name)."""
    if not text or text.endswith(".py"):
        return None
    names = [part.strip() for part in text.split(",")]
    if not all(names) or any(c.isspace() for n in names for c in n):
        return None
    if any("/" in n and not n.startswith("@") for n in names):  # a path, not a host
        return None
    return names


def load_inventory(path: str, override_data: dict[str, Any] | None = None,
                   only: Sequence[str] | None = None) -> Any:
    """A ``pyinfra.api.Inventory`` read by pyinfra's own CLI loader
    (``pyinfra_cli.inventory.make_inventory``), so every form ``pyinfra`` takes works: a file
    (module-level lists are groups, ``group_data/`` beside it and in the current directory),
    ``@local``, ``@ssh/host``, a host name, a comma list. With ``only``, the inventory holds just
    those hosts (the hosts in play, their groups and data as loaded): a deploy that reads every
    host's settings then never sees the others."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory
    from pyinfra_cli.util import PYTHON_CODES

    if not Path(path).is_file() and inventory_names(path) is None:
        raise SpecfleetError(
            f"no inventory file {path}",
            fix="give a pyinfra inventory: a file, @local, a host name or a comma list of "
            "host names (as pyinfra takes them)")
    # pyinfra's CLI runs once per process and keeps each file's compiled code by path; this
    # process may read an inventory or its group data again after they changed (a sweep writes
    # group data), so it reads them as they are now.
    PYTHON_CODES.clear()
    with ctx_state.use(State()):  # as pyinfra's CLI: its files run with a state in context
        try:
            inv = make_inventory(path, override_data=override_data or {}, cwd=os.getcwd())
        except SyntaxError as exc:  # compiled before pyinfra's wrapper: the user's file
            raise user_code_error(exc, [path]) from None
        except Exception as exc:
            if is_user_code_error(exc):  # the inventory's or group data's own Python raised
                raise user_code_error(exc, [path]) from None
            raise
    if not len(inv):
        raise SpecfleetError(
            f"the inventory {path} has no host (pyinfra read it as a module or a host name that "
            "does not resolve)",
            fix="give an inventory file with hosts, @local, @ssh/HOST, or a comma list of host "
            "names (`pyinfra INVENTORY debug-inventory` shows how pyinfra reads it)")
    return inv if only is None else _only_hosts(inv, only)


def _only_hosts(inv: Any, only: Sequence[str]) -> Any:
    """``inv`` with just the hosts named in ``only``: the same host, group and fleet data."""
    from pyinfra.api import Inventory

    keep = set(only)
    names = [(h.name, dict(inv.host_data[h.name])) for h in inv if h.name in keep]
    groups = {name: ([h.name for h in members if h.name in keep], dict(inv.group_data[name]))
              for name, members in inv.groups.items()}
    for name, data in inv.group_data.items():  # group data of no host still reads as a group
        groups.setdefault(name, ([], dict(data)))
    groups.pop("all", None)
    return Inventory((names, dict(inv.data)), override_data=inv.override_data, **groups)


def host_address(name: str, data: Any) -> str:
    """Where a host of the inventory is reached: its ``ssh_hostname`` (pyinfra's ``@ssh/HOST``
    sets it), this machine for ``@local``, else its name."""
    return str(data.get("ssh_hostname") or ("127.0.0.1" if name == "@local" else name))


def inventory_groups(inv: Any) -> dict[str, list[str]]:
    return {name: [h.name for h in hosts] for name, hosts in inv.groups.items()}


# --------------------------------------------------------------------------------------------------
# What each host did in one step
# --------------------------------------------------------------------------------------------------


@dataclass
class HostStep:
    """One host in one step."""

    status: str  # "ok", "changed", "failed", "unreachable", "not started"
    changed_ops: list[str] = field(default_factory=list)
    # Dry: operations that change only if their condition holds at run time ("NAME (if ...)").
    conditional_ops: list[str] = field(default_factory=list)
    error_ops: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status in (OK, CHANGED)


@dataclass
class StepRun:
    name: str
    hosts: list[str]
    rc: int
    seconds: float
    results: dict[str, HostStep]


def _op_name(state: Any, op_hash: str) -> str:
    return ", ".join(sorted(state.op_meta[op_hash].names)) or "an operation"


def _conditional_name(state: Any, op_hash: str, condition: Any) -> str:
    """A conditional operation with its condition in words where it has them (``CONDITION_ATTR``,
    ``operations.util.changed_if``)."""
    conditions = condition if isinstance(condition, list) else [condition]
    words = [getattr(c, CONDITION_ATTR, None) for c in conditions]
    said = " and ".join(w for w in words if w) or "if its condition holds at run time"
    return f"{_op_name(state, op_hash)} ({said})"


def _on_changes_only(condition: Any) -> bool:
    """Whether an ``_if`` holds only when other operations change: pyinfra's ``any_changed`` /
    ``all_changed`` or specfleet's ``changed_if`` (a lambda of another kind may read anything)."""
    conditions = condition if isinstance(condition, list) else [condition]
    return all(getattr(c, CONDITION_ATTR, None) or getattr(c, "__qualname__", "").startswith(
        ("any_changed.", "all_changed.")) for c in conditions)


def failure_text(meta: Any) -> list[str]:
    """Why an operation failed on a host, from its ``OperationMeta``: the reason the operation
    gave there (``ERROR_ATTR``: a specfleet error's problem, journal excerpt and fix), else the
    last lines its failed command printed on stderr (then stdout)."""
    said = getattr(meta, ERROR_ATTR, None)
    if said:
        lines = [ln.strip() for ln in str(said).splitlines() if ln.strip()]
        keep = [ln for ln in lines if not ln.startswith("|")]
        return keep[:4] or lines[:1]
    try:
        out = meta.stderr_lines or meta.stdout_lines
    except Exception:  # noqa: BLE001 - an operation that never completed has no output
        out = []
    out = [ln.strip() for ln in out if ln.strip()]
    return out[-3:]


def _is_check(meta: Any) -> bool:
    commands = list(getattr(meta, "_commands", None) or [])
    return bool(commands) and all(getattr(c, CHECK_ATTR, False) for c in commands)


class _Recorder:
    """pyinfra state callbacks: which host failed to connect (and why), and which operation
    failed each host. (A ``pyinfra.api.BaseStateCallback`` in duck form, made at run time.)"""

    def __init__(self) -> None:
        self.connect_errors: dict[str, str] = {}
        self.op_errors: dict[str, list[str]] = {}
        self.listeners: list[Callable[[str, str, str], None]] = []

    def host_connect_error(self, state: Any, host: Any, error: Any) -> None:
        self.connect_errors[host.name] = str(error.args[0] if getattr(error, "args", None)
                                             else error)

    def operation_host_start(self, state: Any, host: Any, op_hash: str) -> None:
        if op_hash in state.op_meta:
            for fn in self.listeners:
                fn(host.name, "start", _op_name(state, op_hash))

    def operation_host_error(self, state: Any, host: Any, op_hash: str, retry_count: int = 0,
                             max_retries: int = 0) -> None:
        self.op_errors.setdefault(host.name, []).append(op_hash)


def _callback_class() -> type:
    from pyinfra.api.state import BaseStateCallback

    class Recorder(_Recorder, BaseStateCallback):
        pass

    return Recorder


# --------------------------------------------------------------------------------------------------
# The session: one State for the whole run
# --------------------------------------------------------------------------------------------------


def _echo_to_stderr(message: Any = None, nl: bool = True, **_: Any) -> None:
    """pyinfra's echo (a command's output it prints) on stderr: stdout is the result's."""
    sys.stderr.write(f"    {'' if message is None else message}{chr(10) if nl else ''}")
    sys.stderr.flush()


def _log_to_stderr(verbosity: int) -> None:
    """pyinfra's log and echoed output to stderr for the person watching (as its CLI shows them);
    never parsed."""
    from pyinfra.api.output import set_echo

    set_echo(_echo_to_stderr)
    log = logging.getLogger("pyinfra")
    if any(getattr(h, "_specfleet", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("    %(message)s"))
    handler._specfleet = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbosity > 3 else logging.INFO)
    log.propagate = False


class Session:
    """One pyinfra ``State`` for a controller's whole run: ``connect`` the hosts in play once,
    then ``run`` deploy files on any of them, step after step, over the same connections (so a
    lock a step keeps for the run stays held, and renewed, between steps); ``close`` disconnects
    (which releases what the run holds)."""

    def __init__(self, inventory: str, options: PyinfraOptions | None = None,
                 dry: bool = False) -> None:
        import pyinfra
        from pyinfra.api import Config, State

        self.options = options or PyinfraOptions()
        self.dry = dry
        self.inventory_path = (os.path.abspath(inventory) if os.path.exists(inventory)
                               else inventory)  # @local, a host name or a comma list
        where = str(checkout_dir())
        if where not in sys.path:  # deploy files import operations/facts from the checkout
            sys.path.insert(0, where)
        pyinfra.is_cli = False
        full = load_inventory(self.inventory_path, self.options.override_data())
        self.all_hosts = [h.name for h in full]
        self.all_groups = inventory_groups(full)
        self.in_play = select_hosts(self.all_hosts, self.all_groups, self.options.limit)
        self.inventory = load_inventory(self.inventory_path, self.options.override_data(),
                                        only=self.in_play)
        config = Config()
        if self.options.sudo:
            config.SUDO = True
        if self.options.sudo_user:
            config.SUDO_USER = self.options.sudo_user
        if self.options.parallel:
            config.PARALLEL = self.options.parallel
        self.state = State(check_for_changes=dry)
        self.state.cwd = where
        self._config_file(config)
        self.state.init(self.inventory, config)
        v = self.options.verbosity
        self.state.print_noop_info = self.state.print_fact_info = v > 0
        self.state.print_input = self.state.print_fact_input = v > 1
        self.state.print_output = self.state.print_fact_output = v > 2
        _log_to_stderr(v)
        self.recorder = _callback_class()()
        self.state.add_callback_handler(self.recorder)
        self.hosts = [h.name for h in self.inventory]
        self.groups = inventory_groups(self.inventory)
        self.connected: set[str] = set()

    def _config_file(self, config: Any) -> None:
        """``--config FILE`` (or ``config.py`` in the checkout), exec'd as pyinfra's CLI does:
        its upper-case names set the config."""
        path = self.options.config
        if path is None:
            default = Path(self.state.cwd or ".") / "config.py"
            path = str(default) if default.is_file() else None
        if path is None:
            return
        if not Path(path).is_file():
            raise SpecfleetError(f"no pyinfra config file {path}",
                                 fix="give --config a pyinfra config.py")
        from pyinfra.context import ctx_state

        # pyinfra's CLI sets its state in context before it execs the config file: the file's
        # `from pyinfra import state` is this run's state, never one left by an earlier run.
        with ctx_state.use(self.state):
            names = _exec_python(Path(path))
        for key, value in names.items():
            if key.isupper():
                setattr(config, key, value)

    def host(self, name: str) -> Any:
        return self.inventory.get_host(name)

    def _check_alive(self, hosts: Sequence[str]) -> None:
        """Forget the connection of each host that no longer answers (one ``true``, at most
        ``ALIVE_TIMEOUT_S``): a link cut between steps would otherwise hang the next step on a
        dead TCP session. ``connect`` then tries it again, as a new pyinfra run would."""
        import gevent

        def probe(h: Any) -> bool:
            try:
                with gevent.Timeout(ALIVE_TIMEOUT_S, TimeoutError):
                    # The class's own method: a host whose run lost its lock refuses every
                    # command of the run (operations.preflight), yet its connection is alive.
                    ok, _ = type(h).run_shell_command(h, "true", print_output=False,
                                                      print_input=False)
                return bool(ok)
            except Exception:  # noqa: BLE001 - any failure: the connection is gone
                return False

        live = [self.host(h) for h in hosts if h in self.connected]
        checks = {self.state.pool.spawn(probe, h): h for h in live}
        gevent.wait(list(checks))
        for greenlet, h in checks.items():
            if greenlet.value:
                continue
            say(f"{h.name}: the connection does not answer; connecting again")
            try:  # the class's own disconnect: the run lock stays this run's (its lease runs)
                type(h).disconnect(h)
            except Exception:  # noqa: BLE001 - a dead session may not close cleanly
                h.connected = False
            self.connected.discard(h.name)

    def connect(self, hosts: Sequence[str]) -> dict[str, str]:
        """Connect the hosts not yet connected; returns ``{host: why}`` of those that failed."""
        from pyinfra.api.state import StateStage

        self._check_alive(hosts)
        todo = [self.host(h) for h in hosts if h not in self.connected]
        if not todo:
            return {}
        from gevent import wait as gwait

        if self.state.current_stage < StateStage.Connect:
            self.state.set_stage(StateStage.Connect)
        greenlets = [self.state.pool.spawn(h.connect) for h in todo]
        gwait(greenlets)
        failed = {}
        for h in todo:
            if h.connected:
                _fail_fast_on_a_dead_link(h)
                self.connected.add(h.name)
                self.state.activate_host(h)
            else:
                failed[h.name] = self.recorder.connect_errors.get(h.name, "could not connect")
        return failed

    def _fresh_step(self, hosts: Sequence[Any]) -> None:
        """A new step on the same State: no operations yet, the step's hosts active."""
        from pyinfra.api.state import StateHostMeta, StateHostResults

        st = self.state
        st.is_executing = False
        st.op_meta = {}
        st.ops = {h: {} for h in self.inventory}
        st.meta = {h: StateHostMeta() for h in self.inventory}
        st.results = {h: StateHostResults() for h in self.inventory}
        for h in self.inventory:
            h.op_hash_order = []
        st.active_hosts = set(hosts)
        st.activated_hosts = set(hosts)
        st.failed_hosts = set()
        self.recorder.op_errors = {}

    def run(self, deploy: str, hosts: Sequence[str], name: str) -> StepRun:
        """Deploy file ``deploy`` on ``hosts`` (each connected first): loaded for each host as
        pyinfra's CLI loads it, then its operations run (or, dry, only planned)."""
        from pyinfra.api.exceptions import PyinfraError
        from pyinfra.api.operations import run_ops
        from pyinfra.api.state import StateStage
        from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

        say(f"{name}: {', '.join(hosts)}")
        start = time.monotonic()
        results: dict[str, HostStep] = {}
        for h, why in self.connect(hosts).items():
            results[h] = HostStep(UNREACHABLE, why=[f"unreachable: {why}"])
        live = [self.host(h) for h in hosts if h not in results and h in self.connected]
        for h in hosts:
            if h not in results and h not in self.connected:
                results[h] = HostStep(UNREACHABLE, why=["unreachable: the connection was lost"])
        if not live:
            return StepRun(name, list(hosts), 1, time.monotonic() - start, results)
        self._fresh_step(live)
        path = os.path.abspath(deploy)
        code = compile(Path(path).read_text(), path, "exec")
        if self.state.current_stage < StateStage.Prepare:
            self.state.set_stage(StateStage.Prepare)
        self.state.current_deploy_filename = path
        rc = 0
        load_errors: dict[str, list[str]] = {}
        lost: dict[str, str] = {}
        with ctx_state.use(self.state), ctx_inventory.use(self.inventory), \
                ctx_config.use(self.state.config):
            for h in live:
                try:
                    with ctx_host.use(h):
                        exec(code, {"__file__": path, "__name__": "__specfleet_deploy__"})  # noqa: S102
                except SpecfleetError as exc:  # bad settings or host state, said while loading
                    load_errors[h.name] = exc.render().replace(f"[{h.name}] ", "").splitlines()
                except Exception as exc:  # noqa: BLE001 - a deploy that breaks fails its host
                    load_errors[h.name] = [f"{type(exc).__name__}: {exc}"]
        for hname in load_errors:
            h = self.host(hname)
            self.state.active_hosts.discard(h)
            for op_hash in h.op_hash_order:
                self.state.ops[h].pop(op_hash, None)
        if not self.dry and self.state.active_hosts:
            try:
                with ctx_state.use(self.state), ctx_inventory.use(self.inventory), \
                        ctx_config.use(self.state.config):
                    run_ops(self.state)
            except PyinfraError:  # "No hosts remaining!": every host failed, each one said why
                rc = 1
            except (EOFError, OSError, ConnectionError) as exc:
                # A link cut while a command was in flight (the connection's dead-link timeout):
                # that host is unreachable; the others keep what they did.
                rc = 1
                for h in live:
                    if not _link_alive(h):
                        lost[h.name] = f"unreachable: connection lost ({type(exc).__name__})"
                        self.connected.discard(h.name)
        for h in live:
            if h.name in lost:
                results[h.name] = HostStep(UNREACHABLE, why=[lost[h.name]])
            elif h.name in load_errors:
                results[h.name] = HostStep(FAILED, why=load_errors[h.name])
            else:
                results[h.name] = self._host_result(h)
        if any(not r.passed for r in results.values()):
            rc = rc or 1
        return StepRun(name, list(hosts), rc, time.monotonic() - start, results)

    def _host_result(self, h: Any) -> HostStep:
        st = self.state
        step = HostStep(OK)
        on_changes: list[str] = []  # conditional on other operations' changes alone
        planned = getattr(h, PLANNED_ERROR_ATTR, None) if self.dry else None
        if planned:  # a planning run that expects the host to fail says where and why
            setattr(h, PLANNED_ERROR_ATTR, None)
            lines = [ln.strip() for ln in str(planned).splitlines() if ln.strip()]
            return HostStep(FAILED, why=[ln for ln in lines if not ln.startswith("|")][:4])
        for op_hash in h.op_hash_order:
            data = st.ops[h].get(op_hash)
            if data is None:
                continue
            meta = data.operation_meta
            if self.dry:
                if meta.will_change:
                    condition = data.global_arguments.get("_if")
                    if condition:
                        named = _conditional_name(st, op_hash, condition)
                        step.conditional_ops.append(named)
                        if _on_changes_only(condition):
                            on_changes.append(named)
                    else:
                        step.changed_ops.append(_op_name(st, op_hash))
                continue
            if not meta.is_complete():
                continue
            if meta.did_error():
                step.error_ops.append(_op_name(st, op_hash))
                if not step.why:
                    text = failure_text(meta)
                    step.why = [f"in '{_op_name(st, op_hash)}': {text[0]}" if text else
                                f"failed in '{_op_name(st, op_hash)}'", *text[1:]]
            elif meta.did_change() and not _is_check(meta):
                step.changed_ops.append(_op_name(st, op_hash))
        if h in st.failed_hosts or self.recorder.op_errors.get(h.name):
            step.status = FAILED
            # A link lost under a step fails that step (operations.preflight.ConnectionLost):
            # the host is unreachable, as when the loss ends the run.
            if not h.connected or not _link_alive(h):
                step.status = UNREACHABLE
                self.connected.discard(h.name)
                if not any("unreachable" in line for line in step.why):
                    step.why.insert(0, "unreachable: the connection was lost")
            if not step.why:
                step.why = ["failed (pyinfra gave no reason)"]
        elif step.changed_ops:
            step.status = CHANGED
        elif self.dry:
            # Nothing on this host changes unconditionally, so no condition on a change upstream
            # can hold at run time: those conditional operations are decided, unchanged.
            step.conditional_ops = [c for c in step.conditional_ops if c not in on_changes]
        return step

    def close(self) -> None:
        """Disconnect every host (what the run holds there is released on the way)."""
        from pyinfra.api.connect import disconnect_all
        from pyinfra.api.state import StateStage

        st = self.state
        # Only the hosts still connected: one that was lost keeps its lock until the lease ends,
        # rather than this run waiting on a dead connection to release it.
        st.activated_hosts = {self.host(h) for h in self.connected}
        try:
            if st.current_stage < StateStage.Disconnect:
                st.set_stage(StateStage.Disconnect)
            disconnect_all(st)
        finally:
            self.connected.clear()


# A link that stops carrying data (a cut cable, a host that vanished) fails the host's next
# command within this time instead of after TCP's ~15 minutes of retransmissions.
DEAD_LINK_S = 30


def _link_alive(h: Any) -> bool:
    try:
        transport = h.connector.client.get_transport()
        return bool(transport and transport.is_active())
    except AttributeError:
        return True


def _fail_fast_on_a_dead_link(h: Any) -> None:
    """SSH keepalives every few seconds, and TCP_USER_TIMEOUT on the connection: unacknowledged
    data for ``DEAD_LINK_S`` ends it, so a command in flight on a cut link fails the host as
    unreachable instead of hanging the rollout. Best effort: a connector without a socket (local,
    docker) is left as it is."""
    try:
        transport = h.connector.client.get_transport()
        transport.set_keepalive(5)
        transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_LINK_S * 1000)
    except (AttributeError, OSError):
        pass


@contextmanager
def session(inventory: str, options: PyinfraOptions | None = None,
            dry: bool = False) -> Iterator[Session]:
    s = Session(inventory, options, dry)
    try:
        yield s
    finally:
        s.close()


def report_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False, default=str)


@contextmanager
def hand_down(fd: int) -> Iterator[None]:
    """A file descriptor the steps run in the block read (the fan-out's in-memory plan): they
    run in this process, so it is theirs as it is."""
    yield


def stop_runs() -> None:
    """Stop the steps of this process at a signal: they run in this process, so the signal's
    exception, raised in the main flow, stops them; nothing else to stop."""


def run_pyinfra(inventory: str, deploy: str, hosts: Sequence[str], name: str,
                options: PyinfraOptions | None = None) -> StepRun:
    """One deploy file on ``hosts``, in a session of its own (connected, run, disconnected)."""
    with session(inventory, options) as s:
        return s.run(deploy, hosts, name)
