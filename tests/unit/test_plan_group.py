"""specfleet.core.plan.group: a serving group's plans over arch x SGLang release x node count,
and every refusal (weights that do not fit, members that disagree, peers that cannot reach).

GPU, topology and SGLang facts are the real captures test_plan.py uses; the network facts are
written as facts.net.NetworkInterfaces returns them (its parser is tested on a real capture in
test_facts_net.py, and on a real fleet host in tests/fleet/test_facts_fleet.py).
"""

from __future__ import annotations

import pytest

from specfleet.core.errors import SpecfleetError
from specfleet.core.plan import KIMI_K26_WEIGHTS_BYTES, PlanError, make_plan
from specfleet.core.plan.group import NET, RDMA, GroupMember, GroupPlanError, make_group_plan
from specfleet.core.settings import settings_from_dict
from specfleet.core.tables.sglang_versions import version_row
from tests.unit.test_plan import (
    ARCH,
    BASE_ENV,
    BUILD,
    DRAFTER_CONFIG,
    expected_argv,
    host_facts,
)

GIB = 1024**3


def interfaces(address: str, name: str = "eth0", speed: int | None = 100000) -> list[dict]:
    return [
        {"name": "lo", "state": "UNKNOWN", "loopback": True, "mtu": 65536, "speed_mbps": None,
         "addresses": ["127.0.0.1", "::1"]},
        {"name": "docker0", "state": "UP", "loopback": False, "mtu": 1500, "speed_mbps": None,
         "addresses": ["172.17.0.1"]},
        {"name": name, "state": "UP", "loopback": False, "mtu": 9000, "speed_mbps": speed,
         "addresses": [address, "fe80::1"]},
    ]  # fmt: skip


def group_data(n: int, **extra) -> dict:
    return {"group": {"name": "kimi-pair", "members": [f"g{i}" for i in range(n)], **extra}}


def members(
    profile: str,
    n: int,
    build: str = "0.5.23",
    topo: str | None = None,
    data: dict | None = None,
    per_host: dict | None = None,
    facts_patch: dict | None = None,
) -> list[GroupMember]:
    out = []
    for i in range(n):
        host = f"g{i}"
        address = f"10.0.0.{11 + i}"
        facts = {**host_facts(profile, topo, sglang=build), NET: interfaces(address), RDMA: []}
        facts.update((facts_patch or {}).get(host, {}))
        layer = {**(data or group_data(n)), **(per_host or {}).get(host, {})}
        out.append(GroupMember(host, facts, settings_from_dict(layer, host=host), address))
    return out


# (profile, nodes, topology capture): Kimi K2.6 (561 GiB) with room to spare on each.
GROUPS = [
    ("h100x8", 2, "b200x8", "SM90", True),
    ("h100x8", 3, "b200x8", "SM90", True),
    ("h200x2", 4, None, "SM90", True),
    ("b200x8", 2, None, "SM100", True),
    ("rtx6000x8", 2, None, "SM120", False),
]


@pytest.mark.local
@pytest.mark.parametrize("build", list(BUILD))
@pytest.mark.parametrize("profile,n,topo,arch,nvlink", GROUPS, ids=lambda v: str(v))
def test_group_matrix(profile, n, topo, arch, nvlink, build):
    group = make_group_plan(members(profile, n, build, topo), DRAFTER_CONFIG)
    per_node = len(host_facts(profile, topo)["facts.gpu.Gpus"]["gpus"])
    tp = n * per_node
    assert list(group.plans) == [f"g{i}" for i in range(n)]
    for rank, (host, plan) in enumerate(group.plans.items()):
        node_args = [
            "--nnodes", str(n), "--node-rank", str(rank),
            "--dist-init-addr", "10.0.0.11:20000", "--dist-timeout", "600",
        ]  # fmt: skip
        single = expected_argv(arch, build, tp, pcie_many=(not nvlink and per_node > 2))
        # The node flags come right after the launcher; the rest is the single-host plan at the
        # group's tensor-parallel size.
        launcher = single[:3]
        assert plan.argv == [*launcher, *node_args, *single[3:]], host
        assert plan.env == {
            **BASE_ENV,
            **BUILD[build]["env"],
            "NCCL_SOCKET_IFNAME": "eth0",
            "GLOO_SOCKET_IFNAME": "eth0",
        }
        assert plan.reason("tensor-parallel").choice == str(tp)
        assert plan.reason("node-transport").choice == "TCP sockets"
        assert f"10.0.0.{11 + rank}" in plan.reason("node-interface").why
    fit = group.reasons[0]
    assert fit.topic == "group-memory"
    shard = KIMI_K26_WEIGHTS_BYTES / GIB / tp
    assert f"{shard:.1f} GiB per GPU" in fit.why
    assert group.reasons[-1].topic == "group-agreement"
    assert arch in ARCH


