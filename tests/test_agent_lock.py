"""The runtime lock: one holder, a clean handover says when it stopped, a dead holder frees it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from nriplugin.agent.lock import AgentLock, Holder, lock_path, read_holder


def test_lock_path_is_next_to_the_socket() -> None:
    assert lock_path("/var/run/nri/nri.sock") == Path("/var/run/nri/nri.sock.nriplugin.lock")


def test_one_holder_and_a_clean_handover(tmp_path: Path) -> None:
    sock = str(tmp_path / "nri.sock")
    first, second = AgentLock(sock), AgentLock(sock)
    assert first.try_acquire()
    me = Holder.me("socket", sock)
    first.announce(me)
    assert not second.try_acquire()
    seen = second.holder()
    assert seen is not None and seen.pid == me.pid and seen.released is None
    assert "socket" in seen.describe() and f"pid {me.pid}" in seen.describe()
    first.release(me, stopped_serving=123.5)
    assert second.try_acquire()
    last = second.holder()
    assert last is not None and last.released == 123.5
    shorter = Holder(1, "h", "", 0.0, "socket", sock)
    second.announce(shorter)  # a shorter record leaves no tail of the longer one behind
    assert read_holder(second.path) == shorter
    second.release(shorter)


def test_waiting_agent_gets_the_lock_when_released(tmp_path: Path) -> None:
    async def main() -> None:
        sock = str(tmp_path / "nri.sock")
        first, second = AgentLock(sock), AgentLock(sock)
        assert first.try_acquire()
        waiting = asyncio.ensure_future(second.wait())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        first.release(Holder.me("socket", sock))
        await asyncio.wait_for(waiting, 5)
        assert second.held

    asyncio.run(main())


def test_a_dead_holder_frees_the_lock(tmp_path: Path) -> None:
    sock = str(tmp_path / "nri.sock")
    code = (
        "import sys, time; from nriplugin.agent.lock import AgentLock; "
        f"lock = AgentLock({sock!r}); assert lock.try_acquire(); print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        assert not AgentLock(sock).try_acquire()
        proc.kill()
        proc.wait(10)
        assert AgentLock(sock).try_acquire()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unreadable_records_are_no_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    assert read_holder(path) is None
    path.write_text("{not json\n")
    assert read_holder(path) is None
    path.write_text('{"pid": 1}\n')
    assert read_holder(path) is None
