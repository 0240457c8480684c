"""Topic nodes: a member of a serving group joins the others (SGLang's own multi-node launch).

Every member runs the same command but for ``--node-rank``; rank 0 holds the rendezvous
(``--dist-init-addr``) and serves the API. NCCL and Gloo are pinned to the interface the peers
reach this member on: left to themselves they pick the first interface that is up, which on a GPU
host is often a docker bridge or a management port.
"""

from __future__ import annotations

from specfleet.core.plan.context import PlanContext

# The flags that would split the model another way than tensor parallel over every GPU of every
# member, each with what SGLang says about it (with DFLASH, or across nodes) and the fix.
_OTHER_SPLITS = (
    (("--pp-size", "--pipeline-parallel-size"), "runs DFLASH with pp_size == 1 only",
     "remove {flag} from plan.extra_args: the group runs tensor parallel over all {gpus} GPUs"),
    (("--dp-size", "--data-parallel-size"), "does not run data-parallel replicas across nodes",
     "remove {flag}, or serve the replicas as separate groups behind a load balancer"),
)  # fmt: skip


def plan_nodes(c: PlanContext) -> None:
    g = c.group
    if g is None:
        return
    b, ov = c.b, c.overrides
    source = c.row.multinode_source if c.row is not None else "SGLang's server_args"
    for flags, rule, fix in _OTHER_SPLITS:
        for flag in flags:
            value = ov.extra_args.get(flag)
            if value not in (None, False, 1, "1"):
                raise b.error(
                    f"plan.extra_args sets {flag} {value} for serving group {g.name}: SGLang "
                    f"{c.version or '?'} {rule} ({source})",
                    fix.format(flag=flag, gpus=g.nnodes * g.gpus_per_node),
                )
    b.flag("--nnodes", g.nnodes)
    b.flag("--node-rank", g.node_rank)
    b.flag("--dist-init-addr", g.rendezvous)
    b.flag("--dist-timeout", g.dist_timeout_s)
    b.why(
        "nodes",
        f"rank {g.node_rank} of {g.nnodes} ({', '.join(g.members)})",
        f"serving group {g.name}; rank 0 ({g.members[0]}) holds the rendezvous {g.rendezvous} "
        f"and serves the API",
    )
    b.env["NCCL_SOCKET_IFNAME"] = g.interface
    b.env["GLOO_SOCKET_IFNAME"] = g.interface
    b.why("node-interface", g.interface, g.interface_why)
    if g.rdma:
        b.env["NCCL_IB_HCA"] = ",".join(g.rdma)
        b.why(
            "node-transport",
            "RDMA " + ", ".join(g.rdma),
            "active InfiniBand/RoCE ports (facts.net.RdmaPorts): NCCL uses them between hosts",
        )
    else:
        b.why("node-transport", "TCP sockets", f"no active RDMA port: NCCL goes over TCP on "
              f"{g.interface}; inter-host all-reduce will bound throughput", "info")  # fmt: skip
