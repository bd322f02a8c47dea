"""What the stub learns about the runtime at Configure (nriplugin.nri.runtime), pure."""

from __future__ import annotations

import pytest

from nriplugin.nri import api_pb2 as api
from nriplugin.nri.runtime import BASELINE, FEATURES, RuntimeCaps, from_configure, parse_version

V06_LAST = api.REMOVE_CONTAINER  # events 1-11
V010_LAST = api.VALIDATE_CONTAINER_ADJUSTMENT  # events 1-14


def configure(name: str = "containerd", version: str = "", nri: str = "", timeout_ms: int = 0) -> RuntimeCaps:
    return from_configure(
        api.ConfigureRequest(runtime_name=name, runtime_version=version, NRI_version=nri, request_timeout=timeout_ms)
    )


@pytest.mark.parametrize(
    ("name", "version", "nri", "expect", "source"),
    [
        ("containerd", "v2.3.1", "v0.12.5", (0, 12, 5), "runtime"),  # v0.12+ says it
        ("containerd", "v2.4.0", "unknown", (0, 12, 0), "runtime"),  # says it, unparsable: still v0.12+
        ("containerd", "v2.4.0", "v0.11.0", (0, 12, 0), "runtime"),  # only v0.12+ sends the field
        ("containerd", "1.7.24~ds1-6", "", (0, 6, 1), "inferred"),  # Debian's version string
        ("containerd", "v2.1.9", "", (0, 8, 0), "inferred"),
        ("containerd", "v2.2.0", "", (0, 10, 0), "inferred"),
        ("containerd", "v2.2.1", "", (0, 11, 0), "inferred"),
        ("containerd", "v2.3.0", "", (0, 11, 0), "inferred"),  # said nothing: not v0.12 after all
        ("containerd", "v1.6.30", "", BASELINE, "assumed"),  # older than any line we know
        ("cri-o", "1.31.0", "", BASELINE, "assumed"),
        ("", "", "", BASELINE, "assumed"),
    ],
)
def test_the_nri_version_is_read_inferred_or_assumed(
    name: str, version: str, nri: str, expect: tuple[int, int, int], source: str
) -> None:
    caps = configure(name, version, nri)
    assert (caps.nri, caps.source) == (expect, source)
    assert caps.describe().endswith(
        {"runtime": "(as it says)", "inferred": "(inferred from its version)"}.get(source, "(assumed)")
    )


def test_events_the_runtime_knows() -> None:
    old, new = configure("containerd", "v2.1.9"), configure(nri="v0.12.5")
    assert old.events == (1 << V06_LAST) - 1 and new.events == (1 << V010_LAST) - 1
    assert old.knows(api.REMOVE_CONTAINER) and not old.knows(api.UPDATE_POD_SANDBOX)
    assert new.knows(api.UPDATE_POD_SANDBOX) and new.knows(api.VALIDATE_CONTAINER_ADJUSTMENT)
    assert not new.knows(api.LAST) and not new.knows(api.UNKNOWN)


def test_features_follow_the_version_and_unknown_ones_are_an_error() -> None:
    v06, v08, v011, v012 = (
        configure("containerd", "v1.7.24"),
        configure("containerd", "v2.1.9"),
        configure("containerd", "v2.2.1"),
        configure(nri="v0.12.5"),
    )
    assert not v06.supports("split_synchronize") and v08.supports("split_synchronize")
    assert not v08.supports("pod_update") and v011.supports("pod_update")
    assert v011.supports("linux_scheduler") and not v08.supports("linux_scheduler")
    assert v012.supports("dedicated_rpcs") and not v011.supports("dedicated_rpcs")
    assert all(v012.supports(f) for f in FEATURES)
    with pytest.raises(ValueError, match="unknown NRI feature 'sched_idle'"):
        v012.supports("sched_idle")


def test_timeouts_come_from_configure_when_sent() -> None:
    assert configure(nri="v0.12.5", timeout_ms=2000).request_timeout == 2.0
    assert configure("containerd", "v1.7.24").request_timeout == 0.0


def test_parse_version() -> None:
    assert parse_version("v0.12.5") == (0, 12, 5)
    assert parse_version("2.1.9~ds1-1") == (2, 1, 9)
    assert parse_version("1.7") == (1, 7, 0)
    assert parse_version("unknown") is None
