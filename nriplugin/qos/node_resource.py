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
from nriplugin.qos.strategy import Capacity, FastUsage, Host, Round, Strategy, register


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
    """Node busy and BE's usage between rounds, from the fast samples.

    With the pods root's own CPU counter (``pods_seconds``: ``cpuacct.usage`` on cgroup v1,
    ``cpu.stat`` ``usage_usec`` on v2, both the scheduler's runtime in ns), what the pods other
    than BE use is measured over the last interval alone: such a counter lags the truth by at
    most a scheduler tick per CPU, and not at all at samples timed just past a tick
    (kernel/tick.py), so one short interval shows an LS step whole as soon as it lies inside
    the step, without reading noise as load. It is measured over ``span`` too
    (``FastUsage.held``): what a raise's hold counts, so that an LS peak shorter than that
    cuts BE but does not keep it at the peak's height. What runs outside the pods (system
    daemons, the kernel, the agent) is known only from /proc/stat, which counts in 10 ms ticks:
    it is taken over ``outside_span`` (that work moves slowly), and the fine reading waits
    until at least ``span`` of it is in.

    Without a pods counter, everything comes from /proc/stat over ``span``: one 50 ms sample
    is off by up to a tick per CPU at each end, which the fast path would cut BE on, and the
    limiter's raise, which goes no higher than the lowest target of its hold, would keep BE
    where those peaks put it. Over ``span`` the error is a third of that, and a step of LS
    load shows a third of itself 50 ms after it began and all of itself after ``span``."""

    def __init__(self, span: float, outside_span: float = 0.0) -> None:
        self.span = span
        self.outside_span = max(span, outside_span)
        self._busy = 0.0  # node busy core-seconds summed over the samples
        # (t, busy so far, BE seconds, pods seconds or None)
        self._points: deque[tuple[float, float, float, float | None]] = deque()

    def reset(self) -> None:
        """BE's groups changed (their counters' sum jumps) or a reading failed: start again."""
        self._points.clear()

    def add(
        self,
        t: float,
        interval: float,
        busy_cores: float,
        be_seconds: float | None,
        pods_seconds: float | None = None,
    ) -> FastUsage | None:
        """BE's usage and everything else's, in cores, as the window ending at ``t`` shows them
        now and over ``span`` (None until two readings are in)."""
        if be_seconds is None:
            self.reset()
            return None
        self._busy += busy_cores * interval
        pts = self._points
        pts.append((t, self._busy, be_seconds, pods_seconds))
        keep = self.span if pods_seconds is None else self.outside_span
        while len(pts) > 2 and t - pts[1][0] >= keep:
            pts.popleft()  # the oldest point left still opens a window of at least ``keep``
        if len(pts) < 2:
            return None
        if pods_seconds is not None:
            fine = self._fine(t, be_seconds, pods_seconds)
            if fine is not None:
                return fine
        t0, busy0, be0, _ = self._start(t, with_pods=False)
        if t <= t0:
            return None
        dt = t - t0
        be = max(0.0, be_seconds - be0) / dt
        non_be = max(0.0, (self._busy - busy0) / dt - be)
        return FastUsage(be, non_be, non_be)

    def _start(self, t: float, with_pods: bool) -> tuple[float, float, float, float | None]:
        """The newest point before ``t`` that opens a window of at least ``span`` (with a pods
        reading, if asked), else the oldest such."""
        pts = self._points
        start = next((p for p in pts if not with_pods or p[3] is not None), pts[0])
        for i in range(len(pts) - 2, 0, -1):
            p = pts[i]
            if t - p[0] >= self.span and (not with_pods or p[3] is not None):
                return p
        return start

    def _fine(self, t: float, be_seconds: float, pods_seconds: float) -> FastUsage | None:
        """From the pods root's counter: the pods over the last interval (and over ``span``),
        the rest over the oldest reading of it kept (None until that is ``span`` old, or
        without one before)."""
        pts = self._points
        prev, first = pts[-2], next(p for p in pts if p[3] is not None)
        if prev[3] is None or t <= prev[0] or t - first[0] < self.span:
            return None
        outside = self._outside(t, pods_seconds)
        be, now = self._pods(prev, t, be_seconds, pods_seconds)
        _, held = self._pods(self._start(t, with_pods=True), t, be_seconds, pods_seconds)
        return FastUsage(be, now + outside, held + outside)

    def since(self, t0: float) -> FastUsage | None:
        """As :meth:`add` measured the newest reading, but the pods from the reading at ``t0``
        on: a rise being followed, from the sample that first showed it — an interval all
        inside the rise, longer (so exacter) with each sample. What runs outside the pods is
        taken as it stood at ``t0``: measured over ``outside_span`` it only ramps while a rise
        is followed (a burst outside enters that window a sample at a time), and following a
        ramp would refine a cut at every sample for what a full round measures anyway. None
        without the pods' counter at both ends, or before a span of /proc/stat is in."""
        pts = self._points
        if len(pts) < 2:
            return None
        t, _, be_seconds, pods_seconds = pts[-1]
        start = next((p for p in pts if p[0] == t0), None)
        first = next((p for p in pts if p[3] is not None), None)
        if start is None or start[3] is None or pods_seconds is None or first is None:
            return None
        if t <= t0 or t - first[0] < self.span:
            return None
        outside = self._outside(t, pods_seconds) if t0 - first[0] < self.span else self._outside(t0, start[3], start[1])
        be, in_pods = self._pods(start, t, be_seconds, pods_seconds)
        _, held = self._pods(self._start(t, with_pods=True), t, be_seconds, pods_seconds)
        return FastUsage(be, in_pods + outside, held + outside)

    def _pods(
        self, since: tuple[float, float, float, float | None], t: float, be_seconds: float, pods_seconds: float
    ) -> tuple[float, float]:
        """BE's cores and the other pods' from the point ``since`` to ``t``."""
        dt = t - since[0]
        be = be_seconds - since[2]
        return max(0.0, be) / dt, max(0.0, (pods_seconds - (since[3] or 0.0)) - be) / dt

    def _outside(self, t: float, pods_seconds: float, busy: float | None = None) -> float:
        """What runs outside the pods up to ``t`` (its busy total ``busy``; default: the
        newest), from the oldest reading of their counter kept."""
        first = next(p for p in self._points if p[3] is not None)
        done = self._busy if busy is None else busy
        return max(0.0, (done - first[1]) - (pods_seconds - (first[3] or 0.0))) / (t - first[0])


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