@pytest.mark.local
def test_two_h200x2_hosts_refused_with_numbers_and_the_count_that_fits():
    # 561 GiB over 4 GPUs of 140.4 GiB: held, with no KV pool after SGLang's fraction.
    with pytest.raises(PlanError) as err:
        make_group_plan(members("h200x2", 2), DRAFTER_CONFIG)
    assert err.value.problem.startswith("serving group kimi-pair (2 hosts, TP 4): ")
    assert "the weights need 140.2 GiB per GPU" in err.value.problem
    assert "no KV pool at all, below plan.min_request_tokens 32,768" in err.value.problem
    # 600 GiB are not held at all: the group says so, with the count that holds them.
    with pytest.raises(GroupPlanError) as err:
        make_group_plan(members("h200x2", 2), DRAFTER_CONFIG, weights_bytes=600 * GIB)
    e = err.value
    assert e.host == "g0"
    assert ("2 hosts x 2 GPUs of 140 GiB cannot hold 600 GiB of weights (150.0 GiB per GPU); "
            "3 such hosts would hold them") in e.problem
    # And three of them do, the KV pool then in tokens on each member's plan as on one host.
    group = make_group_plan(members("h200x2", 3), DRAFTER_CONFIG)
    assert "93.5 GiB per GPU, 46.9 GiB per GPU before SGLang's memory fraction" in \
        group.reasons[0].why
    plan = group.plans["g0"]
    assert "tokens of KV cache by SGLang 0.5.23's accounting" in plan.reason("kv-cache-room").why
    assert plan.reason("request-tokens") is not None


@pytest.mark.local
def test_the_kv_floor_of_a_group_is_plan_min_request_tokens_as_on_one_host():
    data = {**group_data(2), "plan": {"min_request_tokens": 2_000_000}}
    with pytest.raises(PlanError) as err:
        make_group_plan(members("h100x8", 2, topo="b200x8", data=data), DRAFTER_CONFIG)
    assert err.value.problem.startswith("serving group kimi-pair (2 hosts, TP 16): ")
    assert "below plan.min_request_tokens 2,000,000" in err.value.problem


@pytest.mark.local
def test_rdma_ports_become_nccl_ib_hca():
    rdma = [
        {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand",
         "rate_gbps": 400.0, "netdevs": ["ibp12s0"]},
        {"device": "mlx5_1", "port": 1, "state": "DOWN", "link_layer": "InfiniBand",
         "rate_gbps": None, "netdevs": []},
    ]  # fmt: skip
    patch = {"g0": {RDMA: rdma}, "g1": {RDMA: rdma}}
    group = make_group_plan(members("h100x8", 2, topo="b200x8", facts_patch=patch))
    for plan in group.plans.values():
        assert plan.env["NCCL_IB_HCA"] == "mlx5_0:1"
        assert plan.reason("node-transport").choice == "RDMA mlx5_0:1"


@pytest.mark.local
def test_interface_names_may_differ_between_members():
    patch = {"g1": {NET: interfaces("10.0.0.12", name="enp1s0f0")}}
    group = make_group_plan(members("h100x8", 2, topo="b200x8", facts_patch=patch))
    assert group.plans["g0"].env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert group.plans["g1"].env["GLOO_SOCKET_IFNAME"] == "enp1s0f0"


@pytest.mark.local
def test_address_on_no_interface_is_refused():
    patch = {"g1": {NET: interfaces("192.168.9.9")}}
    with pytest.raises(GroupPlanError) as err:
        make_group_plan(members("h100x8", 2, topo="b200x8", facts_patch=patch))
    assert err.value.host == "g1"
    assert "no interface of g1 holds 10.0.0.12" in err.value.problem
    assert "group.addresses.g1" in err.value.fix


@pytest.mark.local
def test_group_addresses_setting_wins_over_inventory_address():
    data = group_data(2, addresses={"g1": "192.168.9.9"})
    patch = {"g1": {NET: interfaces("192.168.9.9", name="ib0")}}
    group = make_group_plan(members("h100x8", 2, topo="b200x8", data=data, facts_patch=patch))
    assert group.plans["g1"].env["NCCL_SOCKET_IFNAME"] == "ib0"


@pytest.mark.local
def test_group_interface_must_exist_on_every_member():
    data = group_data(2, interface="eth9")
    with pytest.raises(GroupPlanError, match="'eth9' is not an interface of g0"):
        make_group_plan(members("h100x8", 2, topo="b200x8", data=data))


@pytest.mark.local
def test_mixed_gpu_counts_refused():
    patch = {"g1": host_facts("h200x2")}
    with pytest.raises(GroupPlanError) as err:
        make_group_plan(members("h100x8", 2, topo="b200x8", facts_patch=patch))
    assert err.value.host == "g1"
    assert "g0: 8, g1: 2" in err.value.problem


