"""The loop's selector keeps looking, without sleeping, for the next request while requests come
back to back, and sleeps at once otherwise (``pacing/selector.py``, :class:`PollClock`).

The selector's clock and its polls are scripted: each test says when bytes become ready and
checks what the selector did (looked, slept, for how long) and the arrival it noted."""

from __future__ import annotations

import selectors
import socket
from collections.abc import Callable

import pytest

from nriplugin.cli.main import build_parser
from nriplugin.pacing.selector import BURST_POLL, PollClock

READY = [(selectors.SelectorKey(None, 0, selectors.EVENT_READ, None), selectors.EVENT_READ)]  # type: ignore[arg-type]


class Scripted(PollClock):
    """A PollClock on a fake clock: a look (``_poll(0)``) takes ``look`` seconds, a sleep lasts
    until the next scripted arrival or its timeout; bytes arrive at the times in ``arrivals``."""

    def __init__(
        self, burst_poll: float = BURST_POLL, look: float = 10e-6, idle: Callable[[], bool] | None = None
    ) -> None:
        self.t = 0.0
        self.look = look
        self.arrivals: list[float] = []
        self.sleeps: list[float | None] = []  # timeouts of the polls that slept
        self.looks = 0
        self.gave_way = 0  # sched_yield calls between looks
        super().__init__(burst_poll, idle)

    def _give_way(self) -> None:  # type: ignore[override]
        self.gave_way += 1

    def _now(self) -> float:  # type: ignore[override]
        return self.t

    def _take(self) -> list[tuple[selectors.SelectorKey, int]]:
        if self.arrivals and self.arrivals[0] <= self.t:
            self.arrivals.pop(0)
            return READY
        return []

    def _poll(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0:
            self.looks += 1
            self.t += self.look
            return self._take()
        self.sleeps.append(timeout)
        nxt = self.arrivals[0] if self.arrivals else None
        if nxt is not None and (timeout is None or nxt <= self.t + timeout):
            self.t = max(self.t, nxt)
        elif timeout is not None:
            self.t += timeout
            return []
        else:
            raise AssertionError("slept forever")
        return self._take()

    def answer_then_wait(
        self, work: float, gap: float, timeout: float | None = None, answer: bool = True
    ) -> list[object]:
        """The loop answers a request (``work`` seconds of its own), then polls; the next
        bytes arrive ``gap`` seconds after. ``answer`` False: the loop did other work (a reply
        to one of its own calls, a file event), no answer."""
        self.t += work
        if answer:
            self.answered()
        self.arrivals.append(self.t + gap)
        return self.select(timeout)  # type: ignore[return-value]


def test_back_to_back_requests_are_found_by_looking_not_by_sleeping() -> None:
    c = Scripted()
    assert c.answer_then_wait(0, 1.0) and c.sleeps == [None] and not c.burst  # a lone request: slept
    assert c.answer_then_wait(50e-6, 80e-6) and len(c.sleeps) == 2  # came 80 us after: slept, woken soon
    assert c.burst
    for _ in range(5):  # from then on the loop looks, and never sleeps
        assert c.answer_then_wait(50e-6, 120e-6)
    assert len(c.sleeps) == 2 and c.burst
    assert c.spun == pytest.approx(5 * 120e-6, abs=5 * 10e-6)


def test_between_looks_that_find_nothing_the_cpu_is_offered_to_others() -> None:
    """A look that finds nothing is followed by sched_yield before the next: on a small node
    the runtime's threads need the CPU the loop is looking on."""
    c = Scripted(look=10e-6)
    c.answer_then_wait(0, 1.0)
    c.answer_then_wait(0, 50e-6)
    assert c.burst
    looks, gave = c.looks, c.gave_way
    # found by the 10th look: the poll's own first look, then 8 empty looks of the burst's,
    # each followed by a yield, and the one that finds it
    assert c.answer_then_wait(0, 95e-6)
    assert c.looks - looks == 10 and c.gave_way - gave == 8
    looks, gave = c.looks, c.gave_way
    c.answer_then_wait(0, 0.5)  # nothing within burst_poll: no yield after the last look; then it sleeps
    spin_looks = c.looks - looks - 1
    assert spin_looks == round(BURST_POLL / 10e-6) and c.gave_way - gave == spin_looks - 1


def test_io_soon_after_work_that_answered_nothing_never_starts_a_burst() -> None:
    """Only a request following an answer is a burst of hooks: the agent's own calls answered
    quickly, or file events, keep the loop sleeping."""
    c = Scripted()
    for _ in range(5):
        assert c.answer_then_wait(50e-6, 30e-6, answer=False)
    assert not c.burst and len(c.sleeps) == 5 and c.spun == 0


def test_the_first_look_that_finds_nothing_in_time_ends_the_burst() -> None:
    c = Scripted()
    c.answer_then_wait(0, 1.0)
    c.answer_then_wait(0, 50e-6)
    assert c.burst
    c.answer_then_wait(0, 0.5)  # the burst ended: looked for burst_poll, then slept
    assert len(c.sleeps) == 3 and not c.burst
    assert c.spun == pytest.approx(BURST_POLL, abs=10e-6)
    looks = c.looks
    c.answer_then_wait(0, 0.5)  # outside a burst: one look (was it there already?), then sleep
    assert c.looks == looks + 1 and len(c.sleeps) == 4


def test_a_request_found_by_looking_arrived_after_the_look_before() -> None:
    """The hook's time starts no later than its bytes could have arrived: at the look before
    the one that found them (within one look of the truth, never after it)."""
    c = Scripted(look=10e-6)
    c.answer_then_wait(0, 1.0)
    c.answer_then_wait(0, 50e-6)
    began = c.t
    c.answer_then_wait(0, 35e-6)
    assert began + 25e-6 <= c.arrived <= began + 35e-6


def test_the_look_stops_at_a_timer_due_sooner() -> None:
    c = Scripted()
    c.answer_then_wait(0, 1.0)
    c.answer_then_wait(0, 50e-6)
    began, sleeps = c.t, len(c.sleeps)
    c.arrivals.append(began + 1.0)
    assert c.select(60e-6) == []  # a timer due in 60 us: looked until then, and did not sleep
    assert 60e-6 <= c.t - began <= 60e-6 + 3 * c.look and len(c.sleeps) == sleeps and not c.burst


def test_zero_never_looks_beyond_the_first() -> None:
    c = Scripted(burst_poll=0)
    for _ in range(4):
        c.answer_then_wait(0, 50e-6)
    assert len(c.sleeps) == 4 and c.looks == 4 and c.spun == 0


class IdleWork:
    """Idle work on the scripted clock: each call takes ``takes`` seconds and says it did work
    (``did``), and notes when it began."""

    def __init__(self, takes: float, did: bool = True) -> None:
        self.clock: Scripted | None = None
        self.takes = takes
        self.did = did
        self.began: list[float] = []

    def __call__(self) -> bool:
        assert self.clock is not None
        self.began.append(self.clock.t)
        self.clock.t += self.takes
        return self.did


def scripted_with(idle: IdleWork) -> Scripted:
    c = Scripted(idle=idle)
    idle.clock = c
    return c


def test_idle_work_runs_before_the_loop_sleeps_and_never_inside_a_burst() -> None:
    """Where the agent collects garbage: when no request is in sight, not between hooks."""
    idle = IdleWork(100e-6)
    c = scripted_with(idle)
    c.answer_then_wait(0, 1.0)  # a lone request: idle work, then sleep
    assert len(idle.began) == 1 and len(c.sleeps) == 1
    c.answer_then_wait(50e-6, 150e-6)  # idle work, then slept: woken soon, a burst begins
    assert len(idle.began) == 2 and c.burst
    for _ in range(20):
        assert c.answer_then_wait(50e-6, 120e-6)
    assert len(idle.began) == 2  # every request of the burst was found by looking
    c.answer_then_wait(0, 0.5)  # the burst ends: looked for burst_poll, then idle work, then sleep
    assert len(idle.began) == 3 and not c.burst
    assert idle.began[-1] >= c.t - 0.5 + BURST_POLL - 100e-6 - 1e-9  # after the look, not before


def test_a_request_that_came_during_idle_work_arrived_no_later_than_when_it_began() -> None:
    idle = IdleWork(300e-6)
    c = scripted_with(idle)
    c.answer_then_wait(0, 1.0)
    sleeps = len(c.sleeps)
    sent = c.t + 100e-6
    assert c.answer_then_wait(0, 100e-6)  # came 100 us into 300 us of idle work
    assert len(c.sleeps) == sleeps  # found by the look after the work: no sleep
    assert c.arrived == idle.began[-1] <= sent


def test_idle_that_did_nothing_costs_no_extra_look() -> None:
    idle = IdleWork(0, did=False)
    with_idle, plain = scripted_with(idle), Scripted()
    for c in (with_idle, plain):
        for gap in (1.0, 50e-6, 120e-6, 0.5):
            c.answer_then_wait(0, gap)
    assert with_idle.looks == plain.looks and with_idle.sleeps == plain.sleeps and idle.began


def test_a_burst_on_a_real_socket() -> None:
    """The real selector: bytes already there are found by the first look, without a sleep."""
    a, b = socket.socketpair()
    c = PollClock()
    try:
        c.register(a, selectors.EVENT_READ)
        c.burst = True
        b.send(b"x")
        assert [k.fileobj for k, _ in c.select(None)] == [a] and c.burst and c.spun == 0
        a.recv(1)
        assert c.select(0.01) == [] and not c.burst  # nothing within the look and the timeout
    finally:
        c.close()
        a.close()
        b.close()


def test_the_cli_default_is_the_selectors() -> None:
    ns = build_parser().parse_args(["run"])
    assert ns.burst_poll_us / 1e6 == BURST_POLL
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--burst-poll-us", "-1"])
