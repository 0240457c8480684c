"""Every problem of one host's settings at once: pydantic's error list read as problems (the key,
what was found, what is expected, the fix), then the checks across keys, each run only over keys
that validated, so that one bad key does not hide another's problem."""

import difflib
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ValidationError

from specfleet.core.settings import schema
from specfleet.core.settings.schema import Settings
from specfleet.core.settings.validators import http_host_problem, secret_flag
from specfleet.core.text import mask_tokens


@dataclass(frozen=True)
class Problem:
    key: str
    text: str
    fix: str


def bad(key: str, found: str, expected: str, fix: str) -> Problem:
    # What was found is quoted back, never a token pasted into the wrong field.
    return Problem(key, f"settings key '{key}' is {mask_tokens(found)}, expected {expected}", fix)


def find_problems(data: Mapping[str, Any], host: str, test_ok: bool
                  ) -> tuple[Settings | None, list[Problem]]:  # fmt: skip
    """The Settings of ``data`` (None if any key is bad) and every problem of it."""
    try:
        settings: Settings | None = Settings.model_validate(data)
        found: list[Problem] = []
    except ValidationError as exc:
        settings, found = None, schema_problems(exc.errors(include_url=False))
    bad_keys = [p.key for p in found]
    context = {"@host": host, "@test_ok": test_ok}
    for paths, check in CHECKS:
        if not any(_overlap(path, key) for path in paths for key in bad_keys):
            found.extend(check(*(context[p] if p in context else _value(settings or data, p)
                                 for p in paths)))  # fmt: skip
    return (settings if not found else None), found


def _value(node: Any, path: str) -> Any:
    return len(_read(node, path[1:]) or ()) if path.startswith("#") else _read(node, path)


def _overlap(path: str, key: str) -> bool:
    if path.startswith("#"):
        return path[1:] == key or path[1:].startswith(key + ".")
    return path == key or key.startswith((path + ".", path + "[")) or path.startswith(key + ".")


def _read(node: Any, path: str) -> Any:
    """The value at ``path`` of a Settings or of raw data (a key not given: its default)."""
    cls: Any = Settings
    for part in path.split("."):
        if node is None:
            return None
        field = cls.model_fields[part]
        if isinstance(node, BaseModel):
            node = getattr(node, part)
        else:
            node = node[part] if part in node else field.get_default(call_default_factory=True)
        cls = _unwrap(field.annotation)
    return node


def schema_problems(errors: list[dict[str, Any]], root: type = Settings) -> list[Problem]:
    """One problem per key: a domain check's own words where one failed (a value refused by every
    member of a union also fails their types), else the type that key takes."""
    chosen: dict[str, dict[str, Any]] = {}
    where: dict[str, tuple[Any, list[str]]] = {}
    for err in errors:
        key, tp, siblings = _locate(err["loc"], root)
        if key not in chosen or (err["type"] == schema.SETTING_ERROR
                                 and chosen[key]["type"] != schema.SETTING_ERROR):  # fmt: skip
            chosen[key], where[key] = err, (tp, siblings)
    return [_problem(key, err, *where[key]) for key, err in chosen.items()]


# Keys a release removed, and what replaced them.
GONE = {
    key: "the KV floor is plan.min_request_tokens, the tokens one request may hold by SGLang's "
    "own accounting, one basis for single hosts and serving groups"
    for key in ("plan.min_kv_gib", "group.min_kv_gib_per_gpu")
}


def _problem(key: str, err: dict[str, Any], tp: Any, siblings: list[str]) -> Problem:
    value = err["input"]
    if err["type"] == "extra_forbidden":
        if key == schema.DATA_KEY:  # a settings file (specfleet plan) copied from an inventory
            return Problem(key, f"unknown settings key '{key}': these are the settings already",
                           f"take what is under '{key}' up one level: {{\"port\": 30000}}, not "
                           f"{{\"{key}\": {{\"port\": 30000}}}}")  # fmt: skip
        if key in GONE:
            return Problem(key, f"settings key '{key}' is gone: {GONE[key]}",
                           "remove it; set plan.min_request_tokens (default 32768) for another "
                           "floor")  # fmt: skip
        leaf = key.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
        if close:
            return Problem(key, f"unknown settings key '{key}' (did you mean '{close[0]}'?)",
                           f"rename it to '{close[0]}', or remove it")  # fmt: skip
        return Problem(key, f"unknown settings key '{key}'",
                       f"remove it, or use one of: {', '.join(sorted(siblings))}")
    if err["type"] == schema.SETTING_ERROR:
        ctx = err["ctx"]
        return bad(key, ctx.get("found") or repr(value), ctx["expected"],
                   ctx["fix"].replace("{key}", key))
    if err["type"] == "missing":
        return Problem(key, f"settings key '{key}' is required",
                       f"set {data_path(key)} in the host or group data")
    expected = type_name(tp)
    found = (f"a {type(value).__name__} (not shown: it is a secret)" if key in schema.SECRET_KEYS
             else f"{value!r} ({type(value).__name__})")  # fmt: skip
    return bad(key, found, expected,
               f"set {data_path(key)} to {expected} where it is given (the host or group data, "
               "or --data)")


