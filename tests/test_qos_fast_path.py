"""The fast path's source: the pods root's own CPU counter (v1 ``cpuacct.usage``, v2 ``cpu.stat``
``usage_usec``) over the last interval, what runs outside the pods from /proc/stat over a long
window. An LS step shows whole in one interval that lies inside it; /proc/stat's tick noise moves
nothing; a rise brings the next sample forward; a full round's turn samples too. On fake v1 and
v2 trees through the real collector, and with a scripted loop (no timing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from nriplugin.kernel.cgroup import Cgroups
from nriplugin.node.assembly import Node
from nriplugin.policy.cache import RuleCache
from nriplugin.policy.model import Policy
from nriplugin.qos.collect import Collector
from nriplugin.qos.cpu_suppress import Limiter
from nriplugin.qos.manager import FAST_FOLLOW, FAST_IDLE, FAST_PERIOD, FAST_REFINE, FAST_WINDOW, QoSManager
from nriplugin.qos.node_resource import FastWindow
from nriplugin.qos.strategy import FastUsage
from nriplugin.reconciler import Reconciler
from testkit.kernel_tree import proc_tree, v1_counters, v1_tree, v2_counters, v2_tree
from testkit.runtime_peer import make_container, make_pod
from tests.test_features import caps
from tests.test_qos_manager import BE_GROUP, Script, node_with_pods, seed_policy

# the window ------------------------------------------------------------------------------------


def test_with_the_pods_counter_tick_noise_moves_nothing_and_a_step_shows_in_one_interval() -> None:
    w = FastWindow(0.15, 1.0)
    t, be, pods, seen = 0.0, 10.0, 30.0, []
    for i in range(30):  # 50 ms samples: /proc/stat reads a steady 1.2 cores as 0.8 and 1.6 by turns
        got = w.add(t, 0.05, 0.8 if i % 2 else 1.6, be, pods)
        if got is not None:
            seen.append(got)
        t, be, pods = t + 0.05, be + 0.025, pods + 0.05  # BE 0.5 core, the pods 1.0 (LS 0.5)
    # before FAST_WINDOW of /proc/stat is in, /proc/stat alone over what there is (as without
    # the pods counter); from then on, the pods' LS 0.5 plus what is outside (1.2 - 1.0), averaged
    late = [u.non_be for u in seen[5:]]
    assert max(late) - min(late) <= 0.1 and all(abs(v - 0.7) <= 0.1 for v in late)
    assert all(u.be == pytest.approx(0.5) for u in seen)
    # LS steps up by a whole core at the start of an interval: the next sample shows all of it;
    # over FAST_WINDOW (what a raise's hold counts) a third of it
    got = w.add(t, 0.05, 2.2, be, pods + 0.05)
    assert got is not None and got.be == pytest.approx(0.5)
    assert got.non_be == pytest.approx(late[-1] + 1.0, abs=0.1)
    assert got.held == pytest.approx(late[-1] + 1.0 / 3, abs=0.1)


def test_the_pods_counter_waits_for_a_span_of_proc_stat_and_both_readings() -> None:
    w = FastWindow(0.5, 1.0)  # quarter-second samples: exact in binary
    w.add(0.0, 0.0, 0.0, 0.0, 0.0)
    # /proc/stat says 3 cores, the pods 1: not a span of /proc/stat yet, /proc/stat alone
    assert w.add(0.25, 0.25, 3.0, 0.0, 0.25) == FastUsage(0.0, 3.0, 3.0)
    # a span in: the pods over the last interval (2 cores) and over the span (1.5), the rest
    # over the span (3 - 1.5)
    fine = w.add(0.5, 0.25, 3.0, 0.0, 0.75)
    assert fine is not None and (fine.non_be, fine.held) == pytest.approx((3.5, 3.0))
    assert w.add(0.75, 0.25, 3.0, 0.0, None) == FastUsage(0.0, 3.0, 3.0)  # the pods unread now: /proc/stat
    # the reading before lacks it: /proc/stat; the one after has both ends again
    assert w.add(1.0, 0.25, 3.0, 0.0, 1.25) == FastUsage(0.0, 3.0, 3.0)
    fine = w.add(1.25, 0.25, 3.0, 0.0, 1.5)
    # the pods over the last interval: 1 core, and over the span from the newest reading of
    # them a span old (0.5; 0.75 has none): 1 core; the rest from the oldest reading of the
    # pods kept (0.25; 0.0 is more than the outside span old): (3.0 - 1.25) / 1.0
    assert fine is not None and (fine.non_be, fine.held) == pytest.approx((1.0 + 1.75, 1.0 + 1.75))


def test_a_followed_rise_takes_what_runs_outside_the_pods_as_it_stood_when_the_rise_began() -> None:
    """Outside the pods is measured over a second: a burst there enters that window a sample
    at a time. Followed, that ramp would refine a cut at every sample; the pods' part still
    sharpens with each."""
    w = FastWindow(0.25, 1.0)  # quarter-second samples: exact in binary
    for k in range(5):  # the node 1 core busy, all of it in the pods (BE none)
        w.add(0.25 * k, 0.25, 1.0, 0.0, 0.25 * k)
    # from the sample at 1.0 on: the pods 2 cores (LS up by one), outside the pods a core
    for k, ramp in ((1, 0.25), (2, 0.5), (3, 0.75)):
        plain = w.add(1.0 + 0.25 * k, 0.25, 3.0, 0.0, 1.0 + 0.5 * k)
        assert plain is not None and plain.non_be == pytest.approx(2.0 + ramp)  # the outside second fills
        followed = w.since(1.0)
        assert followed is not None and followed.non_be == pytest.approx(2.0)  # as it stood at 1.0: none


def test_the_pods_counter_counts_be_once_and_never_below_zero() -> None:
    w = FastWindow(0.1, 1.0)
    w.add(0.0, 0.0, 2.0, 0.0, 0.0)
    w.add(0.1, 0.1, 2.0, 0.2, 0.2)  # BE is all the pods use
    got = w.add(0.2, 0.1, 2.0, 0.4, 0.4)
    assert got is not None and (got.be, got.non_be) == pytest.approx((2.0, 0.0))  # no LS, nothing outside
    got = w.add(0.3, 0.1, 2.0, 0.6, 0.5)  # the pods' counter read before BE's moved: not negative
    assert got is not None and got.be == pytest.approx(2.0) and got.non_be >= 0.0


# the manager, scripted ------------------------------------------------------------------------


def test_proc_stat_tick_noise_alone_writes_nothing(tmp_path: Path) -> None:
    """LS steady at 0.6 core, /proc/stat reading the node 0.4 core off by turns: the pods'
    counter does not move, so neither does BE's limit."""
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    s.ls = 0.6
    mgr.round()
    s.advance(1.0)
    mgr.round()
    assert mgr.limiter.current == pytest.approx(0.7)  # 2 x 65 % - 0.6
    writes = mgr.limiter.writes
    real = s.fast
    turn = [0]

    def noisy(sums: Sequence[Sequence[str]] = ()) -> object:
        turn[0] += 1
        f = real(sums)
        return replace(f, cpu_busy_cores=f.cpu_busy_cores + (0.4 if turn[0] % 2 else -0.4))

    s.fast = noisy  # type: ignore[method-assign,assignment]
    for i in range(400):  # 20 s of 50 ms samples, a full round every second
        s.advance(0.05)
        mgr.round() if i % 20 == 0 else mgr.fast_round()
    assert mgr.limiter.writes == writes


