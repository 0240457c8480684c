"""Facts as the plan takes them: one host's {fact name: value}, checked for shape at the edge.

``check_facts`` runs first in ``make_plan``: a fact of the wrong shape (hand-written, truncated,
from another tool) is refused with a ``FactsInputError`` naming the fact and the field, instead of
failing deep in a topic with a traceback or, worse, giving a plan built on nonsense. A fact that
is missing (None) is unknown, which is no shape error: the topics decide what unknown means.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from specfleet.core.plan.context import GPUS, SGLANG, TOPOLOGY
from specfleet.core.plan.model import PlanError


class FactsInputError(PlanError):
    """Facts the plan cannot read (a file, or a fact of the wrong shape), with what is wrong."""


# A key every value of these facts has: tells a fact's own value from pyinfra's {host: value}.
_VALUE_KEYS = {GPUS: "gpus", TOPOLOGY: "links", SGLANG: "features"}

FACTS_FIX = (
    "give the facts as pyinfra gathers them: pyinfra INVENTORY fact facts.gpu.Gpus "
    "facts.gpu.GpuTopology facts.sglang.SGLangInstall python=VENV/bin/python --json"
)


def one_host_facts(facts: dict[str, Any], host: str | None = None) -> dict[str, Any]:
    """``facts`` as {fact: value} for one host.

    Takes that shape, the one ``pyinfra INVENTORY fact NAME... --json`` prints,
    {fact: {host: value}}, or what ``specfleet probe`` prints (``facts.probe.Probe``: {host:
    {"facts": {fact: value}, "errors": ...}}); from the last two it picks ``host``, or the only
    host there is.
    """
    facts = _unwrap_probe(facts)
    per_host = {
        name: value
        for name, value in facts.items()
        if name.startswith("facts.")
        and isinstance(value, dict)
        and (name not in _VALUE_KEYS or _VALUE_KEYS[name] not in value)
        and all(v is None or isinstance(v, (dict, list)) for v in value.values())
    }
    if not per_host or (set(per_host) != {k for k in facts if k.startswith("facts.")}):
        return facts
    hosts = sorted({h for value in per_host.values() for h in value})
    if host is None:
        if len(hosts) != 1:
            raise FactsInputError(
                f"the facts file holds facts of {len(hosts)} hosts ({', '.join(hosts)}): "
                "choose one with --host"
            )
        host = hosts[0]
    if host not in hosts:
        raise FactsInputError(f"the facts file has no host {host!r} (it has: {', '.join(hosts)})")
    out = {k: v for k, v in facts.items() if k not in per_host}
    for name, value in per_host.items():
        if host in value:
            out[name] = value[host]
    return out


PROBE_FACT = "facts.probe.Probe"


def _unwrap_probe(facts: dict[str, Any]) -> dict[str, Any]:
    """The probe's one fact (named ``facts.probe.Probe (python=...)`` by pyinfra) turned into
    {fact: {host: value}}, the shape of several facts gathered at once; other input as it is."""
    probes = [k for k in facts if k.split(" ", 1)[0] == PROBE_FACT]
    if len(probes) != 1 or not isinstance(facts[probes[0]], dict):
        return facts
    out: dict[str, Any] = {k: v for k, v in facts.items() if k != probes[0]}
    for host, gathered in facts[probes[0]].items():
        inner = gathered.get("facts") if isinstance(gathered, dict) else None
        if not isinstance(inner, dict):
            raise FactsInputError(f"the probe's output for host {host!r} holds no facts",
                                  fix=FACTS_FIX)
        for name, value in inner.items():
            out.setdefault(name, {})[host] = value
    return out


# --------------------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Shape:
    """Checks of one host's facts; the first bad field raises."""

    def __init__(self, host: str | None):
        self.host = host

    def bad(self, where: str, value: Any, expected: str) -> FactsInputError:
        return FactsInputError(
            f"fact {where} is {_shown(value)} ({_kind(value)}), expected {expected}",
            host=self.host,
            fix=FACTS_FIX,
        )

    def mapping(self, where: str, value: Any, optional: bool = True) -> Mapping[str, Any] | None:
        if value is None and optional:
            return None
        if not isinstance(value, Mapping):
            raise self.bad(where, value, "an object" + (" or null" if optional else ""))
        return value

    def listing(self, where: str, value: Any) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            raise self.bad(where, value, "a list or null")
        return list(value)

    def text(self, where: str, value: Any) -> None:
        if value is not None and not isinstance(value, str):
            raise self.bad(where, value, "a string or null")

    def flag(self, where: str, value: Any) -> None:
        if value is not None and not isinstance(value, bool):
            raise self.bad(where, value, "true, false or null")

    def count(self, where: str, value: Any, what: str) -> None:
        """A whole, finite, non-negative number, or null."""
        if value is None:
            return
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and value >= 0 and float(value).is_integer()
        if not ok:
            raise self.bad(where, value, f"{what} (a whole number >= 0) or null")

    def strings(self, where: str, value: Any) -> None:
        for i, item in enumerate(self.listing(where, value)):
            if not isinstance(item, str):
                raise self.bad(f"{where}[{i}]", item, "a string")