@pytest.mark.local
def test_member_with_different_sglang_refused_before_anything():
    patch = {"g1": host_facts("h100x8", "b200x8", sglang="0.5.14")}
    with pytest.raises(GroupPlanError) as err:
        make_group_plan(members("h100x8", 2, topo="b200x8", facts_patch=patch))
    assert err.value.host == "g1"
    assert "runs SGLang sglang 0.5.14, rank 0 (g0) runs sglang 0.5.23" in err.value.problem


@pytest.mark.local
def test_member_with_different_plan_is_refused_naming_what_differs():
    per_host = {"g1": {"plan": {"mem_fraction_static": 0.8}}}
    with pytest.raises(GroupPlanError) as err:
        make_group_plan(members("h100x8", 2, topo="b200x8", per_host=per_host))
    assert err.value.host == "g1"
    assert "--mem-fraction-static 0.8 (rank 0: (absent))" in err.value.problem


@pytest.mark.local
def test_members_must_agree_on_the_group():
    per_host = {"g1": {"group": {"name": "kimi-pair", "members": ["g0", "g1"],
                                 "rendezvous_port": 21000}}}  # fmt: skip
    with pytest.raises(GroupPlanError) as err:
        make_group_plan(members("h100x8", 2, topo="b200x8", per_host=per_host))
    assert "group.rendezvous_port=21000 (not 20000)" in err.value.problem


@pytest.mark.local
def test_missing_member_refused():
    with pytest.raises(GroupPlanError, match="no facts for member"):
        make_group_plan(members("h100x8", 2, topo="b200x8")[:1])


@pytest.mark.local
@pytest.mark.parametrize("flag", ["--pp-size", "--pipeline-parallel-size"])
@pytest.mark.parametrize("build", ["0.5.11", "0.5.14", "0.5.23"])
def test_pipeline_parallel_refused_citing_sglang(flag, build):
    data = {**group_data(2), "plan": {"extra_args": {flag: 2}}}
    with pytest.raises(PlanError) as err:
        make_group_plan(members("h100x8", 2, build=build, topo="b200x8", data=data))
    source = version_row(build).multinode_source
    assert source in err.value.problem
    assert "pp_size == 1" in err.value.problem


@pytest.mark.local
def test_data_parallel_across_nodes_refused():
    data = {**group_data(2), "plan": {"extra_args": {"--dp-size": 2}}}
    with pytest.raises(PlanError, match="data-parallel replicas across nodes"):
        make_group_plan(members("h100x8", 2, topo="b200x8", data=data))


@pytest.mark.local
def test_single_host_plan_unchanged_by_groups():
    facts = host_facts("h200x2", "h200x2")
    plan = make_plan(facts, settings_from_dict({}), DRAFTER_CONFIG, weights_bytes=1)
    assert "--nnodes" not in plan.argv
    assert "NCCL_SOCKET_IFNAME" not in plan.env


@pytest.mark.local
def test_group_plan_errors_are_specfleet_errors_and_render():
    with pytest.raises(SpecfleetError) as err:
        make_group_plan(members("h200x2", 2), DRAFTER_CONFIG, weights_bytes=600 * GIB)
    assert err.value.render().startswith("[g0] serving group kimi-pair:")


@pytest.mark.parametrize(
    "group,problem",
    [
        ({"name": "x", "members": ["g0"]}, "two or more hosts"),
        ({"name": "x", "members": ["g0", "g0"]}, "not listed before"),
        ({"name": "bad name", "members": ["g0", "g1"]}, "a plain name"),
        ({"name": "x", "members": ["g1", "g2"]}, "is not one of its members"),
        ({"name": "x", "members": ["g0", "g1"], "rendezvous_port": 30000}, "other than"),
        ({"name": "x", "members": ["g0", "g1"], "interface": "eth0 bad"}, "interface's name"),
        ({"name": "x", "members": ["g0", "g1"], "addresses": {"g7": "10.0.0.1"}}, "of a member"),
        ({"name": "x", "members": ["g0", "g1"], "min_kv_gib_per_gpu": 8}, "plan.min_request_tokens"),
        ({"name": "x", "members": ["g0", "g1"], "dist_timeout_s": 0}, ">= 1"),
    ],
)
def test_group_settings_validated(group, problem):
    with pytest.raises(SpecfleetError) as err:
        settings_from_dict({"group": group}, host="g0")
    assert problem in err.value.render()


def test_tp_size_and_group_conflict():
    with pytest.raises(SpecfleetError, match="'plan.tp_size' and 'group' are both set"):
        settings_from_dict({**group_data(2), "plan": {"tp_size": 8}}, host="g0")


@pytest.mark.local
def test_render_and_json_show_every_rank():
    group = make_group_plan(members("h100x8", 2, topo="b200x8"), DRAFTER_CONFIG)
    text = group.render()
    assert "rank 0: g0" in text and "rank 1: g1" in text
    assert "--node-rank 1" in text
    doc = group.to_dict()
    assert list(doc["members"]) == ["g0", "g1"]
