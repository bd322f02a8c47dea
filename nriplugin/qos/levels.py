"""Pressure levels and the stateful assessor that turns raw scores into a steady level.

A raw score moves with every sample; a strategy keyed on it would rewrite the BE limit every
round (koordinator#1103: the cpuset path flaps every tick). The assessor smooths and adds
hysteresis, but asymmetrically, because the two errors do not cost the same: one level too low
costs LS latency, one level too high costs some BE throughput for a few seconds.

- Smoothing rises at once and falls slowly: a higher raw score is taken as it is (a real LS
  spike must reach the strategies on the first sample; the reaction target is 200 ms), a lower
  one is approached exponentially with time constant ``fall_time``. Over a noisy stationary load
  the smoothed score rides the peaks, so it does not cross boundaries back and forth.
- Hysteresis: a level is entered as soon as the smoothed score reaches its lower boundary, and
  left downwards only once the score is ``hysteresis`` points below it. A score hovering at 59-61
  around the 60 boundary therefore changes level at most once.

Deterministic: time is an input (``update(t, raw)``), never read here.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol


class Level(IntEnum):
    LOW = 0
    MEDIUM = 1
    HIGH = 2
    CRITICAL = 3
    EMERGENCY = 4


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Upper boundaries, as the policy names them: below ``low`` is LOW, below ``medium``
    MEDIUM, below ``high`` HIGH, below ``critical`` CRITICAL, from ``critical`` on EMERGENCY."""

    low: float = 40.0
    medium: float = 60.0
    high: float = 75.0
    critical: float = 90.0

    def __post_init__(self) -> None:
        b = self.boundaries
        if not all(0 <= x <= 100 for x in b) or any(a >= c for a, c in itertools.pairwise(b)):
            raise ValueError(f"thresholds must increase within 0-100, got {b}")

    @property
    def boundaries(self) -> tuple[float, float, float, float]:
        return (self.low, self.medium, self.high, self.critical)

    def level(self, score: float) -> Level:
        n = 0
        for b in self.boundaries:
            if score >= b:
                n += 1
        return Level(n)


CPU_THRESHOLDS = Thresholds(40, 60, 75, 90)
MEMORY_THRESHOLDS = Thresholds(50, 70, 80, 90)


class PressureConfig(Protocol):
    """What the assessor reads from the policy's ``cpuPressure`` / ``memoryPressure``."""

    @property
    def low(self) -> float: ...
    @property
    def medium(self) -> float: ...
    @property
    def high(self) -> float: ...
    @property
    def critical(self) -> float: ...
    @property
    def hysteresis(self) -> float: ...
    @property
    def fallTime(self) -> float: ...  # the policy's field name


@dataclass(frozen=True, slots=True)
class Assessment:
    t: float
    raw: float
    score: float  # smoothed
    level: Level
    changed: bool  # the level differs from the previous update's


class Assessor:
    """One resource's (CPU or memory) smoothed score and level."""

    def __init__(
        self, thresholds: Thresholds = CPU_THRESHOLDS, hysteresis: float = 5.0, fall_time: float = 5.0
    ) -> None:
        self._t: float | None = None
        self._score = 0.0
        self._level = Level.LOW
        self.configure(thresholds, hysteresis, fall_time)

    @classmethod
    def from_config(cls, cfg: PressureConfig) -> Assessor:
        return cls(thresholds_of(cfg), cfg.hysteresis, cfg.fallTime)

    def configure(self, thresholds: Thresholds, hysteresis: float, fall_time: float) -> None:
        """New settings (a policy reload) keep the current score and level."""
        if hysteresis < 0 or fall_time < 0:
            raise ValueError(f"hysteresis ({hysteresis}) and fall_time ({fall_time}) must be >= 0")
        self.thresholds = thresholds
        self.hysteresis = hysteresis
        self.fall_time = fall_time

    @property
    def score(self) -> float:
        return self._score

    @property
    def level(self) -> Level:
        return self._level

    def update(self, t: float, raw: float) -> Assessment:
        raw = min(100.0, max(0.0, raw))
        if self._t is None or raw >= self._score or self.fall_time == 0:
            score = raw
        else:
            dt = max(0.0, t - self._t)  # a repeated or earlier t decays nothing
            score = raw + (self._score - raw) * math.exp(-dt / self.fall_time)
        self._t = t if self._t is None else max(self._t, t)
        self._score = score
        prev = self._level
        self._level = self._next_level(score)
        return Assessment(t, raw, score, self._level, self._level != prev)

    def _next_level(self, score: float) -> Level:
        th = self.thresholds
        plain = th.level(score)
        if plain >= self._level:
            return plain  # up at once, at the boundary
        # Down only as far as the score is clear of the boundary by the margin.
        return max(plain, min(self._level, th.level(score + self.hysteresis)))


def thresholds_of(cfg: PressureConfig) -> Thresholds:
    return Thresholds(cfg.low, cfg.medium, cfg.high, cfg.critical)
