"""Settings from pyinfra host and group data under one key, ``specfleet``, merged over the
defaults and checked once per distinct data. Host data wins over group data, which wins over
``all``; sections merge key by key, so a group can set ``target.revision`` and a host ``port``."""

import difflib
import functools
import json
import math
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from specfleet.core.errors import SettingsError
from specfleet.core.settings.checks import Problem, find_problems, schema_problems
from specfleet.core.settings.schema import DATA_KEY, TEST_SETTINGS_ENV, ProbeOptions, Settings

# The lowest layer: the model sections whose defaults are not their class's (the target's and
# the drafter's repo ids), so that data naming only ``target.revision`` merges over them.
_DEFAULT_LAYER = {name: Settings.model_fields[name].default.model_dump(exclude_defaults=True)
                  for name in ("target", "drafter")}  # fmt: skip


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; mappings merge key by key, everything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, Mapping) and isinstance(merged.get(key), Mapping)
        merged[key] = deep_merge(merged[key], value) if both else value
    return merged


def allow_test_settings(environ: Mapping[str, str] | None = None) -> bool:
    """Whether test-only settings are accepted: SPECFLEET_ALLOW_TEST_SETTINGS=1 (test fleets)."""
    env = os.environ if environ is None else environ
    return env.get(TEST_SETTINGS_ENV) == "1"


def settings_from_layers(layers: Iterable[Any], host: str = "",
                         environ: Mapping[str, str] | None = None) -> Settings:  # fmt: skip
    """Settings from the ``specfleet`` values (or None) of data layers, lowest priority first
    (all, group..., host); one SettingsError lists every problem. ``environ`` (default
    ``os.environ``) only says whether test-only settings are allowed."""
    merged: dict[str, Any] = _DEFAULT_LAYER
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, Mapping):
            raise SettingsError(f"'{DATA_KEY}' data is {type(layer).__name__}, expected a mapping",
                                host=host, fix=f"make {DATA_KEY} a dict, e.g. {DATA_KEY} = "
                                "{'port': 30000}")  # fmt: skip
        merged = deep_merge(merged, layer)
    # Settings are a pure function of the merged data, the host's name (in errors) and whether
    # test-only settings are allowed: a fleet of hosts sharing their settings, or a deploy's
    # steps asking again for one host, builds and checks them once (a converged run's CPU).
    key = (repr(merged), host, allow_test_settings(environ))
    built = _BUILT.get(key)
    if built is None:
        settings, problems = find_problems(merged, host, key[2])
        built = settings if settings is not None else host_error(host, problems)
        if len(_BUILT) >= _BUILT_MAX:
            _BUILT.clear()
        _BUILT[key] = built
    if isinstance(built, SettingsError):
        raise SettingsError(built.problem, host=built.host, fix=built.fix)
    return built


# ``settings_from_layers``'s memo: Settings are frozen, one serves all; bad data keeps its error.
_BUILT: dict[tuple[str, str, bool], Settings | SettingsError] = {}
_BUILT_MAX = 4096


FIX_WHERE_GIVEN = "fix each key above where it is given (the host or group data, or --data)"


def host_error(host: str, problems: list[Problem]) -> SettingsError:  # every problem of a host
    errors = [SettingsError(p.text, host=host, fix=p.fix) for p in problems]
    if len(errors) == 1:
        return errors[0]
    return SettingsError(f"{len(errors)} settings are bad:\n" + "\n".join(e.render() for e in
                         errors), host=host, fix=FIX_WHERE_GIVEN)


def settings_from_dict(data: Mapping[str, Any] | None, host: str = "",
                       environ: Mapping[str, str] | None = None) -> Settings:  # fmt: skip
    return settings_from_layers([data], host, environ)


