"""Bandwidth as the policy takes it (network QoS), as Koordinator's CRD and code do: a class's
bandwidth is an integer percentage of the total (0-100), ``"N%"`` the same, or a Kubernetes
quantity string in bits/s (``"50M"``); ``totalNetworkBandwidth`` is an integer in Mbit/s (the
CRD's unit) or a quantity string in bits/s (``"100M"``)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from nriplugin.policy.quantity import parse_quantity

MIN_RATE = 1_000  # bits/s: below this tc's rate tables say nothing useful
MAX_RATE = 10**12  # 1 Tbit/s


def bits(text: object) -> int:
    """A quantity in bits/s within MIN_RATE..MAX_RATE; ValueError otherwise."""
    if isinstance(text, str) and text.strip().startswith("-"):
        raise ValueError(f"negative: {text.strip()[:40]!r}")
    q = parse_quantity(text)
    if q < MIN_RATE or q > MAX_RATE:
        raise ValueError(f"{text!s:.40} is outside 1k..1T bits/s")
    return int(q)


def percent(v: object) -> int | None:
    """The percentage an int or ``"N%"`` names (None: not a percentage)."""
    if isinstance(v, bool):
        raise ValueError("expected a percentage (0-100) or a bandwidth such as 50M")
    if isinstance(v, int):
        p = v
    elif isinstance(v, str) and v.strip().endswith("%"):
        try:
            d = Decimal(v.strip()[:-1])
        except InvalidOperation as exc:
            raise ValueError(f"not a percentage: {v[:40]!r}") from exc
        if d != d.to_integral_value():
            raise ValueError(f"percentages are whole numbers: {v[:40]!r}")
        p = int(d)
    else:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"a percentage must be within 0-100, got {p}")
    return p


def check_class_bandwidth(v: object) -> int | str:
    """A class bandwidth as the policy keeps it (policy validation)."""
    if percent(v) is None:
        if not isinstance(v, str):
            raise ValueError(f"expected a percentage (0-100) or a bandwidth such as 50M, got {type(v).__name__}")
        bits(v)
    assert isinstance(v, (int, str))
    return v


def class_bits(v: int | str, total: int) -> int:
    """A class bandwidth in bits/s (a percentage of ``total``, or a quantity)."""
    p = percent(v)
    return total * p // 100 if p is not None else bits(v)


def parse_total_bandwidth(v: object) -> int:
    """``totalNetworkBandwidth`` in bits/s: an integer is Mbit/s, a string a quantity."""
    if isinstance(v, bool):
        raise ValueError("expected Mbit/s or a bandwidth such as 100M")
    if isinstance(v, int):
        if not 1 <= v <= MAX_RATE // 10**6:
            raise ValueError(f"{v} Mbit/s is outside 1..{MAX_RATE // 10**6}")
        return v * 10**6
    if isinstance(v, str):
        return bits(v)
    raise ValueError(f"expected Mbit/s or a bandwidth such as 100M, got {type(v).__name__}")
