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
import json
import math
import os
import re
import types
import typing
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from specfleet.core.errors import SettingsError
from specfleet.core.validators import (
    BACKEND_NAME,
    COMMAND_NAME,
    ENV_NAME,
    GROUP_NAME,
    IFACE_NAME,
    LONG_FLAG,
    abs_path_problem,
    control_path_problem,
    dir_name_problem,
    git_ref_problem,
    has_control_chars,
    host_problem,
    repo_id_problem,
    secret_env_name,
    secret_flag,
    sha256_problem,
    specifier_problem,
    unit_name_problem,
    url_problem,
    version_problem,
)

DATA_KEY = "specfleet"
# Test-only settings (launcher, sglang.no_deps) are refused unless this is "1" in the environment.
TEST_SETTINGS_ENV = "SPECFLEET_ALLOW_TEST_SETTINGS"


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


@dataclass(frozen=True)
class SGLangSource:
    """Where the pinned SGLang comes from."""

    version: str = "0.5.23"
    # "index": pip from index_url / find_links.  "git": pip from git_url at git_ref.
    # "source": pip from a source tree on the host (source_path: an SGLang checkout's python/
    # folder, e.g. a DDTree fork), keyed by that folder; a Rust extension needs cargo there.
    kind: Literal["index", "git", "source"] = "index"
    source_path: str | None = None
    index_url: str | None = None
    find_links: str | None = None
    trusted_hosts: list[str] = field(default_factory=list)
    git_url: str | None = None
    git_ref: str | None = None
    # Tests only (refused unless SPECFLEET_ALLOW_TEST_SETTINGS=1): install without dependencies
    # (no torch here).
    no_deps: bool = False
    # A user-given specifier for compressed-tensors overrides the version table.
    compressed_tensors: str | None = None
    # True: moving to another release installs it into a new venv beside ``venv``
    # (``<venv>-sglang-X``) and switches the unit to it, keeping the old venv untouched for
    # rollback (each run then reads that venv's facts: 4 more fact commands per host). False:
    # upgrade ``venv`` in place, where a venv specfleet did not create refuses to let pip replace
    # torch and its kin (``allow_replacing``).
    side_by_side: bool = False
    # An install into an existing venv that specfleet did not create never replaces another
    # package there (torch, sgl-kernel, flashinfer, ...: pip's dry run says which) unless listed
    # here (names or globs, e.g. ["torch", "nvidia-*"]) or True (any).
    allow_replacing: bool | list[str] = False


@dataclass(frozen=True)
class PatchSource:
    """PR#20547 (the DFlash spec-v2 worker), applied only where the installed SGLang lacks it."""

    # The PR revision to port, pinned (the sha256 of its diff against its merge base, as in the
    # port's port.json); setting it opts in.
    sha256: str | None = None
    # Where the upstream text the port's recipe names comes from: folders on the control machine
    # or URL bases (mirrors, for an air-gapped control machine), tried before the recipe's own
    # pinned URLs (GitHub, PyPI). Every file is checked against its sha256 pin either way.
    source: str | list[str] | None = None
    on_conflict: Literal["keep-v1", "fail"] = "keep-v1"


@dataclass(frozen=True)
class WeightsOptions:
    # The Hub (or a mirror) the hosts download from; the token goes there, so https, or plain
    # http only to a loopback address or a host listed in allow_http_hosts.
    hf_endpoint: str | None = None
    # Hosts that hf_endpoint may name over plain http (a mirror on a trusted LAN).
    allow_http_hosts: list[str] = field(default_factory=list)
    # The token by reference, read on the control machine at deploy time (never stored here):
    # a file (absolute or under ~/), or the name of an environment variable. Neither: HF_TOKEN.
    token_file: str | None = None
    token_env: str | None = None
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
    # The KV cache room per GPU (GiB) below which no plan is made: SGLang would start, or stop at
    # model load with "Not enough memory", with too few tokens of KV cache to serve.
    min_kv_gib: float = 4.0
    draft_window_size: int = 4096
    # DDTree where the installed SGLang has a design specfleet.core.tables.ddtree_designs knows:
    # the tree budget (None: plain DFlash). A host without it serves DFlash and says so.
    ddtree_budget: int | None = None
    # The knobs of PR#29907's design (environment variables; None leaves SGLang's default).
    ddtree_max_topk: int | None = None
    ddtree_depth_bonus: float | None = None
    ddtree_rank_probe: int | None = None
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
    # The fan-out's ephemeral sshd on a serving host stops by itself after this many hours, even
    # if the control machine never stops it: the fan-out's expected time plus a margin (595 GB at
    # 1 Gbit/s upstream is ~80 min). A receiver whose source stopped gets the rest upstream.
    fanout_serve_hours: float = 2.0
    # The speed gate (off: None): each batch is benchmarked before the change and after its
    # readiness gate; a host whose output tokens/s or acceptance length fell below this fraction
    # of its own earlier figures fails (rolled back, counted against the batch's budget).
    speed_gate: float | None = None


@dataclass(frozen=True)
class RemovalOptions:
    """What a removal (``present: False``, ``specfleet remove``) also takes away; by default it
    keeps the weights (hours to download again) and a venv specfleet did not create."""

    # The target's and drafter's folders and the server's compile caches under models_root.
    weights: bool = False
    # The configured venv even when it is the user's own (a venv specfleet created always goes).
    venv: bool = False


