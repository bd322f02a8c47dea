"""The QoS manager's strategies: what one is, what a round hands it, and the registry the
manager runs them from.

A strategy is one of the policy's ``qosManager.plugins`` names. Each round it decides from one
:class:`Round`: the sample, the levels and scores, the policy, and what the strategies before it
decided — the node's capacity for pods (NodeQOSResource, less what SystemQOSResource holds back
for the system), the extra CPU granted to LS bursts (CPUBurst), BE's limit in force and its
target (CPUSuppress). So they run in one order, the policy's (``policy.model.PluginName``):

    NodeQOSResource -> SystemQOSResource -> CPUBurst -> CPUSuppress -> CPUEvict -> MemoryEvict

LS bursts are granted first, BE is limited within what is left, and eviction acts only when
limiting BE is not enough. The policy chooses which run, never their order.

Each strategy class names itself (``name``) and registers with :func:`register` where it is
defined: a name the policy does not have, or one registered twice, fails at that module's
import; :meth:`StrategyRegistry.strategies` fails unless every policy name has its strategy
(``manager.py`` asks for them at its import, having imported every strategy's module).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar, cast

from nriplugin.node.desired import DesiredState
from nriplugin.node.model import NodeModel
from nriplugin.policy.model import PLUGINS, PluginName, Policy, QoSManagerPolicy
from nriplugin.qos.collect import ContainerUsage
from nriplugin.qos.levels import Level
from nriplugin.qos.sample import FastSample, NodeSample


@dataclass(frozen=True, slots=True)
class Capacity:
    """The node's CPU as the strategies divide it (cores)."""

    total: float  # online CPUs
    system_reserved: float  # held back for the system and its daemons (SystemQOSResource)
    ls_request: float  # what LS pods requested
    ls_usage: float  # what they use now
    be_usage: float
    non_be_usage: float  # node busy minus BE: LS, system daemons, anything not BE
    # BE's usage is its groups' own counter: False until that was read twice, when non-BE
    # usage still counts BE pods that have just started
    be_measured: bool = True

    @property
    def schedulable(self) -> float:
        """What LS and BE may share: total minus the system's share."""
        return max(0.0, self.total - self.system_reserved)

    def for_be(self, ls_reserve: float | None = None) -> float:
        """``total - LS reserve - system reserved`` (never negative): what LS does not hold,
        the reserve being its request unless given."""
        kept = self.ls_request if ls_reserve is None else ls_reserve
        return max(0.0, self.total - kept - self.system_reserved)


@dataclass(frozen=True, slots=True)
class FastUsage:
    """Between full rounds: BE's usage and everything else's, measured just now (cores), and
    everything else's over a longer window (``held``; None: the same): a cut follows the
    former, the lowest target a raise's hold counts the latter, so LS's short peaks cut at once
    without holding BE at their height."""

    be: float
    non_be: float
    held: float | None = None
    # the time of the sample that first showed the rise this one follows (None: none): a cut
    # made for it may be refined by less than the deadband while the measure of it sharpens
    rise: float | None = None


@dataclass(slots=True)
class Round:
    """One round's facts, and what the strategies that ran before decided (filled in as they
    run; None where the one that decides it did not run)."""

    t: float
    sample: NodeSample  # between full rounds: the last full round's
    level: Level  # the CPU pressure level
    cpu_score: float
    memory_score: float
    policy: Policy
    fast: FastUsage | None = None  # set between full rounds (the fast path)
    capacity: Capacity | None = None  # NodeQOSResource, then SystemQOSResource
    burst_extra: float = 0.0  # CPUBurst: cores granted to LS bursts (BE's share is cut by as much)
    be_limit: float | None = None  # CPUSuppress: BE's limit in force (None: not limited)
    be_target: float | None = None  # CPUSuppress: what this level allows BE
    be_idle: bool = False  # CPUSuppress: BE's tasks run SCHED_IDLE (beProcess.schedIdle)
    cpu_terms: dict[str, float] | None = None  # the last raw CPU score's terms (what drove the level)

    def cpu_said(self) -> str:
        """The CPU score and the terms behind it, for a decision's log line ("" without terms)."""
        if self.cpu_terms is None:
            return ""
        terms = ", ".join(f"{k} {v:.0f}" for k, v in self.cpu_terms.items())
        return f" [CPU score {self.cpu_score:.0f}; last round's terms: {terms}]"

    @property
    def config(self) -> QoSManagerPolicy:
        """The policy's ``qosManager`` section."""
        return self.policy.qosManager


@dataclass(frozen=True, slots=True)
class Decision:
    """One thing the manager did, for the operator's view (``nriplugin top``) and the log."""

    t: float
    owner: str
    target: str
    value: str
    why: str