def settle(mgr: QoSManager, s: Script) -> None:
    """A full round, then a span of fast samples: the pods' counter is read over the last interval."""
    mgr.round()
    for _ in range(4):
        s.advance(0.05)
        mgr.fast_round()


def test_a_spike_is_cut_by_the_first_sample_that_lies_inside_it(tmp_path: Path) -> None:
    _, _, mgr, s, quota = node_with_pods(tmp_path)
    mgr.round()
    for _ in range(4):  # a span of fast samples: the pods' counter is read over the last interval
        s.advance(0.05)
        mgr.fast_round()
    assert quota.read_text() == "100000"
    s.ls, s.be = 1.0, 1.0  # LS spins a core
    s.advance(0.05)
    assert mgr.fast_round() is True  # the rise seen: followed; this sample straddles its start
    assert quota.read_text() == "100000"
    s.advance(FAST_FOLLOW)
    assert mgr.fast_round() is True
    assert int(quota.read_text()) == pytest.approx(30000, abs=10)  # 2 x 65 % - 1.0, from one short interval


def test_a_rise_is_sized_by_what_ls_waits_for_too_where_its_pods_have_psi(tmp_path: Path) -> None:
    """Under contention LS uses only part of what it asks for: its pods' PSI ``some`` since the
    rise began counts too, so the cut leaves LS what it needs, not what BE let it have."""
    node, _, mgr, s, quota = node_with_pods(tmp_path)
    mgr.pods.pressure_path = lambda group: f"/psi/{group}/cpu.pressure"  # as on v2 or a hybrid host
    node.model.pod_seen(make_pod(4, "LS", parent="/kubepods/burstable/pod4"))
    settle(mgr, s)
    s.ls, s.ls_wait, s.be = 0.8, 0.2, 1.2  # LS asks for a core, gets 0.8 of it while BE runs
    s.advance(0.05)
    assert mgr.fast_round() is True  # the rise seen: followed; its waits counted from here
    s.advance(FAST_FOLLOW)
    assert mgr.fast_round() is True
    assert int(quota.read_text()) == pytest.approx(30000, abs=10)  # 2 x 65 % - (0.8 + 0.2)


