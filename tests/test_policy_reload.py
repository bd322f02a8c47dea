"""Hot reload of the policy file the way it really changes: kubelet's ConfigMap volume (the
atomic writer's symlink swap), editors (write a temp file, rename it over) and plain writes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from nriplugin.policy.cache import PolicyWatcher, RuleCache, chain


def kubelet_write(volume: Path, text: str, stamp: str) -> None:
    """What kubelet's atomic writer (pkg/volume/util/atomic_writer.go) does to a ConfigMap
    volume: a new timestamped directory with the payload, a ``..data_tmp`` symlink to it
    renamed over ``..data``, the user-visible ``policy.yaml -> ..data/policy.yaml`` made once,
    then the old timestamped directory removed."""
    new = volume / f"..2026_05_0{stamp}_10_00_00.{stamp * 9}"
    new.mkdir()
    (new / "policy.yaml").write_text(text)
    data = volume / "..data"
    old = os.readlink(data) if data.is_symlink() else None
    tmp = volume / "..data_tmp"
    tmp.symlink_to(new.name)
    os.rename(tmp, data)
    if not (volume / "policy.yaml").is_symlink():
        (volume / "policy.yaml").symlink_to("..data/policy.yaml")
    if old is not None:
        shutil.rmtree(volume / old)


@contextlib.asynccontextmanager
async def watching(path: Path) -> AsyncIterator[tuple[RuleCache, PolicyWatcher]]:
    """The policy at ``path`` loaded and watched (a short debounce), the watcher stopped after."""
    cache = RuleCache()
    cache.load_file(path)
    w = PolicyWatcher(path, cache, asyncio.get_running_loop(), debounce=0.02)
    w.start()
    try:
        yield cache, w
    finally:
        w.stop()


async def until(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def shares(cache: RuleCache) -> int:
    return cache.policy.beMinCPUShares


def test_chain_follows_every_link(tmp_path: Path) -> None:
    kubelet_write(tmp_path, "beMinCPUShares: 3\n", "1")
    given = str(tmp_path / "policy.yaml")
    assert chain(given) == [
        given,
        str(tmp_path / "..data"),
        str(tmp_path / "..2026_05_01_10_00_00.111111111" / "policy.yaml"),
    ]
    plain = tmp_path / "plain.yaml"
    plain.write_text("{}")
    assert chain(str(plain)) == [str(plain)]
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    assert len(chain(str(loop))) <= 41  # a symlink loop ends (the kernel says ELOOP at 40)


def test_configmap_updates_in_a_row(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The issue's report: after kubelet's first update the old timestamped directory was
    watched, its removal logged as the policy's, and no later edit was picked up."""
    caplog.set_level(logging.INFO, "nriplugin.policy")
    kubelet_write(tmp_path, "beMinCPUShares: 3\n", "1")
    path = tmp_path / "policy.yaml"

    async def main() -> None:
        async with watching(path) as (cache, w):
            for n, value in enumerate((4, 5, 6, 7), start=2):
                kubelet_write(tmp_path, f"beMinCPUShares: {value}\n", str(n))
                assert await until(lambda v=value: shares(cache) == v), f"update {n} not picked up"  # type: ignore[misc]
                assert cache.current.version == n + 1  # the first load was version 2
            # The old timestamped directories are gone, and nothing watches them any more.
            assert sorted(p.name for p in tmp_path.iterdir()) == [
                "..2026_05_05_10_00_00.555555555",
                "..data",
                "policy.yaml",
            ]
            assert set(w.watched()) == {str(tmp_path), str(tmp_path / "..2026_05_05_10_00_00.555555555")}
            kubelet_write(tmp_path, "beMinCPUShares: 0\n", "6")  # invalid: rejected, last good kept
            assert await until(lambda: cache.rejected == 1)
            assert shares(cache) == 7
            kubelet_write(tmp_path, "beMinCPUShares: 9\n", "7")
            assert await until(lambda: shares(cache) == 9)

    asyncio.run(main())
    assert "removed" not in caplog.text


