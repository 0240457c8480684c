"""The launch plan: one host's facts and the settings in, SGLang's argv and environment out.

``make_plan`` is a pure function (no I/O). It runs one module per topic, in order; each adds its
flags and environment and records every choice as a ``Reason`` (topic, choice, why), so a person
can read what would run on a box and why:

- ``gpus``: the GPUs and the arch rule (``specfleet.core.tables.gpu_archs``);
- ``sglang``: the install, or the version table's prediction (``tables.sglang_versions``);
- ``tp``, ``nodes``, ``memory``: tensor parallel (across the hosts of a serving group: see
  ``group``), whether the weights fit, the memory fraction;
- ``attention``, ``dflash``: the target and draft backends, block size, draft window, worker;
- ``allreduce``: custom all-reduce off without NVLink;
- ``launch``: model paths, the model's parsers (``tables.models``), listen address, argv;
- ``overrides``: ``settings.plan.extra_args`` / ``extra_env``, last.

CLI, one host, no connection to it: ``specfleet plan --facts FACTS.json --json``
(``python -m specfleet.plan``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specfleet.core.plan.allreduce import plan_all_reduce
from specfleet.core.plan.attention import plan_attention
from specfleet.core.plan.context import GIB, GPUS, MIB, SGLANG, TOPOLOGY, GroupRole, PlanContext
from specfleet.core.plan.ddtree import plan_ddtree_memory
from specfleet.core.plan.dflash import block_size, plan_ddtree, plan_dflash, plan_refused_requests
from specfleet.core.plan.gpus import plan_gpus
from specfleet.core.plan.inputs import FactsInputError, check_facts, one_host_facts
from specfleet.core.plan.launch import (
    launch_argv,
    plan_metrics,
    plan_model_args,
    plan_model_paths,
)
from specfleet.core.plan.memory import plan_gpu_memory, plan_mem_fraction
from specfleet.core.plan.model import Plan, PlanBuilder, PlanError, Reason, ReasonKind
from specfleet.core.plan.nodes import plan_nodes
from specfleet.core.plan.overrides import apply_overrides
from specfleet.core.plan.sglang import plan_sglang
from specfleet.core.plan.tp import plan_tp
from specfleet.core.settings import Settings
from specfleet.core.tables.models import DEFAULT_BLOCK_SIZE, KIMI_K26_WEIGHTS_BYTES

__all__ = [
    "DEFAULT_BLOCK_SIZE", "GIB", "GPUS", "KIMI_K26_WEIGHTS_BYTES", "MIB", "SGLANG", "TOPOLOGY",
    "FactsInputError", "GroupRole", "Plan", "PlanError", "Reason", "ReasonKind", "block_size",
    "check_facts", "make_plan", "one_host_facts",
]  # fmt: skip

# The topics in the order they decide; later ones read what earlier ones set on the context.
TOPICS = (
    plan_gpus,
    plan_sglang,
    plan_tp,
    plan_nodes,
    plan_gpu_memory,
    plan_model_paths,
    plan_ddtree,
    plan_attention,
    plan_dflash,
    plan_mem_fraction,
    plan_ddtree_memory,
    plan_all_reduce,
    plan_metrics,
    plan_model_args,
    plan_refused_requests,
)


def make_plan(
    facts: Mapping[str, Any],
    settings: Settings,
    drafter_config: Mapping[str, Any] | None = None,
    predicted: bool = False,
    *,
    weights_bytes: int | None = None,
    host: str | None = None,
    group: GroupRole | None = None,
) -> Plan:
    """The SGLang launch plan for one host.

    ``facts`` maps fact names (``facts.gpu.Gpus``, ``facts.gpu.GpuTopology``,
    ``facts.sglang.SGLangInstall``, ...) to their values; a missing fact is unknown.
    ``drafter_config`` is the drafter's config.json (its block size); without it the plan assumes
    Kimi-K2.6-DFlash's. ``predicted`` takes SGLang's features from the version table for
    ``settings.sglang.version`` (a fresh host, before install). ``weights_bytes`` is the size of
    target + drafter weights; by default the models table's for a known target, else unchecked.
    ``group``: this host's place in a serving group (``group.make_group_plan`` works it out and
    calls this for each member). Raises ``PlanError`` when no working plan exists,
    ``FactsInputError`` (a ``PlanError``) when a fact has the wrong shape (``inputs.check_facts``).
    """
    check_facts(facts, host)
    if weights_bytes is not None and (
        isinstance(weights_bytes, bool) or not isinstance(weights_bytes, int) or weights_bytes < 0
    ):
        raise FactsInputError(
            f"weights_bytes is {weights_bytes!r}, expected a whole number of bytes >= 0",
            host=host,
            fix="give the size of target + drafter weights in bytes, or leave it out",
        )
    c = PlanContext(
        facts=facts,
        settings=settings,
        b=PlanBuilder(host=host),
        drafter_config=drafter_config,
        predict=predicted,
        weights_bytes=weights_bytes,
        group=group,
    )
    for topic in TOPICS:
        topic(c)
    flags = apply_overrides(c)
    return Plan(
        argv=launch_argv(c, flags),
        env=dict(c.b.env),
        reasons=list(c.b.reasons),
        predicted=c.predicted,
    )
