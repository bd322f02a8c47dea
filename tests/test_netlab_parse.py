"""The network lab's parsers (``testkit.netlab``, ``bench.netqos``): ping output, percentiles and
the bench's annotation flags, without a network."""

from __future__ import annotations

import pytest

from bench.netqos import parse_annotations
from testkit.netlab import parse_ping, percentile

BUSYBOX = """PING 198.18.1.6 (198.18.1.6): 56 data bytes
64 bytes from 198.18.1.6: seq=0 ttl=63 time=0.255 ms
64 bytes from 198.18.1.6: seq=1 ttl=63 time=150.064 ms
64 bytes from 198.18.1.6: seq=3 ttl=63 time=12.5 ms

--- 198.18.1.6 ping statistics ---
4 packets transmitted, 3 packets received, 25% packet loss
round-trip min/avg/max = 0.255/54.273/150.064 ms
"""


def test_ping_output_gives_percentiles_and_losses() -> None:
    got = parse_ping(BUSYBOX, sent=4)
    assert (got.p50_ms, got.p99_ms, got.sent, got.received) == (12.5, 150.064, 4, 3)


def test_no_reply_is_an_error_not_zero_latency() -> None:
    with pytest.raises(RuntimeError, match="no ping replies"):
        parse_ping("PING 198.18.1.6 (198.18.1.6): 56 data bytes\n", sent=3)


def test_nearest_rank_percentile() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == 50.0
    assert percentile(xs, 99) == 99.0
    assert percentile(xs, 100) == 100.0
    assert percentile([7.0], 99) == 7.0


def test_annotation_flags() -> None:
    got = parse_annotations(["be:kubernetes.io/egress-bandwidth=20M", "ls:a=b", "be:c="])
    assert got == {"be": {"kubernetes.io/egress-bandwidth": "20M", "c": ""}, "ls": {"a": "b"}}
    for bad in ("xx:a=b", "be:a", "be:=1"):
        with pytest.raises(SystemExit):
            parse_annotations([bad])
