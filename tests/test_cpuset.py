"""The CPUSet allocator (properties over random topologies) and the plugin's share pool."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nriplugin.features import Context, Intent, InvalidInput
from nriplugin.features.cpuset import RESOURCE_STATUS, assign, desired
from nriplugin.intent.cpus import CPUAllocator, NoCapacity
from nriplugin.kernel.cpulist import format_cpulist, parse_cpulist
from nriplugin.kernel.probe import Topology, topology
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.nri import api_pb2 as api
from nriplugin.nri.runtime import RuntimeCaps
from nriplugin.policy.model import Policy
from nriplugin.policy.qos import QoSClass
from testkit.kernel_tree import sys_tree
from testkit.runtime_peer import make_container, make_lsr, make_pod
from tests.test_features import caps


def topo(tmp: Path, cores: int, smt: int, numa: int):  # type: ignore[no-untyped-def]
    return topology(sys_tree(tmp, cores=cores, smt=smt, numa_nodes=numa))


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "release", "claim"]), st.integers(0, 7), st.integers(1, 6)), max_size=25
)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(2, 1, 1), (4, 2, 1), (8, 2, 2), (6, 1, 2), (4, 4, 2)]), ops)
def test_allocator_invariants(
    tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, int, int], steps: list[tuple[str, int, int]]
) -> None:
    cores, smt, numa = shape
    t = topo(tmp_path_factory.mktemp("sys"), cores, smt, numa)
    a = CPUAllocator(t)
    for op, owner, n in steps:
        key = f"c{owner}"
        try:
            if op == "alloc":
                a.allocate(key, n)
            elif op == "release":
                a.release(key)
            else:
                a.claim(key, set(range(n)))
        except NoCapacity:
            pass
        sets = list(a.exclusive.values())
        taken = set().union(*sets) if sets else set()
        assert sum(len(s) for s in sets) == len(taken)  # no CPU handed out twice
        pool = a.share_pool()
        assert pool  # sharers always have somewhere to run
        assert set(pool) | taken == set(t.online)  # the pools cover the online CPUs


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(4, 2, 1), (8, 2, 2), (4, 4, 2)]), st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_allocations_keep_siblings_together_and_stay_on_one_node(
    tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, int, int], asks: list[int]
) -> None:
    cores, smt, numa = shape
    t = topo(tmp_path_factory.mktemp("sys"), cores, smt, numa)
    a = CPUAllocator(t)
    for i, n in enumerate(asks):
        try:
            got = a.allocate(f"o{i}", n)
        except NoCapacity:
            continue
        assert len(got) >= n and len(got) % smt == 0
        for c in got:
            assert set(t.siblings[c]) <= got  # SMT siblings together
        nodes = {t.numa[c] for c in got}
        per_node = cores // numa
        if (len(got) // smt) <= per_node:
            assert len(nodes) == 1  # fits one node: placed on one node
    assert a.share_pool()


def test_claims_are_validated(tmp_path: Path) -> None:
    a = CPUAllocator(topo(tmp_path, 4, 2, 1))
    a.claim("x", {0, 4})
    with pytest.raises(NoCapacity, match="already exclusive"):
        a.claim("y", {4})
    with pytest.raises(NoCapacity, match="not all online"):
        a.claim("z", {99})
    assert a.claim("x", {1}) == {0, 4}  # idempotent: the first decision stands


@pytest.mark.parametrize("nri", [(0, 12, 5), (0, 6, 1)])
def test_plugin_pins_lsr_and_moves_sharers(tmp_path: Path, nri: tuple[int, int, int]) -> None:
    """When the pinned container goes, the sharers get the grown pool: pushed with
    UpdateContainers where the runtime's NRI makes that safe, else only in the desired state
    (the reconciler writes it: an old NRI can deadlock on a plugin's UpdateContainers)."""

    async def main() -> None:
        t = topo(tmp_path, 4, 2, 1)
        c = caps(**{"cpuset.cpus": True})
        c.topology = t
        pushed: list[list[api.ContainerUpdate]] = []

        async def push(updates: list[api.ContainerUpdate]) -> None:
            pushed.append(updates)

        invalid: list[str] = []
        p = QoSPlugin(Node.create(caps=c, on_invalid=invalid.append), push=push)
        p.runtime_caps(RuntimeCaps(nri=nri, source="runtime"))
        ls = make_pod(1, "LS")
        ls_c = make_container(1, ls)
        assert p.create_container(ls, ls_c) is None  # nothing exclusive yet: all CPUs, no adjustment
        lsr, lsr_c = make_lsr(2, 200000)
        out = p.create_container(lsr, lsr_c)
        assert isinstance(out, tuple)
        adj, updates = out
        pinned = set(parse_cpulist(adj.linux.resources.cpu.cpus))
        assert len(pinned) == 2 and set(t.siblings[min(pinned)]) == pinned
        assert [u.container_id for u in updates] == [ls_c.id]
        assert set(parse_cpulist(updates[0].linux.resources.cpu.cpus)) == set(t.online) - pinned
        sched = make_pod(3, "LSE")
        sched.annotations["scheduling.koordinator.sh/resource-status"] = json.dumps({"cpuset": "3,7"})
        sched_c = make_container(3, sched)
        out = p.create_container(sched, sched_c)
        assert isinstance(out, tuple) and out[0].linux.resources.cpu.cpus == "3,7"
        hostile = make_pod(4, "LSE")
        hostile.annotations["scheduling.koordinator.sh/resource-status"] = json.dumps({"cpuset": "0-9999"})
        p.create_container(hostile, make_container(4, hostile))
        assert invalid == ["cpuset"]
        p.remove_container(lsr, lsr_c)
        await asyncio.sleep(0.01)
        grown = set(t.online) - {3, 7}
        target = p.desired.intent(ls_c.id)
        assert target is not None and set(parse_cpulist(str(target.values["cpuset.cpus"]))) == grown
        if nri >= (0, 12, 1):
            assert len(pushed) == 1 and ls_c.id in {u.container_id for u in pushed[0]}  # and the hostile pod's
            assert all(set(parse_cpulist(u.linux.resources.cpu.cpus)) == grown for u in pushed[0])
        else:
            assert pushed == []
        # The last exclusive set gone: all CPUs again, a value the sharers' desired state keeps
        # (the runtime's default no longer holds for them; the reconciler writes it back).
        p.remove_container(sched, sched_c)
        target = p.desired.intent(ls_c.id)
        assert target is not None and set(parse_cpulist(str(target.values["cpuset.cpus"]))) == set(t.online)

    asyncio.run(main())


def test_a_container_that_cannot_be_pinned_shares_never_overlaps(tmp_path: Path) -> None:
    """Two cores, three LSR pods of one CPU each: the first is pinned, the others run in the
    share pool (not the runtime's all-CPU default, which would overlap the pinned core), and
    the shortfall is reported as a capacity shortfall, not as a pod's bad annotation."""
    t = topo(tmp_path, 2, 1, 1)
    c = caps(**{"cpuset.cpus": True})
    c.topology = t
    invalid: list[str] = []
    p = QoSPlugin(Node.create(caps=c, on_invalid=invalid.append))
    got = []
    for i in range(3):
        pod, ctr = make_lsr(i, 100000)
        out = p.create_container(pod, ctr)
        adj = out[0] if isinstance(out, tuple) else out
        assert adj is not None
        got.append(set(parse_cpulist(adj.linux.resources.cpu.cpus)))
    assert len(got[0]) == 1
    assert got[1] == got[2] == set(t.online) - got[0]
    assert invalid == ["cpuset_capacity", "cpuset_capacity"]
    why = p.desired.intent(make_container(1, make_pod(1, "LSR")).id)
    assert why is not None and "whole core" in why.files[("cpuset.cpus", "")].why
    # the pinned one goes: its core returns to the pool, and a new LSR pod can have it
    p.remove_container(make_pod(0, "LSR"), make_container(0, make_pod(0, "LSR")))
    assert p.desired.intent(make_container(1, make_pod(1, "LSR")).id) is not None
    late = make_pod(3, "LSR")
    lc = make_container(3, late)
    lc.linux.resources.cpu.quota.value = 100000
    out = p.create_container(late, lc)
    assert isinstance(out, tuple) and len(parse_cpulist(out[0].linux.resources.cpu.cpus)) == 1


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 8), st.integers(0, 2))
def test_be_squeezed_by_cpuset_gets_whole_cores_of_the_share_pool(
    tmp_path_factory: pytest.TempPathFactory, n: int, lsr: int
) -> None:
    """cpuset suppression: whole cores (siblings together), never an exclusive CPU, at least
    one core, and a larger count gives a superset (a changing limit moves few CPUs)."""
    a = CPUAllocator(topo(tmp_path_factory.mktemp("sys"), 4, 2, 1))
    for i in range(lsr):
        a.allocate(f"lsr{i}", 2)
    got = a.shared_subset(n)
    pool = a.share_pool()
    assert got <= pool and got
    assert all(set(a.topo.siblings[c]) <= got for c in got)  # no core half BE's
    assert len(got) >= min(n, len(pool))
    assert a.shared_subset(n + 1) >= got


