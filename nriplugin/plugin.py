"""The QoS plugin: turns the policy's desired state into NRI adjustments and updates."""

from __future__ import annotations

import logging

from .nri import api_pb2 as api
from .nri.stub import Plugin
from .policy.default import DefaultPolicy, desired_cpu_shares
from .policy.qos import InvalidQoSLabel, QoSClass, qos_class

log = logging.getLogger("nriplugin.plugin")


class QoSPlugin(Plugin):
    def __init__(self, policy: DefaultPolicy | None = None) -> None:
        self.policy = policy or DefaultPolicy()
        self.rejected_labels = 0
        self.adjusted = 0

    def _qos(self, pod: api.PodSandbox) -> QoSClass | None:
        try:
            return qos_class(pod.labels, pod.linux.cgroup_parent)
        except InvalidQoSLabel as exc:
            self.rejected_labels += 1
            log.warning(
                "pod %s/%s: %s; leaving it untouched",
                pod.namespace,
                pod.name,
                exc,
                extra={"pod": f"{pod.namespace}/{pod.name}", "reason": "invalid_label"},
            )
            return None

    def _shares(self, pod: api.PodSandbox) -> int | None:
        qos = self._qos(pod)
        return None if qos is None else desired_cpu_shares(self.policy, qos)

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        shares = self._shares(pod)
        if shares is None:
            return None
        adj = api.ContainerAdjustment()
        adj.linux.resources.cpu.shares.value = shares
        self.adjusted += 1
        return adj

    def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> list[api.ContainerUpdate]:
        """Keep the desired shares when kubelet updates a container's resources."""
        shares = self._shares(pod)
        if shares is None or resources.cpu.shares.value == shares:
            return []
        return [_shares_update(container.id, shares)]

    def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> list[api.ContainerUpdate]:
        """Bring containers that existed before we connected to the desired state."""
        by_id = {p.id: p for p in pods}
        updates = []
        for c in containers:
            pod = by_id.get(c.pod_sandbox_id)
            if pod is None:
                continue
            shares = self._shares(pod)
            if shares is not None and c.linux.resources.cpu.shares.value != shares:
                updates.append(_shares_update(c.id, shares))
        log.info("synchronized %d pods, %d containers, %d updates", len(pods), len(containers), len(updates))
        return updates


def _shares_update(container_id: str, shares: int) -> api.ContainerUpdate:
    u = api.ContainerUpdate(container_id=container_id)
    u.linux.resources.cpu.shares.value = shares
    return u
