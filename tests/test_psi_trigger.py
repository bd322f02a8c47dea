"""PSI triggers: the arming line, the kernel's refusal (this machine's answer), files that are
not pressure files."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from nriplugin.kernel.psi_trigger import open_trigger, trigger_line


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


def test_a_watch_wakes_on_pollpri_and_follows_its_paths(tmp_path: Path) -> None:
    """One epoll for many triggers: an fd signalling POLLPRI (a socket's urgent byte stands in
    for an armed trigger, which this kernel refuses) wakes the loop; paths that leave the set
    are closed; files that are not pressure files are refused once and remembered."""
    import socket

    from nriplugin.kernel.psi_trigger import PressureWatch

    plain = tmp_path / "cpu.pressure"  # a regular file, as on a temp tree: not pollable
    plain.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")

    async def main() -> None:
        watch = PressureWatch()
        woke = asyncio.Event()
        watch.start(asyncio.get_running_loop(), woke.set)
        a, b = socket.socketpair()
        try:
            assert watch.watch("ls-pod", os.dup(a.fileno())) == ""
            watch.follow({"ls-pod", str(plain)})
            assert str(plain) in watch.refused and "ls-pod" in watch.fds
            b.send(b"!", socket.MSG_OOB)
            await asyncio.wait_for(woke.wait(), 2.0)
            watch.follow(set())  # the LS pod left
            assert not watch.fds and not watch.refused
        finally:
            watch.close()
            a.close()
            b.close()

    asyncio.run(main())
