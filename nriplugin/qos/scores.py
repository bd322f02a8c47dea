"""CPU and memory pressure scores, as pure functions of measurements.

Each score is a sum of four terms capped at 100; the result keeps the terms, so metrics,
``explain`` and ``nriplugin top`` can say which one drove a decision.

**CPU**, four terms weighted by how directly they show LS waiting for a CPU::

    node  = 0.4 · node CPU %
    ls    = 30 · min(LS usage / LS request, 2)
    trend = min(20, 20 · max(0, trend of node CPU % in points per minute over 5 min))
    load  = 10 · min(load1 / ncpu, 2)

The trend term is 20 points per %/min of rising busy share, at most 20: a node 0.5 %/min
busier scores 10. The sum is capped at 100 (34 + 45 + 20 + 15 scores 100, EMERGENCY).

**BE's own usage does not count.** Counted, BE soaking up
idle CPU raises "node CPU %", its trend and the load average, so BE suppresses itself while LS
is idle, the opposite of colocation (BE runs as much as it can while LS does not need the CPU).
Here the CPU that BE uses is treated as reclaimable, which it is (it is what suppression
reclaims):

- node term: non-BE usage, ``(node busy - BE usage) / ncpu`` (LS, system daemons, the kernel);
- trend term: the slope of that same non-BE share (least squares is linear, so it is the node's
  slope minus BE's slope over the same samples);
- load term: ``max(0, load1 - BE load) / ncpu``, where BE load is BE's usage in cores averaged
  the way the kernel averages load1 (exponentially, 1 minute), so a BE that just started or
  just stopped is discounted as much as it still weighs in load1. A spinning BE thread adds
  about 1 to load1 and 1 core to BE usage. Not discounted: BE threads waiting for a CPU beyond
  the cores BE gets (4 BE threads on 2 cores add 4 to load1, 2 are discounted); the term is at
  most 10 points.
- LS term: unchanged (LS against its own request).

So with BE alone on the node, the score is about what it would be with the node idle. When LS
does need the CPU, its usage, ratio, trend and runnable threads raise the score as they would
with BE counted.

"LS" is every latency-sensitive class: LSE, LSR and LS.

**Memory** (BE's memory is counted, since memory in use is not reclaimable without
eviction)::

    used    = 0.35 · (MemTotal - MemAvailable) / MemTotal %
    growth  = 0.25 · min(5 · LS RSS growth in %/min, 100)
    reclaim = 0.2 · min(10 · direct scan / kswapd scan, 100)
    swap    = 0.2 · swap used %

LS RSS growth is in percentage points of MemTotal per minute (the slope over 5 minutes): the
same unit as the used term, and never a division by a small LS footprint (a 10 MB pod growing
1 MB/min is not node pressure). Shrinking counts as 0. Reclaim is per interval; direct
reclaim without kswapd scanning saturates the term.

Every division is guarded (no LS request, no swap, no CPUs: the term is 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nriplugin.qos.sample import LS_CLASSES, NodeSample
from nriplugin.qos.trends import Trends


@dataclass(frozen=True, slots=True)
class CpuInputs:
    ncpu: int
    node_usage_cores: float  # busy, all classes and the system
    be_usage_cores: float
    ls_usage_cores: float
    ls_request_cores: float
    trend_pct_per_min: float  # slope of node busy % (all of it, BE included)
    load1: float
    be_trend_pct_per_min: float = 0.0  # slope of BE's share of the node, %
    be_load: float | None = None  # BE's weight in load1 (1-min average of its cores); None: be_usage_cores


@dataclass(frozen=True, slots=True)
class CpuScore:
    node: float
    ls: float
    trend: float
    load: float
    total: float

    @property
    def terms(self) -> dict[str, float]:
        return {"node": self.node, "ls": self.ls, "trend": self.trend, "load": self.load}


@dataclass(frozen=True, slots=True)
class MemoryInputs:
    mem_total: int
    mem_available: int
    ls_rss_growth_pct_per_min: float  # of MemTotal
    pgscan_direct: int  # over the interval
    pgscan_kswapd: int
    swap_total: int
    swap_free: int


@dataclass(frozen=True, slots=True)
class MemoryScore:
    used: float
    growth: float
    reclaim: float
    swap: float
    total: float

    @property
    def terms(self) -> dict[str, float]:
        return {"used": self.used, "growth": self.growth, "reclaim": self.reclaim, "swap": self.swap}


def _f(x: float) -> float:
    """Non-finite measurements (a collector's bug) count as 0 rather than poisoning the sum."""
    return x if math.isfinite(x) else 0.0


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, x))