def settings_for_host(host: Any) -> Settings:
    """The Settings of a pyinfra ``Host``: its data layers merged key by key, lowest priority
    first (pyinfra's own lookup would take the highest layer's whole ``specfleet`` dict)."""
    inventory = getattr(host, "inventory", None)
    if inventory is None:
        return settings_from_dict(host.data.get(DATA_KEY), host=host.name)
    layers = [inventory.get_data(), *map(inventory.get_group_data, getattr(host, "groups", ())),
              inventory.get_host_data(host.name), inventory.get_override_data()]
    stray = placeholder_problems(layers) + stray_problems(
        layers, override=inventory.get_override_data())
    if stray:
        raise host_error(host.name, stray)
    return settings_from_layers((layer.get(DATA_KEY) for layer in layers), host=host.name)


# A value an example inventory asks you to fill in: ``"<address of the GPU host>"``.
_PLACEHOLDER_CHARS = frozenset("<>")


def _placeholders(value: Any, where: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 2 and text[0] == "<" and text[-1] == ">" and \
                not _PLACEHOLDER_CHARS & set(text[1:-1]):
            yield where, text
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _placeholders(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _placeholders(item, f"{where}[{i}]")


def placeholder_problems(layers: Iterable[Mapping[str, Any]]) -> list[Problem]:
    """Every value of a host's data still a ``<...>`` placeholder (``inventories/first_host.py``
    holds them until it is filled in): named as such, before anything connects to the host (an
    address ``<address of the GPU host>`` is never looked up)."""
    found: dict[str, str] = {}
    for layer in layers:
        for where, text in _placeholders(layer, ""):
            key = where.removeprefix(DATA_KEY + ".")
            found[key] = text
    return [Problem(key, f"'{key}' is still the placeholder {text!r} (an example inventory's "
                    "blank, not filled in)", f"replace {text} with the real value in the "
                    "inventory")
            for key, text in sorted(found.items())]


@functools.lru_cache(maxsize=1024)  # the same few keys on every host, on every call
def _near_data_key(key: str) -> bool:
    """``specfleat``, ``Specfleet``: a misspelt ``specfleet`` (``specfleet_bench`` is a deploy's
    own data)."""
    return (key != DATA_KEY and not key.startswith(DATA_KEY + "_")
            and bool(difflib.get_close_matches(key.lower(), [DATA_KEY], n=1, cutoff=0.8)))


def stray_problems(layers: Iterable[Mapping[str, Any]],
                   override: Mapping[str, Any] | None = None) -> list[Problem]:  # fmt: skip
    """Settings meant for specfleet where it never reads them, which pyinfra keeps without a
    word: a data key spelt near ``specfleet`` or dotted under it (pyinfra does not split
    ``--data specfleet.port=1``), and settings names at the top of the run's ``--data``
    (``override``) or of the data of a host that has no ``specfleet`` data at all (its deploy
    would run on the defaults)."""
    layers = list(layers)
    keys = sorted({key for layer in layers for key in layer if isinstance(key, str)})
    problems = []
    for key in keys:
        if key.startswith(DATA_KEY + "."):
            nested = "..."
            for part in reversed(key.split(".")[1:]):
                nested = f'{{"{part}": {nested}}}'
            problems.append(Problem(
                key, f"data key '{key}' is not read: pyinfra does not split dotted keys",
                f"nest it: {DATA_KEY}={nested} (--data merges it over the inventory's settings "
                "key by key)"))
        elif _near_data_key(key):
            problems.append(Problem(key, f"data key '{key}' is not read (did you mean "
                                    f"'{DATA_KEY}'?)", f"rename it to '{DATA_KEY}'"))
    overridden = sorted(key for key in override or () if key in Settings.model_fields)
    if overridden:
        names = ", ".join(f"'{key}'" for key in overridden)
        problems.append(Problem(
            overridden[0], f"--data {names}: a setting outside '{DATA_KEY}', which specfleet "
            "does not read",
            f"pass --data '{DATA_KEY}={{\"{overridden[0]}\": ...}}' (merged over the inventory's "
            "settings key by key)"))
    misplaced = [key for key in keys if key in Settings.model_fields]
    if misplaced and not problems and all(layer.get(DATA_KEY) is None for layer in layers):
        names = ", ".join(f"'{key}'" for key in misplaced)
        problems.append(Problem(
            misplaced[0], f"data {names} at the top level, where specfleet does not read settings "
            f"(it reads only the '{DATA_KEY}' key)",
            f"move them under '{DATA_KEY}': {{'{DATA_KEY}': {{'{misplaced[0]}': ...}}}}"))
    return problems


def check_inventory_settings(inventory: Any) -> dict[str, Settings]:
    """Every host's Settings, or one SettingsError listing every bad key of every host: for the
    CLI at inventory load and a deploy file before any operation (pyinfra stops at the first)."""
    try:
        return dict(_ALL_HOSTS[inventory])
    except (KeyError, TypeError):
        pass
    good: dict[str, Settings] = {}
    bad: list[SettingsError] = []
    for host in inventory:
        try:
            good[host.name] = settings_for_host(host)
        except SettingsError as exc:
            bad.append(exc)
    said = said_once(bad, len(good) + len(bad))
    if len(said) == 1:
        raise said[0]
    if said:
        raise SettingsError(f"{len(bad)} hosts have bad settings:\n" + "\n".join(
            e.render() for e in said), fix=FIX_WHERE_GIVEN)
    try:
        _ALL_HOSTS[inventory] = good
    except TypeError:
        pass  # an inventory that cannot be weakly referenced is simply read again
    return dict(good)


def said_once(bad: list[SettingsError], hosts: int) -> list[SettingsError]:
    """Errors that differ only in the host they name as one naming those hosts: a bad ``--data``
    or group value reaches each host alike, and a copy per host buries the one fix."""
    mark = "\0host\0"
    same: dict[tuple[str, str | None], list[SettingsError]] = {}
    for e in bad:
        same.setdefault((e.problem.replace(f"[{e.host}] ", mark), e.fix), []).append(e)
    said = []
    for (problem, fix), errors in same.items():
        if len(errors) == 1:
            said.append(errors[0])
            continue
        names = [e.host or "" for e in errors]
        host = f"all {hosts} hosts" if len(names) == hosts else ", ".join(names)
        said.append(SettingsError(problem.replace(mark, f"[{host}] "), host=host, fix=fix))
    return said


# pyinfra runs a deploy file once per host, and each run asks for every host's settings: the
# inventory's data does not change during a run, so they are read once per inventory.
_ALL_HOSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# The keys a probe file may set (``probe.file``): the probe itself, not where it comes from.
PROBE_FILE_KEYS = ("questions", "min_correct", "max_tokens", "concurrency", "min_accept_length",
                   "timeout_s")


def probe_from_file(probe: ProbeOptions, text: str, path: str, host: str = "") -> ProbeOptions:
    """``probe`` with a probe file's values (``probe.file``'s JSON text) in place: a malformed
    file is a SettingsError naming the file, the key and the fix."""
    where, fix = f"probe file {path}", 'write {"questions": [{"prompt": "...", "answer": "REGEX"}]}'
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SettingsError(f"{where} is not JSON ({exc})", host=host, fix=fix) from None
    if not isinstance(data, Mapping):
        raise SettingsError(f"{where} holds {type(data).__name__}, expected a JSON object",
                            host=host, fix=fix)  # fmt: skip
    unknown = sorted(set(data) - set(PROBE_FILE_KEYS))
    if unknown:
        raise SettingsError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}", host=host,
                            fix=f"use only {', '.join(PROBE_FILE_KEYS)}")
    merged = {**probe.model_dump(), **data, "file": probe.file}
    if isinstance(data.get("questions"), list) and "min_correct" not in data:
        # Questions of its own without a count: the default share (7 of 8) of them.
        merged["min_correct"] = max(1, math.ceil(len(data["questions"]) * 7 / 8))
    try:
        built = ProbeOptions.model_validate(merged)
        problems = [] if built.min_correct <= len(built.questions) else [Problem(
            "min_correct", f"settings key 'min_correct' is {built.min_correct}, expected at most "
            f"the number of questions ({len(built.questions)})", "lower min_correct")]
    except ValidationError as exc:
        problems = schema_problems(exc.errors(include_url=False), root=ProbeOptions)
    if problems:
        raise host_error(host, [Problem(p.key, p.text.replace("settings key '", f"{where}: key '"),
                                        f"fix that key in {path}: {p.fix}") for p in problems])
    return built
