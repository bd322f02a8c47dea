"""Fixtures for the end-to-end tests: a private containerd 1.7 with NRI, and nriplugin."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from testkit import containerd as harness
from testkit.plugin import PluginProcess, each, runtime_args

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def pkg_root() -> Path:
    if os.geteuid() != 0:
        pytest.skip("end-to-end tests need root (containerd, cgroups)")
    return harness.install()


@pytest.fixture
def runtime_factory(pkg_root: Path) -> Iterator[object]:
    made: list[harness.Containerd] = []

    def make(nri: bool = True, start: bool = True, cni: bool = False) -> harness.Containerd:
        base = Path(tempfile.mkdtemp(prefix="nriplugin-e2e-"))
        c = harness.Containerd(pkg_root, base, nri=nri, cni=cni)
        made.append(c)
        if start:
            c.start()
            c.import_images()
        return c

    yield make
    each(made, harness.Containerd.teardown)
    for c in made:  # teardown leaves nothing behind
        assert not harness.cgroup_dirs(c.cgroup_root), f"cgroups left: {harness.cgroup_dirs(c.cgroup_root)}"
        assert not c.base.exists()
        assert not Path("/sys/class/net", c.net_name).exists(), f"bridge left: {c.net_name}"


@pytest.fixture
def runtime(runtime_factory: object) -> harness.Containerd:
    return runtime_factory()  # type: ignore[operator,no-any-return]


@pytest.fixture
def plugin_factory() -> Iterator[object]:
    made: list[PluginProcess] = []

    def make(runtime: harness.Containerd, *extra: str, wait: bool = True) -> PluginProcess:
        p = PluginProcess(runtime.nri_socket, *runtime_args(runtime), *extra)
        made.append(p)
        if wait:
            p.wait_ready()
        return p

    yield make
    each(made, PluginProcess.stop)
