"""The kernel's CPU list syntax (``0-3,8,10-11``), read and written: cpuset files, sysfs
topology, Koordinator's cpuset annotations."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11]; raises ValueError on anything else."""
    out: list[int] = []
    text = text.strip()
    if not text:
        return out
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        a = int(lo)
        b = int(hi) if sep else a
        if a < 0 or b < a or b - a > 65536:
            raise ValueError(f"bad cpu list {text[:80]!r}")
        out.extend(range(a, b + 1))
    return sorted(set(out))


def format_cpulist(cpus: Iterable[int]) -> str:
    s = sorted(set(cpus))
    out: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)