class CollectorView(Protocol):
    @property
    def by_container(self) -> Mapping[str, ContainerUsage]: ...
    def sample(self, be_groups: Sequence[str] = (), ls_waits: bool = True) -> NodeSample: ...
    async def sample_async(self, be_groups: Sequence[str] = (), ls_waits: bool = True) -> NodeSample: ...
    def fast(self, sums: Sequence[Sequence[str]] = ()) -> FastSample: ...
    def wake(self, wait: float) -> float: ...
    def group_cpu_seconds(self, group: str) -> float | None: ...
    def pressure_path(self, group: str) -> str | None: ...
    def stall_us(self, files: Iterable[str]) -> int | None: ...


class Owner(Protocol):
    """Where QoS-level groups are owned (the reconciler)."""

    def own_group(self, path: str) -> str: ...


class StrategyObserver(Protocol):
    def round_done(self, seconds: float, collect_seconds: float) -> None: ...
    def scores(self, cpu: float, cpu_level: str, memory: float, memory_level: str) -> None: ...
    def be_limit(self, cores: float) -> None: ...
    def suppressed(self, reason: str) -> None: ...
    def burst(self, granted: bool) -> None: ...
    def birth_lift(self, seconds: float | None) -> None: ...  # None: BE's quota lifted for a birth


class EvictionHook(Protocol):
    """The eviction machinery (``eviction/loop.py``) CPUEvict and MemoryEvict decide through;
    it also listens to the kernel's memory events between rounds."""

    def start(self, loop: asyncio.AbstractEventLoop) -> None: ...
    def stop(self) -> None: ...
    def cpu_round(self, r: Round) -> None: ...
    def memory_round(self, r: Round) -> None: ...


class Host(Protocol):
    """What a strategy may use of the manager that runs it."""

    @property
    def model(self) -> NodeModel: ...
    @property
    def desired(self) -> DesiredState: ...
    @property
    def owner(self) -> Owner: ...
    @property
    def collector(self) -> CollectorView: ...
    @property
    def observer(self) -> StrategyObserver: ...
    @property
    def decisions(self) -> deque[Decision]: ...
    @property
    def eviction(self) -> EvictionHook | None: ...
    @property
    def groups(self) -> list[str]: ...  # the QoS-level groups holding BE pods


class Strategy(Protocol):
    """One policy plugin. Subclass it for the defaults: no section of its own, nothing to do
    between rounds, nothing to withdraw."""

    name: ClassVar[PluginName]
    needs_capacity: ClassVar[bool] = False  # sizes things from ``Round.capacity``

    def __init__(self, host: Host) -> None: ...

    @classmethod
    def configured(cls, cfg: QoSManagerPolicy) -> bool:
        """Whether its own section of the policy is enabled."""
        return True

    @classmethod
    def runs(cls, cfg: QoSManagerPolicy) -> bool:
        """Whether the policy runs it: the manager on, the name listed, its section enabled."""
        return cfg.enable and cls.name in cfg.plugins and cls.configured(cfg)

    @classmethod
    def reads_ls_waits(cls, policy: Policy) -> bool:
        """Whether it decides on LS containers' waits for a CPU, so a round must read them (on
        cgroup v1 a file per LS task: the bulk of a large node's round)."""
        return False

    def decide(self, r: Round) -> None:
        """A full round's decision; what later strategies need goes into ``r``."""

    def between_rounds(self, r: Round) -> None:
        """The fast path, when non-BE usage jumped between full rounds (``r.fast``)."""

    def off(self, t: float, why: str) -> bool:
        """The policy turned it off: withdraw its overlays. True if anything was withdrawn."""
        return False


S = TypeVar("S", bound=type[Strategy])
T = TypeVar("T", bound=Strategy)


class StrategyRegistry:
    """Strategy classes by the policy's plugin names, given back in the policy's order."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self._by_name: dict[str, type[Strategy]] = {}

    def register(self, cls: S) -> S:
        """A class decorator: ``cls`` is the strategy for ``cls.name``."""
        name = cls.name
        if name not in self.names:
            raise TypeError(f"{cls.__qualname__}: {name!r} is not a plugin of the policy ({', '.join(self.names)})")
        if name in self._by_name:
            raise TypeError(f"{name} has two strategies: {self._by_name[name].__qualname__} and {cls.__qualname__}")
        self._by_name[name] = cls
        return cls

    def made(self, running: Mapping[str, Strategy], cls: type[T]) -> T:
        """The strategy made from ``cls`` among ``running`` (the manager's, by name): what the
        view shows of one strategy (BE's limit, the LS bursts) is asked by its registered
        name, and ``cls`` must be the class registered for it."""
        if self._by_name.get(cls.name) is not cls:
            raise KeyError(f"{cls.__qualname__} is not the strategy registered for {cls.name}")
        return cast(T, running[cls.name])

    def strategies(self) -> tuple[type[Strategy], ...]:
        """Every strategy in the run order; an error unless each plugin name has one."""
        missing = [n for n in self.names if n not in self._by_name]
        if missing:
            raise TypeError(f"no strategy registered for the policy's plugin(s): {', '.join(missing)}")
        return tuple(self._by_name[n] for n in self.names)


REGISTRY = StrategyRegistry(PLUGINS)
register = REGISTRY.register
