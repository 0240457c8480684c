"""The settings schema: pydantic models, strict (``"10"`` is no int, ``"yes"`` no bool), closed and
frozen; each value's own checks are field validators (``validators.py``), checks across keys are
in ``checks.py``. Later features add fields here, with a docstring: their line of the settings
reference (docs/settings.md)."""

import math
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from specfleet.core.settings import validators as valid

DATA_KEY = "specfleet"
# Test-only settings (launcher, sglang.no_deps, patch.test_recipe) are refused unless this is
# "1" in the environment.
TEST_SETTINGS_ENV = "SPECFLEET_ALLOW_TEST_SETTINGS"
# The one error type of a domain check; its context carries what is expected and the fix (where
# "{key}" stands for the key's path), and "found" where the value must not be quoted.
SETTING_ERROR = "specfleet_setting"


def refuse(expected: str, fix: str, found: str | None = None) -> PydanticCustomError:
    ctx = {"expected": expected, "fix": fix, **({"found": found} if found else {})}
    return PydanticCustomError(SETTING_ERROR, "expected {expected}", ctx)


def rule(problem: Callable[[Any], str | None], fix: str) -> AfterValidator:
    """A field validator from a ``*_problem`` function: None passes, else what is expected."""

    def check(value: Any) -> Any:
        expected = problem(value)
        if expected:
            raise refuse(expected, fix, found=valid.hide_userinfo(value))
        return value

    return AfterValidator(check)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def number(low: float, high: float | None = None, *, fix: str, low_open: bool = False,
           high_open: bool = False, integer: bool = False) -> AfterValidator:  # fmt: skip
    """A finite number within [low, high]; an open end excludes its bound."""
    if integer:
        expected = f">= {_num(low)}" if high is None else f"{_num(low)}..{_num(high)}"
    elif high is not None:
        expected = (f"a number in {'(' if low_open else '['}{_num(low)}, {_num(high)}"
                    f"{')' if high_open else ']'}")  # fmt: skip
    else:
        expected = f"a number {'>' if low_open else '>='} {_num(low)}"

    def check(value: float) -> float:
        ok = math.isfinite(value) and (value > low if low_open else value >= low)
        if not ok or (high is not None and (value >= high if high_open else value > high)):
            raise refuse(expected, fix)
        return value

    return AfterValidator(check)


def is_(pattern: Any, expected: str) -> Callable[[str], str | None]:
    """A ``*_problem`` function of a regex: ``expected`` unless the whole value matches."""
    return lambda value: None if pattern.fullmatch(value) else expected


def _flag(flag: str) -> str:
    if not valid.LONG_FLAG.fullmatch(flag):
        raise refuse("long flags as keys, such as '--context-length' (no '=value': the value is "
                     "the mapping's value)", f"write it as '--{flag.lstrip('-').split('=')[0]}'",
                     found=f"a mapping with the key {flag!r}")  # fmt: skip
    return flag


SECRET_FIX = (
    "remove it: give the server's API key with api_key_file (a file on the control machine) or "
    "api_key, and the Hugging Face token with weights.token_file or weights.token_env: those "
    "stay out of the unit, its argv and its environment file"
)


def _env_name(name: str) -> str:
    if not valid.ENV_NAME.fullmatch(name):
        raise refuse("an environment variable's name (letters, digits and _, not starting with "
                     "a digit)", "rename or remove that entry of plan.extra_env")  # fmt: skip
    if valid.secret_env_name(name):
        raise refuse("no secrets in plan.extra_env (variables named TOKEN, KEY, SECRET or "
                     "PASSWORD)", SECRET_FIX, found=f"the variable {name}")  # fmt: skip
    if valid.unsafe_env_name(name):
        raise refuse("no variable that changes what code the server runs or how it logs "
                     "(LD_*, PYTHONPATH and kin, the compile caches specfleet places, "
                     "SGLANG_LOGGING_CONFIG_PATH: they would undo the pinned venv, the "
                     "root-owned caches and the redacting log config)", "remove it: install what "
                     "the server needs into the venv, and leave its logging to specfleet",
                     found=f"the variable {name}")  # fmt: skip
    return name


