"""Work that waits out a burst of hooks (``node/turns.py``, :class:`Quiet`), and the take-in of
created containers that uses it (``node/hooks.py``): it runs when the loop's selector is about
to sleep, or after the lag; every hook about a waiting container takes that one in first, and
no hook takes in the others of the burst, except those that need them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.node.turns import Quiet, when_quiet
from nriplugin.nri import api_pb2 as api
from nriplugin.nri.runtime import RuntimeCaps
from testkit.runtime_peer import make_container, make_pod
from tests.test_cpuset import topo
from tests.test_features import caps


async def turns_of_the_loop(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def on_quiet_loop(body: Callable[[Quiet], Awaitable[None]], lag: float = 60.0) -> None:
    """Run ``body`` on a loop whose quiet moments are ``body``'s to call (``quiet.moment()``, as
    the agent's selector does before it sleeps)."""

    async def main() -> None:
        quiet = Quiet(lag)
        assert not quiet.moment()  # binds it to this loop; nothing waits yet
        await body(quiet)

    asyncio.run(main())


def test_work_waits_for_the_quiet_moment_and_runs_in_order() -> None:
    done: list[str] = []

    async def body(quiet: Quiet) -> None:
        when_quiet(done.append, "first")
        when_quiet(done.append, "second")
        await turns_of_the_loop()
        assert done == []  # the loop never went quiet
        assert quiet.moment()  # the selector is about to sleep: the work is released
        assert done == []  # to run on the loop, a turn at a time, not inside the selector
        await turns_of_the_loop()
        assert done == ["first", "second"]
        assert not quiet.moment()  # nothing left: the selector may sleep

    on_quiet_loop(body)


def test_work_runs_after_the_lag_when_the_loop_is_never_quiet() -> None:
    done: list[str] = []

    async def body(quiet: Quiet) -> None:
        when_quiet(done.append, "late")
        await asyncio.sleep(0.005)
        assert done == []
        await asyncio.sleep(0.05)
        assert done == ["late"]
        assert not quiet.moment()

    on_quiet_loop(body, lag=0.02)


def test_on_a_loop_without_quiet_moments_it_runs_right_after_the_callback() -> None:
    done: list[str] = []

    async def main() -> None:
        when_quiet(done.append, "soon")
        assert done == []
        await turns_of_the_loop()
        assert done == ["soon"]

    asyncio.run(main())
    when_quiet(done.append, "no loop: now")
    assert done == ["soon", "no loop: now"]


def plugin(tmp_path: Path) -> QoSPlugin:
    c = caps(**{"cpuset.cpus": True})
    c.topology = topo(tmp_path, 4, 2, 1)
    p = QoSPlugin(Node.create(caps=c))
    p.runtime_caps(RuntimeCaps(nri=(0, 12, 5), source="runtime"))
    return p


def burst(p: QoSPlugin, first: int, n: int) -> list[tuple[api.PodSandbox, api.Container]]:
    out = []
    for i in range(first, first + n):
        pod = make_pod(i, "LS")
        ctr = make_container(i, pod)
        p.create_container(pod, ctr)
        out.append((pod, ctr))
    return out


def test_a_burst_is_taken_in_when_it_is_over_and_a_hook_takes_in_only_its_own(tmp_path: Path) -> None:
    p = plugin(tmp_path)

    async def body(quiet: Quiet) -> None:
        created = burst(p, 1, 4)
        await turns_of_the_loop()
        assert [c.id in p.model for _, c in created] == [False] * 4  # the burst goes on
        (pod1, c1), (pod2, c2), (pod3, c3), (_, c4) = created
        p.start_container(pod3, c3)
        assert [c.id in p.model for _, c in created] == [False, False, True, False]
        p.update_container(pod1, c1, c1.linux.resources)
        assert [c.id in p.model for _, c in created] == [True, False, True, False]
        p.remove_container(pod2, c2)  # taken in and let go: nothing of it stays queued
        assert c2.id not in p.model and c2.id not in p._created
        assert list(p._created) == [c4.id]
        assert quiet.moment()
        await turns_of_the_loop()
        assert c4.id in p.model and not p._created

    on_quiet_loop(body)


def test_a_pod_hook_takes_in_the_waiting_containers_of_its_pod_alone(tmp_path: Path) -> None:
    p = plugin(tmp_path)

    async def body(quiet: Quiet) -> None:
        (pod1, c1), (_, c2) = burst(p, 1, 2)
        p.remove_pod_sandbox(pod1)
        assert c1.id not in p.model and f"pod:{pod1.id}" not in p.model and list(p._created) == [c2.id]
        assert quiet.moment()
        await turns_of_the_loop()
        assert c2.id in p.model

    on_quiet_loop(body)


def test_an_exclusive_container_takes_the_waiting_sharers_in_and_moves_them(tmp_path: Path) -> None:
    """Cores leave the share pool: the sharers created in the burst are in the answer's updates."""
    p = plugin(tmp_path)

    async def body(quiet: Quiet) -> None:
        sharers = burst(p, 1, 2)
        lsr = make_pod(9, "LSR")
        lsr_c = make_container(9, lsr)
        lsr_c.linux.resources.cpu.quota.value = 200000
        lsr_c.linux.resources.cpu.period.value = 100000
        out = p.create_container(lsr, lsr_c)
        assert isinstance(out, tuple)
        assert sorted(u.container_id for u in out[1]) == sorted(c.id for _, c in sharers)
        assert not p._created

    on_quiet_loop(body)