# allocation tables on model topologies (CPU c + t x cores is thread t of core c, as on x86) -----
# The reference is kubelet's static CPU manager with full-pcpus-only: whole physical cores, one
# NUMA node where the request fits; here the fitting node with the fewest free cores (best fit).


def test_allocation_table_with_smt_and_two_nodes(tmp_path: Path) -> None:
    a = CPUAllocator(topo(tmp_path, 4, 2, 2))  # node 0: cores 0, 1; node 1: cores 2, 3
    assert a.allocate("a", 2) == {0, 4} and a.generation == 1  # one core, node 0 (a tie: lower id)
    assert a.allocate("b", 3) == {2, 3, 6, 7} and a.generation == 2  # two cores: only node 1 has them
    assert a.allocate("a", 5) == {0, 4} and a.generation == 2  # decided once
    with pytest.raises(NoCapacity) as info:
        a.allocate("c", 1)
    assert str(info.value) == (
        "needs 1 whole core(s) for 1 CPU(s); 1 of 4 core(s) are free and one must stay in the share pool"
    )
    assert a.share_pool() == {1, 5} and a.taken() == {0, 4, 2, 3, 6, 7}
    a.notes["a"] = "pinned"
    assert a.release("a") and a.generation == 3 and "a" not in a.notes
    a.notes["c"] = "cannot pin: no room"
    assert not a.release("a") and not a.release("c") and a.generation == 3 and "c" not in a.notes
    assert a.claim("d", {0, 1, 4, 5}) == {0, 1, 4, 5} and a.generation == 4
    assert a.share_pool() == set(range(8))  # nothing left to share: sharers get all but reserved
    a.reserved = {5}
    assert a.share_pool() == {0, 1, 2, 3, 4, 6, 7}


