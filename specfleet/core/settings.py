"""One typed settings object for every option a specfleet deploy takes.

Settings are read from pyinfra host and group data under one key, ``specfleet``, and merged over
the defaults below. Host data wins over group data, which wins over ``all``; nested sections
(``target``, ``drafter``, ``rollout``, ...) merge key by key, so a group can set
``target.revision`` and a host ``port`` without repeating the rest.

Later features add fields here; they do not invent their own plumbing.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from specfleet.core.errors import SettingsError

DATA_KEY = "specfleet"


@dataclass(frozen=True)
class ModelSource:
    """A Hugging Face repository fetched onto the host."""

    repo_id: str
    # A full commit sha. A branch or tag is accepted only with follow_branch=True.
    revision: str | None = None
    follow_branch: bool = False
    # The directory under models_root; defaults to the repo id with "/" replaced by "--".
    local_dir: str | None = None
    allow_patterns: list[str] | None = None
    ignore_patterns: list[str] | None = None
    gated: bool = False

    @property
    def dir_name(self) -> str:
        return self.local_dir or self.repo_id.replace("/", "--")

    def root(self, models_root: str) -> str:
        """The folder under ``models_root`` that holds this model's revisions."""
        return f"{models_root.rstrip('/')}/{self.dir_name}"

    def serve_path(self, models_root: str) -> str:
        """The path SGLang is given: the pinned revision's own folder, so that a new pin changes
        the unit; or the ``current`` link, flipped only after a verified download, when a
        branch is followed."""
        pinned = self.revision if self.revision and not self.follow_branch else None
        return f"{self.root(models_root)}/{pinned or 'current'}"


@dataclass(frozen=True)
class SGLangSource:
    """Where the pinned SGLang comes from."""

    version: str = "0.5.23"
    # "index": pip from index_url / find_links.  "git": pip from git_url at git_ref.
    kind: Literal["index", "git"] = "index"
    index_url: str | None = None
    find_links: str | None = None
    trusted_hosts: list[str] = field(default_factory=list)
    git_url: str | None = None
    git_ref: str | None = None
    # Tests only: install without dependencies (no torch here).
    no_deps: bool = False
    # A user-given specifier for compressed-tensors overrides the version table.
    compressed_tensors: str | None = None
    # Moving to another release installs it into a new venv beside ``venv`` (``<venv>-sglang-X``)
    # and switches the unit to it, keeping the old venv untouched for rollback. False: upgrade
    # ``venv`` in place (pip may then replace torch in it).
    side_by_side: bool = True


@dataclass(frozen=True)
class PatchSource:
    """PR#20547 (the DFlash spec-v2 worker), applied only where the installed SGLang lacks it."""

    # A local path on the control machine or an http(s) URL. No default: none can be pinned here.
    source: str | None = None
    sha256: str | None = None
    on_conflict: Literal["keep-v1", "fail"] = "keep-v1"


@dataclass(frozen=True)
class WeightsOptions:
    hf_endpoint: str | None = None
    # A token file on the control machine; HF_TOKEN in the control machine's environment also works.
    token_file: str | None = None
    # Where a host's own token lives, if not at huggingface_hub's default path.
    host_token_path: str | None = None
    margin_percent: float = 2.0
    margin_min_gib: float = 10.0
    verify: Literal["fast", "deep"] = "fast"
    stall_minutes: float = 10.0
    prune_other_revisions: bool = False
    poll_seconds: float = 5.0


@dataclass(frozen=True)
class PlanOverrides:
    """Overrides of the planner's rules. Each one shows in the plan as overriding a rule."""

    tp_size: int | None = None
    attention_backend: str | None = None
    draft_attention_backend: str | None = None
    mem_fraction_static: float | None = None
    draft_window_size: int = 4096
    # SM120 may choose flashinfer for the target instead of triton.
    sm120_target_backend: Literal["triton", "flashinfer"] = "triton"
    # Flags to add or replace: {"--context-length": "131072", "--enable-foo": True, "--bar": None}.
    # True renders a bare flag, None removes a flag the plan would have set.
    extra_args: dict[str, str | int | float | bool | None] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutOptions:
    canary: str | None = None
    order: list[str] | None = None
    batch_size: int | None = None
    batch_percent: float | None = None
    max_fail_percent: float = 0.0
    prefetch_weights: bool = True
    fanout: bool = True
    # Hosts with the same site share one upstream download per model (a seed per site); unset:
    # one for the whole fleet. Set it per group of hosts that share a fast LAN.
    fanout_site: str | None = None


