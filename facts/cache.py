"""One probe per host per run, as a fact cache while nothing on the host has changed.

pyinfra 3 has no fact cache: every ``host.get_fact`` is one SSH command. A deploy takes one
``facts.probe`` of everything its operations will ask (``load``), then operations ask through
``cached_fact``/``cached_gather`` instead of ``host.get_fact``/``facts.probe.gather``. The probe's
value is served only while it is still what the host would answer:

- it was taken in the current stage (a value read while preparing is never used executing);
- no operation has run a command on this host since it was taken (the first one that does makes
  every later operation on the host ask live facts again, as without the cache);
- the asking operation runs with the probe's connector arguments (``_sudo``, ``_su_user``...);
- the fact, with exactly these arguments, is in the probe and answered without error.

Anything else is asked live. Without a ``load`` (a deploy that takes no probe, pyinfra-testing's
``FakeHost``) every call is simply ``host.get_fact``. Facts read inside a callback
(``FunctionCommand``) or after an operation's own first command must stay ``host.get_fact``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import shlex
import weakref
from collections.abc import Mapping
from typing import Any

from pyinfra import logger
from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.arguments import all_argument_meta
from pyinfra.context import ContextObject, ctx_host

from facts.hostpy import RUNNER, PythonJob
from facts.probe import (
    MARK,
    MISSING,
    Spec,
    fact_class,
    gather,
    probe_command,
    section_value,
    split_probe_output,
)

# The connector arguments that change what a fact's command sees.
IDENTITY_ARGS = (
    "_sudo", "_sudo_user", "_use_sudo_login", "_preserve_sudo_env", "_su_user", "_use_su_login",
    "_preserve_su_env", "_su_shell", "_doas", "_doas_user", "_dzdo", "_dzdo_user",
    "_shell_executable", "_chdir", "_env",
)  # fmt: skip

# host -> the probe taken on it (weak: a host dies with its State).
_PROBES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fact_key(cls: type[FactBase] | str, kwargs: Mapping[str, Any] | None = None) -> str:
    """One word naming a fact and its arguments, defaults filled in (as ``host.get_fact`` calls
    the fact's ``command``): ``facts.weights.WeightsState#3f9a0c1d2e``."""
    cls = fact_class(cls)
    kwargs = dict(kwargs or {})
    # Memoised on the arguments' repr (cheap next to binding them to the signature): a deploy
    # asks the same few dozen keys on every host, hundreds of times per host.
    return _remembered(_KEYS, (cls, repr(sorted(kwargs.items()))), lambda: _fact_key(cls, kwargs))


_KEYS: dict[tuple[type, str], str] = {}
_MEMO_MAX = 4096


def _remembered(memo: dict, key: Any, build: Any) -> Any:
    """``memo[key]``, built by ``build()`` the first time (a bounded memo of a pure function)."""
    value = memo.get(key)
    if value is None:
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        value = memo[key] = build()
    return value


def _fact_key(cls: type[FactBase], kwargs: dict[str, Any]) -> str:
    if callable(cls.command):
        bound = _command_signature(cls).bind(**kwargs)
        bound.apply_defaults()
        kwargs = dict(bound.arguments)
    text = json.dumps(sorted(kwargs.items()), default=repr)
    return f"{cls.name}#{hashlib.sha1(text.encode()).hexdigest()[:10]}"  # noqa: S324 - a key


@functools.lru_cache(maxsize=512)
def _command_signature(cls: type[FactBase]) -> inspect.Signature:
    """The signature of a fact's ``command``: one per class (each ``inspect.signature`` costs
    more than the rest of a fact key, and a deploy asks hundreds per host)."""
    return inspect.signature(cls().command)


def keyed_specs(specs: Mapping[str, Spec] | list) -> dict[str, tuple[type[FactBase], dict]]:
    """``{fact_key: (cls, kwargs)}`` of a list of ``(fact, kwargs)`` or a probe spec mapping."""
    items = specs.values() if isinstance(specs, Mapping) else specs
    out = {}
    for spec in items:
        target, kwargs = spec if isinstance(spec, (tuple, list)) else (spec, {})
        try:
            cls = fact_class(target)
            kwargs = dict(kwargs or {})
            key = fact_key(cls, kwargs)
            _fact_shell(key, cls, kwargs)
        except Exception as exc:  # noqa: BLE001 - the probe is an optimisation: ask it live
            logger.warning("the probe leaves out %r %r: %s", target, kwargs, exc)
            continue
        out[key] = (cls, kwargs)
    return out


def _identity(host: Any) -> dict[str, Any]:
    args = getattr(host, "current_op_global_arguments", None)
    if args is None:
        # Outside an operation (a deploy function choosing its settings from facts): the
        # connector arguments an operation gets when it sets none, pyinfra's defaults.
        args = _default_arguments(host)
    return {k: args[k] for k in IDENTITY_ARGS if args.get(k)}


def _default_arguments(host: Any) -> dict[str, Any]:
    config = getattr(getattr(host, "state", None), "config", None)
    if config is None:
        return {}
    out = {}
    for key in IDENTITY_ARGS:
        meta = all_argument_meta.get(key)
        if meta is not None:
            try:
                out[key] = meta.default(config)
            except AttributeError:
                continue
    return out


def _completed_with_commands(host: Any) -> set[str]:
    """Hashes of this host's operations that have run and ran at least one command."""
    state = host.state
    out = set()
    for op_hash, op_data in (state.ops.get(host) or {}).items():
        meta = op_data.operation_meta
        if meta.is_complete() and meta._commands:
            out.add(op_hash)
    return out


def _fact_shell(key: str, cls: type[FactBase], kwargs: dict) -> str:
    """The shell a fact runs for ``kwargs`` (``key``: their ``fact_key``), as its own ``command``
    builds it, once per key: a fact's command is a function of its class and arguments alone."""
    return _remembered(_SHELLS, key, lambda: _build_fact_shell(cls, kwargs))


_SHELLS: dict[str, str] = {}


def _build_fact_shell(cls: type[FactBase], kwargs: dict) -> str:
    fact = cls()
    command = fact.command(**kwargs) if callable(fact.command) else fact.command
    command = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
    required = fact.requires_command(**kwargs)
    if required:
        command = (
            f"if command -v {required} >/dev/null 2>&1; then ({command}); "
            f"else echo '{MISSING}'; fi"
        )
    return command


def command(specs: Mapping[str, Spec] | list, parallel: bool = True) -> str:
    """The probe's shell command for ``specs`` (run it as the first command of a step, with
    anything else that step needs prepended, then hand its stdout to ``store``).

    ``parallel`` runs the facts at once, each into its own file, then prints them in order:
    the probe takes as long as its slowest fact instead of all of them (the facts only read).
    Facts that are one Python script (``python_job``) of the same interpreter run in one
    process (``facts.hostpy.RUNNER``) where that interpreter is there, else each alone.
    The output is ``facts.probe``'s: a begin line, stdout, prefixed stderr, an end line.
    """
    keyed = keyed_specs(specs)
    if not parallel:
        return probe_command(keyed)
    parts = ['d=$(mktemp -d 2>/dev/null || { mkdir -p "/tmp/specfleet-probe.$$" && '
             'echo "/tmp/specfleet-probe.$$"; })']
    sections = {}
    for i, (key, (cls, kwargs)) in enumerate(keyed.items()):
        sections[key] = (
            f"{{ echo '{MARK}-begin {key} {cls.name}'; ( {_fact_shell(key, cls, kwargs)} ) "
            f'2>"$d/{i}.err"; rc=$?; echo; ! test -s "$d/{i}.err" || '
            f'sed \'s/^/{MARK}-stderr /\' "$d/{i}.err"; echo "{MARK}-end {key} $rc"; }} '
            f'>"$d/{i}"'
        )
    grouped = _python_groups(keyed)
    for members in grouped.values():
        job0 = members[0][2]
        words = [QuoteString(job0.interpreter), *job0.flags, "-c", QuoteString(RUNNER),
                 QuoteString(MARK)]
        for i, key, job, cls in members:
            words += [f'"$d/{i}"', QuoteString(key), QuoteString(cls.name),
                      QuoteString(job.source), str(len(job.argv)),
                      *(QuoteString(a) for a in job.argv)]
        alone = "; ".join(sections.pop(key) for _, key, _, _ in members)
        parts.append(
            f"{{ if command -v {shlex.quote(job0.interpreter)} >/dev/null 2>&1; "
            f"then {StringCommand(*words).get_raw_value()}; else {alone}; fi; }} &"
        )
    parts += [f"{section} &" for section in sections.values()]
    files = " ".join(f'"$d/{i}"' for i in range(len(keyed)))
    # `&` already ends each part: join them with spaces, not `;` (`&;` is a syntax error).
    return " ".join([parts[0] + ";", *parts[1:], f'wait; cat {files}; rm -rf "$d"; true'])


def _python_groups(keyed: dict[str, tuple[type[FactBase], dict]]) -> dict[tuple, list]:
    """``{(interpreter, flags): [(index, key, PythonJob, fact class)]}`` of two jobs or more."""
    groups: dict[tuple, list] = {}
    for i, (key, (cls, kwargs)) in enumerate(keyed.items()):
        python_job = getattr(cls(), "python_job", None)
        job = python_job(**kwargs) if callable(python_job) else None
        if isinstance(job, PythonJob):
            groups.setdefault((job.interpreter, job.flags), []).append((i, key, job, cls))
    return {k: v for k, v in groups.items() if len(v) > 1}


def parse(specs: Mapping[str, Spec] | list, stdout_lines: list[str]) -> dict:
    """``facts.probe.parse_probe``, with each fact's ``command`` called on the instance that
    processes its output, as ``host.get_fact`` does (pyinfra's hash facts keep the path there)."""
    keyed = keyed_specs(specs)
    sections = split_probe_output(stdout_lines)
    facts: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for key, (cls, kwargs) in keyed.items():
        fact = cls()
        if callable(fact.command):
            fact.command(**kwargs)
        facts[key], error = section_value(fact, sections.get(key))
        if error:
            errors[key] = error
    return {"facts": facts, "errors": errors}


def store(host: Any, specs: Mapping[str, Spec] | list, stdout_lines: list[str]) -> dict:
    """Keep the probe output of ``command(specs)`` as this host's cache for this stage; returns
    ``{"facts": {key: value}, "errors": {key: message}}``."""
    value = parse(specs, stdout_lines)
    state = host.state
    _PROBES[host] = {
        "state": weakref.ref(state),
        "executing": bool(state.is_executing),
        "facts": value["facts"],
        "errors": value["errors"],
        "identity": _identity(host),
        "dirty_before": _completed_with_commands(host),
        "hits": 0,
        "misses": 0,
    }
    return value


def load(host: Any, specs: Mapping[str, Spec] | list) -> dict:
    """Run the probe of ``specs`` on the host now (one command) and keep it as its cache."""
    _, output = host.run_shell_command(command(specs), print_output=False, print_input=False)
    return store(host, specs, output.stdout_lines)


def forget(host: Any) -> None:
    _PROBES.pop(host, None)


def _valid(host: Any) -> dict | None:
    if isinstance(host, ContextObject):  # pyinfra's ``host`` proxy: the Host it stands for
        host = ctx_host.get()
    try:
        entry = _PROBES.get(host)
    except TypeError:  # an unhashable stand-in host
        return None
    if entry is None:
        return None
    # While one operation runs on the host, no other of its operations can complete and its
    # connector arguments stay put: one check serves every fact it asks.
    running = getattr(host, "current_op_hash", None)
    token = (running, id(getattr(host, "current_op_global_arguments", None)))
    if running is not None and entry.get("valid_for") == token:
        return entry
    state = getattr(host, "state", None)
    if entry["state"]() is not state or entry["executing"] != bool(state.is_executing):
        return None
    if entry["identity"] != _identity(host):
        return None
    if entry["executing"] and _completed_with_commands(host) - entry["dirty_before"]:
        return None
    entry["valid_for"] = token if running is not None else None
    return entry


def cached_value(host: Any, cls: type[FactBase], kwargs: Mapping[str, Any]) -> tuple[bool, Any]:
    """``(True, value)`` when the probe can answer for this fact, else ``(False, None)``."""
    if any(k.startswith("_") for k in kwargs):
        return False, None
    entry = _valid(host)
    if entry is None:
        return False, None
    try:
        key = fact_key(cls, kwargs)
    except TypeError:  # arguments the fact does not take: host.get_fact says so
        return False, None
    if key in entry["facts"] and key not in entry["errors"]:
        entry["hits"] += 1
        return True, entry["facts"][key]
    entry["misses"] += 1
    logger.debug("fact cache miss on %s: %s %r", host.name, cls.name, dict(kwargs))
    return False, None


def cached_fact(host: Any, cls: type[FactBase], **kwargs: Any) -> Any:
    """``host.get_fact(cls, **kwargs)``, answered by the host's probe while it is still valid."""
    hit, value = cached_value(host, cls, kwargs)
    return value if hit else host.get_fact(cls, **kwargs)


def cached_gather(host: Any, specs: Mapping[str, Spec]) -> dict[str, Any]:
    """``facts.probe.gather(host, specs)`` from the host's probe when it answers every fact;
    otherwise one live probe of the facts it lacks."""
    out: dict[str, Any] = {}
    missing: dict[str, Spec] = {}
    for key, spec in specs.items():
        target, kwargs = spec if isinstance(spec, (tuple, list)) else (spec, {})
        hit, value = cached_value(host, fact_class(target), dict(kwargs or {}))
        if hit:
            out[key] = value
        else:
            missing[key] = spec
    if missing:
        out.update(gather(host, missing))
    return {key: out[key] for key in specs}


def stats(host: Any) -> dict[str, int]:
    entry = _PROBES.get(host) or {}
    return {"hits": entry.get("hits", 0), "misses": entry.get("misses", 0)}