def test_best_fit_node_and_spill_over_the_largest_nodes(tmp_path: Path) -> None:
    a = CPUAllocator(topo(tmp_path, 6, 1, 2))  # node 0: cpus 0-2, node 1: cpus 3-5
    a.claim("w", {3})
    assert a.allocate("z", 2) == {4, 5}  # node 1 has 2 free, node 0 3: the tighter fit
    b = CPUAllocator(topo(tmp_path / "b", 6, 1, 2))
    b.claim("y", {0})
    assert b.allocate("x", 4) == {1, 3, 4, 5}  # no node fits 4: the largest node first, then the next


def test_cores_without_smt_and_cpus_missing_from_the_numa_map() -> None:
    t = Topology(online=[0, 1, 2, 3], siblings={c: [c] for c in range(4)}, numa={0: 1, 1: 1})
    a = CPUAllocator(t)  # cpus 2 and 3 are on no listed node: node 0
    assert a.allocate("a", 2) == {2, 3}  # both nodes fit, the lower id wins the tie
    assert a.allocate("b", 1) == {0} and a.generation == 2


def test_claims_take_exactly_what_is_online(tmp_path: Path) -> None:
    a = CPUAllocator(topo(tmp_path, 2, 2, 1))
    assert a.claim("all", {0, 1, 2, 3}) == {0, 1, 2, 3} and a.generation == 1
    with pytest.raises(NoCapacity, match=r"^cpus  are not all online \(0-3\)$"):
        a.claim("none", set())
    with pytest.raises(NoCapacity, match=r"^cpus 1 are already exclusive to another container$"):
        a.claim("again", {1})
    a.reserved = {0}
    a.release("all")
    with pytest.raises(NoCapacity, match=r"^cpus 0 are already exclusive"):
        a.claim("reserved", {0, 1})