@dataclass(frozen=True)
class ServingGroup:
    """Hosts that together run one SGLang server: tensor parallel over all their GPUs (NCCL
    between hosts). Declared once in group data; every member carries the same section."""

    name: str
    # Rank order: members[0] is rank 0, which holds the rendezvous and serves the API.
    members: list[str]
    # Rank 0's torch.distributed rendezvous port (SGLang's --dist-init-addr HOST:PORT).
    rendezvous_port: int = 20000
    # The address each member is reached on by its peers; default: its inventory address.
    addresses: dict[str, str] = field(default_factory=dict)
    # The NIC NCCL and Gloo use; default: the interface that holds the member's address.
    interface: str | None = None
    # A layout that leaves less than this per GPU for KV cache and activations is refused.
    min_kv_gib_per_gpu: float = 8.0
    # SGLang's --dist-timeout: how long ranks wait for each other at start-up, in seconds.
    dist_timeout_s: int = 600


@dataclass(frozen=True)
class WatchdogOptions:
    """The host-side health watchdog (``specfleet/hostside/watchdog.py``, its own systemd unit)."""

    enable: bool = True
    # Seconds between generation probes.
    interval_s: float = 30.0
    # One probe's budget: SGLang's /health_generate answers within SGLANG_HEALTH_CHECK_TIMEOUT
    # (20 s by default), plus a margin.
    probe_timeout_s: float = 40.0
    # Failed probes in a row (with sglang:generation_tokens_total flat) before a restart.
    failures: int = 3
    # After a restart the next one waits backoff_s, doubling per restart in window_s, up to
    # backoff_max_s; at most max_restarts restarts in window_s, then it waits for a person.
    backoff_s: float = 300.0
    backoff_max_s: float = 3600.0
    max_restarts: int = 3
    window_s: float = 21600.0
    # How long a start may load before failed probes count; unset: readiness_timeout_s.
    load_grace_s: float | None = None


@dataclass(frozen=True)
class MetricsOptions:
    """Prometheus: SGLang's own metrics, specfleet's per-host state, and how both leave the host."""

    # SGLang's --enable-metrics (its /metrics on the server's port).
    enable: bool = True
    # The watchdog relays the server's /metrics (that path only) here, since the server listens
    # on the loopback; None: no relay.
    relay_port: int | None = 30091
    # The relay has no auth: on the loopback unless opened to a scraper (the host's fleet
    # address, or '0.0.0.0'); `specfleet monitoring` refuses a loopback relay as a remote target.
    relay_listen: str = "127.0.0.1"
    # node-exporter's textfile collector folder (Debian's prometheus-node-exporter default).
    textfile_dir: str = "/var/lib/prometheus/node-exporter"
    # Where node-exporter listens on the host, for the generated scrape config.
    node_exporter_port: int = 9100


@dataclass(frozen=True)
class ProbeQuestion:
    """One question of the readiness gate's correctness probe and the answer it must get."""

    prompt: str
    # A regular expression (Python ``re``, case-insensitive) the answer's text must contain.
    answer: str


# Short arithmetic and facts a 1T model answers right greedily, each checked by a regex that
# accepts the usual ways to write the answer. The stand-in server knows them from its own table.
DEFAULT_PROBE_QUESTIONS = (
    ("What is 17 + 25? Answer with the number only.", r"(?<!\d)42(?!\d)"),
    ("What is 12 * 12? Answer with the number only.", r"(?<!\d)144(?!\d)"),
    ("What is 100 - 37? Answer with the number only.", r"(?<!\d)63(?!\d)"),
    ("What is 9 * 8? Answer with the number only.", r"(?<!\d)72(?!\d)"),
    ("What is the capital of France? Answer with one word.", r"\bParis\b"),
    ("What is the chemical symbol for gold? Answer with the symbol only.", r"\bAu\b"),
    ("How many days are in a week? Answer with the number only.", r"(?<!\d)7(?!\d)|\bseven\b"),
    ("What is the largest planet in the solar system? Answer with one word.", r"\bJupiter\b"),
)


@dataclass(frozen=True)
class ProbeOptions:
    """The readiness gate's correctness probe: after /health_generate, these questions at
    temperature 0 must get their answers, with a plausible speculative acceptance length."""

    enable: bool = True
    questions: list[ProbeQuestion] = field(default_factory=lambda: [
        ProbeQuestion(q, a) for q, a in DEFAULT_PROBE_QUESTIONS])
    # Right answers needed (at most the number of questions).
    min_correct: int = 7
    # Output tokens per request (>= 64 makes speculative verify run for many steps).
    max_tokens: int = 64
    # Requests in flight at once (batched verify runs too).
    concurrency: int = 8
    # The mean acceptance length /generate reports must be at least this (upstream's DFlash
    # test asks 2.8; a broken verify collapses it toward 1.0) and at most the block size.
    min_accept_length: float = 2.0
    timeout_s: float = 120.0
    # A JSON file on the control machine with any of the keys above (questions, min_correct,
    # ...): read at deploy time, its values replace these (a probe for another model).
    file: str | None = None


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
    # False removes the deploy from the host (operations.removal); a second run changes nothing.
    present: bool = True
    removal: RemovalOptions = field(default_factory=RemovalOptions)
    # None: this host serves alone. Set: it is one member of a multi-host server.
    group: ServingGroup | None = None
    watchdog: WatchdogOptions = field(default_factory=WatchdogOptions)
    metrics: MetricsOptions = field(default_factory=MetricsOptions)
    probe: ProbeOptions = field(default_factory=ProbeOptions)

    service_name: str = "specfleet-sglang"
    listen_host: str = "127.0.0.1"
    port: int = 30000
    # A secret: kept out of argv, --diff and logs (and out of this object's repr). Prefer
    # api_key_file: a file on the control machine holding the key, read at deploy time, so that an
    # inventory in git holds no secret.
    api_key: str | None = field(default=None, repr=False)
    api_key_file: str | None = None
    readiness_timeout_s: float = 3600.0
    # Tests only (refused unless SPECFLEET_ALLOW_TEST_SETTINGS=1): the command that stands in for
    # `python -m sglang.launch_server`.
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


