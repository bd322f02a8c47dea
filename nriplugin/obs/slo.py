"""The hook-latency SLO, and ``nriplugin slo``: how a live ``/metrics`` page measures up to it.

containerd waits on every hook, so the promise is about answers: by default 99.9 % of
CreateContainer hooks answered within 2 ms over 30 days. A hook that failed (error, timeout)
is not in the latency histogram (``nriplugin_hook_failures_total`` counts it) and counts as
a bad answer; one answered over budget is in the histogram and counts by its latency. The same
definition feeds the Prometheus rules (``tools/monitoring.py`` writes them from :class:`SLO`),
so the command and the alerts agree on what "good" means.

Quantiles follow Prometheus's ``histogram_quantile`` to the letter (linear inside a bucket, the
highest finite bound when the rank falls in +Inf), so ``nriplugin slo`` and the recording rules
give the same p99 from the same counts. The counts here are since the agent started.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAM = "nriplugin_hook_duration_seconds"
FAILURES = "nriplugin_hook_failures"  # the parser's family name for ..._failures_total
BAD_FAILURES = ("error", "timeout")  # not in the histogram; over_budget ones are


@dataclass(frozen=True)
class SLO:
    event: str = "create_container"
    threshold_seconds: float = 0.002
    objective: float = 0.999  # share of hooks that must be good
    window_days: int = 30

    def __post_init__(self) -> None:
        if not 0 < self.objective < 1:
            raise ValueError(f"objective {100 * self.objective:g} %: must be above 0 and below 100 %")
        if not self.threshold_seconds > 0:
            raise ValueError(f"threshold {self.threshold_seconds * 1e3:g} ms: must be above 0")
        if self.window_days < 1:
            raise ValueError(f"window {self.window_days} days: must be at least 1")

    @property
    def budget(self) -> float:
        """The share of hooks allowed to be bad."""
        return 1 - self.objective

    def describe(self) -> str:
        return (
            f"{_pct(self.objective)} of {self.event} hooks answered within {_ms(self.threshold_seconds)} "
            f"over {self.window_days} days (error budget {_pct(self.budget)})"
        )


Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), ascending, ending with +Inf


def quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus's ``histogram_quantile`` (promql/quantile.go bucketQuantile); None for no data."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    i = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if i == len(buckets) - 1:
        return buckets[-2][0] if len(buckets) > 1 else None
    upper, count = buckets[i]
    if i == 0 and upper <= 0:
        return upper
    lower, below = (0.0, 0.0) if i == 0 else buckets[i - 1]
    return lower + (upper - lower) * (rank - below) / (count - below)


def share_within(threshold: float, buckets: Buckets) -> tuple[float, bool]:
    """Observations at or under ``threshold`` (linear inside its bucket when it is not a bucket
    bound; then the second value is False: an estimate)."""
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if threshold == upper:
            return count, True
        if threshold < upper:
            if math.isinf(upper):
                return below, False
            return below + (count - below) * (threshold - lower) / (upper - lower), False
        lower, below = upper, count
    return below, True


@dataclass(frozen=True)
class EventReport:
    event: str
    answered: int
    failed: int  # error or timeout: no answer in time, counted as bad
    p50: float | None
    p99: float | None
    good: float  # answered within the threshold
    exact: bool  # the threshold is a bucket bound (else ``good`` is interpolated)

    @property
    def total(self) -> int:
        return self.answered + self.failed

    @property
    def within(self) -> float | None:
        return self.good / self.total if self.total else None

    def budget_used(self, slo: SLO) -> float | None:
        """Bad hooks as a share of what the objective allows for this many hooks (1.0: exactly
        on the objective; over 1.0: the SLO is missed at this rate)."""
        if not self.total:
            return None
        return (self.total - self.good) / (self.total * slo.budget)


def analyse(text: str, slo: SLO) -> list[EventReport]:
    """One report per event in an agent's /metrics text; the SLO's event first, then by name."""
    hist: dict[str, dict[float, float]] = defaultdict(dict)
    failed: dict[str, float] = defaultdict(float)
    for fam in text_string_to_metric_families(text):
        if fam.name == HISTOGRAM:
            for s in fam.samples:
                if s.name == HISTOGRAM + "_bucket":
                    hist[s.labels["event"]][float(s.labels["le"])] = s.value
        elif fam.name == FAILURES:
            for s in fam.samples:
                if s.name == FAILURES + "_total" and s.labels.get("reason") in BAD_FAILURES:
                    failed[s.labels["event"]] += s.value
    out = []
    for event in sorted(set(hist) | set(failed), key=lambda e: (e != slo.event, e)):
        buckets = sorted(hist.get(event, {}).items())
        good, exact = share_within(slo.threshold_seconds, buckets) if buckets else (0.0, True)
        out.append(
            EventReport(
                event=event,
                answered=int(buckets[-1][1]) if buckets else 0,
                failed=int(failed.get(event, 0)),
                p50=quantile(0.5, buckets),
                p99=quantile(0.99, buckets),
                good=good,
                exact=exact,
            )
        )
    return out


class MetricsUnreachable(Exception):
    """No metrics page at the address; the message is the one line to print."""


def metrics_url(agent: str) -> str:
    """``HOST:PORT`` (as ``doctor --agent`` takes it) or a whole URL."""
    if "://" in agent:
        return agent
    return f"http://{agent}/metrics"


def fetch(url: str, timeout: float = 5.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body: bytes = r.read()
    except urllib.error.HTTPError as exc:
        raise MetricsUnreachable(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (OSError, ValueError) as exc:  # refused, timed out, bad address
        raise MetricsUnreachable(f"{url}: {getattr(exc, 'reason', exc)}") from None
    text = body.decode(errors="replace")
    if f"# TYPE {HISTOGRAM} histogram" not in text:
        raise MetricsUnreachable(f"{url}: no {HISTOGRAM} here (not nriplugin's metrics endpoint?)")
    return text


def render(reports: list[EventReport], slo: SLO, url: str) -> str:
    lines = [f"SLO: {slo.describe()}", f"from {url} (counts since the agent started)", ""]
    if not reports:
        return "\n".join([*lines, "no hooks answered yet"])
    within = f"within {_ms(slo.threshold_seconds)}"
    rows = [("event", "hooks", "failed", "p50", "p99", within, "budget used")]
    for r in reports:
        share = "-" if r.within is None else ("" if r.exact else "~") + _pct(r.within, 3)
        used = r.budget_used(slo)
        rows.append(
            (
                r.event + (" *" if r.event == slo.event else ""),
                str(r.answered),
                str(r.failed),
                _ms(r.p50),
                _ms(r.p99),
                share,
                "-" if used is None else _pct(used, 0),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    lines.append("")
    lines.append(f"* the SLO's event. Budget used: bad hooks / ({_pct(slo.budget)} of hooks); over 100 % misses it.")
    if any(not r.exact for r in reports):
        lines.append("~ the threshold is not a bucket bound: interpolated inside its bucket.")
    return "\n".join(lines)


def run(agent: str, slo: SLO) -> int:
    url = metrics_url(agent)
    try:
        text = fetch(url)
    except MetricsUnreachable as exc:
        print(f"nriplugin slo: {exc}")
        return 2
    print(render(analyse(text, slo), slo, url))
    return 0


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"


def _pct(x: float, digits: int | None = None) -> str:
    if digits is None:
        return f"{100 * x:g} %"
    return f"{100 * x:.{digits}f} %"