def test_shared_subsets_take_whole_cores_from_the_top(tmp_path: Path) -> None:
    a = CPUAllocator(topo(tmp_path, 4, 2, 1))
    assert a.shared_subset(1) == {3, 7} and a.shared_subset(2) == {3, 7}
    assert a.shared_subset(3) == {2, 3, 6, 7}
    assert a.shared_subset(0) == a.share_pool()  # nothing asked: the whole pool, never nothing
    a.allocate("x", 2)  # core 0 goes
    assert a.shared_subset(8) == {1, 2, 3, 5, 6, 7}


def lsr_ctx(
    tmp: Path,
    quota: int | None,
    period: int | None = None,
    qos: str = "LSR",
    smt: int = 2,
    has: bool = True,
    annotations: dict[str, str] | None = None,
) -> Context:
    """A container of class ``qos`` with a CPU quota, on a 4-core node (its own allocator)."""
    pod = make_pod(1, qos)
    pod.annotations.update(annotations or {})
    ctr = make_container(1, pod)
    if quota is not None:
        ctr.linux.resources.cpu.quota.value = quota
    if period is not None:
        ctr.linux.resources.cpu.period.value = period
    cpus = CPUAllocator(topo(tmp, 4, smt, 1))
    return Context(pod, ctr, QoSClass(qos), Policy(), caps(**{"cpuset.cpus": has}), cpus)