def _api_key(key: str) -> str:
    # The key itself is never shown.
    if key == "":
        raise refuse("a non-empty key", "omit api_key for a server without a key (an empty key "
                     "is no key)", found="an empty string")  # fmt: skip
    if not valid.api_key_chars_ok(key):
        raise refuse("printable ASCII without spaces (a log's redaction could not tell a key's "
                     "words from the text around them)", "use a key of letters, digits and "
                     "punctuation, without spaces", found=f"a {len(key)}-character string with a "
                     "whitespace, control or non-ASCII character (not shown: it is a secret)")
    return key


def _token_env(name: str) -> str:
    if name.startswith("hf_") and len(name) >= 23 and name[3:].isalnum():
        raise refuse("the name of the environment variable that holds the token",
                     "remove the token from the inventory (revoke it if the inventory was "
                     "shared) and set weights.token_env to a name such as 'HF_TOKEN'",
                     found="what looks like a Hugging Face token (not shown)")  # fmt: skip
    if not valid.ENV_NAME.fullmatch(name):
        raise refuse("an environment variable's name", "set weights.token_env to the name of the "
                     "variable holding the token, e.g. 'HF_TOKEN' (the name, not the token)")
    return name


def _local_or_url(local: Callable[[str], str | None], what: str) -> Callable[[str], str | None]:
    schemes = ("https", "http", "file")
    return lambda v: valid.url_problem(v, schemes) if "://" in v else local(v) and what


def _path(example: str) -> AfterValidator:
    return rule(valid.abs_path_problem, f"set {{key}} to an absolute path such as {example!r}")


def _owned(example: str) -> AfterValidator:
    return rule(valid.owned_dir_problem, f"set {{key}} to a folder of specfleet's own such as "
                f"{example!r}")


def _seconds(example: float) -> AfterValidator:
    return number(0, fix=f"set {{key}} to seconds, e.g. {_num(example)}", low_open=True)


def _at_least_1(fix: str) -> AfterValidator:
    return number(1, integer=True, fix=fix)


_SGLANG_DEFAULT = number(0, integer=True, fix="leave {key} unset for SGLang's default")
_GIT_SCHEMES = ("https", "git+https", "ssh", "git+ssh", "file", "git+file", "http", "git+http")
_BACKEND = rule(is_(valid.BACKEND_NAME, "an attention backend's name such as 'fa3'"),
                "unset {key} to let the rules choose, or name one backend")
_NAME = rule(lambda v: (not v.strip() or valid.has_control_chars(v)) and "a non-empty name",
             "set {key} to a name, or unset it")
Port = Annotated[int, number(1, 65535, integer=True, fix="set {key} to a free TCP port")]
Pattern = Annotated[str, rule(lambda v: (not v or valid.has_control_chars(v)) and "a non-empty "
                              "glob such as '*.json'", "fix or remove that entry of the list")]
HostName = Annotated[str, rule(valid.host_problem, "give host names or IP addresses")]
Text = Annotated[str, rule(lambda v: valid.has_control_chars(v) and "a value without newlines or "
                           "control characters", "remove newlines and control characters")]
Finite = Annotated[float, rule(lambda v: not math.isfinite(v) and "a finite number",
                               "give a finite number")]
Mirror = Annotated[str, rule(_local_or_url(valid.control_path_problem, "an absolute path or one "
                             "under ~/"), "set patch.source to a folder on the control machine "
                             "(absolute or under ~/) or an http(s) URL base of the port's sources")]
Launcher = Annotated[list[str], rule(
    lambda c: (not c or not c[0] or any(map(valid.has_control_chars, c)))
    and "a command: a program, then its arguments",
    "give the stand-in's command, e.g. ['/usr/bin/python3', '/srv/standin.py']")]


