"""What the QoS manager's collection hands to its assessment and strategies: plain, immutable
measurements (no I/O, no kernel names), so scores and strategies are pure functions of them.

Units: CPU in cores (1.0 = one CPU busy for the whole interval), memory in bytes, time in
seconds (``time.monotonic()``), pressure stalls in microseconds of the interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LS_CLASSES = ("LSE", "LSR", "LS")  # the latency-sensitive classes, highest first


@dataclass(frozen=True, slots=True)
class Pressure:
    """One PSI resource (``/proc/pressure/cpu`` or a cgroup's ``cpu.pressure``): the kernel's
    averages (percent) and the stall time accumulated over the last interval (µs)."""

    some_avg10: float = 0.0
    full_avg10: float = 0.0
    some_delta_us: int = 0
    full_delta_us: int = 0


@dataclass(frozen=True, slots=True)
class ClassUsage:
    """One QoS class (LSE, LSR, LS, BE) summed over the containers the node model knows."""

    containers: int = 0
    cpu_cores: float = 0.0  # used over the interval
    # requested: shares / 1024 as kubelet sets them; a BE container's batch-cpu request where it
    # has one (kubelet gives a batch-sized pod 2 shares: it asks for no CPU of its own)
    cpu_request_cores: float = 0.0
    cpu_limit_cores: float | None = None  # sum of quotas / periods; None when any is unlimited
    # throttled periods / periods over the interval, of its containers with a quota, each
    # container's periods throttled at its own ratio or its pod's, whichever is higher
    throttled_ratio: float = 0.0
    # the mean share of the interval its containers had a task waiting for a CPU (their own
    # cpu.pressure, cgroup v2); None where the kernel has no per-group PSI (v1)
    stall_ratio: float | None = None
    memory_bytes: int = 0  # usage (v1 memory.usage_in_bytes minus cache; v2 memory.current minus file)
    rss_bytes: int = 0


@dataclass(frozen=True, slots=True)
class NodeSample:
    """One full collection round."""

    t: float
    interval: float  # seconds since the previous sample (0 for the first)
    ncpu: int
    cpu_busy_cores: float  # node-wide, from /proc/stat
    load1: float
    psi_cpu: Pressure = field(default_factory=Pressure)
    psi_memory: Pressure = field(default_factory=Pressure)
    mem_total: int = 0
    mem_available: int = 0
    swap_total: int = 0
    swap_free: int = 0
    pgscan_direct: int = 0  # pages scanned over the interval
    pgscan_kswapd: int = 0
    by_class: dict[str, ClassUsage] = field(default_factory=dict)
    collect_seconds: float = 0.0  # how long the round took
    be_cpu_seconds: float | None = None  # CPU used so far by BE's QoS-level groups (None: not read)
    memory_read: bool = False  # every known container's memory was read in this round
    # LS RSS with arrivals and departures taken out: it moves only by the growth of containers
    # measured in two rounds, so an LS pod starting is not LS memory growing (None: not known)
    ls_rss_held: float | None = None

    def usage(self, qos: str) -> ClassUsage:
        return self.by_class.get(qos, ClassUsage())


@dataclass(frozen=True, slots=True)
class FastSample:
    """The cheap path (every fast period, ``qos.manager.FAST_PERIOD``): node CPU and PSI
    totals, a few reads of /proc, and the CPU counters of the QoS-level groups asked for. ``t``
    is the scheduler's tick before the reads where it is known (kernel/tick.py)."""

    t: float
    interval: float
    cpu_busy_cores: float
    psi_cpu_some_delta_us: int = 0
    seconds: tuple[float | None, ...] = ()  # the CPU each set of groups asked for has used so far
