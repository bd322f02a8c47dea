"""The QoS manager's strategies as plugins: one registered strategy per policy plugin name, run
in the one order, and every name doing something — leaving one out of ``qosManager.plugins``
changes what a round does, and withdraws what it had set."""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from nriplugin.node.assembly import Node
from nriplugin.policy.cache import PolicyError, parse
from nriplugin.policy.model import PLUGINS, Policy
from nriplugin.policy.qos import QoSClass
from nriplugin.qos.collect import ContainerUsage
from nriplugin.qos.manager import BURST, STRATEGIES, SUPPRESS, QoSManager
from nriplugin.qos.strategy import Capacity, Round, Strategy, StrategyRegistry
from testkit.runtime_peer import make_container, make_pod
from tests.test_qos_manager import Script, node_with_pods

ORDER = ["NodeQOSResource", "SystemQOSResource", "CPUBurst", "CPUSuppress", "CPUEvict", "MemoryEvict"]


def test_every_plugin_name_has_one_strategy_in_the_one_order() -> None:
    """LS bursts first, BE limited within what is left, eviction only when that is not enough:
    the registry gives the strategies in the policy's order, one per name, both ways."""
    assert [s.name for s in STRATEGIES] == ORDER == list(PLUGINS)
    assert len(set(STRATEGIES)) == len(STRATEGIES)
    needs = [s.name for s in STRATEGIES if s.needs_capacity]
    assert needs == ["CPUBurst", "CPUSuppress", "CPUEvict"]


def fake(name: str) -> type[Strategy]:
    return cast("type[Strategy]", type(f"Fake{name}", (), {"name": name}))


def test_the_registry_refuses_names_the_policy_does_not_have_and_gaps() -> None:
    reg = StrategyRegistry(["A", "B"])
    with pytest.raises(TypeError, match=r"FakeC: 'C' is not a plugin of the policy \(A, B\)"):
        reg.register(fake("C"))
    a = reg.register(fake("A"))
    with pytest.raises(TypeError, match="A has two strategies: FakeA and FakeA"):
        reg.register(fake("A"))
    with pytest.raises(TypeError, match=re.escape("no strategy registered for the policy's plugin(s): B")):
        reg.strategies()
    b = reg.register(fake("B"))
    assert reg.strategies() == (a, b)  # the policy's order, not the order of registration


def test_an_unknown_plugin_name_is_refused_by_the_policy() -> None:
    with pytest.raises(PolicyError) as err:
        parse("qosManager: {plugins: [CPUBurst, CPUSupress]}\n", "p.yaml")
    msg = str(err.value)
    assert "qosManager.plugins.1" in msg and '(got "CPUSupress")' in msg
    assert all(f"'{p}'" in msg for p in PLUGINS)  # the names it takes, said


@dataclass
class Evictions:
    """The eviction machinery as the manager sees it: what each round handed to it."""

    cpu: list[Round] = field(default_factory=list)
    memory: list[Round] = field(default_factory=list)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        pass

    def stop(self) -> None:
        pass

    def cpu_round(self, r: Round) -> None:
        self.cpu.append(r)

    def memory_round(self, r: Round) -> None:
        self.memory.append(r)


@dataclass
class Scene:
    """2 CPUs: LS (request and limit one core) at its limit with the node idle enough for a 1.5x
    burst, BE using half a core."""

    node: Node
    mgr: QoSManager
    script: Script
    ls_quota: Path  # the LS container's cpu.cfs_quota_us
    be_quota: Path  # BE's QoS-level group's
    evictions: Evictions

    @classmethod
    def of(cls, tmp_path: Path, p: Policy) -> Scene:
        node, _, mgr, s, be_quota = node_with_pods(tmp_path, p)
        ev = Evictions()
        mgr.eviction = ev
        ls_key = make_container(2, make_pod(2, "LS")).id
        ls_quota = tmp_path / "cpu" / "kubepods/burstable/pod2" / ls_key / "cpu.cfs_quota_us"
        ls_quota.write_text("100000")
        s.ls, s.be = 0.95, 0.5
        s.by_container = {ls_key: ContainerUsage(QoSClass.LS, "pod2", 0.95, 0, 0, limit_cores=1.0)}
        return cls(node, mgr, s, ls_quota, be_quota, ev)

    def quotas(self) -> tuple[str, str]:
        """(LS's quota, BE's) as the kernel has them."""
        return self.ls_quota.read_text().strip(), self.be_quota.read_text().strip()

    def round(self, p: Policy | None = None) -> tuple[str, str]:
        """A round a second on, under ``p`` if given; the quotas after it."""
        if p is not None:
            self.node.rules.set(p, "test")
        self.script.advance(1.0)
        self.mgr.round()
        return self.quotas()