@dataclass(frozen=True)
class Settings:
    """Everything a Kimi K2.6 + DFlash deploy can be told. Defaults are that deploy's."""

    target: ModelSource = field(
        default_factory=lambda: ModelSource(repo_id="moonshotai/Kimi-K2.6")
    )
    drafter: ModelSource = field(
        default_factory=lambda: ModelSource(repo_id="z-lab/Kimi-K2.6-DFlash", gated=True)
    )
    models_root: str = "/srv/models"
    # An existing venv named here is reused, not replaced.
    venv: str = "/opt/specfleet/sglang"
    python: str = "python3"
    sglang: SGLangSource = field(default_factory=SGLangSource)
    patch: PatchSource = field(default_factory=PatchSource)
    weights: WeightsOptions = field(default_factory=WeightsOptions)
    plan: PlanOverrides = field(default_factory=PlanOverrides)
    rollout: RolloutOptions = field(default_factory=RolloutOptions)

    service_name: str = "specfleet-sglang"
    listen_host: str = "127.0.0.1"
    port: int = 30000
    # A secret: kept out of argv, --diff and logs (and out of this object's repr).
    api_key: str | None = field(default=None, repr=False)
    readiness_timeout_s: float = 3600.0
    # Tests only: the command that stands in for `python -m sglang.launch_server`.
    launcher: list[str] | None = None
    state_dir: str = "/var/lib/specfleet"


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        k, v = typing.get_args(tp)
        return f"a mapping of {_type_name(k)} to {_type_name(v)}"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return f"a mapping (section {tp.__name__})"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _coerce(value: Any, tp: Any, key: str, host: str) -> Any:
    def bad() -> SettingsError:
        return SettingsError(
            f"settings key '{key}' is {value!r} ({type(value).__name__}), "
            f"expected {_type_name(tp)}",
            host=host,
            fix=f"set {DATA_KEY}['{key}'] in the host or group data to {_type_name(tp)}",
        )

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _coerce(value, option, key, host)
            except SettingsError:
                continue
        raise bad()
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise bad()
    if tp is type(None):
        if value is None:
            return None
        raise bad()
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise bad()
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]", host) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise bad()
        kt, vt = typing.get_args(tp)
        return {
            _coerce(k, kt, key, host): _coerce(v, vt, f"{key}.{k}", host) for k, v in value.items()
        }
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise bad()
        return _build(tp, value, host, prefix=f"{key}.")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise bad()
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad()
    raise bad()


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    # get_type_hints evaluates every string annotation anew: most of a settings build's time,
    # and a deploy builds every host's settings on every host.
    return typing.get_type_hints(cls)


def _build(cls: type, data: Mapping[str, Any], host: str, prefix: str = "") -> Any:
    hints = _type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise SettingsError(
                f"unknown settings key '{prefix}{key}'",
                host=host,
                fix=f"remove it, or use one of: {', '.join(sorted(names))}",
            )
    defaults = cls() if _has_all_defaults(cls) else None
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            tp = hints[f.name]
            raw = data[f.name]
            if dataclasses.is_dataclass(tp) and isinstance(raw, Mapping) and defaults is not None:
                # Nested sections merge over the section's defaults, not replace them.
                raw = {**dataclasses.asdict(getattr(defaults, f.name)), **raw}
            values[f.name] = _coerce(raw, tp, f"{prefix}{f.name}", host)
        elif defaults is None and f.default is dataclasses.MISSING and (
            f.default_factory is dataclasses.MISSING
        ):
            raise SettingsError(
                f"settings key '{prefix}{f.name}' is required",
                host=host,
                fix=f"set {DATA_KEY}['{prefix}{f.name}'] in the host or group data",
            )
    return cls(**values)


def _has_all_defaults(cls: type) -> bool:
    return all(
        f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        for f in dataclasses.fields(cls)
    )


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; mappings merge key by key, everything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def settings_from_layers(layers: Iterable[Any], host: str = "") -> Settings:
    """Build Settings from data layers ordered lowest priority first (all, group..., host).

    Each layer is the value of the ``specfleet`` key in that layer, or None where it has none.
    """
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, Mapping):
            raise SettingsError(
                f"'{DATA_KEY}' data is {type(layer).__name__}, expected a mapping",
                host=host,
                fix=f"make {DATA_KEY} a dict, e.g. {DATA_KEY} = {{'port': 30000}}",
            )
        merged = deep_merge(merged, layer)
    settings = _build(Settings, merged, host)
    return validate(settings, host)


