"""The hook path's shape: what one NRI event costs the running agent (every loop on) must not
grow with the containers on the node, and stays within a budget.

Counted, not timed (``testkit/hook_work.py``): bytecode instructions executed by the agent's code
for the event and everything it left behind on the loop, and its file-system calls, with the
agent's clock held so that no periodic round falls into the window. A node of 300 containers
and one of 3000 must cost the same per event. Times belong to ``bench/hook_latency.py``.
"""

from __future__ import annotations

import asyncio
import collections
import resource
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from nriplugin.node.hooks import QoSPlugin
from nriplugin.nri import api_pb2 as api
from nriplugin.pacing.turns import Pacer
from testkit.hook_work import Work, realistic_pod, run_on_stoppable_loop, running_agent, temporary_dir
from testkit.runtime_peer import PluginSession
from tests.test_quiet import plugin

Event = Callable[[PluginSession], Coroutine[Any, Any, object]]

# Bytecode instructions per event on a node of 300 containers (the most over BE and LS pods
# and three lifecycles), with room for honest growth (~30 %). Measured when set: create of an
# unseen pod 4.4k, run_pod 7.3k (a BE pod's own group written), create 3.4k, start 4.5k,
# update 3.1k, remove 2.2k, remove_pod 2.6k. Since CreateContainer answers a shape it has
# seen from that one computation (the unseen pod's container came first, of the same shape):
# create 2.0k; since the usual read is decoded in one step and the stub's table holds each
# event's policy: 0.93k (1.12k before); since each field of the request is read once: 0.91k.
# A budget is raised only with a reason in the commit that raises it.
BUDGET = {
    "create_unseen_pod": 6_000,
    "run_pod": 9_500,
    "create": 1_200,
    "start": 6_000,
    "update": 4_200,
    "remove": 3_000,
    "remove_pod": 3_400,
}
# What a node ten times larger may add per event: nothing that scales with it. The slack
# covers state that differs with the node but not per container (the QoS manager's level).
SLACK = 0.05


def lifecycle(
    pod: api.PodSandbox, ctr: api.Container, unseen: api.PodSandbox, other: api.Container
) -> list[tuple[str, Event]]:
    """A pod's life as containerd tells it, and a container of a pod never announced (a pod
    that came while the agent was away, or a runtime that sends no RunPodSandbox)."""
    resized = api.LinuxResources()
    resized.CopyFrom(ctr.linux.resources)
    resized.cpu.shares.value += 10
    return [
        ("create_unseen_pod", lambda s: s.create_container(unseen, other)),
        ("run_pod", lambda s: s.state_change(api.RUN_POD_SANDBOX, pod)),
        ("create", lambda s: s.create_container(pod, ctr)),
        ("start", lambda s: s.state_change(api.START_CONTAINER, pod, ctr)),
        ("update", lambda s: s.update_container(pod, ctr, resized)),
        ("remove", lambda s: s.state_change(api.REMOVE_CONTAINER, pod, ctr)),
        ("remove_pod", lambda s: s.state_change(api.REMOVE_POD_SANDBOX, pod)),
    ]


def work_per_event(known: int) -> dict[str, Work]:
    """The most work each event took over three BE and three LS pod lifecycles."""

    async def main() -> dict[str, Work]:
        most: dict[str, Work] = {}
        with temporary_dir() as tmp:
            async with running_agent(tmp, known) as agent:
                with agent.held():  # no periodic round between the events either
                    for k in range(6):
                        pod, ctr = realistic_pod(500000 + k, ("BE", "LS")[k % 2])
                        unseen, other = realistic_pod(700000 + k, ("BE", "LS")[k % 2])
                        ctr.state = other.state = api.CONTAINER_CREATED
                        for name, event in lifecycle(pod, ctr, unseen, other):
                            w = await agent.work_of(event)
                            if name not in most or w.opcodes > most[name].opcodes:
                                most[name] = w
        return most

    return run_on_stoppable_loop(main())


@pytest.fixture(scope="module")
def small() -> dict[str, Work]:
    return work_per_event(300)


@pytest.fixture(scope="module")
def large() -> dict[str, Work]:
    return work_per_event(3000)


def grew(a: Work, b: Work) -> str:
    d = collections.Counter(b.by_function)
    d.subtract(a.by_function)
    return ", ".join(f"{f} +{c}" for f, c in d.most_common(6) if c > 0)