def data_path(key: str) -> str:
    """A key as the data spells it, ``plan.tp_size`` -> ``specfleet['plan']['tp_size']``: a fix
    that said ``specfleet['plan.tp_size']`` would send the user to write an unknown key."""
    parts = re.findall(r"\[(\d+)\]|([^.\[\]]+)", key)
    return schema.DATA_KEY + "".join(f"[{i}]" if i else f"[{name!r}]" for i, name in parts)


def _unwrap(tp: Any) -> Any:  # the type under Annotated and Optional
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _locate(loc: tuple[Any, ...], tp: Any) -> tuple[str, Any, list[str]]:
    """(the key's path, the type it takes, the keys beside it) of a pydantic error location; the
    members of a union in the location (pydantic names each one it tried) are left out."""
    path, siblings = "", []
    items = list(loc)
    while items:
        item = items.pop(0)
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            siblings = list(tp.model_fields)
            path = f"{path}.{item}" if path else str(item)
            field = tp.model_fields.get(item)
            tp = field.annotation if field else None
        elif origin is list:
            path, tp = f"{path}[{item}]", typing.get_args(tp)[0]
        elif origin is dict:
            key_type, value_type = typing.get_args(tp)
            path = f"{path}.{item}"
            tp = key_type if items[:1] == ["[key]"] else value_type
            items = items[1:] if items[:1] == ["[key]"] else items
        else:
            break
    return path, tp, siblings


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " or ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is list:
        return f"a list of {type_name(args[0])}"
    if origin is dict:
        return f"a mapping of {type_name(args[0])} to {type_name(args[1])}"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"a mapping (section {tp.__name__})"
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


# Checks across keys: each reads the keys it names (and "@host", "@test_ok"), yields problems.
Check = Callable[..., Iterator[Problem]]
CHECKS: list[tuple[tuple[str, ...], Check]] = []