def check_facts(facts: Any, host: str | None = None) -> None:
    """Raise ``FactsInputError`` where a fact the plan reads has the wrong shape.

    Checks only what the plan reads: ``facts.gpu.Gpus`` (its ``gpus`` list, each GPU's memory,
    compute capability and name), ``facts.gpu.GpuTopology`` and ``facts.sglang.SGLangInstall``.
    Other keys of the facts are left alone.
    """
    s = _Shape(host)
    if not isinstance(facts, Mapping):
        raise FactsInputError(
            f"the facts are {_kind(facts)}, expected an object of fact names", host=host,
            fix=FACTS_FIX,
        )  # fmt: skip
    for name, check_more in ((GPUS, _check_gpu_list), (TOPOLOGY, None),
                             (SGLANG, _check_features)):
        value = s.mapping(name, facts.get(name))
        if value is None:
            continue
        for key, kind in _FIELDS[name].items():
            getattr(s, kind)(f"{name}.{key}", value.get(key))
        if check_more is not None:
            check_more(s, value)
    topology = facts.get(TOPOLOGY)
    if isinstance(topology, Mapping) and not topology.get("error"):
        # A topology read without an error always has these (facts.gpu.GpuTopology): one left
        # out is a hand-written file, and planning on would take "not on NVLink" for it.
        missing = [key for key in ("gpus", "nvlink_all_pairs") if key not in topology]
        if missing:
            raise FactsInputError(
                f"fact field {', '.join(f'{TOPOLOGY}.{k}' for k in missing)} is missing (not "
                "false, not null: left out): the "
                "plan would have to guess whether the GPUs are on NVLink", host=host,
                fix=FACTS_FIX + " (or preview a machine type with specfleet plan --profile)")


# The fields the plan reads of each fact, each with the ``_Shape`` check of its kind; the GPU
# list and SGLang's features are checked item by item below.
_FIELDS: dict[str, dict[str, str]] = {
    GPUS: {"error": "text"},
    TOPOLOGY: {"error": "text", "nvlink_all_pairs": "flag", "gpus": "listing", "links": "mapping"},
    SGLANG: {"version": "text", "location": "text", "speculative_algorithms": "strings",
             "attention_backends": "strings"},
}


def _check_gpu_list(s: _Shape, value: Mapping[str, Any]) -> None:
    for i, gpu in enumerate(s.listing(f"{GPUS}.gpus", value.get("gpus"))):
        where = f"{GPUS}.gpus[{i}]"
        gpu = s.mapping(where, gpu, optional=False)
        s.count(f"{where}.memory_mib", gpu.get("memory_mib"), "the GPU's memory in MiB")
        s.count(f"{where}.index", gpu.get("index"), "the GPU's index")
        cap = gpu.get("compute_capability")
        if cap is not None and (
            isinstance(cap, bool)
            or not isinstance(cap, (str, int, float))
            or (isinstance(cap, float) and not math.isfinite(cap))
        ):
            raise s.bad(f"{where}.compute_capability", cap, "a capability such as '9.0', or null")
        sm = gpu.get("sm")
        if sm is not None and (isinstance(sm, bool) or not isinstance(sm, (str, int))):
            raise s.bad(f"{where}.sm", sm, "an SM number such as 90, or null")
        for key in ("name", "driver", "pci_bus_id"):
            s.text(f"{where}.{key}", gpu.get(key))


_WORKERS = (None, "v1", "v2")


def _check_features(s: _Shape, value: Mapping[str, Any]) -> None:
    features = s.mapping(f"{SGLANG}.features", value.get("features"))
    for key, feature in (features or {}).items():
        where = f"{SGLANG}.features.{key}"
        if key == "dflash":
            if feature not in _WORKERS:
                raise s.bad(where, feature, "the DFLASH worker: 'v1', 'v2' or null")
        else:
            s.flag(where, feature)
