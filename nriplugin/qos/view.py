"""The QoS manager as an operator sees it: one JSON document, served by the agent at
``/debug/qos`` and drawn by ``nriplugin top``.

``top`` runs as a separate process (often as another user, on a laptop through a port
forward), so it cannot read the manager's objects; the agent hands out a snapshot of the
manager's public state instead. ``state`` only reads: no I/O and no clock unless ``now`` is
left out, so it is tested with a fake manager, and it holds when the agent has just started
(no sample yet). It imports nothing from the manager: the manager is described by the
small protocols below, which ``QoSManager`` satisfies (checked by mypy in tests/test_top.py).

Times in the manager are ``time.monotonic()`` seconds, meaningless in another process, so
the document carries ages (seconds ago), never timestamps.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nriplugin.qos.levels import Level
    from nriplugin.qos.sample import NodeSample

CLASSES = ("LSE", "LSR", "LS", "BE")  # highest priority first, as top lists them
DECISIONS = 20  # the last decisions in the document (the manager keeps 50)


class Assessed(Protocol):
    """One resource's assessor (``levels.Assessor``)."""

    @property
    def score(self) -> float: ...
    @property
    def level(self) -> Level: ...


class DecisionLike(Protocol):
    @property
    def t(self) -> float: ...
    @property
    def owner(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def why(self) -> str: ...


class LimiterLike(Protocol):
    @property
    def current(self) -> float | None: ...


class BursterLike(Protocol):
    def bursting(self) -> dict[str, float]: ...


class ManagerConfig(Protocol):
    """The policy's ``qosManager`` section, the parts the operator wants to see."""

    @property
    def enable(self) -> bool: ...
    @property
    def profile(self) -> str: ...
    @property
    def syncPeriod(self) -> float: ...


class _Policy(Protocol):
    @property
    def qosManager(self) -> ManagerConfig: ...


class _Rules(Protocol):
    @property
    def policy(self) -> _Policy: ...


class Manager(Protocol):
    """What ``state`` reads from ``qos.manager.QoSManager`` (public attributes only)."""

    @property
    def last(self) -> NodeSample | None: ...
    @property
    def cpu(self) -> Assessed: ...
    @property
    def memory(self) -> Assessed: ...
    @property
    def level(self) -> Level: ...
    @property
    def ratio(self) -> float: ...
    @property
    def limiter(self) -> LimiterLike: ...
    @property
    def burster(self) -> BursterLike: ...
    @property
    def decisions(self) -> Iterable[DecisionLike]: ...
    @property
    def rules(self) -> _Rules: ...


def _num(x: float | None, digits: int = 3) -> float | None:
    """Rounded for a readable document; NaN and infinities (not JSON) become null."""
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), digits)


def state(manager: Manager, now: float | None = None, decisions: int = DECISIONS) -> dict[str, Any]:
    """A JSON-serialisable snapshot: config, scores and levels, BE's limit, node CPU, per-class
    usage against request and limit, the bursting containers, the last ``decisions`` newest
    first. Fields that need a sample are null until the first round has run."""
    now = time.monotonic() if now is None else now
    cfg = manager.rules.policy.qosManager
    last = manager.last
    node: dict[str, Any] | None = None
    classes: list[dict[str, Any]] = []
    if last is not None:
        node = {
            "ncpu": last.ncpu,
            "busyCores": _num(last.cpu_busy_cores),
            "load1": _num(last.load1, 2),
            "memTotalBytes": last.mem_total,
            "memAvailableBytes": last.mem_available,
            "sampleAgeSeconds": _num(max(0.0, now - last.t), 2),
        }
        for name in CLASSES:
            u = last.usage(name)
            classes.append(
                {
                    "class": name,
                    "containers": u.containers,
                    "usageCores": _num(u.cpu_cores),
                    "requestCores": _num(u.cpu_request_cores),
                    "limitCores": _num(u.cpu_limit_cores),  # the containers' own quotas; null: one is unlimited
                    "throttledRatio": _num(u.throttled_ratio),
                    "memoryBytes": u.memory_bytes,
                }
            )
    recent = list(manager.decisions)[-decisions:] if decisions > 0 else []
    return {
        "enabled": bool(cfg.enable),
        "profile": str(cfg.profile),
        "syncPeriodSeconds": _num(cfg.syncPeriod),
        "sampled": last is not None,
        "cpu": {"score": _num(manager.cpu.score, 1), "level": manager.cpu.level.name},
        "memory": {"score": _num(manager.memory.score, 1), "level": manager.memory.level.name},
        "level": manager.level.name,
        "suppressRatio": _num(manager.ratio),
        "beLimitCores": _num(manager.limiter.current),  # the BE QoS group's quota; null: not limited
        "node": node,
        "classes": classes,
        "bursting": [{"container": k, "ratio": _num(r)} for k, r in sorted(manager.burster.bursting().items())],
        "decisions": [
            {
                "ageSeconds": _num(max(0.0, now - d.t), 2),
                "owner": d.owner,
                "target": d.target,
                "value": d.value,
                "why": d.why,
            }
            for d in reversed(recent)
        ],
    }


def response(manager: Manager | None) -> tuple[int, str, bytes]:
    """The ``/debug/qos`` route: the snapshot, or 503 when the agent runs no manager (yet)."""
    if manager is None:
        return 503, "application/json", b'{"error": "the QoS manager is not running"}\n'
    return 200, "application/json", json.dumps(state(manager), indent=1).encode() + b"\n"