@pytest.mark.parametrize(
    ("quota", "period", "smt", "n"),
    [
        (200000, None, 2, 2),
        (150000, 50000, 2, 4),  # 3 CPUs -> 2 whole cores
        (100001, None, 1, 2),  # 1.00001 CPUs -> 2
        (1, None, 1, 1),
        (100000, 100000, 1, 1),
    ],
)
def test_assign_sizes_from_the_quota(tmp_path: Path, quota: int, period: int | None, smt: int, n: int) -> None:
    ctx = lsr_ctx(tmp_path, quota, period, smt=smt)
    assert ctx.cpus is not None and ctx.container is not None
    assert assign(ctx) is None
    cpus = ctx.cpus.exclusive[ctx.container.id]
    assert len(cpus) == n
    cpu_count = -(-quota // (period or 100000))
    assert ctx.cpus.notes[ctx.container.id] == f"LSR: {cpu_count} CPUs as whole cores from the node's topology"
    intent = Intent()
    desired(ctx, intent)
    s = intent.files[("cpuset.cpus", "")]
    assert s.value == format_cpulist(cpus) and s.why == ctx.cpus.notes[ctx.container.id]


def test_assign_leaves_alone_what_it_cannot_or_need_not_pin(tmp_path: Path) -> None:
    for i, ctx in enumerate(
        (
            lsr_ctx(tmp_path / "0", None),  # no quota: nothing to size
            lsr_ctx(tmp_path / "1", 0),
            lsr_ctx(tmp_path / "2", -1),
            lsr_ctx(tmp_path / "3", 200000, qos="LS"),  # not a candidate
            lsr_ctx(tmp_path / "4", 200000, has=False),  # no cpuset files here
        )
    ):
        assert ctx.cpus is not None
        assert assign(ctx) is None and ctx.cpus.exclusive == {}, i
        intent = Intent()
        desired(ctx, intent)
        assert intent.values == {}, i  # nothing exclusive: the runtime's all-CPU default stands
    pod_level = lsr_ctx(tmp_path / "5", 200000)
    pod_level = Context(pod_level.pod, None, pod_level.qos, pod_level.policy, pod_level.caps, pod_level.cpus)
    assert assign(pod_level) is None and pod_level.cpus is not None and pod_level.cpus.exclusive == {}
    none = lsr_ctx(tmp_path / "6", 200000)
    assert assign(Context(none.pod, none.container, none.qos, none.policy, none.caps, None)) is None


def test_a_shortfall_shares_and_is_said(tmp_path: Path) -> None:
    ctx = lsr_ctx(tmp_path, 800000)  # 8 CPUs: all four cores, but one must stay shared
    assert ctx.cpus is not None and ctx.container is not None
    short = "needs 4 whole core(s) for 8 CPU(s); 4 of 4 core(s) are free and one must stay in the share pool"
    assert assign(ctx) == short
    assert ctx.cpus.notes[ctx.container.id] == f"cannot pin: {short}"
    ctx.cpus.claim("other", {0, 4})
    intent = Intent()
    desired(ctx, intent)
    s = intent.files[("cpuset.cpus", "")]
    assert s.value == "1-3,5-7"
    assert s.why == f"LSR: the share pool (online CPUs minus exclusive ones); cannot pin: {short}"
    closed = Policy.model_validate({"features": {"cpuset": {"failurePolicy": "fail-closed"}}})
    strict = Context(ctx.pod, ctx.container, ctx.qos, closed, ctx.caps, ctx.cpus)
    with pytest.raises(InvalidInput) as info:
        desired(strict, Intent())
    assert (info.value.key, info.value.why) == ("cpuset", f"cannot pin: {short}")
    plain = lsr_ctx(tmp_path / "ls", None, qos="LS")
    assert plain.cpus is not None
    plain.cpus.claim("other", {0, 4})
    intent = Intent()
    desired(plain, intent)
    assert intent.why == {"cpuset.cpus": "LS: the share pool (online CPUs minus exclusive ones)"}


@pytest.mark.parametrize(
    ("status", "why"),
    [
        ("[1]", "expected a JSON object"),
        ('{"cpuset": 5}', "cpuset must be a cpu list string"),
        ('{"cpuset": "9-1"}', "cpuset '9-1': bad cpu list '9-1'"),
        ('{"cpuset": "' + "1," * 30 + 'x"}', f"cpuset {('1,' * 20)!r}: invalid literal for int() with base 10: 'x'"),
        ('{"cpuset": "0-9999"}', "cpus 0-9999 are not all online (0-7)"),
    ],
)
def test_a_bad_scheduling_decision_is_refused_by_name(tmp_path: Path, status: str, why: str) -> None:
    ctx = lsr_ctx(tmp_path, 200000, annotations={RESOURCE_STATUS: status})
    assert ctx.cpus is not None and ctx.container is not None
    with pytest.raises(InvalidInput) as info:
        assign(ctx)
    assert (info.value.key, info.value.why) == (RESOURCE_STATUS, why)
    note = ctx.cpus.notes[ctx.container.id]
    assert note.startswith("cannot pin: ") and why in note and ctx.cpus.exclusive == {}


def test_the_schedulers_decision_is_taken_as_written(tmp_path: Path) -> None:
    ctx = lsr_ctx(tmp_path, 200000, qos="LSE", annotations={RESOURCE_STATUS: '{"cpuset": "1,5"}'})
    assert ctx.cpus is not None and ctx.container is not None
    assert assign(ctx) is None and ctx.cpus.exclusive[ctx.container.id] == {1, 5}
    assert ctx.cpus.notes[ctx.container.id] == f"LSE: exclusive, as scheduled ({RESOURCE_STATUS})"
    assert assign(ctx) is None and ctx.cpus.generation == 1  # once
    other = lsr_ctx(tmp_path / "n", 200000, annotations={RESOURCE_STATUS: '{"numa": 1}'})
    assert assign(other) is None and other.cpus is not None and len(other.cpus.exclusive) == 1  # sized by quota


def test_degenerate_topologies() -> None:
    empty = CPUAllocator(Topology())
    with pytest.raises(NoCapacity, match=r"^needs 2 whole core\(s\) for 2 CPU\(s\); 0 of 0 core\(s\) are free"):
        empty.allocate("x", 2)
    partial = CPUAllocator(Topology(online=[0, 1, 2], siblings={0: [0]}))  # 1 and 2 have no sibling list
    assert partial.cores == [(0,), (1,), (2,)]


def test_desired_needs_an_allocator_a_container_and_cpuset_files(tmp_path: Path) -> None:
    for i, (has, alloc) in enumerate(((False, True), (True, False))):
        ctx = lsr_ctx(tmp_path / str(i), None, qos="LS", has=has)
        assert ctx.cpus is not None
        ctx.cpus.claim("other", {0, 4})
        if not alloc:
            ctx = Context(ctx.pod, ctx.container, ctx.qos, ctx.policy, ctx.caps, None)
        intent = Intent()
        desired(ctx, intent)
        assert intent.values == {}, i