def settings_from_layers(
    layers: Iterable[Any], host: str = "", environ: Mapping[str, str] | None = None
) -> Settings:
    """Build Settings from data layers ordered lowest priority first (all, group..., host).

    Each layer is the value of the ``specfleet`` key in that layer, or None where it has none.
    Every value is checked (``validate``); ``environ`` (default ``os.environ``) only says whether
    test-only settings are allowed.
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
    # Settings are a pure function of the merged data, the host's name (in errors) and whether
    # test-only settings are allowed: a fleet of hosts sharing their settings, or a deploy's
    # steps asking again for one host, builds and checks them once (a converged run's CPU).
    key = (repr(merged), host, allow_test_settings(environ))
    built = _BUILT.get(key)
    if built is None:
        built = validate(_build(Settings, merged, host), host, environ)
        if len(_BUILT) >= _BUILT_MAX:
            _BUILT.clear()
        _BUILT[key] = built
    return built


# ``settings_from_layers``'s memo: Settings are frozen, so one value serves every caller.
_BUILT: dict[tuple[str, str, bool], Settings] = {}
_BUILT_MAX = 4096


def settings_from_dict(
    data: Mapping[str, Any] | None, host: str = "", environ: Mapping[str, str] | None = None
) -> Settings:
    return settings_from_layers([data], host, environ)


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


def allow_test_settings(environ: Mapping[str, str] | None = None) -> bool:
    """Whether test-only settings (``launcher``, ``sglang.no_deps``) are accepted: only with
    ``SPECFLEET_ALLOW_TEST_SETTINGS=1`` in the environment of the run (the test fleet sets it)."""
    env = os.environ if environ is None else environ
    return env.get(TEST_SETTINGS_ENV) == "1"


class _Problems:
    """The bad values of one host's settings, each a SettingsError; raised together."""

    def __init__(self, host: str):
        self.host = host
        self.errors: list[SettingsError] = []

    def bad(self, key: str, found: str, expected: str, fix: str) -> None:
        self.errors.append(
            SettingsError(f"settings key '{key}' is {found}, expected {expected}",
                          host=self.host, fix=fix)  # fmt: skip
        )

    def problem(self, problem: str, fix: str) -> None:
        self.errors.append(SettingsError(problem, host=self.host, fix=fix))

    def check(self, key: str, value: Any, expected: str | None, fix: str) -> None:
        """Record ``expected`` (a checker's answer) as a problem of ``key`` unless it is None."""
        if expected is not None:
            self.bad(key, repr(value), expected, fix)

    def number(self, key: str, value: float | int | None, low: float | None, high: float | None,
               *, low_open: bool = False, high_open: bool = False, fix: str) -> None:  # fmt: skip
        """``value`` within [low, high] (an open end excludes the bound); finite; None passes."""
        if value is None:
            return
        ok = math.isfinite(value)
        if ok and low is not None:
            ok = value > low if low_open else value >= low
        if ok and high is not None:
            ok = value < high if high_open else value <= high
        if ok:
            return
        if low is not None and high is not None:
            rng = f"{'(' if low_open else '['}{_num(low)}, {_num(high)}{')' if high_open else ']'}"
            expected = f"a number in {rng}"
        elif low is not None:
            expected = f"a number {'>' if low_open else '>='} {_num(low)}"
        else:
            expected = f"a number {'<' if high_open else '<='} {_num(high)}"
        self.bad(key, repr(value), expected, fix)

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise SettingsError(
                f"{len(self.errors)} settings are bad:\n"
                + "\n".join(e.render() for e in self.errors),
                host=self.host,
                fix="fix each key above in the host or group data",
            )


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def validate(
    settings: Settings, host: str = "", environ: Mapping[str, str] | None = None
) -> Settings:
    """Every value's own checks and the cross-field ones the types alone cannot express.

    All problems of the host are reported together, each naming the key, what was found, what is
    expected and a fix. ``environ`` (default: ``os.environ``) only says whether test-only settings
    are allowed.
    """
    p = _Problems(host)
    _check_top(settings, p, allow_test_settings(environ))
    for name in ("target", "drafter"):
        _check_model(name, getattr(settings, name), p)
    if settings.target.dir_name == settings.drafter.dir_name:
        p.problem(
            f"settings keys 'target' and 'drafter' resolve to one model folder "
            f"{settings.target.dir_name!r} under models_root {settings.models_root!r}",
            "give the drafter another repo_id or local_dir (target.local_dir / drafter.local_dir)",
        )
    _check_sglang(settings.sglang, p, allow_test_settings(environ))
    _check_patch(settings.patch, p)
    _check_weights(settings.weights, p)
    _check_plan(settings.plan, p, has_api_key=_has_key(settings))
    _check_rollout(settings.rollout, p)
    if settings.group is not None:
        _check_group(settings, p)
    _check_watchdog(settings.watchdog, p)
    _check_metrics(settings.metrics, settings.port, p)
    _check_probe(settings.probe, p)
    p.raise_any()
    return settings


def api_key_chars_ok(key: str) -> bool:
    """Whether an API key is printable ASCII without whitespace: the one rule for ``api_key`` and
    ``api_key_file``. A key with a space could leak in part: a log's redaction finds an unknown
    key's value up to whitespace."""
    return all(32 < ord(c) < 127 for c in key)


