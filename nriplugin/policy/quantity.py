"""Kubernetes resource quantities ("500m", "1k", "512Mi", "1.5Gi", "2e3"), strictly parsed."""

from __future__ import annotations

import re
from decimal import Decimal

# Decimal suffixes (n u m "" k M G T P E: powers of 1000 from 1e-9) and binary ones (Ki .. Ei:
# powers of 1024), as Kubernetes' resource.Quantity takes them.
_SUFFIX = {s: Decimal(1000) ** (i - 3) for i, s in enumerate(("n", "u", "m", "", "k", "M", "G", "T", "P", "E"))}
_SUFFIX |= {s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))}
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
