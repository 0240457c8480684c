"""The state one plan is made from and adds to, topic by topic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specfleet.core.plan.model import PlanBuilder, ReasonKind
from specfleet.core.settings import Settings
from specfleet.core.tables.gpu_archs import ArchRule
from specfleet.core.tables.sglang_versions import VersionRow

# The facts a plan reads, by pyinfra fact name.
GPUS = "facts.gpu.Gpus"
TOPOLOGY = "facts.gpu.GpuTopology"
SGLANG = "facts.sglang.SGLangInstall"

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class GroupRole:
    """One member's place in a serving group, as the group planner worked it out."""

    name: str
    nnodes: int
    node_rank: int
    members: tuple[str, ...]
    # rank 0's address and rendezvous port: --dist-init-addr
    rendezvous: str
    gpus_per_node: int
    # GPU memory the whole group shards the weights over (smallest GPU x every GPU).
    group_gpu_bytes: int
    # The NIC this member's NCCL and Gloo use, and why.
    interface: str
    interface_why: str
    # Active RDMA devices on this member ("mlx5_0:1"); empty: NCCL goes over TCP sockets.
    rdma: tuple[str, ...]
    dist_timeout_s: int


@dataclass
class PlanContext:
    """Inputs (facts, settings) and what earlier topics decided."""

    facts: Mapping[str, Any]
    settings: Settings
    b: PlanBuilder
    drafter_config: Mapping[str, Any] | None = None
    predict: bool = False
    weights_bytes: int | None = None
    group: GroupRole | None = None
    # gpus
    gpus: list[Mapping[str, Any]] = field(default_factory=list)
    sm: str = ""
    names: list[str] = field(default_factory=list)
    rule: ArchRule | None = None
    # sglang
    install: dict[str, Any] = field(default_factory=dict)
    row: VersionRow | None = None
    predicted: bool = False
    features: Mapping[str, Any] = field(default_factory=dict)
    version: str = ""
    registry: set[str] = field(default_factory=set)
    src: ReasonKind = "rule"
    # tensor parallel and memory
    tp: int = 0
    total_bytes: int = 0
    size: int | None = None
    # attention and dflash
    attention: str = ""
    block: int = 0
    ddtree: Any = None  # ddtree.DDTreeChoice where DDTree is on
    # memory: the fraction in force (the plan's or SGLang's own)
    mem_fraction: float | None = None

    @property
    def overrides(self):
        return self.settings.plan

    @property
    def pr20547(self) -> bool:
        return bool(self.features.get("dflash_pr20547"))