class Section(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ModelSource(Section):
    repo_id: Annotated[str, rule(valid.repo_id_problem, "set {key} to the repo as the Hub names "
                                 "it, e.g. 'moonshotai/Kimi-K2.6'")]  # fmt: skip
    """The repo as the Hub names it, 'namespace/name'."""
    revision: Annotated[str, rule(valid.git_ref_problem, "pin {key} to a 40-hex commit (a branch "
                                  "or tag only with follow_branch: True)")] | None = None
    """A full commit sha; a branch or tag only with follow_branch."""
    follow_branch: bool = False
    """Follow a branch on purpose: a move shows as a planned change."""
    local_dir: Annotated[str, rule(valid.dir_name_problem, "set {key} to a folder name such as "
                                   "'kimi-k26', or unset it")] | None = None  # fmt: skip
    """The folder under models_root; default: the repo id with '/' as '--'."""
    allow_patterns: list[Pattern] | None = None
    """Globs of the files to fetch (all when unset)."""
    ignore_patterns: list[Pattern] | None = None
    """Globs of the files not to fetch."""
    gated: bool = False
    """The repo needs an accepted licence (a 403 then says so)."""

    @property
    def dir_name(self) -> str:
        return self.local_dir or self.repo_id.replace("/", "--")


class SGLangSource(Section):
    version: Annotated[str, rule(valid.version_problem, "set {key} to a release such as '0.5.23'")
                       ] = "0.5.23"  # fmt: skip
    """The SGLang release (PEP 440)."""
    kind: Literal["index", "git", "source"] = "index"
    """'index': pip from index_url / find_links; 'git': from git_url at git_ref; 'source': from
    source_path."""
    source_path: Annotated[str, rule(valid.abs_path_problem, "give the absolute path of an SGLang "
                           "checkout's python/ folder on the host")] | None = None  # fmt: skip
    """An SGLang checkout's python/ folder on the host (kind 'source', e.g. a DDTree fork)."""
    index_url: Annotated[str, rule(valid.url_problem, "give the index's URL: https (plain http to "
                         "a host in sglang.trusted_hosts), no user or password in it (pip's netrc "
                         "or keyring on the host holds those)")] | None = None  # fmt: skip
    """pip's index (http only to loopback or trusted_hosts)."""
    find_links: Annotated[str, rule(_local_or_url(valid.abs_path_problem, "a URL or an absolute "
                          "path to a wheelhouse on the host"), "give the wheelhouse's URL, or its "
                          "absolute path on the host")] | None = None  # fmt: skip
    """A wheelhouse: URL or absolute path on the host."""
    trusted_hosts: list[Annotated[str, rule(lambda v: valid.host_problem(v, allow_port=True),
                        "list host names or IP addresses (host or host:port)")]] = []
    """Hosts pip may reach over plain http (host or host:port)."""
    git_url: Annotated[str, rule(lambda v: valid.url_problem(v, _GIT_SCHEMES), "use e.g. "
                       "'git+https://github.com/sgl-project/sglang.git#subdirectory=python'")
                       ] | None = None  # fmt: skip
    """The git source (kind 'git')."""
    git_ref: Annotated[str, rule(valid.git_ref_problem, "set {key} to a branch, tag or commit")
                       ] | None = None  # fmt: skip
    """The branch, tag or commit of git_url."""
    no_deps: bool = False
    """Tests only: install without dependencies."""
    compressed_tensors: Annotated[str, rule(valid.specifier_problem, "set {key} to a specifier, or "
                                  "unset it to use the version table's")] | None = None
    """A specifier for compressed-tensors, over the version table's."""
    side_by_side: bool = False
    """Another release goes into a new venv beside venv (kept for rollback), not in place."""
    allow_replacing: bool | list[Annotated[str, rule(
        lambda v: not v.strip() and "a package name or glob",
        "list package names such as 'torch' or globs such as 'nvidia-*'")]] = False
    """Packages pip may replace in a venv specfleet did not create (names, globs, or True)."""


class PatchSource(Section):
    """PR#20547 (the DFlash spec-v2 worker), ported where the installed SGLang lacks it."""
    sha256: Annotated[str, rule(valid.sha256_problem, "set {key} to the PR revision's sha256 (64 "
                                "hex, as in the port's port.json)")] | None = None  # fmt: skip
    """The PR revision to port, pinned (its diff's sha256 against its merge base); it opts in."""
    source: Mirror | list[Mirror] | None = None
    """Mirrors of the port's sources (control-machine folders, URL bases), before its own URLs."""
    on_conflict: Literal["keep-v1", "fail"] = "keep-v1"
    """What a port that does not apply does."""
    test_recipe: Annotated[str, rule(valid.control_path_problem, "give the test's recipe.json "
                           "as an absolute path on the control machine")] | None = None
    """Tests only: a recipe.json used instead of the port's own (a variant lacking one fix)."""


class WeightsOptions(Section):
    hf_endpoint: Annotated[str, rule(valid.url_problem, "use the endpoint's https:// URL (the "
                           "token is sent there), or list a trusted mirror's host in "
                           "weights.allow_http_hosts")] | None = None  # fmt: skip
    """The Hub or a mirror (the token goes there): https, or http to loopback/allow_http_hosts."""
    allow_http_hosts: list[HostName] = []
    """Hosts hf_endpoint may name over plain http (a mirror on a trusted LAN)."""
    token_file: Annotated[str, rule(valid.control_path_problem, "set {key} to a file on the "
                          "control machine, e.g. '~/.cache/huggingface/token'")] | None = None
    """The HF token's file on the control machine, read at deploy time."""
    token_env: Annotated[str, AfterValidator(_token_env)] | None = None
    """The variable holding the HF token (default HF_TOKEN)."""
    host_token_path: Annotated[str, rule(valid.abs_path_problem, "set {key} to the token's "
                               "absolute path on the host")] | None = None  # fmt: skip
    """A host's own token, if not at huggingface_hub's default path."""
    margin_percent: Annotated[float, number(0, 100, high_open=True, fix="set {key} to the "
                              "free-space margin in percent, e.g. 2")] = 2.0  # fmt: skip
    """Free space to keep, in percent of the disk."""
    margin_min_gib: Annotated[float, number(0, fix="set {key} to the least free space to keep, "
                              "e.g. 10")] = 10.0  # fmt: skip
    """Free space to keep, at least, in GiB."""
    verify: Literal["fast", "deep"] = "fast"
    """How downloaded files are checked."""
    stall_minutes: Annotated[float, number(0, low_open=True, fix="set {key} to the minutes "
                             "without progress that count as a stall, e.g. 10")] = 10.0
    """Minutes without progress that count as a stall."""
    prune_other_revisions: bool = False
    """Delete other revisions of the model after a verified download."""
    poll_seconds: Annotated[float, number(0, low_open=True, fix="set {key} to e.g. 5")] = 5.0
    """Seconds between progress polls."""


class PlanOverrides(Section):
    """Each override shows in the plan as overriding a rule."""
    tp_size: Annotated[int, _at_least_1("leave it unset to use every GPU, or give the number of "
                                        "GPUs to shard over")] | None = None  # fmt: skip
    """GPUs to shard over (default: all)."""
    attention_backend: Annotated[str, _BACKEND] | None = None
    """The target's attention backend."""
    draft_attention_backend: Annotated[str, _BACKEND] | None = None
    """The drafter's attention backend."""
    mem_fraction_static: Annotated[float, number(0, 1, low_open=True, high_open=True,
                                                 fix="use e.g. 0.85")] | None = None
    """SGLang's --mem-fraction-static."""
    min_request_tokens: Annotated[int, number(0, integer=True, fix="use e.g. 32768 (the "
                                  "default): the tokens one request must be able to hold")
                                  ] = 32768  # fmt: skip
    """The tokens one request must be able to hold (SGLang caps each at its KV pool, counted by
    its own accounting) below which no plan is made; single hosts and serving groups alike."""
    draft_window_size: Annotated[int, _at_least_1("use e.g. 4096 (the default), at least the "
                                                  "drafter's block size")] = 4096  # fmt: skip
    """The drafter's window."""
    ddtree_budget: Annotated[int, number(2, integer=True, fix="use e.g. 32, or leave it unset for "
                             "plain DFlash")] | None = None  # fmt: skip
    """DDTree's tree budget where the installed SGLang has a known design (None: plain DFlash)."""
    ddtree_max_topk: Annotated[int, _SGLANG_DEFAULT] | None = None
    """PR#29907's knob (None: SGLang's default)."""
    ddtree_depth_bonus: Finite | None = None
    """PR#29907's knob (None: SGLang's default)."""
    ddtree_rank_probe: Annotated[int, _SGLANG_DEFAULT] | None = None
    """PR#29907's knob (None: SGLang's default)."""
    sm120_target_backend: Literal["triton", "flashinfer"] = "triton"
    """The target's backend on SM120."""
    extra_args: dict[Annotated[str, AfterValidator(_flag)], Text | Finite | int | bool | None] = {}
    """Flags to add or replace; True: a bare flag, None: remove one the plan set."""
    extra_env: dict[Annotated[str, AfterValidator(_env_name)], Text] = {}
    """Variables added to the server's environment."""


class RolloutOptions(Section):
    canary: Annotated[str, _NAME] | None = None
    """The host that goes first, alone (default: the first)."""
    order: list[str] | None = None
    """Hosts to go first, in this order."""
    batch_size: Annotated[int, _at_least_1("set {key} to the hosts per batch (1 or more), or "
                                           "unset it")] | None = None  # fmt: skip
    """Hosts per batch."""
    batch_percent: Annotated[float, number(0, 100, low_open=True, fix="set {key} to a percentage "
                             "of the fleet, e.g. 25")] | None = None  # fmt: skip
    """Percent of the fleet per batch."""
    max_fail_percent: Annotated[float, number(0, 100, fix="set {key} to the share of hosts that "
                                "may fail, e.g. 0")] = 0.0  # fmt: skip
    """Failure budget, in percent of the fleet."""
    prefetch_weights: bool = True
    """Download every host's weights before the first restart."""
    fanout: bool = True
    """Hosts copy the weights from each other, one upstream download per site."""
    fanout_site: Annotated[str, _NAME] | None = None
    """Hosts of one site share one upstream download per model."""
    fanout_serve_hours: Annotated[float, number(0, 24, low_open=True, fix="set {key} to the "
                                  "hours a fan-out may take (at most a day), e.g. 2")] = 2.0
    """The fan-out's sshd on a serving host stops by itself after this."""
    speed_gate: Annotated[float, number(0, 1, low_open=True, fix="set {key} to the fraction of its "
                          "earlier speed a host must keep, e.g. 0.85, or unset it (no speed "
                          "gate)")] | None = None  # fmt: skip
    """A host whose tokens/s or acceptance length fell below this share of its own fails."""


class RemovalOptions(Section):
    weights: bool = False
    """Also the target's and drafter's folders and the compile caches."""
    venv: bool = False
    """Also the configured venv when it is the user's own."""


class ServingGroup(Section):
    """Hosts that together run one SGLang server: tensor parallel over all their GPUs (NCCL
    between hosts). Declared once in group data; every member carries the same section."""
    name: Annotated[str, rule(is_(valid.GROUP_NAME, "a plain name (letters, digits, . _ -)"),
                              "name the serving group, e.g. 'kimi-h100-pair'")]
    """The group's name."""
    members: list[str]
    """Member hosts in rank order: members[0] is rank 0 and serves the API."""
    rendezvous_port: Port = 20000
    """Rank 0's torch.distributed port (SGLang also takes the next ones)."""
    addresses: dict[str, Annotated[str, rule(valid.host_problem, "give the IP address or name the "
                                             "other members reach this member on")]] = {}
    """Each member's address for its peers (default: its inventory address)."""
    interface: Annotated[str, rule(is_(valid.IFACE_NAME, "a network interface's name, e.g. eth0"),
                                   "unset it to use the interface that holds each member's "
                                   "address")] | None = None  # fmt: skip
    """The NIC NCCL and Gloo use (default: the one holding the address)."""
    dist_timeout_s: Annotated[int, _at_least_1("use e.g. 600 (seconds the ranks wait for each "
                                               "other)")] = 600  # fmt: skip
    """SGLang's --dist-timeout, in seconds."""


class WatchdogOptions(Section):
    """The host-side health watchdog (``specfleet/hostside/watchdog.py``, its own systemd unit)."""
    enable: bool = True
    """Run the watchdog."""
    interval_s: Annotated[float, number(0, 3600, low_open=True, fix="set {key} to the seconds "
                          "between probes, at most an hour (e.g. 30), or watchdog.enable to "
                          "False")] = 30.0  # fmt: skip
    """Seconds between generation probes."""
    probe_timeout_s: Annotated[float, _seconds(40)] = 40.0
    """One probe's budget."""
    failures: Annotated[int, _at_least_1("set {key} to e.g. 3, or watchdog.enable to False")] = 3
    """Failed probes in a row (tokens flat) before a restart."""
    backoff_s: Annotated[float, _seconds(300)] = 300.0
    """The wait after a restart, doubling per restart in window_s."""
    backoff_max_s: Annotated[float, _seconds(3600)] = 3600.0
    """The longest wait between restarts."""
    max_restarts: Annotated[int, _at_least_1("set {key} to e.g. 3, or watchdog.enable to "
                                             "False")] = 3  # fmt: skip
    """Restarts in window_s before it waits for a person."""
    window_s: Annotated[float, _seconds(21600)] = 21600.0
    """The window of max_restarts."""
    load_grace_s: Annotated[float, _seconds(3600)] | None = None
    """How long a start may load before failed probes count (default: readiness_timeout_s)."""


class MetricsOptions(Section):
    enable: bool = True
    """SGLang's --enable-metrics."""
    relay_port: Port | None = 30091
    """The watchdog relays the server's /metrics here (None: no relay)."""
    relay_listen: HostName = "127.0.0.1"
    """Where the relay (no auth) listens: a fleet address or '0.0.0.0' opens it to a scraper."""
    textfile_dir: Annotated[str, _path("/var/lib/prometheus/node-exporter")
                            ] = "/var/lib/prometheus/node-exporter"  # fmt: skip
    """node-exporter's textfile collector folder."""
    node_exporter_port: Port = 9100
    """Where node-exporter listens, for the generated scrape config."""


# The longest regex a probe answer may be: the readiness gate matches it on the host, bounded
# (``specfleet.hostside.readiness_gate.ANSWER_PATTERN_MAX``, the same number, checked by a test).
ANSWER_PATTERN_MAX = 200


def _regex(answer: str) -> str | None:
    if len(answer) > ANSWER_PATTERN_MAX:
        return (f"a regex of at most {ANSWER_PATTERN_MAX} characters (this one has "
                f"{len(answer)}): the gate matches it on the host, bounded")
    try:
        empty = re.fullmatch(answer, "") is not None
        return empty and "a regex that an empty answer does not match"
    except re.error as exc:
        return f"a regular expression (Python re: {exc})"


class ProbeQuestion(Section):
    prompt: Annotated[str, rule(lambda v: not v.strip() and "a question", "write the question the "
                                "server must answer")]  # fmt: skip
    """A question the server must answer right (temperature 0)."""
    answer: Annotated[str, rule(_regex, "fix the regex of that answer (a short pattern the "
                                "right answer contains, e.g. '\\bParis\\b')")]
    """A regex (Python re, case-insensitive) the answer's text must contain."""


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


class ProbeOptions(Section):
    """The readiness gate's correctness probe: after /health_generate, these questions at
    temperature 0 must get their answers, with a plausible speculative acceptance length."""
    enable: bool = True
    """Run the probe."""
    questions: Annotated[list[ProbeQuestion], rule(lambda v: not v and "at least one question "
                         "with its answer", "list questions as {'prompt': ..., 'answer': REGEX}, "
                         "or leave the defaults")] = [ProbeQuestion(prompt=q, answer=a)
                                                       for q, a in DEFAULT_PROBE_QUESTIONS]
    """The questions and the regex (at most 200 characters) each answer must contain."""
    min_correct: Annotated[int, number(1, integer=True, fix="set {key} to the right answers "
                           "needed, at most the number of questions")] = 7  # fmt: skip
    """Right answers needed (at most the number of questions)."""
    max_tokens: Annotated[int, number(1, integer=True, fix="set {key} to e.g. 64")] = 64
    """Output tokens per request (>= 64 makes speculative verify run for many steps)."""
    concurrency: Annotated[int, number(1, integer=True, fix="set {key} to e.g. 8")] = 8
    """Requests in flight at once (batched verify runs too)."""
    min_accept_length: Annotated[float, number(1, fix="set {key} to at least 1.0 (a verify step "
                                 "emits one token at least)")] = 2.0  # fmt: skip
    """The least mean acceptance length /generate may report (a broken verify nears 1.0)."""
    timeout_s: Annotated[float, _seconds(120)] = 120.0
    """The seconds one request may take."""
    file: Annotated[str, rule(valid.control_path_problem, "set probe.file to a JSON file on the "
                    "control machine, e.g. '~/probe.json'")] | None = None  # fmt: skip
    """A JSON file on the control machine whose keys replace these at deploy time."""


class Settings(Section):
    """Everything a Kimi K2.6 + DFlash deploy can be told. Defaults are that deploy's."""
    target: ModelSource = ModelSource(repo_id="moonshotai/Kimi-K2.6")
    """The served model."""
    drafter: ModelSource = ModelSource(repo_id="z-lab/Kimi-K2.6-DFlash", gated=True)
    """The DFlash drafter."""
    models_root: Annotated[str, _owned("/srv/models")] = "/srv/models"
    """The folder of the models' folders."""
    venv: Annotated[str, _owned("/opt/specfleet/sglang")] = "/opt/specfleet/sglang"
    """SGLang's venv; an existing one is reused, not replaced."""
    python: Annotated[str, rule(
        lambda v: not (valid.COMMAND_NAME.fullmatch(v) or valid.abs_path_problem(v) is None)
        and "an interpreter's name on PATH or its absolute path",
        "set python to e.g. 'python3' or '/usr/bin/python3.11'")] = "python3"
    """The interpreter that makes the venv."""
    sglang: SGLangSource = SGLangSource()
    """Where SGLang comes from."""
    patch: PatchSource = PatchSource()
    """PR#20547, where the installed SGLang lacks it."""
    weights: WeightsOptions = WeightsOptions()
    """Downloads of the weights."""
    plan: PlanOverrides = PlanOverrides()
    """Overrides of the launch plan's rules."""
    rollout: RolloutOptions = RolloutOptions()
    """The fleet rollout."""
    present: bool = True
    """False removes the deploy from the host."""
    removal: RemovalOptions = RemovalOptions()
    """What a removal also takes away."""
    group: ServingGroup | None = None
    """Set: this host is one member of a multi-host server."""
    watchdog: WatchdogOptions = WatchdogOptions()
    """The health watchdog."""
    metrics: MetricsOptions = MetricsOptions()
    """Prometheus metrics."""
    probe: ProbeOptions = ProbeOptions()
    """The readiness gate's correctness probe."""
    service_name: Annotated[str, rule(valid.unit_name_problem, "set service_name to a plain name "
                            "of specfleet's own such as 'specfleet-sglang'")
                            ] = "specfleet-sglang"  # fmt: skip
    """The systemd unit's name."""
    listen_host: Annotated[str, rule(valid.listen_address_problem, "set listen_host to an IP "
                           "address of the host, e.g. '127.0.0.1' or '0.0.0.0'")
                           ] = "127.0.0.1"  # fmt: skip
    """The address the server listens on."""
    port: Annotated[int, number(1, 65535, integer=True, fix="set port to a free TCP port such as "
                    "30000")] = 30000  # fmt: skip
    """The server's port."""
    api_key: Annotated[str, AfterValidator(_api_key)] | None = Field(default=None, repr=False)
    """The server's API key (prefer api_key_file); kept out of argv, diffs and logs."""
    api_key_file: Annotated[str, rule(valid.control_path_problem, "set api_key_file to a file on "
                            "the control machine, e.g. '~/.specfleet/api-key'")] | None = None
    """A file on the control machine holding the API key, read at deploy time."""
    readiness_timeout_s: Annotated[float, number(0, low_open=True, fix="set {key} to the seconds "
                                   "a start may take, e.g. 3600")] = 3600.0  # fmt: skip
    """How long a start may take to answer."""
    launcher: Launcher | None = None
    """Tests only: the command standing in for `python -m sglang.launch_server`."""
    state_dir: Annotated[str, _owned("/var/lib/specfleet")] = "/var/lib/specfleet"
    """specfleet's own state on the host."""


# Keys whose values are never quoted back in an error, whatever is wrong with them.
SECRET_KEYS = frozenset({"api_key"})
