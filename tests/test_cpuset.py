"""The CPUSet allocator (properties over random topologies) and the plugin's share pool."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nriplugin.features.cpuset import CPUAllocator, NoCapacity
from nriplugin.kernel.probe import parse_cpulist, topology
from nriplugin.node import Node
from nriplugin.nri import api_pb2 as api
from nriplugin.plugin import QoSPlugin
from tests.kernel_tree import sys_tree
from tests.runtime_peer import make_container, make_pod
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


def test_plugin_pins_lsr_and_moves_sharers(tmp_path: Path) -> None:
    async def main() -> None:
        t = topo(tmp_path, 4, 2, 1)
        c = caps(**{"cpuset.cpus": True})
        c.topology = t
        pushed: list[list[api.ContainerUpdate]] = []

        async def push(updates: list[api.ContainerUpdate]) -> None:
            pushed.append(updates)

        invalid: list[str] = []
        p = QoSPlugin(Node.create(caps=c, on_invalid=invalid.append), push=push)
        ls = make_pod(1, "LS")
        ls_c = make_container(1, ls)
        assert p.create_container(ls, ls_c) is None  # nothing exclusive yet: all CPUs, no adjustment
        lsr = make_pod(2, "LSR")
        lsr_c = make_container(2, lsr)
        lsr_c.linux.resources.cpu.quota.value = 200000
        lsr_c.linux.resources.cpu.period.value = 100000
        out = p.create_container(lsr, lsr_c)
        assert isinstance(out, tuple)
        adj, updates = out
        pinned = set(parse_cpulist(adj.linux.resources.cpu.cpus))
        assert len(pinned) == 2 and set(t.siblings[min(pinned)]) == pinned
        assert [u.container_id for u in updates] == [ls_c.id]
        assert set(parse_cpulist(updates[0].linux.resources.cpu.cpus)) == set(t.online) - pinned
        sched = make_pod(3, "LSE")
        sched.annotations["scheduling.koordinator.sh/resource-status"] = json.dumps({"cpuset": "3,7"})
        out = p.create_container(sched, make_container(3, sched))
        assert isinstance(out, tuple) and out[0].linux.resources.cpu.cpus == "3,7"
        hostile = make_pod(4, "LSE")
        hostile.annotations["scheduling.koordinator.sh/resource-status"] = json.dumps({"cpuset": "0-9999"})
        p.create_container(hostile, make_container(4, hostile))
        assert invalid == ["cpuset"]
        p.remove_container(lsr, lsr_c)
        await asyncio.sleep(0.01)
        assert pushed and set(parse_cpulist(pushed[0][0].linux.resources.cpu.cpus)) == set(t.online) - {3, 7}

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
        pod = make_pod(i, "LSR")
        ctr = make_container(i, pod)
        ctr.linux.resources.cpu.quota.value = 100000
        ctr.linux.resources.cpu.period.value = 100000
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
