"""/debug/qos's snapshot pinned at its rounding (3 digits, 2 for load and ages, 1 for scores),
its nulls and the memory figures, on the fake manager of tests/test_top.py."""

from __future__ import annotations

import json
import math

from nriplugin.qos import view
from nriplugin.qos.cpu_suppress import SUPPRESS
from nriplugin.qos.levels import Level
from nriplugin.qos.sample import ClassUsage, NodeSample
from nriplugin.qos.strategy import Decision
from tests.test_top import FakeManager, Score


def test_numbers_are_rounded_and_non_finite_is_null() -> None:
    assert view._num(None) is None
    assert view._num(math.nan) is None and view._num(math.inf) is None and view._num(-math.inf) is None
    assert view._num(1.23456) == 1.235
    assert view._num(1.23456, 1) == 1.2
    assert isinstance(view._num(3), float)
    assert (view.CLASSES, view.DECISIONS) == (("LSE", "LSR", "LS", "BE"), 20)


def test_every_field_at_its_precision() -> None:
    sample = NodeSample(
        t=10.0,
        interval=1.0,
        ncpu=8,
        cpu_busy_cores=3.14159,
        load1=2.71828,
        mem_total=1000,
        mem_available=400,
        by_class={
            "LSR": ClassUsage(
                containers=2,
                cpu_cores=1.23456,
                cpu_request_cores=2.34567,
                cpu_limit_cores=3.45678,
                throttled_ratio=0.123456,
                memory_bytes=777,
            )
        },
    )
    m = FakeManager(last=sample, cpu=Score(42.345, Level.MEDIUM), memory=Score(12.345, Level.LOW))
    m.ratio = 0.81234
    m.limiter.step(0.0, 1.23456)
    m.burster.step(0.0, "b", wants=True, ratio=1.33333)
    m.burster.step(0.0, "a", wants=True, ratio=1.5)
    m.decisions.append(Decision(7.123, SUPPRESS, "g", "v", "w"))
    s = view.state(m, now=12.34567)
    assert s["node"] == {
        "ncpu": 8,
        "busyCores": 3.142,
        "load1": 2.72,
        "memTotalBytes": 1000,
        "memAvailableBytes": 400,
        "sampleAgeSeconds": 2.35,
    }
    assert s["classes"][1] == {
        "class": "LSR",
        "containers": 2,
        "usageCores": 1.235,
        "requestCores": 2.346,
        "limitCores": 3.457,
        "throttledRatio": 0.123,
        "memoryBytes": 777,
    }
    assert s["cpu"] == {"score": 42.3, "level": "MEDIUM"}
    assert s["memory"] == {"score": 12.3, "level": "LOW"}
    assert (s["suppressRatio"], s["beLimitCores"], s["syncPeriodSeconds"]) == (0.812, 1.235, 1.0)
    assert s["bursting"] == [{"container": "a", "ratio": 1.5}, {"container": "b", "ratio": 1.333}]  # sorted
    assert s["decisions"] == [{"ageSeconds": 5.22, "owner": SUPPRESS, "target": "g", "value": "v", "why": "w"}]
    assert s["enabled"] is True and s["profile"] == "balanced"


def test_a_sample_from_the_future_has_age_zero() -> None:
    m = FakeManager(last=NodeSample(t=10.0, interval=1.0, ncpu=1, cpu_busy_cores=0.0, load1=0.0))
    assert view.state(m, now=9.0)["node"]["sampleAgeSeconds"] == 0.0


def test_the_document_is_indented_json_with_a_newline() -> None:
    status, ctype, body = view.response(FakeManager())
    assert (status, ctype) == (200, "application/json")
    assert body.endswith(b"}\n") and body.startswith(b'{\n "enabled": true,')
    assert json.loads(body)["sampled"] is False
    assert view.response(None) == (503, "application/json", b'{"error": "the QoS manager is not running"}\n')


def test_now_defaults_to_the_monotonic_clock() -> None:
    import time

    m = FakeManager(last=NodeSample(t=time.monotonic(), interval=1.0, ncpu=1, cpu_busy_cores=0.0, load1=0.0))
    age = view.state(m)["node"]["sampleAgeSeconds"]
    assert 0.0 <= age < 60.0
    m2 = FakeManager(last=NodeSample(t=time.monotonic() - 1000, interval=1.0, ncpu=1, cpu_busy_cores=0.0, load1=0.0))
    assert view.state(m2)["node"]["sampleAgeSeconds"] >= 1000


def test_one_decision_asked_is_one_given() -> None:
    m = FakeManager()
    for i in range(3):
        m.decisions.append(Decision(float(i), SUPPRESS, "g", f"{i}", "why"))
    assert [d["value"] for d in view.state(m, now=5.0, decisions=1)["decisions"]] == ["2"]
    assert view.state(m, now=5.0, decisions=-1)["decisions"] == []