@pytest.mark.parametrize("event", list(BUDGET))
def test_an_event_costs_the_same_on_a_node_ten_times_larger(
    event: str, small: dict[str, Work], large: dict[str, Work]
) -> None:
    a, b = small[event], large[event]
    assert a.opcodes > 100, f"{event}: the agent did nearly nothing ({a.opcodes}): is the harness measuring it?"
    assert b.opcodes <= a.opcodes * (1 + SLACK), (
        f"{event}: {a.opcodes} instructions with 300 containers known, {b.opcodes} with 3000: it grows with the "
        f"node ({grew(a, b)})"
    )
    assert b.files == a.files, f"{event}: file-system calls {dict(a.files)} with 300 known, {dict(b.files)} with 3000"


@pytest.mark.parametrize("event", list(BUDGET))
def test_an_event_stays_within_its_budget(event: str, small: dict[str, Work]) -> None:
    w = small[event]
    assert w.opcodes <= BUDGET[event], (
        f"{event}: {w.opcodes} instructions, budget {BUDGET[event]}; the most expensive:\n{w.top(12)}"
    )


def test_the_count_sees_a_loop_over_the_node(small: dict[str, Work]) -> None:
    """The guard's own check: a listener that walks the node model on every new pod (the
    regression this guard was written for) is counted."""
    from nriplugin.node.model import NodeModel

    class Walker:
        def __init__(self, model: NodeModel) -> None:
            self.model = model

        def added(self, key: str) -> None:
            sum(1 for k in self.model if k.startswith("pod:"))

        def started(self, key: str, existing: bool) -> None: ...
        def changed(self, key: str) -> None: ...
        def removed(self, key: str) -> None: ...
        def resynced(self) -> None: ...

    async def main() -> int:
        with temporary_dir() as tmp:
            async with running_agent(tmp, 300) as agent:
                assert agent.agent.node is not None
                model = agent.agent.node.model
                model.subscribe(Walker(model))
                pod, _ = realistic_pod(600000, "BE")
                return (await agent.work_of(lambda s: s.state_change(api.RUN_POD_SANDBOX, pod))).opcodes

    walked = run_on_stoppable_loop(main())
    assert walked > small["run_pod"].opcodes + 300 * 5


# Minor page faults per CreateContainer of a burst, at most. Measured when set: ~0.2 with the
# requests kept as they came, 2.5-3.2 with their parsed messages kept.
FAULTS_PER_CREATE = 1.0


def test_a_burst_of_creates_keeps_its_requests_not_their_parse(tmp_path: Path) -> None:
    """Until a burst is over, the take-in queue keeps each container's request as the runtime
    sent it (~2.4 KB), not the messages parsed from it: those hold the whole parse (~10 KB), so
    every request of a burst would parse into memory the process had never touched. Counted in
    the process's minor page faults over 2000 creates, each parsed from its wire bytes as the
    stub does; then the queue is taken in and the model holds what the runtime sent."""
    sent = []
    for i in range(2000):
        pod, ctr = realistic_pod(100000 + i, ("BE", "LS")[i % 2])
        sent.append(api.CreateContainerRequest(pod=pod, container=ctr).SerializeToString())

    async def main() -> tuple[int, QoSPlugin]:
        pacer = Pacer(asyncio.get_running_loop(), wait_out_bursts=True, settle=60.0, lag=600.0)  # the burst goes on
        quiet = pacer.bursts
        assert quiet is not None
        p = plugin(tmp_path, pacer)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for wire in sent:
            req = api.CreateContainerRequest.FromString(wire)
            p.create_container(req.pod, req.container, wire)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        assert quiet.waiting == 1 and not any(r.container.id in p.model for r in map(parse, sent[:5]))
        quiet.release()
        while quiet.waiting or len(p.model) < 2 * len(sent):
            await asyncio.sleep(0)
        return faults, p

    (faults, p), n = asyncio.run(main()), len(sent)
    assert faults / n <= FAULTS_PER_CREATE, f"{faults} page faults in {n} creates: a create keeps memory it touched"
    for wire in (sent[0], sent[-1]):
        req = parse(wire)
        record = p.model.get(req.container.id)
        assert record is not None and record.container == req.container and record.pod == req.pod


def parse(wire: bytes) -> api.CreateContainerRequest:
    return api.CreateContainerRequest.FromString(wire)
