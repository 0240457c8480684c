"""What the CLI shows of an inventory without changing anything: each host's merged settings
(``specfleet settings``) and the status document with every host in it (``specfleet status``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from specfleet.core.secrets import control_token_source
from specfleet.core.settings import Settings, settings_for_host
from specfleet.core.text import mask_tokens_in
from specfleet.fleet.pyinfra_run import session

# The one secret a Settings may hold by value; the others are references already.
HIDDEN = "(set inline in the inventory; not shown)"


def secret_references(s: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where each secret of a host comes from, as a reference (a file, a variable), never its
    value; of a variable, whether ``environ`` (default ``os.environ``) sets it (the token's
    source is ``control_token_source``'s, the rule a deploy reads it by)."""
    if s.api_key is not None:
        api_key = "inline api_key in the inventory (not shown; prefer api_key_file)"
    elif s.api_key_file:
        api_key = f"file {s.api_key_file} on the control machine"
    else:
        api_key = "none (the server takes requests without a key)"
    w = s.weights
    source = control_token_source(w.token_file, w.token_env, environ)
    if source.kind == "file":
        token = f"file {source.name} on the control machine"
    elif source.is_set:
        token = f"${source.name} on the control machine: set"
    elif source.named:
        token = (f"${source.name} on the control machine: unset (a deploy stops until it is "
                 f"exported: export {source.name})")
    else:
        # Not an error (a token already on the host serves), but a gated repo's 403 comes late.
        token = (f"${source.name} on the control machine: unset, so only the host's own token "
                 f"({w.host_token_path or '~/.cache/huggingface/token'}) if any; a gated or "
                 f"private repo needs one: export {source.name} (or set weights.token_file)")
    return {"api_key": api_key, "hf_token": token}


def settings_view(s: Settings, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A host's settings as plain data with every secret value replaced by ``HIDDEN`` and the
    references listed under ``secrets``."""
    data = mask_tokens_in(s.model_dump())
    if data.get("api_key") is not None:
        data["api_key"] = HIDDEN
    data["secrets"] = secret_references(s, environ)
    return data


def merged_settings(inventory: Any, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{host: settings_view}`` of the named hosts, each merged across its groups, host data
    and ``--data`` as a deploy merges them."""
    from pyinfra.api import State

    State(inventory=inventory)  # hosts read their data through the state they belong to
    return {h.name: settings_view(settings_for_host(h)) for h in inventory if h.name in names}


def _lines(value: Any, indent: str) -> list[str]:
    if isinstance(value, Mapping):
        out: list[str] = []
        for key, item in value.items():
            if isinstance(item, Mapping) and item:
                out += [f"{indent}{key}:", *_lines(item, indent + "  ")]
            else:
                out.append(f"{indent}{key}: {json.dumps(item)}")
        return out
    return [f"{indent}{json.dumps(value)}"]


def render_settings(shown: Mapping[str, Mapping[str, Any]]) -> str:
    """One block per host, nested keys indented, values as JSON (pure)."""
    blocks = [f"{name}:\n" + "\n".join(_lines(data, "  ")) for name, data in shown.items()]
    return "\n\n".join(blocks)


# --------------------------------------------------------------------------------------------------
# status: every host of the run in the document, the unreachable ones with their error
# --------------------------------------------------------------------------------------------------


def status_document(document: Mapping[str, Any], hosts: Sequence[str],
                    unreachable: Mapping[str, str]) -> dict[str, Any]:
    """The status deploy's document with every host in play: one that could not be reached is
    listed with ``reachable: false``, its error, and that as its verdict (pure)."""
    rows = dict(document.get("hosts") or {})
    for h in hosts:
        if h in unreachable:
            rows[h] = {"host": h, "reachable": False, "error": unreachable[h],
                       "drift": [], "healthy": False, "verdict": f"unreachable: {unreachable[h]}"}
        elif h in rows:
            rows[h] = {**rows[h], "reachable": True}
        else:
            rows[h] = {"host": h, "reachable": True, "error": "the status deploy gave no row",
                       "drift": [], "healthy": False, "verdict": "failed: no status row"}
    return {**document, "hosts": {h: rows[h] for h in hosts if h in rows}}


def status_exit(rc: int, document: Mapping[str, Any], fail_on_drift: bool) -> int:
    """pyinfra's exit code, 1 where a host is unreachable or gave no row, and 4 on drift with
    ``--fail-on-drift`` (pure)."""
    rows = document.get("hosts", {}).values()
    if rc == 0 and any(r.get("error") for r in rows):
        rc = 1
    if rc == 0 and fail_on_drift and any(r.get("drift") for r in rows):
        rc = 4
    return rc


def unreachable_table(document: Mapping[str, Any]) -> str:
    """The lines of the hosts that could not be reached (pyinfra's own table shows the others)."""
    rows = [r for r in document.get("hosts", {}).values() if r.get("reachable") is False]
    if not rows:
        return ""
    width = max(len(r["host"]) for r in rows)
    return "\n".join(f"{r['host'].ljust(width)}  {r['verdict']}" for r in rows)


def reachable_hosts(inventory: str, options: Any, hosts: Sequence[str]) -> dict[str, str]:
    """Connect each host once (pyinfra's connection, its options) and return ``{host: error}``
    of those that cannot be reached, so that the status run is given only the others."""
    with session(inventory, options) as s:
        return s.connect(list(hosts))