def _has_key(settings: Settings) -> bool:
    return settings.api_key is not None or settings.api_key_file is not None


_TEST_FIX = (
    f"remove it: it is for specfleet's own tests (they set {TEST_SETTINGS_ENV}=1 in the "
    "environment of the run)"
)


_PATH_EXAMPLES = {"models_root": "/srv/models", "venv": "/opt/specfleet/sglang",
                  "state_dir": "/var/lib/specfleet"}  # fmt: skip


def _check_top(s: Settings, p: _Problems, test_ok: bool) -> None:
    if not 1 <= s.port <= 65535:
        p.bad("port", str(s.port), "1..65535", "set port to a free TCP port such as 30000")
    for key, example in _PATH_EXAMPLES.items():
        value = getattr(s, key)
        p.check(key, value, abs_path_problem(value),
                f"set {key} to an absolute path such as {example!r}")  # fmt: skip
    if not (COMMAND_NAME.fullmatch(s.python) or abs_path_problem(s.python) is None):
        p.bad("python", repr(s.python), "an interpreter's name on PATH or its absolute path",
              "set python to e.g. 'python3' or '/usr/bin/python3.11'")  # fmt: skip
    p.check("service_name", s.service_name, unit_name_problem(s.service_name),
            "set service_name to a plain name such as 'specfleet-sglang'")  # fmt: skip
    p.check("listen_host", s.listen_host, host_problem(s.listen_host),
            "set listen_host to an address of the host, e.g. '127.0.0.1' or '0.0.0.0'")  # fmt: skip
    p.number("readiness_timeout_s", s.readiness_timeout_s, 0, None, low_open=True,
             fix="set readiness_timeout_s to the seconds a start may take, e.g. 3600")  # fmt: skip
    if s.api_key is not None:
        # The key itself is never shown.
        if s.api_key == "":
            p.bad("api_key", "an empty string", "a non-empty key",
                  "omit api_key for a server without a key (an empty key is no key)")  # fmt: skip
        elif not api_key_chars_ok(s.api_key):
            p.bad("api_key", f"a {len(s.api_key)}-character string with a whitespace, control or "
                  "non-ASCII character (not shown: it is a secret)",
                  "printable ASCII without spaces (a log's redaction could not tell a key's "
                  "words from the text around them)",
                  "use a key of letters, digits and punctuation, without spaces")  # fmt: skip
        if s.api_key_file is not None:
            p.problem("settings keys 'api_key' and 'api_key_file' are both set",
                      "keep api_key_file (the key stays out of the inventory) and remove api_key")
    if s.api_key_file is not None:
        p.check("api_key_file", s.api_key_file, control_path_problem(s.api_key_file),
                "set api_key_file to a file on the control machine, e.g. '~/.specfleet/api-key'")
    if s.launcher is not None:
        if not test_ok:
            p.bad("launcher", repr(s.launcher), f"no value: 'launcher' is a test-only setting "
                  f"(refused unless {TEST_SETTINGS_ENV}=1)", _TEST_FIX)  # fmt: skip
        elif not s.launcher or not s.launcher[0] or any(map(has_control_chars, s.launcher)):
            p.bad("launcher", repr(s.launcher), "a command: a program, then its arguments",
                  "give the stand-in's command, e.g. ['/usr/bin/python3', '/srv/standin.py']")


def _check_model(name: str, src: ModelSource, p: _Problems) -> None:
    p.check(f"{name}.repo_id", src.repo_id, repo_id_problem(src.repo_id),
            f"set {name}.repo_id to the repo as the Hub names it, e.g. 'moonshotai/Kimi-K2.6'")
    if src.revision is not None:
        if not src.follow_branch and not _is_commit(src.revision):
            p.problem(
                f"settings key '{name}.revision' is {src.revision!r}, which is not a commit sha",
                f"pin {DATA_KEY}['{name}']['revision'] to a 40-hex commit, or set "
                f"{DATA_KEY}['{name}']['follow_branch'] = True to follow it on purpose",
            )
        else:
            p.check(f"{name}.revision", src.revision, git_ref_problem(src.revision),
                    f"set {name}.revision to a 40-hex commit or a branch such as 'main'")
    if src.local_dir is not None:
        p.check(f"{name}.local_dir", src.local_dir, dir_name_problem(src.local_dir),
                f"set {name}.local_dir to a folder name such as 'kimi-k26', or unset it "
                "(default: the repo id with '/' as '--')")  # fmt: skip
    for key in ("allow_patterns", "ignore_patterns"):
        for i, pattern in enumerate(getattr(src, key) or []):
            if not pattern or has_control_chars(pattern):
                p.bad(f"{name}.{key}[{i}]", repr(pattern), "a non-empty glob such as '*.json'",
                      f"fix or remove that entry of {name}.{key}")


_GIT_SCHEMES = ("https", "git+https", "ssh", "git+ssh", "file", "git+file", "http", "git+http")