def test_without_psi_files_a_rise_is_sized_by_use_alone(tmp_path: Path) -> None:
    _, _, mgr, s, quota = node_with_pods(tmp_path)
    settle(mgr, s)
    s.ls, s.ls_wait, s.be = 0.8, 0.2, 1.2
    s.advance(0.05)
    assert mgr.fast_round() is True
    s.advance(FAST_FOLLOW)
    assert mgr.fast_round() is True
    assert int(quota.read_text()) == pytest.approx(50000, abs=10)  # 2 x 65 % - 0.8: use alone


# the loop ---------------------------------------------------------------------------------------


def run_loop(mgr: QoSManager, turns: int, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Run the manager's loop for ``turns`` waits, recording each wait instead of sleeping."""
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) >= turns:
            raise asyncio.CancelledError
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)  # the manager's module sees the same asyncio
    mgr.psi_path = None  # no trigger: the loop's plain wait

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await mgr.run()

    asyncio.run(main())
    return waits


def test_a_rise_brings_the_next_sample_forward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, mgr, _, _ = node_with_pods(tmp_path)
    rises = iter([False, True, True, False, False])
    mgr.fast_round = lambda: next(rises)  # type: ignore[method-assign]
    assert run_loop(mgr, 5, monkeypatch) == [FAST_PERIOD, FAST_FOLLOW, FAST_FOLLOW, FAST_PERIOD, FAST_PERIOD]


