"""NodeQOSResource and SystemQOSResource: what the node has for pods and what the system keeps —
the base every later strategy divides up.

- NodeQOSResource: total CPUs, what LS requested and uses, what BE uses (its QoS-level groups'
  own counter where read twice, so BE pods that have just started count as BE), and what
  everything but BE uses. Without it no strategy that sizes CPU can run: CPUBurst, CPUSuppress
  and CPUEvict stand down (their overlays withdrawn), the manager says so once in the log;
  MemoryEvict, which measures memory itself, still runs.
- SystemQOSResource: holds back ``qosManager.systemReserved.cpu`` for the system and its
  daemons (at most the whole node). Without it nothing is held back: the capacity's
  ``system_reserved`` is 0. With no capacity (NodeQOSResource off) it has nothing to hold back
  from.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from nriplugin.qos.sample import LS_CLASSES, NodeSample
from nriplugin.qos.strategy import Capacity, Host, Round, Strategy, register


def capacity(sample: NodeSample) -> Capacity:
    """The capacity a sample shows, BE's usage summed over its containers, nothing held back."""
    ls = [sample.usage(q) for q in LS_CLASSES]
    be = sample.usage("BE").cpu_cores
    return Capacity(
        total=float(sample.ncpu),
        system_reserved=0.0,
        ls_request=sum(u.cpu_request_cores for u in ls),
        ls_usage=sum(u.cpu_cores for u in ls),
        be_usage=be,
        non_be_usage=max(0.0, sample.cpu_busy_cores - be),
    )


class Rate:
    """A counter's rate over the window since its previous reading."""

    def __init__(self) -> None:
        self.t: float | None = None
        self.value = 0.0

    def update(self, t: float, value: float | None) -> float | None:
        if value is None:
            self.t = None
            return None
        prev_t, prev = self.t, self.value
        self.t, self.value = t, value
        if prev_t is None or t <= prev_t:
            return None
        return max(0.0, (value - prev) / (t - prev_t))


class FastWindow:
    """Node busy and BE's usage over the last ``span`` seconds of fast samples.

    One 50 ms sample of /proc/stat is off by up to a tick per CPU at each end (at 100 Hz, 0.2
    core per CPU). The fast path would cut BE on that noise, and the limiter's raise, which
    goes no higher than the lowest target of its hold, would keep BE where the noise's peaks
    put it. Over 150 ms the error is a third of that, and a step of LS load shows a third of
    itself 50 ms after it began and all of itself after 150 ms."""

    def __init__(self, span: float) -> None:
        self.span = span
        self._busy = 0.0  # node busy core-seconds summed over the samples
        self._points: deque[tuple[float, float, float]] = deque()  # (t, busy so far, BE seconds)

    def reset(self) -> None:
        """BE's groups changed (their counters' sum jumps) or a reading failed: start again."""
        self._points.clear()

    def add(self, t: float, interval: float, busy_cores: float, be_seconds: float | None) -> tuple[float, float] | None:
        """Node busy and BE's usage, in cores, over the window ending at ``t`` (None until
        two readings are in)."""
        if be_seconds is None:
            self.reset()
            return None
        self._busy += busy_cores * interval
        pts = self._points
        pts.append((t, self._busy, be_seconds))
        while len(pts) > 2 and t - pts[1][0] >= self.span:
            pts.popleft()  # the oldest point left still opens a window of at least ``span``
        t0, busy0, be0 = pts[0]
        if len(pts) < 2 or t <= t0:
            return None
        dt = t - t0
        return (self._busy - busy0) / dt, max(0.0, be_seconds - be0) / dt


@register
class NodeQOSResourceStrategy(Strategy):
    name = "NodeQOSResource"

    def __init__(self, host: Host) -> None:
        self._be = Rate()  # BE's groups' CPU counter, one reading per full round

    def decide(self, r: Round) -> None:
        s = r.sample
        cap = capacity(s)
        be = self._be.update(s.t, s.be_cpu_seconds)
        if be is None:
            cap = replace(cap, be_measured=False)
        else:
            cap = replace(cap, be_usage=be, non_be_usage=max(0.0, s.cpu_busy_cores - be))
        r.capacity = cap

    def between_rounds(self, r: Round) -> None:
        if r.fast is not None:
            r.capacity = replace(capacity(r.sample), be_usage=r.fast.be, non_be_usage=r.fast.non_be)

    def off(self, t: float, why: str) -> bool:
        self._be = Rate()  # a rate across the time it was off would be no rate at all
        return False


@register
class SystemQOSResourceStrategy(Strategy):
    name = "SystemQOSResource"

    def __init__(self, host: Host) -> None:
        pass

    def decide(self, r: Round) -> None:
        cap = r.capacity
        if cap is not None:
            held = min(max(0.0, r.config.systemReserved.cpu), cap.total)
            r.capacity = replace(cap, system_reserved=held)

    def between_rounds(self, r: Round) -> None:
        self.decide(r)
