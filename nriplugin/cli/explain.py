"""`nriplugin explain` and `nriplugin doctor`: what each feature would set for a pod and why,
and what this node's kernel can do."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nriplugin.features import FeatureFailed, born_with
from nriplugin.kernel.cgroup import RESOURCES, Cgroups, Version
from nriplugin.kernel.cpulist import format_cpulist
from nriplugin.kernel.probe import Capabilities
from nriplugin.node.assembly import Node
from nriplugin.node.hooks import carried, runtime_paths
from nriplugin.nri import api_pb2 as api
from nriplugin.nri.runtime import RuntimeCaps, parse_version
from nriplugin.policy.cache import RuleCache, describe
from nriplugin.policy.model import Policy


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PodIn(_Input):
    name: str = "pod"
    namespace: str = "default"
    uid: str = "00000000-0000-0000-0000-000000000000"
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    cgroupParent: str = "/kubepods/burstable/pod00000000-0000-0000-0000-000000000000"


class ResourcesIn(_Input):
    cpuShares: int | None = Field(default=None, ge=0)
    cpuQuota: int | None = None
    cpuPeriod: int | None = Field(default=None, ge=0)
    memoryLimit: int | None = None


class ContainerIn(_Input):
    name: str = "main"
    resources: ResourcesIn = ResourcesIn()


class Description(_Input):
    pod: PodIn = PodIn()
    containers: list[ContainerIn] = [ContainerIn()]


def load_description(path: Path) -> Description:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    try:
        return Description.model_validate(doc or {})
    except ValidationError as exc:
        raise ValueError(f"{path}: {describe(exc)}") from exc


def to_nri(d: Description) -> tuple[api.PodSandbox, list[api.Container]]:
    p = api.PodSandbox(id="pod", name=d.pod.name, namespace=d.pod.namespace, uid=d.pod.uid)
    p.labels.update(d.pod.labels)
    p.annotations.update(d.pod.annotations)
    p.linux.cgroup_parent = d.pod.cgroupParent
    out = []
    for i, c in enumerate(d.containers):
        ctr = api.Container(id=f"container-{i}", pod_sandbox_id="pod", name=c.name)
        ctr.linux.cgroups_path = f"{d.pod.cgroupParent.rstrip('/')}/container-{i}"
        r = c.resources
        if r.cpuShares is not None:
            ctr.linux.resources.cpu.shares.value = r.cpuShares
        if r.cpuQuota is not None:
            ctr.linux.resources.cpu.quota.value = r.cpuQuota
        if r.cpuPeriod is not None:
            ctr.linux.resources.cpu.period.value = r.cpuPeriod
        if r.memoryLimit is not None:
            ctr.linux.resources.memory.limit.value = r.memoryLimit
        out.append(ctr)
    return p, out


def _caps(runtime_nri: str | None) -> RuntimeCaps:
    if runtime_nri is None:
        return RuntimeCaps()
    v = parse_version(runtime_nri)
    if v is None:
        raise ValueError(f"not an NRI version: {runtime_nri[:40]!r} (e.g. v0.12.5)")
    return RuntimeCaps(nri=v, source="runtime")


def describe_runtime(
    policy: Policy, runtime_nri: str | None, cgroup: Version | None = None, resctrl_mounted: bool = False
) -> dict[str, Any]:
    """Which process attributes BE is born with on a runtime of NRI ``runtime_nri`` (e.g.
    "v0.12.5"; None: not known here, the oldest supported, v0.6.1, is assumed — the running
    agent logs what it learnt at Configure), and which path the pids limit, a pod-level
    resize and resctrl take there (on cgroup ``cgroup``)."""
    runtime = _caps(runtime_nri)
    how = "as given" if runtime_nri is not None else "assumed: the runtime is not asked here"
    return {
        "nri": f"NRI {runtime.nri_version} ({how})",
        "bornWith": born_with.plan(policy, runtime).lines(),
        "paths": runtime_paths(policy, runtime, cgroup, resctrl_mounted),
    }


def explain(d: Description, rules: RuleCache, cgroups: Cgroups, runtime_nri: str | None = None) -> dict[str, Any]:
    """The pod as the hooks would see it: into a node model of its own, the same desired state;
    for a BE pod, what its containers are born with on a runtime of NRI ``runtime_nri``."""
    failures: list[str] = []
    node = Node.create(rules, cgroups=cgroups, on_invalid=failures.append)
    runtime = _caps(runtime_nri)
    fields = carried(runtime)
    pod, ctrs = to_nri(d)
    qos = node.desired.qos(pod)
    report: dict[str, Any] = {
        "policyVersion": rules.current.version,
        "policySource": rules.current.source,
        **({"policyNotes": list(rules.notes)} if rules.notes else {}),
        "qosClass": qos.value if qos else "invalid label: left untouched",
        "pod": {},
        "containers": {},
    }

    def entry(intent: Any, requested: dict[str, int] | None, pod_level: bool = False) -> dict[str, Any]:
        if intent is None:
            return {"note": "not managed (SYSTEM class or invalid label)"}
        rows = {}
        for res, value in intent.values.items():
            if pod_level:
                how = "written to the pod cgroup at RunPodSandbox"
            elif res in fields:
                how = "NRI adjustment"
            else:
                v = cgroups.version
                how = "cgroup v2 unified (NRI)" if v is not None and v.unified else "written to the cgroup file"
            rows[res] = {"value": value, "why": intent.why.get(res, ""), "via": how}
            if requested and res in requested:
                rows[res]["criAsked"] = requested[res]
        for s in intent.settings():
            if s.device:
                rows[s.label] = {"value": s.value, "why": s.why, "via": "written to the cgroup file"}
        for g in (intent.resctrl_group, intent.core_sched_group):
            if g is not None:
                rows[g.resource] = {"value": g.value, "why": g.why, "via": "the task joins at StartContainer"}
        return rows

    try:
        node.model.pod_seen(pod)
        report["pod"] = entry(node.desired.intent(f"pod:{pod.id}"), None, pod_level=True)
        for c in ctrs:
            asked = {
                k: v
                for k, v in (
                    ("cpu.shares", c.linux.resources.cpu.shares.value),
                    ("cpu.cfs_quota_us", c.linux.resources.cpu.quota.value),
                    ("memory.limit_in_bytes", c.linux.resources.memory.limit.value),
                )
                if v
            }
            node.model.container_created(pod, c)
            report["containers"][c.name] = entry(node.desired.intent(c.id), asked)
    except FeatureFailed as exc:
        report["refused"] = f"a fail-closed feature failed, the container would be refused: {exc}"
    if failures:
        report["skippedFeatures"] = sorted(set(failures))
    mounted = node.writer.resctrl is not None
    if qos is not None and qos.value == "BE":
        report["runtime"] = describe_runtime(rules.policy, runtime_nri, cgroups.version, mounted)
    elif qos is not None:
        report["runtime"] = {"paths": runtime_paths(rules.policy, runtime, cgroups.version, mounted)}
    return report


FEATURE_NEEDS: dict[str, tuple[str, list[str]]] = {
    "cpuQOS": ("implemented", ["cpu.shares"]),
    "cpuQOS.groupIdentity": ("implemented", ["cpu.bvt_warp_ns"]),
    "cpuQOS.schedIdle": ("implemented", ["cpu.idle"]),
    "batchResource": ("implemented", ["cpu.shares", "cpu.cfs_quota_us", "memory.limit_in_bytes"]),
    "cpuBurst": ("implemented", ["cpu.cfs_burst_us"]),
    "memoryQOS": ("implemented", ["memory.min", "memory.low", "memory.high"]),
    "memoryQOS.v1SoftLimit": ("implemented (memory.low's value on cgroup v1)", ["memory.soft_limit_in_bytes"]),
    "cpuset": ("implemented", ["cpuset.cpus"]),
    "blkio": ("implemented (device blocks)", ["blkio.throttle.read_bps_device"]),
    "blkio.weight": ("implemented", ["blkio.weight"]),
    "pidsLimit": ("implemented", ["pids.max"]),
}


def doctor(
    caps: Capabilities, cg: Cgroups, nri_socket: str, policy: Policy | None = None, runtime_nri: str | None = None
) -> dict[str, Any]:
    t = caps.topology
    numa = sorted(set(t.numa.values()))
    features = {}
    for name, (state, needs) in FEATURE_NEEDS.items():
        missing = [n for n in needs if not caps.files.get(n)]
        features[name] = {"status": state, "works_here": not missing, **({"missing": missing} if missing else {})}
    features["cpuQOS.coreSched"] = {
        "status": "implemented",
        "works_here": caps.core_sched,
        **({} if caps.core_sched else {"missing": ["core scheduling (prctl PR_SCHED_CORE)"]}),
    }
    features["resctrl"] = {
        "status": "implemented",
        "works_here": caps.resctrl.mounted,
        **({} if caps.resctrl.mounted else {"missing": ["resctrl mount"]}),
    }
    return {
        "kernel": platform.release(),
        "cgroup": {
            "version": int(caps.cgroup_version),
            "root": str(cg.root),
            "controllers": caps.controllers,
            "files": {k: v for k, v in caps.files.items() if k in RESOURCES},
        },
        "cpu": {
            "online": format_cpulist(t.online),
            "smt": t.smt,
            "numaNodes": len(numa),
            "cores": len(set(t.core.values())),
        },
        "resctrl": {
            "mounted": caps.resctrl.mounted,
            "l3Closids": caps.resctrl.l3_closids,
            "cacheWays": caps.resctrl.cache_ways,
            "mbaClosids": caps.resctrl.mb_closids,
        },
        "psi": caps.psi,
        "coreScheduling": caps.core_sched,
        "nri": {
            "socket": nri_socket,
            "present": os.path.exists(nri_socket),
            "lock": runtime_lock(nri_socket),
            **describe_runtime(policy or Policy(), runtime_nri, cg.version, caps.resctrl.mounted),
        },
        "inotify": inotify_usage(),  # the reconciler's watches: one per managed cgroup directory
        "features": features,
        "network": network(),
    }


def network(netns: str | None = None) -> dict[str, Any]:
    """Whether pods get interfaces of their own here (host veths with a peer in another
    namespace; host-network pods have none and cannot be shaped) and whether the tc pieces
    network QoS needs exist (tried on a throwaway IFB of ours, ``nrq-probe``)."""
    from nriplugin.netqos.tc import TC, missing

    try:
        tc = TC(netns)
    except Exception as exc:  # no netlink (a container without NET_ADMIN, say)
        return {"error": str(exc)}
    try:
        caps = tc.probe()
        veths = tc.veths()
        snap = tc.snapshot()
    except Exception as exc:
        return {"error": str(exc)}
    finally:
        tc.close()
    lacking = missing(caps)
    owners = [o for _, _, o in veths]
    return {
        "podInterfaces": len(veths),  # 0: pods share the host's network (or the CNI uses no veths)
        "shapedByNriplugin": owners.count("nriplugin"),
        "shapedByOthers": sum(1 for o in owners if o not in ("", "nriplugin")),
        "ifbs": {d: present for d, present in snap.ifbs.items()},
        "tc": caps,
        "leafQueue": "fq_codel" if caps["fq_codel"] else "pfifo (no fq_codel in this kernel)",
        "works_here": not lacking,
        **({"missing": lacking} if lacking else {}),
    }


def inotify_usage() -> dict[str, Any]:
    from nriplugin.kernel.inotify import usage

    try:
        return usage()
    except OSError as exc:
        return {"error": str(exc)}


def runtime_lock(nri_socket: str) -> dict[str, Any]:
    """Which agent holds this runtime (one agent per runtime, see agent/lock.py)."""
    import fcntl
    from dataclasses import asdict

    from nriplugin.agent.lock import lock_path, read_holder

    path = lock_path(nri_socket)
    out: dict[str, Any] = {"path": str(path)}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return {**out, "held": False, "holder": None}
    try:
        try:  # a shared lock for an instant: granted only if no agent holds it
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            held = False
        except BlockingIOError:
            held = True
    finally:
        os.close(fd)
    holder = read_holder(path)
    key = "holder" if held else "lastHolder"
    return {**out, "held": held, key: asdict(holder) if holder else None}


AGENT_METRICS = {
    "nriplugin_connection_state": "connection",
    "nriplugin_policy_version": "policyVersion",
    "nriplugin_policy_unused_field": "policyFieldsNotUsed",
    "nriplugin_reconcile_entries": "reconcilerEntries",
    "nriplugin_reconcile_passes_total": "reconcilerPasses",
    "nriplugin_drift_total": "driftFound",
    "nriplugin_repaired_total": "repaired",
    "nriplugin_conflicts_total": "conflicts",
    "nriplugin_write_errors_total": "writeErrors",
    "nriplugin_inventory_passes_total": "criInventory",
    "nriplugin_inventory_containers_total": "criInventoryContainers",
    "nriplugin_qos_cpu_pressure_score": "qosCpuPressureScore",
    "nriplugin_qos_memory_pressure_score": "qosMemoryPressureScore",
    "nriplugin_qos_pressure_level": "qosLevel",
    "nriplugin_qos_be_cpu_limit_cores": "qosBeCpuLimitCores",
    "nriplugin_qos_cpu_suppress_total": "qosCpuSuppress",
    "nriplugin_qos_cpu_burst_total": "qosCpuBurst",
}


def agent_state(address: str) -> dict[str, Any]:
    """The running agent's state, from its /metrics (doctor runs as a separate process)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as r:
            text = r.read().decode()
    except (OSError, ValueError) as exc:  # refused, timed out, an HTTP error, a bad address
        return {"reachable": False, "address": address, "error": why_unreachable(exc)}
    out: dict[str, Any] = {"reachable": True, "address": address}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        key = AGENT_METRICS.get(name)
        if key is None:
            continue
        v = float(value)
        if name == "nriplugin_connection_state":
            if v == 1:
                out[key] = labels.split('"')[1]
        elif name == "nriplugin_qos_pressure_level":  # {resource="cpu",level="HIGH"} 1
            if v == 1:
                parts = labels.split('"')
                out.setdefault(key, {})[parts[1]] = parts[3]
        elif labels:
            out.setdefault(key, {})[labels.split('"')[1]] = v
        else:
            out[key] = v
    return out


def why_unreachable(exc: Exception) -> str:
    """A failed request in a few words: ``connection refused``, ``timed out``, ``HTTP 404``."""
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    reason = getattr(exc, "reason", exc)  # urlopen wraps the socket's error in a URLError
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror[:1].lower() + reason.strerror[1:]
    return str(reason)


def no_agent(state: dict[str, Any]) -> str | None:
    """The one line ``doctor`` ends with when no agent answered (``agent_state``), else None."""
    if state.get("reachable"):
        return None
    return (
        f"no agent answering at http://{state.get('address')} ({state.get('error')}) — is nriplugin running? "
        "(--agent HOST:PORT if elsewhere)"
    )


def render(doc: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2, default=str)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def load_rules(policy: str | None) -> RuleCache:
    rules = RuleCache()
    if policy:
        rules.load_file(Path(policy))
    return rules