def run_timed(
    mgr: QoSManager, s: Script, turns: int, at: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> list[float]:
    """Run the manager's loop for ``turns`` waits, each advancing the script's clock by as
    much; ``at(n)`` changes the load after the n-th wait."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        at(len(waits))
        if len(waits) >= turns:
            raise asyncio.CancelledError
        s.advance(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    mgr.psi_path = None

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await mgr.run()

    asyncio.run(main())
    return waits


def test_a_rise_is_measured_first_a_follow_period_after_then_sooner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first sample that measures a rise lies a whole FAST_FOLLOW inside it; the next ones,
    each measuring from the rise's start over a longer interval, come every FAST_REFINE."""
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    mgr.round()

    def at(n: int) -> None:
        if n == 4:
            s.ls, s.be = 1.0, 1.0  # LS spins a core

    waits = run_timed(mgr, s, 9, at, monkeypatch)
    assert waits[3:8] == [FAST_PERIOD, FAST_FOLLOW, FAST_REFINE, FAST_REFINE, FAST_REFINE]


def test_while_be_runs_next_to_nothing_the_fast_path_samples_slower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BE idle takes no CPU from LS: FAST_IDLE between samples; BE busy again: FAST_PERIOD."""
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    s.be = 0.0
    mgr.round()

    def at(n: int) -> None:
        if n == 6:
            s.be = 1.5  # BE wakes

    waits = run_timed(mgr, s, 9, at, monkeypatch)
    assert FAST_IDLE in waits[:6] and waits[5] == FAST_IDLE
    assert waits[-2:] == [FAST_PERIOD, FAST_PERIOD]  # seen at the next sample: back to the fast period


def test_a_full_rounds_turn_samples_the_fast_path_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    order: list[str] = []
    real_round = mgr.round_async

    async def full() -> None:
        order.append("round")
        await real_round()

    def fast() -> bool:
        order.append("fast")
        return False

    mgr.round_async = full  # type: ignore[method-assign]
    mgr.fast_round = fast  # type: ignore[method-assign]
    run_loop(mgr, 3, monkeypatch)
    assert order[:2] == ["round", "fast"] and s.rounds == 1  # the first turn: a full round, then a sample


# the real collector on fake trees ---------------------------------------------------------------


def manager_on(
    root: Path, proc: Path, counters: Callable[[str, int], None]
) -> tuple[QoSManager, Collector, list[float], Path]:
    """An LS pod and a BE pod on the tree ``root``, the real collector reading it and ``proc``."""
    be, ls = make_pod(1, "BE"), make_pod(2, "LS")
    ctrs = [make_container(1, be, shares=2), make_container(2, ls)]
    rules = RuleCache(seed_policy())
    node = Node.create(rules, caps=caps(), cgroups=Cgroups(root))
    for c in ctrs:
        counters(c.linux.cgroups_path.lstrip("/"), 0)
    for pod, c in ((be, ctrs[0]), (ls, ctrs[1])):
        node.model.container_started(pod, c)
    clock = [1000.0]
    col = Collector(node.model, node.desired, Cgroups(root), proc, clock=lambda: clock[0], memory_every=1)
    rec = Reconciler(node.desired, node.writer, node.model, watch=False, resync_period=3600)
    return QoSManager(node.model, node.desired, rec, col, rules, psi_path=None), col, clock, root


def spike_on(tmp_path: Path, counters: Callable[[str, int], None], root: Path, quota: Callable[[], str]) -> None:
    """BE spinning 2 cores, LS idle; /proc/stat reading the node 0.2 core off by turns. Then LS
    takes one of BE's cores: the first fast sample after it cuts BE to 2 x 65 % - 1."""
    proc = tmp_path / "proc"
    mgr, col, clock, _ = manager_on(root, proc, counters)
    ns = {"kubepods": 0, BE_GROUP: 0}
    busy = [0]

    def advance(dt: float, be: float, ls: float, noise: int) -> None:
        clock[0] += dt
        ns[BE_GROUP] += int(be * dt * 1e9)
        ns["kubepods"] += int((be + ls) * dt * 1e9)
        busy[0] += int((be + ls) * dt * 100) + noise  # ticks of 10 ms
        for g, v in ns.items():
            counters(g, v)
        proc_tree(proc, busy=busy[0], idle=10**6)

    advance(0.0, 0, 0, 0)
    mgr.round()
    advance(1.0, 2.0, 0.0, 0)
    mgr.round()
    held = quota()
    for i in range(30):  # 1.5 s of fast samples under /proc/stat's noise: nothing moves
        advance(0.05, 2.0, 0.0, 2 if i % 2 else -2)
        assert mgr.fast_round() is False
    assert quota() == held
    advance(0.05, 1.0, 1.0, 0)
    assert mgr.fast_round() is True  # the rise seen: followed
    advance(FAST_FOLLOW, 1.0, 1.0, 0)
    assert mgr.fast_round() is True
    assert int(quota()) == pytest.approx(30000, abs=10)
    col.close()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_spike_is_cut_from_the_pods_roots_counter(tmp_path: Path, version: str) -> None:
    """v1: ``cpuacct.usage``; v2: ``cpu.stat`` ``usage_usec``."""
    groups = ["kubepods/besteffort", "kubepods/burstable"]
    root = (v1_tree if version == "v1" else v2_tree)(tmp_path / "cg", groups)
    if version == "v1":
        quota = root / "cpu" / BE_GROUP / "cpu.cfs_quota_us"
        spike_on(tmp_path, lambda g, ns: v1_counters(root, g, usage_ns=ns), root, lambda: quota.read_text().strip())
    else:
        cpu_max = root / BE_GROUP / "cpu.max"
        spike_on(
            tmp_path, lambda g, ns: v2_counters(root, g, usage_ns=ns), root, lambda: cpu_max.read_text().split()[0]
        )


def test_a_hold_counts_the_fast_paths_longer_window_not_its_short_peak() -> None:
    lim = Limiter(deadband=0.2, relax_hold=2.0)
    assert lim.step(0.0, 1.0) == 1.0
    assert lim.step(1.0, 1.5) is None  # a raise held from here
    # a fast sample: its last interval allows 1.0 (within the deadband: no cut), its longer
    # window 1.3: the hold counts 1.3
    assert lim.step(1.5, 1.0, tighten_only=True, held=1.3) is None
    assert lim.step(3.0, 1.5) == pytest.approx(1.3)
    # a short peak past the deadband cuts at once
    assert lim.step(3.5, 0.5, tighten_only=True, held=1.0) == 0.5


def test_a_rise_that_begins_inside_a_followed_one_is_measured_from_where_it_began(tmp_path: Path) -> None:
    """A small rise is being followed when LS spins a core: from the sample that shows that,
    the rise is measured from the sample before it, not from the small one's start."""
    _, _, mgr, s, quota = node_with_pods(tmp_path)
    settle(mgr, s)
    s.ls, s.be = 0.3, 1.7  # a small rise: followed from here
    s.advance(0.05)
    assert mgr.fast_round() is True
    s.advance(FAST_FOLLOW)
    assert mgr.fast_round() is True  # 2 x 65 % - 0.3 = 1.0: within the deadband, nothing cut
    s.ls, s.be = 1.0, 1.0  # LS spins a core
    s.advance(FAST_REFINE)
    assert mgr.fast_round() is True  # measured from the small rise's start: 0.58
    s.advance(FAST_FOLLOW)
    assert mgr.fast_round() is True  # measured from the sample before the spike: 1.0
    assert int(quota.read_text()) == pytest.approx(30000, abs=10)  # 2 x 65 % - 1.0


def test_a_raise_waits_while_rises_keep_coming() -> None:
    """A noisy LS load rises again and again: each rise the fast path follows restarts a
    raise's hold, so BE stays where the rises cut it until they stop."""
    lim = Limiter(deadband=0.2, relax_hold=2.0)
    assert lim.step(0.0, 0.6) == 0.6  # cut for a rise
    for i in range(1, 41):  # 4 s of samples wanting more, a rise every 0.5 s
        t = 0.1 * i
        if i % 5 == 0:
            lim.rising(t)
        assert lim.step(t, 1.2) is None
    raised = [t for i in range(41, 70) if lim.step(t := 0.1 * i, 1.2) is not None]
    assert raised and raised[0] == pytest.approx(4.0 + 2.0)  # the hold counted from the last rise


def test_a_noisy_ls_load_is_not_given_back_between_its_peaks(tmp_path: Path) -> None:
    """LS spinning in short chunks: each a rise the fast path follows and cuts for, the full
    rounds between them seeing LS idle, the fast path's longer window a fraction of a core.
    BE's limit is raised only once the chunks stop: a raise between them would be undone by
    the next one."""
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    settle(mgr, s)
    t0, limits = s.t, []

    def run(until: float, chunks: bool) -> None:
        while s.t - t0 < until:
            busy = chunks and (s.t - t0 + 0.25) % 0.5 < 0.1  # 100 ms of a core every 500 ms, between rounds
            s.ls, s.be = (1.0, 1.0) if busy else (0.0, 2.0)
            s.advance(0.03)
            mgr.round() if int((s.t - t0) / 1.0) != int((s.t - t0 - 0.03) / 1.0) else mgr.fast_round()
            limits.append(mgr.limiter.current)

    run(8.0, chunks=True)
    cut = min(x for x in limits if x is not None)
    first = next(i for i, x in enumerate(limits) if x is not None and x < cut + 0.01)
    held = [x for x in limits[first:] if x is not None]
    assert cut < 0.5 and max(held) < cut + 0.01  # cut at the first chunk, held through the rest
    run(14.0, chunks=False)
    assert mgr.limiter.current is not None and mgr.limiter.current > cut + 0.2  # given back once they stop


def test_a_cut_made_for_a_rise_is_refined_as_the_rise_is_measured_more_exactly(tmp_path: Path) -> None:
    _, _, mgr, s, quota = node_with_pods(tmp_path)
    settle(mgr, s)
    writes = mgr.limiter.writes
    s.ls, s.be = 0.6, 1.4
    s.advance(0.05)
    assert mgr.fast_round() is True  # a rise, followed
    s.advance(FAST_FOLLOW)  # measured roughly at first: 2 x 65 % - 0.6 = 0.7, cut
    assert mgr.fast_round() is True
    assert int(quota.read_text()) == pytest.approx(70000, abs=10)
    s.ls, s.be = 0.8, 1.2  # more exactly since the rise: (0.6 + 0.8) / 2 -> 0.6, within the deadband of 0.7
    s.advance(FAST_FOLLOW)
    assert mgr.fast_round() is True
    assert int(quota.read_text()) == pytest.approx(60000, abs=10)  # refined: more than REFINE_CORES below
    assert mgr.limiter.writes == writes + 2
    while mgr.fast_round():  # the rest of the rise's window: the measure since it nears 0.8
        s.advance(FAST_FOLLOW)
    # followed down in steps of at least REFINE_CORES, toward 2 x 65 % - 0.8
    assert 50000 <= int(quota.read_text()) <= 60000
    assert mgr.limiter.writes <= writes + 2 + round(FAST_WINDOW / FAST_FOLLOW)
    s.advance(0.05)
    assert mgr.fast_round() is False  # no longer followed: the policy's deadband again
    writes = mgr.limiter.writes
    s.ls, s.be = 0.9, 1.1  # 0.4 allowed: more than REFINE_CORES below, within the deadband
    s.advance(0.05)
    mgr.fast_round()
    assert mgr.limiter.writes == writes


def test_a_rise_that_cut_nothing_is_not_refined(tmp_path: Path) -> None:
    """A noisy load: the limit already holds its peaks, a rise cuts nothing, and what follows
    the rise moves the limit only past the policy's deadband."""
    _, _, mgr, s, quota = node_with_pods(tmp_path)
    s.ls, s.be = 0.75, 1.25
    mgr.round()
    s.advance(1.0)
    mgr.round()  # 2 x 65 % - 0.75
    for _ in range(4):
        s.advance(0.05)
        mgr.fast_round()
    assert int(quota.read_text()) == pytest.approx(55000, abs=10)
    s.ls, s.be = 0.3, 1.7  # LS idles: a fall, nothing cut
    s.advance(0.05)
    mgr.fast_round()
    writes = mgr.limiter.writes
    s.ls, s.be = 0.5, 1.5  # a rise: 0.8 allowed, above the limit: nothing cut
    s.advance(0.05)
    assert mgr.fast_round() is True
    s.ls, s.be = 0.9, 1.1  # measured since: 0.4, more than REFINE_CORES below 0.55, not the deadband
    s.advance(FAST_FOLLOW)
    assert mgr.fast_round() is True
    assert mgr.limiter.writes == writes


# what a round reads -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "waits"),
    [
        ({}, False),  # BE runs SCHED_IDLE: CPUEvict evicts on no stall
        ({"beProcess": {"schedIdle": False}}, True),
        ({"beProcess": {"schedIdle": False}, "qosManager": {"cpuEvict": {"enabled": False}}}, False),
    ],
)
def test_a_round_reads_ls_waits_only_when_cpu_evict_decides_on_them(
    tmp_path: Path, policy: dict[str, object], waits: bool
) -> None:
    _, _, mgr, s, _ = node_with_pods(tmp_path, Policy.model_validate(policy))
    mgr.round()
    assert s.ls_waits is waits
    asyncio.run(mgr.round_async())
    assert s.ls_waits is waits


def test_without_ls_waits_a_round_reads_no_ls_pressure(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", ["kubepods/besteffort", "kubepods/burstable"])
    proc = proc_tree(tmp_path / "proc")
    _, col, clock, _ = manager_on(root, proc, lambda g, ns: v2_counters(root, g, usage_ns=ns, cpu_some_us=ns // 1000))
    col.sample(ls_waits=False)
    clock[0] += 1.0
    assert col.sample(ls_waits=False).usage("LS").stall_ratio is None
    clock[0] += 1.0
    col.sample()
    clock[0] += 1.0
    assert col.sample().usage("LS").stall_ratio == 0.0  # read: no wait meanwhile
    col.close()
