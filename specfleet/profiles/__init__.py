"""Machine profiles for ``specfleet plan --profile NAME``: the GPU facts of a machine type, as
specfleet's own facts (``facts.gpu.Gpus``, ``facts.gpu.GpuTopology``) make them of real
``nvidia-smi`` captures (``tests/fixtures/nvidia/``). One JSON file per profile, written by
``python -m tests.unit.test_plan_profiles --write`` and checked against the captures by that test:
never written by hand (a hand-written facts file is how a plan once went PCIe-only unsaid).

Each file: ``{"profile", "machine", "source", "facts": {fact name: value}}``; ``source`` says
which capture each fact comes from, and what, if anything, was derived rather than captured.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from specfleet.core.errors import SpecfleetError


def names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir()
                  if p.name.endswith(".json"))


def load(name: str) -> dict[str, Any]:
    """The profile ``name`` ({profile, machine, source, facts}), or an error listing them."""
    if name not in names():
        raise SpecfleetError(f"there is no machine profile {name!r}",
                             fix=f"name one of: {', '.join(names())} (specfleet plan "
                             "--list-profiles), or plan a host's own facts with --facts")
    return json.loads(resources.files(__name__).joinpath(f"{name}.json").read_text())


def listing() -> str:
    return "\n".join(f"{n:<12} {load(n)['machine']}" for n in names())