def test_plain_edits_and_editor_replace(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("beMinCPUShares: 3\n")

    async def main() -> None:
        async with watching(path) as (cache, _):
            path.write_text("beMinCPUShares: 4\n")  # in place
            assert await until(lambda: shares(cache) == 4)
            tmp = tmp_path / ".policy.yaml.swp"  # an editor: write a temp file, rename it over
            tmp.write_text("beMinCPUShares: 5\n")
            tmp.replace(path)
            assert await until(lambda: shares(cache) == 5)
            path.rename(tmp_path / "policy.yaml~")  # vim's backup: move away, write anew
            path.write_text("beMinCPUShares: 6\n")
            assert await until(lambda: shares(cache) == 6)
            path.unlink()  # removed: the last good policy stays, and says so
            assert await until(lambda: "removed; keeping policy version 5" in caplog.text)
            path.write_text("beMinCPUShares: 8\n")  # and comes back
            assert await until(lambda: shares(cache) == 8)
            (tmp_path / "other.yaml").write_text("x")  # a neighbour changes: no reload
            await asyncio.sleep(0.1)
            assert cache.current.version == 6

    asyncio.run(main())


def test_symlink_to_a_file_elsewhere(tmp_path: Path) -> None:
    """A link to a file in another directory (a hand-made deploy): edits to the target and a
    re-pointed link both reload."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "srv").mkdir()
    a = tmp_path / "srv" / "a.yaml"
    b = tmp_path / "srv" / "b.yaml"
    a.write_text("beMinCPUShares: 3\n")
    b.write_text("beMinCPUShares: 5\n")
    path = tmp_path / "etc" / "policy.yaml"
    path.symlink_to(a)

    async def main() -> None:
        async with watching(path) as (cache, _):
            a.write_text("beMinCPUShares: 4\n")
            assert await until(lambda: shares(cache) == 4)
            tmp = tmp_path / "etc" / "new"
            tmp.symlink_to(b)
            tmp.replace(path)
            assert await until(lambda: shares(cache) == 5)
            a.write_text("beMinCPUShares: 9\n")  # the old target is no longer the policy
            b.write_text("beMinCPUShares: 6\n")
            assert await until(lambda: shares(cache) == 6)
            assert shares(cache) != 9

    asyncio.run(main())


def test_agent_reloads_a_configmap_volume(tmp_path: Path) -> None:
    """The running agent (`nriplugin run --policy`, registered with a runtime peer) follows
    kubelet's updates of its ConfigMap volume: the DaemonSet's setup in kind/."""
    from testkit.runtime_peer import RuntimePeer
    from tests.agent_proc import agent, free_port, http_get

    volume = tmp_path / "etc-nriplugin"
    volume.mkdir()
    kubelet_write(volume, "beMinCPUShares: 3\n", "1")

    def version(port: int) -> float:
        _, body = http_get(f"http://127.0.0.1:{port}/metrics")
        line = next((ln for ln in body.splitlines() if ln.startswith("nriplugin_policy_version ")), "x 0")
        return float(line.split()[1])

    async def main() -> None:
        sock = str(tmp_path / "nri.sock")
        port = free_port()
        log = (tmp_path / "agent.log").open("w")
        args = ("--socket", sock, "--metrics-address", f"127.0.0.1:{port}", "--policy", str(volume / "policy.yaml"))
        peer = RuntimePeer()
        try:
            async with agent(*args, "--cri-socket", "", "--log-format", "text", stderr=log) as proc:
                await peer.listen(sock)
                await peer.next_session(timeout=15)
                assert await until(lambda: version(port) == 2.0, 15)  # the file's policy, at start
                for n, value in enumerate((4, 5, 6), start=2):
                    kubelet_write(volume, f"beMinCPUShares: {value}\n", str(n))
                    assert await until(lambda n=n: version(port) == n + 1.0, 10), (tmp_path / "agent.log").read_text()  # type: ignore[misc]
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(proc.wait(), 10) == 0
        finally:
            await peer.close()
            log.close()
        text = (tmp_path / "agent.log").read_text()
        assert "removed" not in text and f"policy version 5 from {volume / 'policy.yaml'}" in text

    asyncio.run(main())