def cpu_pressure(i: CpuInputs) -> CpuScore:
    """The CPU pressure score, 0-100, BE's own usage, trend and load left out."""
    ncpu = i.ncpu if i.ncpu > 0 else 0
    node_cores = max(0.0, _f(i.node_usage_cores))
    be_cores = max(0.0, _f(i.be_usage_cores))
    trend = _f(i.trend_pct_per_min)
    load1 = max(0.0, _f(i.load1))
    node_cores = max(0.0, node_cores - be_cores)
    trend -= _f(i.be_trend_pct_per_min)
    be_load = be_cores if i.be_load is None else max(0.0, _f(i.be_load))
    load1 = max(0.0, load1 - be_load)
    node = 0.4 * _clamp(100.0 * node_cores / ncpu, 0.0, 100.0) if ncpu else 0.0
    request = _f(i.ls_request_cores)
    ls = 30.0 * min(max(0.0, _f(i.ls_usage_cores)) / request, 2.0) if request > 0 else 0.0
    trend_term = min(20.0, 20.0 * max(0.0, trend))
    load = 10.0 * min(load1 / ncpu, 2.0) if ncpu else 0.0
    return CpuScore(node, ls, trend_term, load, min(100.0, node + ls + trend_term + load))


def memory_pressure(i: MemoryInputs) -> MemoryScore:
    """The memory pressure score, 0-100."""
    used_pct = _clamp(100.0 * (i.mem_total - i.mem_available) / i.mem_total, 0.0, 100.0) if i.mem_total > 0 else 0.0
    used = 0.35 * used_pct
    growth = 0.25 * _clamp(5.0 * _f(i.ls_rss_growth_pct_per_min), 0.0, 100.0)
    direct, kswapd = max(0, i.pgscan_direct), max(0, i.pgscan_kswapd)
    # Only direct reclaim (kswapd not scanning at all) means kswapd cannot keep up: saturate.
    ratio_term = min(10.0 * direct / kswapd, 100.0) if kswapd > 0 else (100.0 if direct > 0 else 0.0)
    reclaim = 0.2 * ratio_term
    swap_pct = _clamp(100.0 * (i.swap_total - i.swap_free) / i.swap_total, 0.0, 100.0) if i.swap_total > 0 else 0.0
    swap = 0.2 * swap_pct
    return MemoryScore(used, growth, reclaim, swap, min(100.0, used + growth + reclaim + swap))


def _ls(sample: NodeSample) -> tuple[float, float, int]:
    usage = request = 0.0
    rss = 0
    for q in LS_CLASSES:
        u = sample.usage(q)
        usage += u.cpu_cores
        request += u.cpu_request_cores
        rss += u.rss_bytes
    return usage, request, rss


def cpu_inputs(sample: NodeSample, trends: Trends) -> CpuInputs:
    """The CPU score's inputs from this round's sample and the trends (which include it)."""
    n = max(1, sample.ncpu)
    ls_usage, ls_request, _ = _ls(sample)
    return CpuInputs(
        ncpu=sample.ncpu,
        node_usage_cores=sample.cpu_busy_cores,
        be_usage_cores=sample.usage("BE").cpu_cores,
        ls_usage_cores=ls_usage,
        ls_request_cores=ls_request,
        trend_pct_per_min=100.0 * trends.node_cores.per_minute() / n,
        load1=sample.load1,
        be_trend_pct_per_min=100.0 * trends.be_cores.per_minute() / n,
        be_load=trends.be_load.value,
    )


def memory_inputs(sample: NodeSample, trends: Trends) -> MemoryInputs:
    """The memory score's inputs; LS RSS growth is the 5-minute slope in % of MemTotal."""
    total = sample.mem_total
    return MemoryInputs(
        mem_total=total,
        mem_available=sample.mem_available,
        ls_rss_growth_pct_per_min=100.0 * trends.rss.per_minute() / total if total > 0 else 0.0,
        pgscan_direct=sample.pgscan_direct,
        pgscan_kswapd=sample.pgscan_kswapd,
        swap_total=sample.swap_total,
        swap_free=sample.swap_free,
    )