def _check_sglang(sg: SGLangSource, p: _Problems, test_ok: bool) -> None:
    p.check("sglang.version", sg.version, version_problem(sg.version),
            "set sglang.version to a release such as '0.5.23'")  # fmt: skip
    for i, trusted in enumerate(sg.trusted_hosts):
        p.check(f"sglang.trusted_hosts[{i}]", trusted, host_problem(trusted, allow_port=True),
                "list host names or IP addresses (host or host:port) in sglang.trusted_hosts")
    http_fix = (
        "use https, or list the host in sglang.trusted_hosts (pip's own list of hosts it may "
        "reach over plain http)"
    )
    if sg.index_url is not None:
        p.check("sglang.index_url", sg.index_url,
                url_problem(sg.index_url, http_hosts=_hosts(sg.trusted_hosts),
                            http_setting="sglang.trusted_hosts"), http_fix)  # fmt: skip
    if sg.find_links is not None:
        if "://" in sg.find_links:
            expected = url_problem(sg.find_links, schemes=("https", "http", "file"),
                                   http_hosts=_hosts(sg.trusted_hosts),
                                   http_setting="sglang.trusted_hosts")  # fmt: skip
            fix = http_fix
        else:
            expected = abs_path_problem(sg.find_links)
            expected = expected and "a URL or an absolute path to a wheelhouse on the host"
            fix = "give the wheelhouse's URL, or its absolute path on the host"
        p.check("sglang.find_links", sg.find_links, expected, fix)
    if sg.git_url is not None:
        p.check("sglang.git_url", sg.git_url,
                url_problem(sg.git_url, schemes=_GIT_SCHEMES, http_hosts=_hosts(sg.trusted_hosts),
                            http_setting="sglang.trusted_hosts"),
                "use e.g. 'git+https://github.com/sgl-project/sglang.git#subdirectory=python'")
    if sg.git_ref is not None:
        p.check("sglang.git_ref", sg.git_ref, git_ref_problem(sg.git_ref),
                "set sglang.git_ref to a branch, tag or commit")  # fmt: skip
    if sg.source_path is not None:
        p.check("sglang.source_path", sg.source_path, abs_path_problem(sg.source_path),
                "give the absolute path of an SGLang checkout's python/ folder on the host")
    if sg.kind == "source" and not sg.source_path:
        p.problem(
            "settings key 'sglang.kind' is 'source' but 'sglang.source_path' is unset",
            "set sglang.source_path to the python/ folder of an SGLang checkout on the host",
        )
    if sg.kind == "git" and not (sg.git_url and sg.git_ref):
        p.problem(
            "settings key 'sglang.kind' is 'git' but 'sglang.git_url' or 'sglang.git_ref' is unset",
            "set both sglang.git_url and sglang.git_ref, or use kind 'index'",
        )
    if sg.compressed_tensors is not None:
        p.check("sglang.compressed_tensors", sg.compressed_tensors,
                specifier_problem(sg.compressed_tensors),
                "set sglang.compressed_tensors to a specifier, or unset it to use the version "
                "table's")  # fmt: skip
    if isinstance(sg.allow_replacing, list):
        for i, name in enumerate(sg.allow_replacing):
            if not name.strip():
                p.bad(f"sglang.allow_replacing[{i}]", repr(name), "a package name or glob",
                      "list package names such as 'torch' or globs such as 'nvidia-*'")
    if sg.no_deps and not test_ok:
        p.bad("sglang.no_deps", "True", f"false: 'sglang.no_deps' is a test-only setting "
              f"(refused unless {TEST_SETTINGS_ENV}=1)", _TEST_FIX)  # fmt: skip


def _hosts(hosts: Iterable[str]) -> list[str]:
    """Host names from ``host`` or ``host:port`` entries."""
    out = []
    for h in hosts:
        name, sep, port = h.rpartition(":")
        out.append(name if sep and port.isdigit() and ":" not in name else h)
    return out


def _check_patch(patch: PatchSource, p: _Problems) -> None:
    mirrors = [patch.source] if isinstance(patch.source, str) else list(patch.source or ())
    for mirror in mirrors:
        if "://" in mirror:
            # Every file is pinned by its sha256: plain http cannot slip another text in.
            expected = url_problem(mirror, schemes=("https", "http", "file"), http_hosts=None)
        else:
            expected = control_path_problem(mirror)
        p.check("patch.source", mirror, expected,
                "set patch.source to a folder on the control machine (absolute or under ~/) or "
                "an http(s) URL base holding the port's upstream sources")  # fmt: skip
    if patch.source is not None and not patch.sha256:
        p.problem(
            "settings key 'patch.source' is set without 'patch.sha256'",
            "opt in with patch.sha256 (the PR revision the port is made from, "
            "1c844c0fdcab59266c0b1bb46e2099b86469364ffd5ad5ac436f1a7f2847d252), or delete "
            "patch.source",
        )
    if patch.sha256 is not None:
        p.check("patch.sha256", patch.sha256, sha256_problem(patch.sha256),
                "set patch.sha256 to the PR revision's sha256 (64 hex, as in the port's "
                "port.json)")  # fmt: skip


