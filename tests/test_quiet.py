"""Work that waits out a burst of hooks (``pacing/turns.py``, :class:`BurstWait`), and the take-in of
created containers that uses it (``node/hooks.py``): it runs when the loop's selector is about
to sleep, or after the lag; every hook about a waiting container takes that one in first, and
no hook takes in the others of the burst, except those that need them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from nriplugin.agent.assembly import Agent
from nriplugin.cli.main import build_parser
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import QoSPlugin
from nriplugin.nri import api_pb2 as api
from nriplugin.nri.runtime import RuntimeCaps
from nriplugin.pacing import turns
from nriplugin.pacing.traffic import HookTraffic
from nriplugin.pacing.turns import BurstWait, Pacer
from testkit.runtime_peer import make_container, make_lsr, make_pod
from tests.test_cpuset import topo
from tests.test_features import caps


async def turns_of_the_loop(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def on_quiet_loop(
    body: Callable[[Pacer], Awaitable[None]],
    settle: float = 60.0,
    lag: float = 600.0,
    traffic: HookTraffic | None = None,
    turn: float | None = None,
) -> None:
    """Run ``body`` with a pacer that waits out bursts (as the agent's), bursts ending after
    ``settle`` seconds without an answer (the default: never, unless ``body`` releases);
    ``traffic``: the hooks' (the test sets its last answer)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await body(Pacer(loop, traffic, wait_out_bursts=True, settle=settle, lag=lag, turn=turn))

    asyncio.run(main())


class Answers(HookTraffic):
    """Hook traffic whose last answer the test sets (``now()``: one at every moment)."""

    def __init__(self, last: float = 0.0, now: bool = False) -> None:
        super().__init__()
        self._last, self._now = last, now

    @property
    def last_answer(self) -> float:
        return time.perf_counter() if self._now else self._last

    @last_answer.setter
    def last_answer(self, at: float) -> None:
        self._last = at


def bursts_of(pacer: Pacer) -> BurstWait:
    assert pacer.bursts is not None
    return pacer.bursts


def test_work_waits_while_hooks_are_answered_and_runs_in_order_once_they_stop() -> None:
    done: list[str] = []
    traffic = HookTraffic()
    traffic.last_answer = time.perf_counter()

    async def body(pacer: Pacer) -> None:
        pacer.when_quiet(done.append, "first")
        pacer.when_quiet(done.append, "second")
        for _ in range(6):  # a burst: an answer every 5 ms, well within the settle time
            await asyncio.sleep(0.005)
            traffic.last_answer = time.perf_counter()
        assert done == [] and bursts_of(pacer).waiting == 2
        await asyncio.sleep(0.6)  # the burst is over
        assert done == ["first", "second"] and bursts_of(pacer).waiting == 0

    on_quiet_loop(body, settle=0.2, traffic=traffic)


def test_work_runs_after_the_lag_when_the_burst_goes_on() -> None:
    done: list[str] = []

    async def body(pacer: Pacer) -> None:
        pacer.when_quiet(done.append, "late")
        await asyncio.sleep(0.01)
        assert done == []
        await asyncio.sleep(0.6)
        assert done == ["late"]

    on_quiet_loop(body, settle=0.002, lag=0.2, traffic=Answers(now=True))  # an answer every moment


def test_the_check_for_a_bursts_end_backs_off_while_it_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long burst costs a few checks, not one per settle time; its work still runs within
    BACKOFF settle times of its end, and a later burst is checked every settle time again."""
    done: list[float] = []
    traffic = HookTraffic()
    traffic.last_answer = time.perf_counter()
    checks = [0]
    check = BurstWait._check

    def counted(self: BurstWait) -> None:
        checks[0] += 1
        check(self)

    monkeypatch.setattr(BurstWait, "_check", counted)
    settle = 0.01

    async def burst(seconds: float) -> float:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:  # an answer every fifth of a settle time
            traffic.last_answer = time.perf_counter()
            await asyncio.sleep(settle / 5)
        return traffic.last_answer

    async def body(pacer: Pacer) -> None:
        pacer.when_quiet(lambda: done.append(time.perf_counter()))
        over = await burst(1.0)
        assert done == [] and bursts_of(pacer).waiting == 1
        assert checks[0] <= 15  # 9 as the backoff goes; one per settle time would be 100
        await asyncio.sleep(turns.BACKOFF * settle + 0.05)
        assert len(done) == 1 and done[0] - over <= turns.BACKOFF * settle + 0.05
        checks[0] = 0
        pacer.when_quiet(lambda: done.append(time.perf_counter()))
        traffic.last_answer = time.perf_counter()
        await asyncio.sleep(3.5 * settle)  # no more answers: due a settle time after the last
        assert len(done) == 2 and checks[0] <= 2

    on_quiet_loop(body, settle=settle, traffic=traffic)


def test_work_queued_after_a_release_runs_at_once_until_a_hook_is_answered() -> None:
    """A job's next turn: at once while the loop stays quiet, after the next quiet spell once
    a hook was answered (the burst resumed)."""
    done: list[str] = []
    traffic = HookTraffic()

    async def body(pacer: Pacer) -> None:
        pacer.when_quiet(done.append, "first turn")
        bursts_of(pacer).release()
        pacer.when_quiet(done.append, "next turn, still quiet")
        await turns_of_the_loop()
        assert done == ["first turn", "next turn, still quiet"]
        traffic.last_answer = time.perf_counter()  # a hook: the burst resumed
        pacer.when_quiet(done.append, "after the burst")
        await turns_of_the_loop()
        assert done[-1] != "after the burst" and bursts_of(pacer).waiting == 1

    on_quiet_loop(body, traffic=traffic)


def test_a_take_in_that_runs_in_turns_gives_way_to_a_resumed_burst(tmp_path: Path) -> None:
    traffic = HookTraffic()

    async def body(pacer: Pacer) -> None:
        p = plugin(tmp_path, pacer)
        created = burst(p, 1, 4)
        bursts_of(pacer).release()  # the hooks stopped
        await turns_of_the_loop(2)
        assert sum(c.id in p.model for _, c in created) == 2  # a turn each, one after the other
        traffic.last_answer = time.perf_counter()  # a hook came between two turns
        await turns_of_the_loop(4)
        assert sum(c.id in p.model for _, c in created) == 3 and bursts_of(pacer).waiting == 1
        bursts_of(pacer).release()
        await turns_of_the_loop(2)
        assert all(c.id in p.model for _, c in created)

    on_quiet_loop(body, traffic=traffic, turn=0.0)  # one container a turn


def test_without_waiting_out_bursts_it_runs_right_after_the_callback_and_with_no_loop_now() -> None:
    done: list[str] = []

    async def main() -> None:
        pacer = Pacer(asyncio.get_running_loop())
        pacer.when_quiet(done.append, "soon")
        assert done == []
        await turns_of_the_loop()
        assert done == ["soon"]

    asyncio.run(main())
    Pacer().when_quiet(done.append, "no loop: now")
    assert done == ["soon", "no loop: now"]


def test_the_agent_hands_one_pacer_that_waits_out_bursts_to_whoever_shares_its_loop(tmp_path: Path) -> None:
    async def main() -> None:
        ns = build_parser().parse_args(["run", "--socket", str(tmp_path / "nri.sock")])
        agent = Agent(ns)
        assert agent.pacer.loop is asyncio.get_running_loop() and agent.pacer.bursts is not None
        assert agent.pacer.traffic is agent.traffic and agent.opts.traffic is agent.traffic

    asyncio.run(main())


def plugin(tmp_path: Path, pacer: Pacer) -> QoSPlugin:
    c = caps(**{"cpuset.cpus": True})
    c.topology = topo(tmp_path, 4, 2, 1)
    p = QoSPlugin(Node.create(caps=c), pacer=pacer)
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
    async def body(pacer: Pacer) -> None:
        p = plugin(tmp_path, pacer)
        created = burst(p, 1, 4)
        await turns_of_the_loop()
        assert [c.id in p.model for _, c in created] == [False] * 4  # the burst goes on
        (pod1, c1), (pod2, c2), (pod3, c3), (_, c4) = created
        p.start_container(pod3, c3)
        assert [c.id in p.model for _, c in created] == [False, False, True, False]
        p.update_container(pod1, c1, c1.linux.resources)
        assert [c.id in p.model for _, c in created] == [True, False, True, False]
        p.remove_container(pod2, c2)  # dropped from the queue: never taken in, nor its pod
        assert c2.id not in p.model and c2.id not in p._created and f"pod:{pod2.id}" not in p.model
        assert list(p._created) == [c4.id]
        bursts_of(pacer).release()  # the burst is over
        await turns_of_the_loop()
        assert c4.id in p.model and not p._created

    on_quiet_loop(body)


def test_a_pod_hook_takes_in_the_waiting_containers_of_its_pod_alone(tmp_path: Path) -> None:
    async def body(pacer: Pacer) -> None:
        p = plugin(tmp_path, pacer)
        (pod1, c1), (_, c2) = burst(p, 1, 2)
        p.remove_pod_sandbox(pod1)
        assert c1.id not in p.model and f"pod:{pod1.id}" not in p.model and list(p._created) == [c2.id]
        bursts_of(pacer).release()  # the burst is over
        await turns_of_the_loop()
        assert c2.id in p.model

    on_quiet_loop(body)


def test_an_exclusive_container_moves_the_waiting_sharers_without_taking_them_in(tmp_path: Path) -> None:
    """Cores leave the share pool: the sharers created in the burst are in the answer's updates;
    their take-in still waits (the hook's work does not grow with the burst)."""

    async def body(pacer: Pacer) -> None:
        p = plugin(tmp_path, pacer)
        sharers = burst(p, 1, 2)
        lsr, lsr_c = make_lsr(9, 200000)
        out = p.create_container(lsr, lsr_c)
        assert isinstance(out, tuple)
        assert sorted(u.container_id for u in out[1]) == sorted(c.id for _, c in sharers)
        assert list(p._created) == [c.id for _, c in sharers]
        bursts_of(pacer).release()
        await turns_of_the_loop()
        pool = p.desired.intent(sharers[0][1].id)
        assert pool is not None and pool.values["cpuset.cpus"] == out[1][0].linux.resources.cpu.cpus

    on_quiet_loop(body)