def settings_from_dict(data: Mapping[str, Any] | None, host: str = "") -> Settings:
    return settings_from_layers([data], host)


def settings_for_host(host: Any) -> Settings:
    """The Settings of a pyinfra ``Host``: its data layers deep-merged, lowest priority first.

    pyinfra's own lookup replaces a whole ``specfleet`` dict with the highest layer's, and merges
    several groups with ``dict.update``; here every layer merges key by key instead.
    """
    inventory = getattr(host, "inventory", None)
    if inventory is None:
        return settings_from_dict(host.data.get(DATA_KEY), host=host.name)
    layers = [
        inventory.get_data(),
        *(inventory.get_group_data(group) for group in getattr(host, "groups", ())),
        inventory.get_host_data(host.name),
        inventory.get_override_data(),
    ]
    return settings_from_layers((layer.get(DATA_KEY) for layer in layers), host=host.name)


def settings_for_all_hosts(inventory: Any) -> dict[str, Settings]:
    """Every host's Settings, or one SettingsError that lists every bad host, not just the first.

    pyinfra stops at the first error a deploy file raises, so a deploy calls this once, before any
    host's operations are added, to show the whole inventory's problems in one run.
    """
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
    if len(bad) == 1:
        raise bad[0]
    if bad:
        raise SettingsError(
            f"{len(bad)} hosts have bad settings:\n" + "\n".join(e.render() for e in bad),
            fix="fix each key above in the inventory or group data",
        )
    try:
        _ALL_HOSTS[inventory] = good
    except TypeError:
        pass  # an inventory that cannot be weakly referenced is simply read again
    return dict(good)


# pyinfra runs a deploy file once per host, and each run asks for every host's settings: the
# inventory's data does not change during a run, so they are read once per inventory.
_ALL_HOSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def validate(settings: Settings, host: str = "") -> Settings:
    """Cross-field checks the types alone cannot express."""
    if not 1 <= settings.port <= 65535:
        raise SettingsError(
            f"settings key 'port' is {settings.port}, expected 1..65535",
            host=host,
            fix=f"set {DATA_KEY}['port'] to a free TCP port such as 30000",
        )
    for name in ("target", "drafter"):
        src: ModelSource = getattr(settings, name)
        if src.revision is not None and not src.follow_branch and not _is_commit(src.revision):
            raise SettingsError(
                f"settings key '{name}.revision' is {src.revision!r}, which is not a commit sha",
                host=host,
                fix=(
                    f"pin {DATA_KEY}['{name}']['revision'] to a 40-hex commit, or set "
                    f"{DATA_KEY}['{name}']['follow_branch'] = True to follow it on purpose"
                ),
            )
    if settings.sglang.kind == "git" and not (settings.sglang.git_url and settings.sglang.git_ref):
        raise SettingsError(
            "settings key 'sglang.kind' is 'git' but 'sglang.git_url' or 'sglang.git_ref' is unset",
            host=host,
            fix="set both sglang.git_url and sglang.git_ref, or use kind 'index'",
        )
    if settings.patch.source and not settings.patch.sha256:
        raise SettingsError(
            "settings key 'patch.source' is set without 'patch.sha256'",
            host=host,
            fix="pin the patch: set patch.sha256 to the sha256 of the diff (sha256sum FILE)",
        )
    mfs = settings.plan.mem_fraction_static
    if mfs is not None and not 0.0 < mfs < 1.0:
        raise SettingsError(
            f"settings key 'plan.mem_fraction_static' is {mfs}, expected a number in (0, 1)",
            host=host,
            fix="use e.g. 0.85",
        )
    if settings.plan.tp_size is not None and settings.plan.tp_size < 1:
        raise SettingsError(
            f"settings key 'plan.tp_size' is {settings.plan.tp_size}, expected >= 1",
            host=host,
            fix="leave it unset to use every GPU, or give the number of GPUs to shard over",
        )
    return settings


def _is_commit(rev: str) -> bool:
    return len(rev) == 40 and all(c in "0123456789abcdef" for c in rev.lower())


def settings_to_dict(settings: Settings) -> dict[str, Any]:
    return dataclasses.asdict(settings)
