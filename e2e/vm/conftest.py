"""The VM lane's fixtures: one guest per test session, systemd as its PID 1 (booting takes
20-40 s and Python in the guest starts 30-50x slower than here), powered off and removed at
the end whatever happens.
Without a VM (no qemu, no kernel package, no root) the lane's tests skip with the reason, and
fail with it when NRIPLUGIN_REQUIRE_PEERS=1 (CI)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import containerd as harness
from testkit import vm


def unavailable(why: str) -> None:
    if os.environ.get("NRIPLUGIN_REQUIRE_PEERS") == "1":
        pytest.fail(f"no VM for the cgroup v2 lane: {why}")
    pytest.skip(f"no VM for the cgroup v2 lane: {why}")


@pytest.fixture(scope="session")
def vm_kit() -> Path:
    if os.geteuid() != 0:
        unavailable("needs root (the kit build installs qemu; the guest's tests write cgroups as root)")
    try:
        return vm.build_kit()
    except vm.Unavailable as exc:
        unavailable(str(exc))
        raise


@pytest.fixture(scope="session")
def guest_runtime() -> list[str]:
    """The containerd lines the guest runs (:func:`testkit.vm.runtime_lines`), installed here
    first: the guest sees this machine's cache read-only and could not build them."""
    lines = vm.runtime_lines()
    for line in lines:
        harness.install(line)
    return lines


@pytest.fixture(scope="session")
def guest(vm_kit: Path, guest_runtime: list[str]) -> Iterator[vm.Guest]:
    try:
        g = vm.Guest(vm_kit, systemd=True)  # systemd as PID 1: the systemd driver's tests need it
    except vm.Unavailable as exc:
        unavailable(str(exc))
        raise
    with g:
        yield g