def _check_weights(w: WeightsOptions, p: _Problems) -> None:
    for i, h in enumerate(w.allow_http_hosts):
        p.check(f"weights.allow_http_hosts[{i}]", h, host_problem(h),
                "list host names or IP addresses in weights.allow_http_hosts")  # fmt: skip
    if w.hf_endpoint is not None:
        p.check("weights.hf_endpoint", w.hf_endpoint,
                url_problem(w.hf_endpoint, http_hosts=w.allow_http_hosts,
                            http_setting="weights.allow_http_hosts"),
                "use the endpoint's https:// URL (the token is sent there), or list a trusted "
                "mirror's host in weights.allow_http_hosts")  # fmt: skip
    if w.token_file is not None:
        p.check("weights.token_file", w.token_file, control_path_problem(w.token_file),
                "set weights.token_file to a file on the control machine, e.g. "
                "'~/.cache/huggingface/token'")  # fmt: skip
    if w.token_env is not None:
        if re.fullmatch(r"hf_[A-Za-z0-9]{20,}", w.token_env):
            # A pasted token: never quoted back.
            p.bad("weights.token_env", "what looks like a Hugging Face token (not shown)",
                  "the name of the environment variable that holds the token",
                  "remove the token from the inventory (revoke it if the inventory was shared) "
                  "and set weights.token_env to a name such as 'HF_TOKEN'")  # fmt: skip
        elif not ENV_NAME.fullmatch(w.token_env):
            p.bad("weights.token_env", repr(w.token_env), "an environment variable's name",
                  "set weights.token_env to the name of the variable holding the token, e.g. "
                  "'HF_TOKEN' (the name, not the token)")  # fmt: skip
        if w.token_file is not None:
            p.problem("settings keys 'weights.token_file' and 'weights.token_env' are both set",
                      "keep one of them")  # fmt: skip
    if w.host_token_path is not None:
        p.check("weights.host_token_path", w.host_token_path, abs_path_problem(w.host_token_path),
                "set weights.host_token_path to the token's absolute path on the host")
    p.number("weights.margin_percent", w.margin_percent, 0, 100, high_open=True,
             fix="set weights.margin_percent to the free-space margin in percent, e.g. 2")
    p.number("weights.margin_min_gib", w.margin_min_gib, 0, None,
             fix="set weights.margin_min_gib to the least free space to keep, e.g. 10")
    p.number("weights.stall_minutes", w.stall_minutes, 0, None, low_open=True,
             fix="set weights.stall_minutes to the minutes without progress that count as a "
             "stall, e.g. 10")  # fmt: skip
    p.number("weights.poll_seconds", w.poll_seconds, 0, None, low_open=True,
             fix="set weights.poll_seconds to e.g. 5")  # fmt: skip


_SECRET_FIX = (
    "remove it: give the server's API key with api_key_file (a file on the control machine) or "
    "api_key, and the Hugging Face token with weights.token_file or weights.token_env: those "
    "stay out of the unit, its argv and its environment file"
)


