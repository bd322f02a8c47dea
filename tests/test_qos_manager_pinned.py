"""The QoS manager's loop and rounds pinned: a full round at once and then every syncPeriod, fast
rounds in between, a wake-up brings the next full round forward, a failing round does not end
the loop; the fast path decides only on a jump of non-BE usage; a strategy that needs the
node's capacity stands down (said once) without NodeQOSResource; the policy's pressure
settings apply at the next round."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nriplugin.policy.model import PLUGINS, Policy
from nriplugin.qos.levels import Level, Thresholds
from nriplugin.qos.manager import (
    FAST_BE_BUSY,
    FAST_FOLLOW,
    FAST_IDLE,
    FAST_JUMP,
    FAST_OUTSIDE,
    FAST_PERIOD,
    FAST_REFINE,
    FAST_RESTART,
    FAST_WINDOW,
    HISTORY,
    QoSManager,
)
from nriplugin.qos.sample import NodeSample
from nriplugin.qos.strategy import Round
from tests.test_qos_manager import BE_GROUP, Script, node_with_pods


@dataclass
class Hook:
    """The eviction machinery as the manager drives it."""

    calls: list[str] = field(default_factory=list)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")

    def cpu_round(self, r: Round) -> None:
        self.calls.append("cpu")

    def memory_round(self, r: Round) -> None:
        self.calls.append("memory")


@dataclass
class Seen:
    rounds: list[tuple[float, float]] = field(default_factory=list)
    scored: list[tuple[float, str, float, str]] = field(default_factory=list)
    limits: list[float] = field(default_factory=list)

    def round_done(self, seconds: float, collect_seconds: float) -> None:
        self.rounds.append((seconds, collect_seconds))

    def scores(self, cpu: float, cpu_level: str, memory: float, memory_level: str) -> None:
        self.scored.append((cpu, cpu_level, memory, memory_level))

    def be_limit(self, cores: float) -> None:
        self.limits.append(cores)

    def suppressed(self, reason: str) -> None:
        pass

    def burst(self, granted: bool) -> None:
        pass

    def birth_lift(self, seconds: float | None) -> None:
        pass


def test_constants() -> None:
    assert (FAST_PERIOD, FAST_FOLLOW, FAST_JUMP, FAST_WINDOW, FAST_OUTSIDE, HISTORY) == (
        0.03,
        0.03,
        0.15,
        0.15,
        1.0,
        300.0,
    )
    assert (FAST_IDLE, FAST_BE_BUSY, FAST_REFINE, FAST_RESTART) == (0.25, 0.05, 0.02, 0.3)


def test_a_new_manager_starts_low_with_the_policys_assessors(tmp_path: Path) -> None:
    p = Policy.model_validate({"qosManager": {"cpuPressure": {"hysteresis": 7}, "memoryPressure": {"fallTime": 9}}})
    _, _, mgr, _, _ = node_with_pods(tmp_path, p)
    assert (mgr.level, mgr.ratio, mgr.last, mgr.groups) == (Level.LOW, 1.0, None, [])
    assert mgr.cpu.hysteresis == 7 and mgr.memory.fall_time == 9
    assert mgr.memory.thresholds == Thresholds(50, 70, 80, 90)
    assert mgr.trends.rss.window == HISTORY
    assert mgr.decisions.maxlen == 50
    assert [s.name for s in mgr.strategies] == list(PLUGINS)
    assert mgr.limiter is mgr.strategies[3].limiter  # type: ignore[attr-defined]
    assert mgr.burster is mgr.strategies[2].burster  # type: ignore[attr-defined]


def test_a_round_assesses_reports_and_sets_the_ratio(tmp_path: Path) -> None:
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    seen = Seen()
    mgr.observer = seen
    s.ls, s.be = 1.0, 1.0  # LS at its request on 2 CPUs: node 20, ls 30, load 5 (BE out) = 55
    mgr.round()
    assert mgr.last is not None and mgr.groups == [BE_GROUP]
    assert mgr.level is Level.MEDIUM and mgr.ratio == 0.8
    cpu, cpu_level, mem, mem_level = seen.scored[-1]
    assert cpu == pytest.approx(55.0) and cpu_level == "MEDIUM"
    assert mem == pytest.approx(0.35 * 25) and mem_level == "LOW"
    assert len(seen.rounds) == 1 and seen.rounds[0][1] == 0.0 and seen.rounds[0][0] >= 0


def test_a_reload_applies_the_new_pressure_settings_at_the_next_round(tmp_path: Path) -> None:
    node, _, mgr, s, _ = node_with_pods(tmp_path)
    s.ls, s.be = 1.0, 1.0
    mgr.round()
    assert mgr.level is Level.MEDIUM
    p = Policy.model_validate({"qosManager": {"cpuPressure": {"low": 10, "medium": 20, "high": 50, "critical": 95}}})
    node.rules.set(p, "test")
    s.advance(1.0)
    mgr.round()
    assert (mgr.level, mgr.ratio) == (Level.CRITICAL, 0.3)  # 55 is past the new high boundary, 50
    assert mgr.cpu.thresholds == Thresholds(10, 20, 50, 95)


def test_the_fast_path_decides_only_on_a_jump(tmp_path: Path) -> None:
    _, _, mgr, s, quota = node_with_pods(tmp_path)
    assert mgr.fast_round() is False  # no round yet: nothing read
    assert s.fast_reads == []
    mgr.round()
    assert quota.read_text() == "100000"
    s.advance(0.1)
    assert mgr.fast_round() is False  # the baseline of BE's and the pods' counters
    assert len(s.fast_reads) == 1
    s.advance(0.1)
    mgr.fast_round()  # the pods' counter read over FAST_WINDOW: the last interval is what the pods use
    writes = mgr.limiter.writes
    s.ls = 0.125  # non-BE up by 0.125 core: less than FAST_JUMP
    s.advance(0.1)
    assert mgr.fast_round() is False
    assert mgr.limiter.writes == writes
    s.ls = 1.25  # a jump: a rise, followed; its first sample straddles its start: no decision
    s.advance(0.1)
    assert mgr.fast_round() is True
    assert mgr.limiter.writes == writes
    s.advance(0.1)  # the rise measured inside it: 2 x 65 % - 1.25 = 0.05 -> floor 0.1
    assert mgr.fast_round() is True
    assert quota.read_text() == "10000"
    s.advance(0.1)
    assert mgr.fast_round() is False  # FAST_WINDOW since the rise; no change since the last decision
    assert mgr.limiter.writes == writes + 1
    s.ls = 0.0
    s.advance(0.1)
    assert mgr.fast_round() is False  # a fall is decided on too (it cuts nothing), but is no rise
    assert mgr._non_be == 0.0


def test_without_the_pods_counter_the_fast_path_reads_proc_stat_over_its_window(tmp_path: Path) -> None:
    _, _, mgr, s, quota = node_with_pods(tmp_path)
    s.pods_counter = False
    mgr.round()
    s.advance(0.1)
    mgr.fast_round()  # the baseline of BE's counter
    writes = mgr.limiter.writes
    s.ls = 0.125
    s.advance(0.1)
    mgr.fast_round()
    s.ls = 1.25  # a jump: 0.2 s window, (0.125 + 1.25) / 2 = 0.6875: a rise, followed
    s.advance(0.1)
    assert mgr.fast_round() is True
    s.advance(0.02)  # the window from 0.22 s back: (0.125 x 0.1 + 1.25 x 0.12) / 0.22 = 0.7386
    assert mgr.fast_round() is True
    assert quota.read_text() == "56136"  # 2 x 65 % - 0.7386: what /proc/stat's window has seen of it
    assert mgr.limiter.writes == writes + 1


def test_the_fast_path_waits_for_be_groups_and_a_readable_counter(tmp_path: Path) -> None:
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    mgr.round()
    mgr.groups = []
    s.advance(0.1)
    mgr.fast_round()
    assert s.fast_reads == []  # no BE group: nothing to read
    mgr.groups = [BE_GROUP, "kubepods.slice/kubepods-besteffort.slice"]
    readings = iter([1.0, 2.0, None, 3.0, 4.0])
    s.group_cpu_seconds = lambda group: None if "/" not in group else next(readings)  # type: ignore[method-assign]
    s.advance(0.1)
    mgr.fast_round()  # 1 + 2: a baseline
    s.ls = 1.5
    s.advance(0.1)
    mgr.fast_round()  # one group unreadable: no rate, no decision
    assert mgr.limiter.writes == 1


def test_a_disabled_manager_does_nothing_between_rounds(tmp_path: Path) -> None:
    node, _, mgr, s, _ = node_with_pods(tmp_path)
    mgr.round()
    node.rules.set(Policy.model_validate({"qosManager": {"enable": False}}), "test")
    s.advance(0.1)
    mgr.fast_round()
    assert s.fast_reads == []


def test_without_node_qos_resource_the_capacity_strategies_stand_down_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugins = [p for p in PLUGINS if p != "NodeQOSResource"]
    node, _, mgr, s, quota = node_with_pods(tmp_path)
    mgr.round()
    assert quota.read_text() == "100000"
    node.rules.set(Policy.model_validate({"qosManager": {"plugins": plugins}}), "test")
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        for _ in range(3):
            s.advance(1.0)
            mgr.round()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("NodeQOSResource is off")]
    assert said == ["NodeQOSResource is off: without the node's capacity CPUBurst, CPUSuppress, CPUEvict do not run"]
    assert quota.read_text() == "-1"  # CPUSuppress withdrew its limit
    assert "QoS overlays withdrawn (CPUSuppress): CPUSuppress needs the node's capacity" in caplog.text
    node.rules.set(Policy(), "test")  # back, then off again: said again
    s.advance(1.0)
    mgr.round()
    node.rules.set(Policy.model_validate({"qosManager": {"plugins": plugins}}), "test")
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        s.advance(1.0)
        mgr.round()
    again = [r for r in caplog.records if r.getMessage().startswith("NodeQOSResource is off")]
    assert len(again) == 2


def test_a_plugin_left_out_is_off_and_its_overlays_withdrawn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node, _, mgr, s, quota = node_with_pods(tmp_path)
    mgr.round()
    node.rules.set(Policy.model_validate({"qosManager": {"plugins": ["NodeQOSResource"]}}), "test")
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        s.advance(1.0)
        mgr.round()
    assert quota.read_text() == "-1"
    assert "QoS overlays withdrawn (CPUSuppress): CPUSuppress is off" in caplog.messages  # said whole


def test_eviction_is_driven_each_round(tmp_path: Path) -> None:
    _, _, mgr, _, _ = node_with_pods(tmp_path)
    hook = Hook()
    mgr.eviction = hook
    mgr.round()
    assert hook.calls == ["cpu", "memory"]


def test_withdraw_all_goes_last_strategy_first(tmp_path: Path) -> None:
    _, _, mgr, _, _ = node_with_pods(tmp_path)
    order: list[str] = []

    def recorder(name: str) -> Callable[[float, str], bool]:
        def off(t: float, why: str) -> bool:
            order.append(name)
            return False

        return off

    for strat in mgr.strategies:
        strat.off = recorder(strat.name)  # type: ignore[method-assign,assignment]
    mgr.withdraw_all("off")
    assert order == list(reversed(PLUGINS))


def test_the_loop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A full round at once, fast rounds meanwhile; a wake-up brings one forward; a failing
    round is logged and the loop goes on; stop ends it and stops the eviction machinery."""
    p = Policy.model_validate({"qosManager": {"syncPeriod": 60}})
    _, _, mgr, s, _ = node_with_pods(tmp_path, p)
    mgr.psi_path = str(tmp_path / "no-psi")
    hook = Hook()
    mgr.eviction = hook

    async def until(cond: object, limit: float = 3.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + limit
        while not cond() and loop.time() < end:  # type: ignore[operator]
            await asyncio.sleep(0.01)

    mgr.round()  # a round that fails fails here, not as a loop that waits for it
    s.rounds = 0
    hook.calls.clear()

    async def main() -> None:
        mgr.start(asyncio.get_running_loop())
        try:
            assert hook.calls == ["start"]
            await until(lambda: len(s.fast_reads) >= 3)
            assert s.rounds == 1 and len(s.fast_reads) >= 3  # fast rounds, no second full one
            mgr._wake.set()
            await until(lambda: s.rounds == 2)
            reads = len(s.fast_reads)
            await until(lambda: len(s.fast_reads) >= reads + 2)
            assert s.rounds == 2  # the wake-up was taken once
            real = s.sample
            failed: list[int] = []

            def fail(be_groups: object = (), ls_waits: bool = True) -> NodeSample:
                failed.append(1)
                raise RuntimeError("boom")

            s.sample = fail  # type: ignore[method-assign]
            mgr._wake.set()
            await until(lambda: bool(failed))
            s.sample = real  # type: ignore[method-assign]
            mgr._wake.set()
            await until(lambda: s.rounds == 3)
            assert s.rounds == 3  # the loop went on
        finally:
            mgr.stop()
        assert mgr._task is not None
        await asyncio.sleep(0)
        assert mgr._task.done()
        assert hook.calls[-1] == "stop" and mgr.ls_pressure is None and mgr._trigger is None

    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        asyncio.run(main())
    assert "QoS round failed; trying again next round" in caplog.text
    assert "no PSI trigger (" in caplog.text and "the 30 ms fast path carries the reaction" in caplog.text


def test_stop_before_start_is_harmless(tmp_path: Path) -> None:
    _, _, mgr, _, _ = node_with_pods(tmp_path)
    mgr.stop()
    assert mgr.ls_pressure is None


def test_the_sync_period_is_the_policys(tmp_path: Path) -> None:
    p = Policy.model_validate({"qosManager": {"syncPeriod": 2.5}})
    _, _, mgr, _, _ = node_with_pods(tmp_path, p)
    assert mgr._sync_period() == 2.5


def test_a_script_is_a_collector() -> None:
    assert Script().pressure_path("g") is None


def test_pod_groups_follow_pods_as_they_come_and_go(tmp_path: Path) -> None:
    from nriplugin.qos.manager import PodGroups
    from testkit.runtime_peer import make_pod

    node, _, _, _, _ = node_with_pods(tmp_path)
    pods = PodGroups(node.model, node.desired, lambda g: f"/psi/{g}")
    assert pods.refresh() is True  # the pods already known are taken in
    assert pods.be() == [BE_GROUP] and pods.ls() == {"/psi/kubepods/burstable/pod2"}
    assert pods.moved() is False and pods.refresh() is False
    node.model.pod_seen(make_pod(5, "BE", parent="/kubepods/besteffort/pod5"))  # a new pod, same group
    assert pods.refresh() is True
    assert pods.be() == [BE_GROUP]
    node.model.pod_seen(make_pod(6, "BE", parent="/kubepods/burstable/pod6"))  # not kubelet's BE group
    node.model.pod_seen(make_pod(7, None, parent="/kubepods/besteffort/pod7"))  # BE by its parent
    node.model.pod_seen(make_pod(8, "SYSTEM", parent="/system/pod8"))
    assert pods.refresh() is True and pods.be() == [BE_GROUP]
    node.model.pod_removed(make_pod(8, "SYSTEM").id)  # neither BE's group nor LS's
    assert pods.moved() is False
    node.model.pod_removed(make_pod(2, "LS").id)
    assert pods.moved() is True and pods.ls() == set()
    pods.removed("not-a-pod")
    assert pods.moved() is False
    node.model.pod_seen(make_pod(9, "LS", parent="/kubepods/burstable/pod9"))
    assert asyncio.run(pods.refresh_async()) is True
    assert pods.ls() == {"/psi/kubepods/burstable/pod9"}


def test_without_pressure_files_ls_pods_are_not_watched(tmp_path: Path) -> None:
    from nriplugin.qos.manager import PodGroups

    node, _, _, _, _ = node_with_pods(tmp_path)
    pods = PodGroups(node.model, node.desired)
    assert pods.refresh() is True and pods.ls() == set() and pods.be() == [BE_GROUP]


def test_a_rounds_time_includes_its_collection(tmp_path: Path) -> None:
    from dataclasses import replace

    _, _, mgr, s, _ = node_with_pods(tmp_path)
    seen = Seen()
    mgr.observer = seen
    real = s.sample
    s.sample = lambda be_groups=(), ls_waits=True: replace(real(be_groups), collect_seconds=0.5)  # type: ignore[method-assign]
    mgr.round()
    seconds, collect = seen.rounds[0]
    assert collect == 0.5 and 0.5 <= seconds < 30


def test_ls_pressure_refusals_are_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from nriplugin.kernel.psi_trigger import PressureWatch

    _, _, mgr, _, _ = node_with_pods(tmp_path)
    mgr.watch_ls_pressure()  # not started: nothing to follow
    (tmp_path / "p1").write_text("")
    mgr.pods.pressure_path = lambda g: str(tmp_path / "p1")
    mgr.pods._dirty.update(k for k in mgr.model if k.startswith("pod:"))
    mgr.ls_pressure = PressureWatch()
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        mgr.round()
        mgr.watch_ls_pressure()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no PSI trigger on LS groups")]
    assert len(said) == 1 and str(tmp_path / "p1") in said[0] and said[0].endswith("the fast path carries the reaction")
    mgr.ls_pressure.close()


def test_a_round_hands_its_time_and_scores_on(tmp_path: Path) -> None:
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    rounds: list[Round] = []

    class Recorder(Hook):
        def cpu_round(self, r: Round) -> None:
            rounds.append(r)

    mgr.eviction = Recorder()
    s.ls, s.be = 1.0, 1.0
    s.advance(3.0)
    mgr.round()
    r = rounds[0]
    assert (r.t, r.cpu_score, r.memory_score) == (3.0, mgr.cpu.score, mgr.memory.score)
    assert r.cpu_score == pytest.approx(55.0)


def test_a_falling_load_is_smoothed_across_rounds(tmp_path: Path) -> None:
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    s.ls, s.be = 1.0, 1.0
    mgr.round()
    s.ls = 0.0
    s.advance(1.0)
    mgr.round()
    assert mgr.cpu.score > 30.0  # 55 falling with a 5 s time constant, not the raw score at once


def test_withdrawals_carry_their_time_and_reason(tmp_path: Path) -> None:
    node, _, mgr, s, _ = node_with_pods(tmp_path)
    mgr.round()
    node.rules.set(Policy.model_validate({"qosManager": {"plugins": ["NodeQOSResource"]}}), "test")
    s.advance(1.0)
    mgr.round()
    d = mgr.decisions[-1]
    assert (d.t, d.value, d.why) == (s.t, "withdrawn", "CPUSuppress is off")
    node.rules.set(Policy(), "test")
    s.advance(1.0)
    mgr.round()
    node.rules.set(Policy.model_validate({"qosManager": {"enable": False}}), "test")
    mgr.round()
    d = mgr.decisions[-1]
    assert d.why == "the QoS manager is disabled" and isinstance(d.t, float)


def test_pod_groups_start_as_moved_and_a_be_pod_leaving_moves_them(tmp_path: Path) -> None:
    from nriplugin.node.model import NodeModel
    from nriplugin.qos.manager import PodGroups

    node, _, _, _, _ = node_with_pods(tmp_path)
    empty = PodGroups(NodeModel(), node.desired)
    assert empty.refresh() is True  # the first round takes the groups in, whatever there is
    pods = PodGroups(node.model, node.desired)
    pods.refresh()
    assert pods.moved() is False
    from testkit.runtime_peer import make_pod

    node.model.pod_removed(make_pod(1, "BE").id)
    assert pods.moved() is True and pods.be() == []


# --- the defaults, the fast path's round, the loop with a trigger armed --------------------------


@dataclass
class Between:
    """A strategy that records the fast path's rounds (it runs under the default policy's name)."""

    rounds: list[Round] = field(default_factory=list)
    name = "CPUSuppress"
    needs_capacity = False

    @classmethod
    def runs(cls, cfg: object) -> bool:
        return True

    def decide(self, r: Round) -> None:
        pass

    def between_rounds(self, r: Round) -> None:
        self.rounds.append(r)

    def off(self, t: float, why: str) -> bool:
        return False


def test_a_new_managers_defaults(tmp_path: Path) -> None:
    node, rec, mgr, s, _ = node_with_pods(tmp_path)
    assert mgr.psi_path == "/proc/pressure/cpu" and mgr.eviction is None
    assert mgr._non_be == 0.0  # no decision yet: non-BE usage is measured from nothing
    hook = Hook()
    other = QoSManager(node.model, node.desired, rec, s, node.rules, eviction=hook, psi_path=None)
    assert other.eviction is hook and other.psi_path is None


def fast_scene(tmp_path: Path) -> tuple[QoSManager, Script, Between]:
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    s.be = 0.0  # BE's counter stands still: the fast path's non-BE usage is what LS uses, exactly
    mgr.round()
    between = Between()
    mgr.strategies = (*mgr.strategies, between)  # type: ignore[arg-type]
    s.advance(0.1)
    mgr.fast_round()  # BE's counter: a baseline
    return mgr, s, between


def test_the_fast_path_decides_at_a_jump_of_exactly_fast_jump(tmp_path: Path) -> None:
    mgr, s, between = fast_scene(tmp_path)
    assert mgr._non_be == 0.0
    s.ls = FAST_JUMP
    s.advance(0.1)
    assert mgr.fast_round() is True  # a rise: followed, nothing decided on the sample that first shows it
    assert between.rounds == [] and mgr._non_be == 0.0
    rise = s.t
    s.advance(0.02)
    assert mgr.fast_round() is True  # within FAST_WINDOW of the rise: every sample decides
    (r,) = between.rounds
    assert r.fast is not None and r.fast.be == 0.0 and r.fast.non_be == pytest.approx(FAST_JUMP) and r.fast.rise == rise
    assert r.t == s.t and r.sample is mgr.last
    assert (r.level, r.cpu_score, r.memory_score) == (mgr.level, mgr.cpu.score, mgr.memory.score)
    assert mgr._non_be == pytest.approx(FAST_JUMP)
    s.advance(0.15)
    assert mgr.fast_round() is False  # the rise no longer followed
    assert len(between.rounds) == 1  # the same non-BE usage as at the last decision: nothing


def test_the_fast_path_hands_the_scores_on(tmp_path: Path) -> None:
    mgr, s, between = fast_scene(tmp_path)
    mgr.cpu._score, mgr.memory._score = 61.0, 23.0
    s.ls = 1.0
    s.advance(0.1)
    mgr.fast_round()
    s.advance(0.02)
    mgr.fast_round()
    (r,) = between.rounds
    assert (r.cpu_score, r.memory_score) == (61.0, 23.0)
    assert r.cpu_terms is not None and r.cpu_terms == mgr.cpu_terms  # the last full round's terms


def test_a_new_manager_has_no_terms_to_say(tmp_path: Path) -> None:
    _, _, mgr, _, _ = node_with_pods(tmp_path)
    assert mgr.cpu_terms is None


def test_the_fast_path_sums_bes_groups(tmp_path: Path) -> None:
    mgr, s, between = fast_scene(tmp_path)
    counters = {BE_GROUP: 1.0, "kubepods.slice/kubepods-besteffort.slice": 2.0}
    mgr.groups = list(counters)
    s.group_cpu_seconds = lambda group: counters.get(group)  # type: ignore[method-assign]
    s.advance(0.1)
    mgr.fast_round()
    counters[BE_GROUP] += 0.1  # 1 core
    counters["kubepods.slice/kubepods-besteffort.slice"] += 0.2  # 2 cores
    s.ls, s.be = 0.5, 3.0
    s.advance(0.1)
    mgr.fast_round()  # a rise, followed
    counters[BE_GROUP] += 0.02
    counters["kubepods.slice/kubepods-besteffort.slice"] += 0.04
    s.advance(0.02)
    mgr.fast_round()
    (r,) = between.rounds
    assert r.fast is not None and r.fast.be == pytest.approx(3.0) and r.fast.non_be == pytest.approx(0.5)


def test_round_async_takes_the_pods_in_and_samples_their_groups(tmp_path: Path) -> None:
    _, _, mgr, s, _ = node_with_pods(tmp_path)
    asked: list[object] = []
    real = s.sample

    def sample(be_groups: Sequence[str] = (), ls_waits: bool = True) -> NodeSample:
        asked.append(list(be_groups))
        return real(be_groups)

    s.sample = sample  # type: ignore[method-assign]
    asyncio.run(mgr.round_async())
    assert mgr.groups == [BE_GROUP] and asked == [[BE_GROUP]]


def test_a_falling_memory_score_is_smoothed_too(tmp_path: Path) -> None:
    from dataclasses import replace

    _, _, mgr, s, _ = node_with_pods(tmp_path)
    real = s.sample
    avail = [0]
    s.sample = lambda be_groups=(), ls_waits=True: replace(real(be_groups), mem_available=avail[0])  # type: ignore[method-assign]
    mgr.round()
    high = mgr.memory.score
    avail[0] = 6 << 30
    s.advance(1.0)
    mgr.round()
    assert high > 30.0 and high > mgr.memory.score > 0.35 * 25 + 1  # falling with its time constant


def test_a_new_manager_without_node_qos_resource_says_so_at_its_first_round(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugins = [p for p in PLUGINS if p != "NodeQOSResource"]
    _, _, mgr, _, _ = node_with_pods(tmp_path, Policy.model_validate({"qosManager": {"plugins": plugins}}))
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        mgr.round()
    assert any(m.startswith("NodeQOSResource is off: without the node's capacity") for m in caplog.messages)


def test_ls_pressure_refusals_are_said_with_their_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from nriplugin.kernel.psi_trigger import PressureWatch

    _, _, mgr, _, _ = node_with_pods(tmp_path)
    (tmp_path / "p1").write_text("")  # a regular file: not pollable
    mgr.pods.pressure_path = lambda g: str(tmp_path / "p1")
    mgr.pods._dirty.update(k for k in mgr.model if k.startswith("pod:"))
    mgr.ls_pressure = PressureWatch()
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        mgr.round()
    why = mgr.ls_pressure.refused[str(tmp_path / "p1")]
    assert why and f"no PSI trigger on LS groups ({tmp_path / 'p1'}: {why}); the fast path carries the reaction" in (
        caplog.messages
    )
    mgr.ls_pressure.close()


@dataclass
class LoopHook(Hook):
    loops: list[object] = field(default_factory=list)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loops.append(loop)
        super().start(loop)


def test_the_loop_with_a_trigger_armed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A FIFO takes the trigger's line and can be polled, as a pressure file of a kernel that
    accepts triggers does: the manager arms it, waits on its wake-up between fast rounds (the
    wait times out every FAST_PERIOD), and closes it at stop."""
    fifo = tmp_path / "cpu.pressure"
    os.mkfifo(fifo)
    p = Policy.model_validate({"qosManager": {"syncPeriod": 60}})
    _, _, mgr, s, _ = node_with_pods(tmp_path, p)
    mgr.psi_path = str(fifo)
    hook = LoopHook()
    mgr.eviction = hook

    async def main() -> None:
        loop = asyncio.get_running_loop()
        mgr.start(loop)
        try:
            assert hook.loops == [loop] and mgr._trigger is not None
            end = loop.time() + 3.0
            while len(s.fast_reads) < 4 and loop.time() < end:
                await asyncio.sleep(0.01)
            assert s.rounds == 1 and len(s.fast_reads) >= 4  # the waits time out: fast rounds go on
            assert mgr._task is not None and not mgr._task.done()
            mgr._wake.set()
            end = loop.time() + 3.0
            while s.rounds < 2 and loop.time() < end:
                await asyncio.sleep(0.01)
            assert s.rounds == 2
        finally:
            mgr.stop()
        await asyncio.sleep(0)
        assert mgr._trigger is None and hook.calls[-1] == "stop"

    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        asyncio.run(main())
    assert f"PSI trigger armed on {fifo}: a CPU stall wakes a round at once" in caplog.messages


def test_without_a_trigger_the_reason_and_the_fast_period_are_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, mgr, _, _ = node_with_pods(tmp_path)
    mgr.psi_path = str(tmp_path / "no-psi")

    async def main() -> None:
        mgr.start(asyncio.get_running_loop())
        mgr.stop()
        await asyncio.sleep(0)

    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        asyncio.run(main())
    (said,) = [m for m in caplog.messages if m.startswith("no PSI trigger (")]
    why = f"{tmp_path / 'no-psi'}: No such file or directory"
    assert said == f"no PSI trigger ({why}); the 30 ms fast path carries the reaction"


def test_a_failing_round_is_said_as_such(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = Policy.model_validate({"qosManager": {"syncPeriod": 60}})
    _, _, mgr, s, _ = node_with_pods(tmp_path, p)
    mgr.psi_path = None

    def fail(be_groups: object = (), ls_waits: bool = True) -> NodeSample:
        raise RuntimeError("boom")

    s.sample = fail  # type: ignore[method-assign]

    async def main() -> None:
        mgr.start(asyncio.get_running_loop())
        await asyncio.sleep(0.02)
        mgr.stop()
        await asyncio.sleep(0)

    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        asyncio.run(main())
    assert "QoS round failed; trying again next round" in caplog.messages


def test_refresh_async_gives_the_loop_back_between_turns(tmp_path: Path) -> None:
    """Many pods' news (keys the model no longer has, here): the refresh yields to the event
    loop between turns (a bare yield, as ``asyncio.sleep(0)`` does) and still takes them all in."""
    from nriplugin.qos.manager import PodGroups

    node, _, _, _, _ = node_with_pods(tmp_path)
    pods = PodGroups(node.model, node.desired)
    pods._dirty.update(f"pod:gone-{i}" for i in range(20_000))
    coro = pods.refresh_async()
    yields = 0
    try:
        while True:
            assert coro.send(None) is None
            yields += 1
    except StopIteration as done:
        moved = done.value
    assert yields >= 1 and moved is True and not pods._dirty and pods.be() == [BE_GROUP]


def test_a_disabled_manager_collects_nothing(tmp_path: Path) -> None:
    node, _, mgr, s, _ = node_with_pods(tmp_path)
    node.rules.set(Policy.model_validate({"qosManager": {"enable": False}}), "test")
    mgr.round()
    asyncio.run(mgr.round_async())
    assert s.rounds == 0 and mgr.last is None and mgr.groups == []


def test_a_limit_change_names_the_cpu_score_and_the_terms_behind_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator reading "BE limited to 0.10 cores: EMERGENCY: ..." asks why EMERGENCY: the
    line says the (smoothed) score and the last round's terms, one JSON field each."""
    _, _, mgr, _, _ = node_with_pods(tmp_path)
    with caplog.at_level(logging.INFO, "nriplugin.qos"):
        mgr.round()
    rec = next(r for r in caplog.records if r.getMessage().startswith(("BE limited to", "BE not limited")))
    assert mgr.cpu_terms is not None and set(mgr.cpu_terms) == {"node", "ls", "trend", "load"}
    terms = ", ".join(f"{k} {v:.0f}" for k, v in mgr.cpu_terms.items())
    assert rec.getMessage().endswith(f" [CPU score {mgr.cpu.score:.0f}; last round's terms: {terms}]")
    assert rec.__dict__["cpu_score"] == round(mgr.cpu.score, 1)
    assert {k: rec.__dict__[f"cpu_{k}"] for k in mgr.cpu_terms} == {k: round(v, 1) for k, v in mgr.cpu_terms.items()}


def test_a_round_without_terms_says_nothing_of_them() -> None:
    r = Round(
        0.0, NodeSample(t=0.0, interval=1.0, ncpu=2, cpu_busy_cores=0.0, load1=0.0), Level.HIGH, 61.0, 0.0, Policy()
    )
    assert r.cpu_said() == ""
    r.cpu_terms = {"node": 30.04, "ls": 41.5, "trend": 20.0, "load": 0.0}
    assert r.cpu_said() == " [CPU score 61; last round's terms: node 30, ls 42, trend 20, load 0]"
