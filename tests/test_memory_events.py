"""Memory notifications: on this machine's real cgroup v1 memory hierarchy (a child group, a
real process allocating in it) the usage threshold and pressure eventfds fire on the asyncio
loop; on v2, ``memory.events`` is watched with inotify (a temp tree laid out like the
kernel's: this machine has no v2 memory controller)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nriplugin.kernel.memory_events import MemoryEvents, control_line, pressure_arg

V1 = Path("/sys/fs/cgroup/memory")
MiB = 1 << 20

# Allocates (and touches) 5 MiB every 20 ms up to the total, then holds it.
ALLOCATOR = (
    "import sys, time\nb = []\nfor _ in range(int(sys.argv[1])):\n"
    "    b.append(bytearray(5 << 20))\n    time.sleep(0.02)\ntime.sleep(60)\n"
)
Group = tuple[Path, list[subprocess.Popen[bytes]]]


def test_control_lines_are_checked() -> None:
    assert control_line(3, 4, "52428800") == "3 4 52428800"
    assert pressure_arg("critical", "hierarchy") == "critical,hierarchy"
    assert pressure_arg("medium") == "medium"
    with pytest.raises(ValueError):
        pressure_arg("severe")
    with pytest.raises(ValueError):
        control_line(3, 4, "1 2")


@pytest.fixture
def v1_group() -> object:
    if os.geteuid() != 0 or not (V1 / "cgroup.event_control").exists():
        pytest.skip("needs root and a cgroup v1 memory hierarchy")
    g = V1 / f"nriplugin-test-events-{os.getpid()}"
    g.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    yield g, procs
    for p in procs:  # by PID, then the group by path
        p.kill()
        p.wait()
    for _ in range(50):
        try:
            g.rmdir()
            break
        except OSError:
            time.sleep(0.05)


def test_v1_threshold_and_pressure_fire_for_a_real_process(v1_group: Group) -> None:
    g, procs = v1_group
    (g / "memory.limit_in_bytes").write_text(str(60 * MiB))

    async def run() -> list[tuple[float, str]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[float, str]] = []
        ev = MemoryEvents(loop, lambda what: fired.append((time.monotonic(), what)))
        assert ev.v1_threshold("usage", str(g), 30 * MiB) is None
        assert ev.v1_pressure("pressure", str(g), "medium", "default") is None
        assert ev.v1_threshold("bad", str(g / "missing"), MiB) is not None  # a reason, not a raise
        p = subprocess.Popen(
            [sys.executable, "-c", ALLOCATOR, "20"],
            preexec_fn=lambda: (g / "cgroup.procs").write_text(str(os.getpid())),
        )
        procs.append(p)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5 and {w for _, w in fired} != {"usage", "pressure"}:
            await asyncio.sleep(0.02)
        ev.close()
        assert len(ev) == 0
        return fired

    fired = asyncio.run(run())
    kinds = [w for _, w in fired]
    assert "usage" in kinds, "the usage threshold never fired"
    assert "pressure" in kinds, "no pressure notification at the limit"


def test_v2_memory_events_through_inotify(tmp_path: Path) -> None:
    g = tmp_path / "kubepods"
    g.mkdir()
    (g / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")

    async def run() -> list[str]:
        fired: list[str] = []
        ev = MemoryEvents(asyncio.get_running_loop(), fired.append)
        assert ev.v2_events("events", str(g)) is None
        why = ev.v2_pressure("pressure", str(g))  # a regular file is no PSI trigger
        assert why is not None and "memory.pressure" in why
        (g / "memory.events").write_text("low 0\nhigh 3\nmax 1\noom 0\noom_kill 0\n")
        for _ in range(100):
            if fired:
                break
            await asyncio.sleep(0.01)
        ev.close()
        return fired

    assert asyncio.run(run()) == ["events"]
