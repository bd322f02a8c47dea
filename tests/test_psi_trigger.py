"""PSI triggers: the arming line, the kernel's refusal (this machine's answer), files that are
not pressure files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nriplugin.qos.psi_trigger import open_trigger, trigger_line


def test_trigger_line_keeps_the_kernels_bounds() -> None:
    assert trigger_line("some", 50_000, 500_000) == "some 50000 500000"
    for kind, stall, window in (("any", 1, 500_000), ("some", 1, 400_000), ("full", 0, 500_000), ("some", 2, 1)):
        with pytest.raises(ValueError):
            trigger_line(kind, stall, window)


def test_refused_or_armed_on_this_kernel() -> None:
    """Either the kernel arms it (and the trigger is watched on a loop and closed), or the
    refusal comes back as a reason, never as an exception."""
    path = "/proc/pressure/cpu"
    if not Path(path).exists():
        pytest.skip("no PSI on this kernel")
    trig, why = open_trigger(path)
    if trig is None:
        assert path in why and ("PSI triggers" in why or "Permission" in why or "denied" in why)
        return

    async def main() -> None:
        assert trig is not None
        trig.start(asyncio.get_running_loop(), lambda: None)
        trig.close()

    asyncio.run(main())


def test_files_that_are_not_pressure_files(tmp_path: Path) -> None:
    trig, why = open_trigger(str(tmp_path / "missing"))
    assert trig is None and "No such file" in why
    regular = tmp_path / "cpu.pressure"
    regular.write_text("")
    trig, why = open_trigger(str(regular))
    assert trig is None and "cannot be polled" in why
