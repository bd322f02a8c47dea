"""What the runtime at the other end of an NRI connection supports, decided once per connection.

NRI grew by versions (containerd/nri tags): v0.8 splits a large Synchronize and adds pids,
OOM score adjustment and the runtime's timeouts in Configure; v0.10 adds UpdatePodSandbox /
PostUpdatePodSandbox and validation plugins (events 12-14) and IO priority; v0.11 the Linux
scheduler, RDT and sysctl adjustments; v0.12 a dedicated RPC per event and the NRI version sent
in RegisterPlugin and Configure; v0.12.1 makes a plugin's own UpdateContainers safe (earlier
adaptations can deadlock the runtime with it). A runtime refuses a subscription to an event it does not know
("invalid plugin events"), and ignores fields it does not know.

:func:`from_configure` reads the runtime's NRI version where it sends it (v0.12 and later),
infers it from the runtime's own name and version where that is known (containerd), and
otherwise assumes the oldest line supported (v0.6, containerd 1.7). Everything else asks the
resulting :class:`RuntimeCaps` (``knows(event)``, ``supports(feature)``), never a version.
Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nriplugin.nri import api_pb2 as api

Version = tuple[int, int, int]

BASELINE: Version = (0, 6, 1)  # the oldest NRI supported: containerd 1.7.16-1.7.2x
VENDORED = "v0.12.5"  # the api.proto in protos/nri (sent as ours at registration)

# Event numbers each NRI line knows: 1-11 from the start, 12-14 (UpdatePodSandbox,
# PostUpdatePodSandbox, ValidateContainerAdjustment) from v0.10.
_EVENTS_SINCE: tuple[tuple[Version, int], ...] = (
    ((0, 10, 0), api.VALIDATE_CONTAINER_ADJUSTMENT),
    ((0, 0, 0), api.REMOVE_CONTAINER),
)

# What a plugin can use, by the first NRI version that carries it (the runtime applies it).
FEATURES: dict[str, Version] = {
    "split_synchronize": (0, 8, 0),  # SynchronizeRequest.more; the plugin must echo it
    "configure_timeouts": (0, 8, 0),  # ConfigureRequest.registration_timeout / request_timeout
    "pids_limit": (0, 8, 0),  # LinuxResources.pids
    "oom_score_adj": (0, 8, 0),  # LinuxContainerAdjustment.oom_score_adj
    "pod_update": (0, 10, 0),  # UpdatePodSandbox / PostUpdatePodSandbox events
    "validation": (0, 10, 0),  # ValidateContainerAdjustment
    "io_priority": (0, 10, 0),  # LinuxContainerAdjustment.io_priority
    "linux_scheduler": (0, 11, 0),  # LinuxContainerAdjustment.scheduler (e.g. SCHED_IDLE)
    "rdt": (0, 11, 0),  # LinuxContainerAdjustment.rdt
    "sysctl": (0, 11, 0),  # LinuxContainerAdjustment.sysctl
    "dedicated_rpcs": (0, 12, 0),  # one RPC per event; StateChange only as the fallback
    "failure_policy": (0, 12, 4),  # ConfigureResponse.failure_policy (not in v0.12.3: containerd 2.4.2)
    # Runtime.UpdateContainers outside a hook. Before v0.12.1 the adaptation holds its lock
    # while the runtime takes its own, and every container event takes them the other way
    # round: a plugin's call that meets a StartContainer wedges the runtime for good
    # (containerd#13733; seen here on containerd 1.7.24). Before that, updates travel only in
    # answers, and the agent writes the rest of the files itself.
    "plugin_updates": (0, 12, 1),
}

# containerd release -> the NRI it vendors (for runtimes older than NRI v0.12, which do not say).
_CONTAINERD_NRI: tuple[tuple[tuple[int, int, int], Version], ...] = (
    ((2, 3, 0), (0, 12, 0)),
    ((2, 2, 1), (0, 11, 0)),
    ((2, 2, 0), (0, 10, 0)),
    ((2, 0, 0), (0, 8, 0)),
    ((1, 7, 0), BASELINE),
)
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> Version | None:
    """``v0.12.5`` / ``2.1.9~ds1`` -> (0, 12, 5) / (2, 1, 9); None when there is no version."""
    m = _VERSION.search(text)
    if m is None:
        return None
    return int(m[1]), int(m[2]), int(m[3] or 0)


def _fmt(v: Version) -> str:
    return f"v{v[0]}.{v[1]}.{v[2]}"


@dataclass(frozen=True, slots=True)
class RuntimeCaps:
    """The runtime's NRI, and how it was learnt: ``source`` is "runtime" (it said so),
    "inferred" (from its name and version) or "assumed" (the baseline)."""

    runtime: str = ""
    runtime_version: str = ""
    nri: Version = BASELINE
    source: str = "assumed"
    request_timeout: float = 0.0  # seconds, when the runtime says (v0.8+); 0: not said
    registration_timeout: float = 0.0

    @property
    def events(self) -> int:
        """The event mask this runtime accepts in a subscription (bit ``event - 1``)."""
        last = next(ev for since, ev in _EVENTS_SINCE if self.nri >= since)
        return (1 << last) - 1

    def knows(self, event: int) -> bool:
        return event > 0 and bool(self.events & (1 << (event - 1)))

    def supports(self, feature: str) -> bool:
        """Whether the runtime's NRI carries ``feature`` (a key of :data:`FEATURES`)."""
        try:
            return self.nri >= FEATURES[feature]
        except KeyError:
            raise ValueError(f"unknown NRI feature {feature!r} (known: {', '.join(FEATURES)})") from None

    @property
    def nri_version(self) -> str:
        return _fmt(self.nri)

    def describe(self) -> str:
        """One line for logs, ``doctor`` and ``explain``."""
        how = {"runtime": "as it says", "inferred": "inferred from its version", "assumed": "assumed"}[self.source]
        who = f"{self.runtime} {self.runtime_version}".strip() or "the runtime"
        return f"{who}: NRI {self.nri_version} ({how})"


def from_configure(req: api.ConfigureRequest) -> RuntimeCaps:
    """The runtime's capabilities from its Configure request (the one place they are decided)."""
    nri, source = _nri_of(req)
    return RuntimeCaps(
        runtime=req.runtime_name,
        runtime_version=req.runtime_version,
        nri=nri,
        source=source,
        request_timeout=req.request_timeout / 1000,
        registration_timeout=req.registration_timeout / 1000,
    )


def _nri_of(req: api.ConfigureRequest) -> tuple[Version, str]:
    if req.NRI_version:
        # Only NRI v0.12 and later send the field: a version that does not parse ("unknown",
        # a development build) is still at least v0.12.
        said = parse_version(req.NRI_version)
        return (said if said is not None and said >= (0, 12, 0) else (0, 12, 0)), "runtime"
    if req.runtime_name == "containerd":
        rv = parse_version(req.runtime_version)
        if rv is not None:
            for since, nri in _CONTAINERD_NRI:
                if rv >= since:
                    return min(nri, (0, 11, 0)), "inferred"  # a v0.12 runtime would have said so
    return BASELINE, "assumed"