def across(*paths: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        CHECKS.append((paths, check))
        return check

    return register


_TEST_FIX = (
    f"remove it: it is for specfleet's own tests (they set {schema.TEST_SETTINGS_ENV}=1 in the "
    "environment of the run)"
)


def _pinned(name: str) -> Check:
    @across(f"{name}.revision", f"{name}.follow_branch")
    def check(revision, follow_branch):
        if revision is not None and not follow_branch and not re.fullmatch("[0-9a-f]{40}",
                                                                          revision.lower()):
            yield Problem(f"{name}.revision", f"settings key '{name}.revision' is {revision!r}, "
                          "which is not a commit sha",
                          f"pin {schema.DATA_KEY}['{name}']['revision'] to a 40-hex commit, or "
                          f"set {schema.DATA_KEY}['{name}']['follow_branch'] = True to follow it "
                          "on purpose")  # fmt: skip

    return check


_pinned("target")
_pinned("drafter")


@across("target.repo_id", "target.local_dir", "drafter.repo_id", "drafter.local_dir",
        "models_root")
def _model_folders_apart(target_id, target_dir, drafter_id, drafter_dir, models_root):
    folder = target_dir or target_id.replace("/", "--")
    if folder == (drafter_dir or drafter_id.replace("/", "--")):
        yield Problem("target", f"settings keys 'target' and 'drafter' resolve to one model "
                      f"folder {models_root.rstrip('/') + '/' + folder!r}",
                      "give the drafter another repo_id or local_dir (target.local_dir / "
                      "drafter.local_dir)")  # fmt: skip


def _hosts(hosts: list[str]) -> list[str]:  # host names of "host" or "host:port" entries
    return [re.sub(r":[0-9]+$", "", h) if h.count(":") == 1 else h for h in hosts]


def _plain_http(key: str, hosts_key: str, fix: str) -> Check:
    @across(key, hosts_key)
    def check(url, hosts):
        if url is not None and "://" in url:
            expected = http_host_problem(url, _hosts(hosts), hosts_key)
            if expected:
                yield bad(key, repr(url), expected, fix)

    return check


_HTTP_FIX = ("use https, or list the host in sglang.trusted_hosts (pip's own list of hosts it may "
             "reach over plain http)")  # fmt: skip
for _key in ("sglang.index_url", "sglang.find_links", "sglang.git_url"):
    _plain_http(_key, "sglang.trusted_hosts", _HTTP_FIX)
_plain_http("weights.hf_endpoint", "weights.allow_http_hosts",
            "use the endpoint's https:// URL (the token is sent there), or list a trusted "
            "mirror's host in weights.allow_http_hosts")


@across("plan.extra_args", "api_key", "api_key_file")
def _no_secret_flags(extra_args, api_key, api_key_file):
    for flag, value in extra_args.items():
        if value is None or value is False:
            continue
        if secret_flag(flag):
            yield bad(f"plan.extra_args.{flag}", f"the flag {flag}", "no secrets in "
                      "plan.extra_args (flags named key, token, secret or password end up in the "
                      "unit's argv)", schema.SECRET_FIX)  # fmt: skip
        elif flag == "--config" and (api_key is not None or api_key_file is not None):
            yield bad(f"plan.extra_args.{flag}", repr(value), "no --config while an API key is "
                      "set (specfleet passes the key through its own --config file)",
                      "remove --config from plan.extra_args, or put its options in "
                      "plan.extra_args")  # fmt: skip


def _each_once(key: str, expected: str, fix: str) -> Check:
    @across(key)
    def check(names):
        seen: set[str] = set()
        for i, name in enumerate(names or ()):
            if not name.strip() or name in seen or any(ord(c) < 32 for c in name):
                yield bad(f"{key}[{i}]", repr(name), expected, fix)
            seen.add(name)

    return check


_each_once("rollout.order", "a host name not listed before", "list each host once in "
           "rollout.order")  # fmt: skip
_each_once("group.members", "an inventory host name not listed before",
           "list each member host once, rank 0 first")


@across("group.name", "group.members", "group.addresses", "@host")
def _group_members(name, members, addresses, host):
    if members is None:
        return
    if len(members) < 2:
        yield bad("group.members", repr(members), "two or more hosts", "list every host of the "
                  "group (rank 0 first), or remove 'group' from a host that serves alone")
    elif host and host not in members:
        yield Problem("group.members", f"host {host} has serving group {name!r} but is not one of "
                      f"its members {members}", f"add {host} to group.members, or give it no "
                      "group")  # fmt: skip
    for member, address in addresses.items():
        if member not in members:
            yield bad(f"group.addresses.{member}", repr(address), "an address of a member",
                      f"remove it, or add {member} to group.members")


# (the keys read, when they conflict, the key named, the problem, the fix): the problem is
# formatted with the keys' values in order.
CONFLICTS = [
    (("sglang.kind", "sglang.source_path"), lambda kind, path: kind == "source" and not path,
     "sglang.kind", "settings key 'sglang.kind' is 'source' but 'sglang.source_path' is unset",
     "set sglang.source_path to the python/ folder of an SGLang checkout on the host"),
    # "#": the number of items, whatever their own problems.
    (("probe.min_correct", "#probe.questions"), lambda need, n: need > max(1, n),
     "probe.min_correct", "settings key 'probe.min_correct' is {0}, expected at most the number "
     "of questions ({1})", "set probe.min_correct to the right answers needed"),
    (("launcher", "@test_ok"), lambda launcher, ok: launcher is not None and not ok, "launcher",
     "settings key 'launcher' is {0!r}, expected no value: 'launcher' is a test-only setting "
     f"(refused unless {schema.TEST_SETTINGS_ENV}=1)", _TEST_FIX),
    (("sglang.no_deps", "@test_ok"), lambda no_deps, ok: no_deps and not ok, "sglang.no_deps",
     "settings key 'sglang.no_deps' is True, expected false: 'sglang.no_deps' is a test-only "
     f"setting (refused unless {schema.TEST_SETTINGS_ENV}=1)", _TEST_FIX),
    (("patch.test_recipe", "@test_ok"), lambda recipe, ok: recipe is not None and not ok,
     "patch.test_recipe", "settings key 'patch.test_recipe' is {0!r}, expected no value: "
     "'patch.test_recipe' is a test-only setting (refused unless "
     f"{schema.TEST_SETTINGS_ENV}=1)", _TEST_FIX),
    # The fan-out's cleanup empties folders of state_dir, and the token copy lives there.
    (("models_root", "state_dir"), lambda a, b: _inside(a, b) or _inside(b, a), "models_root",
     "settings key 'models_root' is {0!r}, expected a folder apart from state_dir {1!r} "
     "(neither inside the other)", "give models_root and state_dir folders of their own, e.g. "
     "'/srv/models' and '/var/lib/specfleet'"),
    # A removal deletes the venv by its own rules and never a folder holding one or the weights.
    (("venv", "state_dir"), lambda a, b: _inside(a, b) or _inside(b, a), "venv",
     "settings key 'venv' is {0!r}, expected a folder apart from state_dir {1!r} "
     "(neither inside the other)", "give venv and state_dir folders of their own, e.g. "
     "'/opt/specfleet/sglang' and '/var/lib/specfleet'"),
    (("venv", "models_root"), lambda a, b: _inside(a, b) or _inside(b, a), "venv",
     "settings key 'venv' is {0!r}, expected a folder apart from models_root {1!r} "
     "(neither inside the other)", "give venv and models_root folders of their own, e.g. "
     "'/opt/specfleet/sglang' and '/srv/models'"),
    (("api_key", "api_key_file"), lambda a, b: a is not None and b is not None, "api_key_file",
     "settings keys 'api_key' and 'api_key_file' are both set",
     "keep api_key_file (the key stays out of the inventory) and remove api_key"),
    (("sglang.kind", "sglang.git_url", "sglang.git_ref"),
     lambda kind, url, ref: kind == "git" and not (url and ref), "sglang.kind",
     "settings key 'sglang.kind' is 'git' but 'sglang.git_url' or 'sglang.git_ref' is unset",
     "set both sglang.git_url and sglang.git_ref, or use kind 'index'"),
    (("patch.source", "patch.sha256"), lambda source, sha: source is not None and not sha,
     "patch.source", "settings key 'patch.source' is set without 'patch.sha256'",
     "opt in with patch.sha256 (the PR revision the port is made from, 1c844c0fdcab59266c0b1bb46e"
     "2099b86469364ffd5ad5ac436f1a7f2847d252), or delete patch.source"),
    (("weights.token_file", "weights.token_env"), lambda a, b: a is not None and b is not None,
     "weights.token_env", "settings keys 'weights.token_file' and 'weights.token_env' are both "
     "set", "keep one of them"),
    (("rollout.batch_size", "rollout.batch_percent"),
     lambda a, b: a is not None and b is not None, "rollout.batch_size",
     "settings keys 'rollout.batch_size' and 'rollout.batch_percent' are both set",
     "set one of them"),
    (("group.rendezvous_port", "port"), lambda rdv, port: rdv == port, "group.rendezvous_port",
     "settings key 'group.rendezvous_port' is {0}, expected a TCP port other than the server's "
     "port {1}",
     "use e.g. 20000 (SGLang also takes the next ports above it)"),
    (("group.name", "plan.tp_size"), lambda group, tp: group is not None and tp is not None,
     "plan.tp_size", "settings keys 'plan.tp_size' and 'group' are both set",
     "remove plan.tp_size: a serving group shards over every GPU of its members"),
    (("watchdog.backoff_s", "watchdog.backoff_max_s"), lambda low, high: high < low,
     "watchdog.backoff_max_s", "settings key 'watchdog.backoff_max_s' is below "
     "'watchdog.backoff_s'", "set watchdog.backoff_max_s to at least watchdog.backoff_s"),
    (("metrics.relay_port", "port"), lambda relay, port: relay == port, "metrics.relay_port",
     "settings key 'metrics.relay_port' is the server's port {1}",
     "give the metrics relay a port of its own, e.g. 30091"),
]


def _inside(path: str, folder: str) -> bool:
    return (path.rstrip("/") + "/").startswith(folder.rstrip("/") + "/")


def _conflict(paths, when, key, text, fix) -> None:
    def check(*values):
        if when(*values):
            yield Problem(key, mask_tokens(text.format(*values)), fix)

    across(*paths)(check)


for _row in CONFLICTS:
    _conflict(*_row)
