"""bench/qos.py's policy: the bench measures how fast BE's quota reacts, so its agent must put a
quota on BE at every CPU level (the default puts none below HIGH, and the run then fails after
its start-up, waiting for a quota that never comes)."""

from __future__ import annotations

from bench import qos
from nriplugin.policy.cache import parse
from nriplugin.policy.model import Policy


def test_the_bench_s_policy_puts_a_quota_on_be_at_every_level() -> None:
    policy, _ = parse(qos.QUOTA_POLICY, "bench.qos")
    assert policy.qosManager.cpuSuppress.quotaFrom == "LOW"
    assert Policy().qosManager.cpuSuppress.quotaFrom == "HIGH"  # else the bench needs no policy
