"""resctrl: one control group per QoS class with an L3 CAT mask and an MBA percentage, and
tasks assigned to it. Root injectable; names and values validated; nothing written outside."""

from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from nriplugin.kernel.probe import Resctrl as Info

_GROUP = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ResctrlError(ValueError):
    pass


def cat_mask(ways: int, start_pct: int, end_pct: int, min_bits: int = 1) -> int:
    """Contiguous cache-way bits for [start%, end%) of ``ways`` (at least ``min_bits`` wide)."""
    if ways <= 0:
        raise ResctrlError("no L3 cache ways")
    lo = math.floor(ways * start_pct / 100)
    hi = max(math.ceil(ways * end_pct / 100), lo + min_bits)
    hi = min(hi, ways)
    lo = min(lo, hi - min_bits)
    return ((1 << (hi - lo)) - 1) << lo


def mba_value(pct: int, info: Info) -> int:
    gran = info.mb_granularity or 10
    v = max(info.mb_min_bandwidth or gran, min(100, round(pct / gran) * gran))
    return v


@dataclass
class ResctrlFS:
    root: Path
    info: Info

    def domains(self, resource: str) -> list[str]:
        """Cache/MB domain ids from the root group's schemata (e.g. L3:0=7ff;1=7ff)."""
        try:
            text = (self.root / "schemata").read_text()
        except OSError:
            return []
        for line in text.splitlines():
            name, _, rest = line.strip().partition(":")
            if name == resource:
                return [d.split("=")[0] for d in rest.split(";") if "=" in d]
        return []

    def schemata(self, start_pct: int, end_pct: int, mba_pct: int) -> str:
        lines = []
        if self.info.l3_cbm_mask:
            mask = cat_mask(self.info.cache_ways, start_pct, end_pct, self.info.l3_min_cbm_bits)
            lines.append("L3:" + ";".join(f"{d}={mask:x}" for d in self.domains("L3")))
        if self.info.mb_closids and self.domains("MB"):
            v = mba_value(mba_pct, self.info)
            lines.append("MB:" + ";".join(f"{d}={v}" for d in self.domains("MB")))
        return "\n".join(lines) + "\n"

    def _dir(self, group: str) -> Path:
        if not _GROUP.match(group):
            raise ResctrlError(f"invalid resctrl group name {group[:80]!r}")
        path = self.root / group
        real, base = os.path.realpath(path), os.path.realpath(self.root)
        if not real.startswith(base + os.sep):
            raise ResctrlError(f"refusing {path}: outside {self.root}")
        return path

    def ensure_group(self, group: str, schemata: str) -> bool:
        """Create ``group`` if needed and set its schemata; returns whether anything changed."""
        d = self._dir(group)
        changed = False
        if not d.is_dir():
            d.mkdir()  # the kernel fills in schemata/tasks; EBUSY/ENOSPC when out of CLOSIDs
            changed = True
        path = d / "schemata"
        try:
            current = path.read_text()
        except FileNotFoundError:
            current = ""
        want = {ln.split(":")[0]: ln for ln in schemata.splitlines() if ln}
        have = {ln.split(":")[0]: ln.strip() for ln in current.splitlines() if ln.strip()}
        if any(have.get(k) != v for k, v in want.items()):
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, schemata.encode())
            finally:
                os.close(fd)
            changed = True
        return changed

    def add_task(self, group: str, pid: int) -> None:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ResctrlError(f"invalid pid {pid!r}")
        path = self._dir(group) / "tasks"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        try:
            os.write(fd, f"{pid}\n".encode())
        finally:
            os.close(fd)

    def join(self, group: str, schemata: str, tids: list[int]) -> None:
        """Move threads into ``group`` (made on first use with ``schemata``). With several,
        the group's task list is read once and only the missing ones written; threads that exit
        meanwhile (ESRCH) are skipped; other errors raise (OSError, ResctrlError)."""
        self.ensure_group(group, schemata)
        have = self.tasks(group) if len(tids) > 1 else set()
        for tid in tids:
            if tid not in have:
                with contextlib.suppress(ProcessLookupError):
                    self.add_task(group, tid)

    def tasks(self, group: str) -> set[int]:
        try:
            text = (self._dir(group) / "tasks").read_text()
        except FileNotFoundError:
            return set()
        return {int(t) for t in text.split() if t.isdigit()}
