"""The QoS manager's tuning profiles, as partial ``qosManager`` documents: latency-first (LS
protected early: lower thresholds, harder suppression), throughput-first (BE kept running:
higher thresholds), balanced.

A profile's values apply first; any field the policy sets itself wins over them, and anything
neither mentions keeps its default. The defaults are ``balanced``, so ``balanced`` restates
them.
"""

from __future__ import annotations

from typing import Any, Literal

Profile = Literal["latency-first", "throughput-first", "balanced"]

PROFILES: dict[str, dict[str, Any]] = {
    # LS first, BE may be sacrificed: react earlier, suppress harder, burst more readily.
    "latency-first": {
        "cpuPressure": {"medium": 50, "high": 65, "critical": 80},
        "cpuSuppress": {
            "suppressRatio": {"medium": 0.7, "high": 0.4, "critical": 0.2},
            "reserveLSRequestFrom": "LOW",
            "quotaFrom": "MEDIUM",
        },
        "cpuBurst": {"enabled": True, "burstRatio": 2.0, "minNodeCPUIdle": 0.15},
    },
    # BE throughput first, LS less demanding: intervene later and more gently, never evict for CPU.
    "throughput-first": {
        "cpuPressure": {"medium": 70, "high": 85, "critical": 95},
        "cpuSuppress": {
            "suppressRatio": {"medium": 0.9, "high": 0.7, "critical": 0.5},
            "reserveLSRequestFrom": "CRITICAL",
            "quotaFrom": "CRITICAL",
        },
        "cpuEvict": {"enabled": False},
    },
    # LS and BE about 1:1.
    "balanced": {
        "cpuPressure": {"medium": 60, "high": 75, "critical": 90},
        "cpuSuppress": {
            "suppressRatio": {"medium": 0.8, "high": 0.5, "critical": 0.3},
            "reserveLSRequestFrom": "HIGH",
            "quotaFrom": "HIGH",
        },
    },
}


def overlay(base: Any, over: Any) -> Any:
    """``over`` deep-merged onto ``base`` (mappings merge, anything else replaces): a profile
    onto the defaults, a partial policy document onto the embedded default."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = overlay(base[k], v) if k in base else v
        return out
    return over
