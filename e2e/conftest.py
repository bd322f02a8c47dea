"""Fixtures for the end-to-end tests: a private containerd with NRI, nriplugin, and a newer runc.

The runtime line is one switch for the whole suite: ``--runtime 1.7|2.1|2.4`` or
``NRIPLUGIN_RUNTIME`` (the option wins and is passed on to everything the tests start); the
newest by default. ``runtime_line`` says what it is, for tests whose runtimes differ."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from testkit import containerd as harness
from testkit.kubelet import Kubelet
from testkit.plugin import PluginProcess, each, runtime_args

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runtime",
        choices=harness.RUNTIMES,
        default=None,
        help=f"containerd line for the e2e tests (default: $NRIPLUGIN_RUNTIME, else {harness.NEWEST})",
    )


def pytest_configure(config: pytest.Config) -> None:
    line = config.getoption("--runtime", default=None)
    if line:
        os.environ["NRIPLUGIN_RUNTIME"] = line


def pytest_report_header(config: pytest.Config) -> str:
    return f"e2e runtime: containerd {harness.selected()} (NRIPLUGIN_RUNTIME / --runtime)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def pkg_root() -> Path:
    if os.geteuid() != 0:
        pytest.skip("end-to-end tests need root (containerd, cgroups)")
    return harness.install()


@pytest.fixture(scope="session")
def runtime_line(pkg_root: Path) -> harness.Runtime:
    """The installed containerd: its version and the behaviour of its line."""
    return harness.runtime_of(pkg_root)


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
def kubelet(runtime: harness.Containerd) -> Iterator[Kubelet]:
    """A test-side kubelet on ``runtime``'s cgroup root (testkit/kubelet.py), started before
    any pod and rewriting the QoS-class groups far more often than kubelet does, so a test sees
    many rounds; ``runtime``'s pods are laid out through it. Stopped before the runtime's
    teardown removes the groups."""
    kl = Kubelet(runtime.cgroup_root, resync=1.0)
    kl.start()
    runtime.kubelet = kl
    try:
        yield kl
    finally:
        kl.stop()


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


def missing(why: str) -> None:
    """A prerequisite this machine lacks: a failure in CI (NRIPLUGIN_REQUIRE_PEERS=1), else a skip."""
    if os.environ.get("NRIPLUGIN_REQUIRE_PEERS") == "1":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def runc() -> Path:
    """runc from the Go module proxy, with seccomp (cached; testkit/build_runc.sh): needs Go, gcc and
    libseccomp-dev."""
    r = subprocess.run(["bash", str(ROOT / "testkit" / "build_runc.sh")], capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        missing(f"testkit/build_runc.sh failed: {r.stderr.strip()[-500:]}")
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def new_runc_runtime(pkg_root: Path, runc: Path) -> Iterator[harness.Containerd]:
    """A private containerd whose runc is ``runc``; torn down with nothing left."""
    base = Path(tempfile.mkdtemp(prefix="nriplugin-e2e-"))
    rt = harness.Containerd(pkg_root, base, runc=runc)
    try:
        rt.start()
        rt.import_images()
        yield rt
    finally:
        rt.teardown()
    assert not harness.cgroup_dirs(rt.cgroup_root), f"cgroups left: {harness.cgroup_dirs(rt.cgroup_root)}"