def policy(without: str = "", reserved: float = 0.25) -> Policy:
    """A quota at every level (``quotaFrom: LOW``): the rounds below are worked in it."""
    plugins = [p for p in PLUGINS if p != without]
    return Policy.model_validate(
        {
            "qosManager": {
                "plugins": plugins,
                "systemReserved": {"cpu": reserved},
                "cpuSuppress": {"quotaFrom": "LOW"},
            }
        }
    )


def test_with_every_plugin_each_does_its_part(tmp_path: Path) -> None:
    """A quarter core reserved for the system."""
    sc = Scene.of(tmp_path, policy())
    # CPUBurst: 1.5x, the node more than 30 % idle; CPUSuppress: (2 total - 0.95 LS use -
    # 0.25 reserved - 0.5 burst) x 0.8 (MEDIUM, below HIGH: LS's use is reserved, not its request)
    assert sc.round() == ("150000", "24000")
    (r,) = sc.evictions.cpu
    assert r.capacity == Capacity(2.0, 0.25, 1.0, 0.95, 0.5, 0.95, be_measured=False)
    assert r.burst_extra == pytest.approx(0.5) and r.be_limit == pytest.approx(0.24)
    assert sc.evictions.memory == [r]  # MemoryEvict after CPUEvict, in the same round


@pytest.mark.parametrize("left_out", PLUGINS)
def test_leaving_a_plugin_out_changes_what_a_round_does(tmp_path: Path, left_out: str) -> None:
    sc = Scene.of(tmp_path, policy(without=left_out))
    quotas, ev = sc.round(), sc.evictions
    if left_out == "NodeQOSResource":  # no capacity: nothing that sizes CPU runs
        assert (quotas, ev.cpu) == (("100000", "-1"), [])
        assert [r.capacity for r in ev.memory] == [None]  # MemoryEvict measures memory itself
    elif left_out == "SystemQOSResource":  # nothing held back: (2 - 0.95 - 0 - 0.5) x 0.8
        assert quotas == ("150000", "44000")
        assert [r.capacity.system_reserved for r in ev.cpu if r.capacity] == [0.0]
    elif left_out == "CPUBurst":  # no burst, so none taken from BE: (2 - 0.95 - 0.25) x 0.8
        assert quotas == ("100000", "64000")
    elif left_out == "CPUSuppress":  # BE unlimited, CPUEvict sees no limit
        assert quotas == ("150000", "-1") and [r.be_limit for r in ev.cpu] == [None]
    elif left_out == "CPUEvict":
        assert not ev.cpu and len(ev.memory) == 1
    else:
        assert left_out == "MemoryEvict"
        assert len(ev.cpu) == 1 and not ev.memory


def test_a_plugin_the_policy_drops_withdraws_its_overlays(tmp_path: Path) -> None:
    sc = Scene.of(tmp_path, policy())
    assert sc.round() == ("150000", "24000")
    # the burst is CPUBurst's, which still runs
    assert sc.round(policy(without="CPUSuppress")) == ("150000", "-1")
    assert not sc.node.desired.overlays.targets(SUPPRESS)
    assert sc.round(Policy.model_validate({"qosManager": {"plugins": ["MemoryEvict"]}})) == ("100000", "-1")
    assert not sc.node.desired.overlays.targets(BURST)
    assert [d.value for d in sc.mgr.decisions if d.why == "CPUSuppress is off"] == ["withdrawn"]


def test_without_node_qos_resource_the_cpu_strategies_stand_down_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sc = Scene.of(tmp_path, policy())
    assert sc.round() == ("150000", "24000")
    with caplog.at_level(logging.INFO, logger="nriplugin.qos"):
        for _ in range(3):
            assert sc.round(policy(without="NodeQOSResource")) == ("100000", "-1")
        sc.script.ls = 1.5  # LS jumps: the fast path has no capacity to size BE from either
        for _ in range(2):
            sc.script.advance(0.1)
            sc.mgr.fast_round()
    assert sc.quotas() == ("100000", "-1")
    said = [m for m in caplog.messages if m.startswith("NodeQOSResource is off")]
    assert said == ["NodeQOSResource is off: without the node's capacity CPUBurst, CPUSuppress, CPUEvict do not run"]
    assert sc.round(policy())[1] != "-1"  # back: BE is limited again


def test_the_registry_gives_a_strategy_by_its_registered_name_and_class_only() -> None:
    """What the view shows of one strategy is asked of the registry (by name), never found by
    type among the manager's strategies; a class that is not the one registered is refused."""
    from nriplugin.qos.cpu_burst import CPUBurstStrategy
    from nriplugin.qos.strategy import REGISTRY

    class Impostor(CPUBurstStrategy):
        pass

    made: dict[str, Strategy] = {cls.name: object.__new__(cls) for cls in STRATEGIES}
    assert REGISTRY.made(made, CPUBurstStrategy) is made["CPUBurst"]
    with pytest.raises(KeyError, match="not the strategy registered for CPUBurst"):
        REGISTRY.made(made, Impostor)
