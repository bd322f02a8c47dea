"""Kubernetes resource quantities ("500m", "1k", "512Mi", "1.5Gi", "2e3"), strictly parsed."""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_RE = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:([eE][+-]?[0-9]{1,3})|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)


def parse_quantity(value: object) -> Decimal:
    """The quantity's value; raises ValueError for anything Kubernetes would not accept."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected a quantity string, got {type(value).__name__}")
    text = str(value).strip()
    if len(text) > 64:
        raise ValueError("quantity too long")
    m = _RE.match(text)
    if not m:
        raise ValueError(f"not a quantity: {text[:40]!r}")
    # The pattern admits only numbers Decimal parses, and 64 characters stay far inside its
    # exponent range: nothing below can raise.
    number = Decimal(m.group(1))
    if m.group(2):
        return number * (Decimal(10) ** int(m.group(2)[1:]))
    return number * _SUFFIX[m.group(3) or ""]