def _check_plan(plan: PlanOverrides, p: _Problems, has_api_key: bool) -> None:
    if plan.tp_size is not None and plan.tp_size < 1:
        p.bad("plan.tp_size", str(plan.tp_size), ">= 1",
              "leave it unset to use every GPU, or give the number of GPUs to shard over")
    for key in ("attention_backend", "draft_attention_backend"):
        value = getattr(plan, key)
        if value is not None and not BACKEND_NAME.fullmatch(value):
            p.bad(f"plan.{key}", repr(value), "an attention backend's name such as 'fa3'",
                  f"unset plan.{key} to let the rules choose, or name one backend")
    mfs = plan.mem_fraction_static
    if mfs is not None and not 0.0 < mfs < 1.0:
        p.bad("plan.mem_fraction_static", str(mfs), "a number in (0, 1)", "use e.g. 0.85")
    kv = plan.min_kv_gib
    if isinstance(kv, bool) or not isinstance(kv, (int, float)) or not 0 <= kv < math.inf:
        p.bad("plan.min_kv_gib", str(plan.min_kv_gib), "a number of GiB >= 0",
              "use e.g. 4 (the default): the KV cache room per GPU a plan must leave")
    if plan.draft_window_size < 1:
        p.bad("plan.draft_window_size", str(plan.draft_window_size), ">= 1",
              "use e.g. 4096 (the default), at least the drafter's block size")
    budget = plan.ddtree_budget
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                               or budget < 2):
        p.bad("plan.ddtree_budget", repr(budget), "a whole number >= 2 (tree nodes per step)",
              "use e.g. 32, or leave it unset for plain DFlash")
    for key in ("ddtree_max_topk", "ddtree_rank_probe"):
        value = getattr(plan, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            p.bad(f"plan.{key}", repr(value), "a whole number >= 0",
                  f"leave plan.{key} unset for SGLang's default")
    bonus = plan.ddtree_depth_bonus
    if bonus is not None and (isinstance(bonus, bool) or not isinstance(bonus, (int, float))
                              or not math.isfinite(bonus)):
        p.bad("plan.ddtree_depth_bonus", repr(bonus), "a finite number",
              "leave plan.ddtree_depth_bonus unset for SGLang's default")
    for flag, value in plan.extra_args.items():
        key = f"plan.extra_args.{flag}"
        if not LONG_FLAG.fullmatch(flag):
            p.bad("plan.extra_args", f"a mapping with the key {flag!r}",
                  "long flags as keys, such as '--context-length' (no '=value': the value is the "
                  "mapping's value)", f"write it as '--{flag.lstrip('-').split('=')[0]}'")
        elif secret_flag(flag) and value is not None and value is not False:
            p.bad(key, f"the flag {flag}", "no secrets in plan.extra_args (flags named key, "
                  "token, secret or password end up in the unit's argv)", _SECRET_FIX)
        elif flag == "--config" and value is not None and value is not False and has_api_key:
            p.bad(key, repr(value), "no --config while an API key is set (specfleet passes the "
                  "key through its own --config file)",
                  "remove --config from plan.extra_args, or put its options in plan.extra_args")
        if isinstance(value, str) and has_control_chars(value):
            p.bad(key, repr(value), "a value without newlines or control characters",
                  f"fix the value of {flag} in plan.extra_args")  # fmt: skip
        if isinstance(value, float) and not math.isfinite(value):
            p.bad(key, repr(value), "a finite number", f"fix the value of {flag}")
    for name, value in plan.extra_env.items():
        key = f"plan.extra_env.{name}"
        if not ENV_NAME.fullmatch(name):
            p.bad(key, repr(name), "an environment variable's name (letters, digits and _, not "
                  "starting with a digit)", "rename or remove that entry of plan.extra_env")
        elif secret_env_name(name):
            p.bad(key, f"the variable {name}", "no secrets in plan.extra_env (variables named "
                  "TOKEN, KEY, SECRET or PASSWORD)", _SECRET_FIX)  # fmt: skip
        if has_control_chars(value):
            p.bad(key, repr(value), "a value without newlines or control characters",
                  f"fix the value of {name} in plan.extra_env")  # fmt: skip


def _check_rollout(r: RolloutOptions, p: _Problems) -> None:
    if r.batch_size is not None and r.batch_size < 1:
        p.bad("rollout.batch_size", str(r.batch_size), ">= 1",
              "set rollout.batch_size to the hosts per batch (1 or more), or unset it")
    p.number("rollout.batch_percent", r.batch_percent, 0, 100, low_open=True,
             fix="set rollout.batch_percent to a percentage of the fleet, e.g. 25")
    p.number("rollout.max_fail_percent", r.max_fail_percent, 0, 100,
             fix="set rollout.max_fail_percent to the share of hosts that may fail, e.g. 0")
    p.number("rollout.fanout_serve_hours", r.fanout_serve_hours, 0, None, low_open=True,
             fix="set rollout.fanout_serve_hours to the hours a fan-out may take, e.g. 2")
    p.number("rollout.speed_gate", r.speed_gate, 0, 1, low_open=True,
             fix="set rollout.speed_gate to the fraction of its earlier speed a host must keep, "
             "e.g. 0.85, or unset it (no speed gate)")
    if r.batch_size is not None and r.batch_percent is not None:
        p.problem("settings keys 'rollout.batch_size' and 'rollout.batch_percent' are both set",
                  "set one of them")  # fmt: skip
    for key in ("canary", "fanout_site"):
        value = getattr(r, key)
        if value is not None and (not value.strip() or has_control_chars(value)):
            p.bad(f"rollout.{key}", repr(value), "a non-empty name",
                  f"set rollout.{key} to a name, or unset it")  # fmt: skip
    if r.order is not None:
        seen: set[str] = set()
        for i, name in enumerate(r.order):
            if not name.strip() or name in seen:
                p.bad(f"rollout.order[{i}]", repr(name), "a host name not listed before",
                      "list each host once in rollout.order")  # fmt: skip
            seen.add(name)


def _check_group(s: Settings, p: _Problems) -> None:
    g = s.group
    if g is None:
        return
    if not GROUP_NAME.fullmatch(g.name):
        p.bad("group.name", repr(g.name), "a plain name (letters, digits, '.', '_', '-')",
              "name the serving group, e.g. 'kimi-h100-pair'")  # fmt: skip
    seen: set[str] = set()
    for i, member in enumerate(g.members):
        if not member.strip() or has_control_chars(member) or member in seen:
            p.bad(f"group.members[{i}]", repr(member), "an inventory host name not listed before",
                  "list each member host once, rank 0 first")  # fmt: skip
        seen.add(member)
    if len(g.members) < 2:
        p.bad("group.members", repr(g.members), "two or more hosts",
              "list every host of the group (rank 0 first), or remove 'group' from a host that "
              "serves alone")  # fmt: skip
    elif p.host and p.host not in g.members:
        p.problem(f"host {p.host} has serving group {g.name!r} but is not one of its members "
                  f"{g.members}", f"add {p.host} to group.members, or give it no group")
    for member, address in g.addresses.items():
        if member not in g.members:
            p.bad(f"group.addresses.{member}", repr(address), "an address of a member",
                  f"remove it, or add {member} to group.members")  # fmt: skip
        p.check(f"group.addresses.{member}", address, host_problem(address),
                "give the IP address or name the other members reach this member on")
    if not 1 <= g.rendezvous_port <= 65535 or g.rendezvous_port == s.port:
        p.bad("group.rendezvous_port", str(g.rendezvous_port),
              f"a TCP port in 1..65535 other than the server's port {s.port}",
              "use e.g. 20000 (SGLang also takes the next ports above it)")  # fmt: skip
    if g.interface is not None and not IFACE_NAME.fullmatch(g.interface):
        p.bad("group.interface", repr(g.interface), "a network interface's name such as 'eth0'",
              "unset it to use the interface that holds each member's address")  # fmt: skip
    p.number("group.min_kv_gib_per_gpu", g.min_kv_gib_per_gpu, 0, None,
             fix="set group.min_kv_gib_per_gpu to the GiB per GPU to keep for KV cache, e.g. 8")
    if g.dist_timeout_s < 1:
        p.bad("group.dist_timeout_s", str(g.dist_timeout_s), ">= 1",
              "use e.g. 600 (seconds the ranks wait for each other)")  # fmt: skip
    if s.plan.tp_size is not None:
        p.problem("settings keys 'plan.tp_size' and 'group' are both set",
                  "remove plan.tp_size: a serving group shards over every GPU of its members")


def _check_watchdog(w: WatchdogOptions, p: _Problems) -> None:
    for key, example in (("interval_s", 30), ("probe_timeout_s", 40), ("backoff_s", 300),
                         ("backoff_max_s", 3600), ("window_s", 21600), ("load_grace_s", 3600)):
        p.number(f"watchdog.{key}", getattr(w, key), 0, None, low_open=True,
                 fix=f"set watchdog.{key} to seconds, e.g. {example}")  # fmt: skip
    for key, example in (("failures", 3), ("max_restarts", 3)):
        if getattr(w, key) < 1:
            p.bad(f"watchdog.{key}", str(getattr(w, key)), ">= 1",
                  f"set watchdog.{key} to e.g. {example}, or watchdog.enable to False")
    if w.backoff_max_s < w.backoff_s:
        p.problem("settings key 'watchdog.backoff_max_s' is below 'watchdog.backoff_s'",
                  "set watchdog.backoff_max_s to at least watchdog.backoff_s")  # fmt: skip


def _check_metrics(m: MetricsOptions, server_port: int, p: _Problems) -> None:
    for key in ("relay_port", "node_exporter_port"):
        value = getattr(m, key)
        if value is not None and not 1 <= value <= 65535:
            p.bad(f"metrics.{key}", str(value), "1..65535", f"set metrics.{key} to a free TCP port")
    if m.relay_port is not None and m.relay_port == server_port:
        p.problem(f"settings key 'metrics.relay_port' is the server's port {server_port}",
                  "give the metrics relay a port of its own, e.g. 30091")  # fmt: skip
    p.check("metrics.relay_listen", m.relay_listen, host_problem(m.relay_listen),
            "set metrics.relay_listen to an address of the host, e.g. '0.0.0.0'")  # fmt: skip
    p.check("metrics.textfile_dir", m.textfile_dir, abs_path_problem(m.textfile_dir),
            "set metrics.textfile_dir to node-exporter's textfile folder, e.g. "
            "'/var/lib/prometheus/node-exporter'")  # fmt: skip


def _check_probe(probe: ProbeOptions, p: _Problems, where: str = "probe") -> None:
    """The probe's own values; ``where`` names them in errors (``probe``, or a probe file)."""

    def key(name: str) -> str:
        return f"{where}.{name}" if where == "probe" else f"{where}: {name}"

    if not probe.questions:
        p.bad(key("questions"), "empty", "at least one question with its answer",
              "list questions as {'prompt': ..., 'answer': REGEX}, or leave the defaults")
    for i, q in enumerate(probe.questions):
        if not q.prompt.strip():
            p.bad(key(f"questions[{i}].prompt"), repr(q.prompt), "a question",
                  "write the question the server must answer")
        try:
            re.compile(q.answer)
            empty = re.fullmatch(q.answer, "") is not None
        except re.error as exc:
            p.bad(key(f"questions[{i}].answer"), repr(q.answer),
                  f"a regular expression (Python re: {exc})", "fix the regex of that answer")
            continue
        if empty:
            p.bad(key(f"questions[{i}].answer"), repr(q.answer),
                  "a regex that an empty answer does not match", "match the answer's text")
    p.number(key("min_correct"), probe.min_correct, 1, max(1, len(probe.questions)),
             fix="set min_correct to the right answers needed, at most the number of questions")
    p.number(key("max_tokens"), probe.max_tokens, 1, None,
             fix="set max_tokens to the output tokens per request, e.g. 64")
    p.number(key("concurrency"), probe.concurrency, 1, None,
             fix="set concurrency to the requests in flight at once, e.g. 8")
    p.number(key("min_accept_length"), probe.min_accept_length, 1, None,
             fix="set min_accept_length to at least 1.0 (a verify step emits one token at least)")
    p.number(key("timeout_s"), probe.timeout_s, 0, None, low_open=True,
             fix="set timeout_s to the seconds one request may take, e.g. 120")
    if probe.file is not None:
        p.check(key("file"), probe.file, control_path_problem(probe.file),
                "set probe.file to a JSON file on the control machine, e.g. '~/probe.json'")


def _is_commit(rev: str) -> bool:
    return len(rev) == 40 and all(c in "0123456789abcdef" for c in rev.lower())


def settings_to_dict(settings: Settings) -> dict[str, Any]:
    return dataclasses.asdict(settings)


# The keys a probe file may set (``probe.file``): the probe itself, not where it comes from.
PROBE_FILE_KEYS = ("questions", "min_correct", "max_tokens", "concurrency", "min_accept_length",
                   "timeout_s")


def probe_from_file(probe: ProbeOptions, text: str, path: str, host: str = "") -> ProbeOptions:
    """``probe`` with the values of a probe file (``probe.file``'s JSON text) in place: a
    malformed file is a SettingsError naming the file, the key and the fix."""
    where = f"probe file {path}"
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SettingsError(f"{where} is not JSON ({exc})", host=host,
                            fix='write {"questions": [{"prompt": "...", "answer": "REGEX"}], '
                            '"min_correct": N, ...}') from None
    if not isinstance(data, Mapping):
        raise SettingsError(f"{where} holds {type(data).__name__}, expected a JSON object",
                            host=host, fix='write {"questions": [...], ...}')
    unknown = sorted(set(data) - set(PROBE_FILE_KEYS))
    if unknown:
        raise SettingsError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}", host=host,
                            fix=f"use only {', '.join(PROBE_FILE_KEYS)}")
    merged = {**dataclasses.asdict(probe), **data, "file": probe.file}
    if isinstance(data.get("questions"), list) and "min_correct" not in data:
        # Questions of its own without a count: the default share (7 of 8) of them.
        merged["min_correct"] = max(1, math.ceil(len(data["questions"]) * 7 / 8))
    try:
        built = _build(ProbeOptions, merged, host, prefix=f"{where}: ")
    except SettingsError as exc:
        raise SettingsError(exc.problem, host=host,
                            fix=f"fix that key in {path}: questions are objects "
                            '{"prompt": "...", "answer": "REGEX"}') from None
    p = _Problems(host)
    _check_probe(built, p, where=where)
    p.raise_any()
    return built
