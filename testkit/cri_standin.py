"""The runtime's CRI RuntimeService, standing in for containerd where none runs (unit tests, the
hook-latency benchmark): the calls the inventory makes (ListPodSandbox, ListContainers, and
the verbose PodSandboxStatus/ContainerStatus whose JSON carries what NRI would say), on a real
gRPC server over a unix socket, with a call log."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from nriplugin.cri import api_pb2 as cri
from nriplugin.nri import api_pb2 as api


class FakeRuntime:
    """CRI's RuntimeService on a unix socket (grpc.aio's own server), with a call log."""

    def __init__(self) -> None:
        self.pods: dict[str, tuple[Any, dict[str, Any]]] = {}
        self.containers: dict[str, tuple[Any, dict[str, Any]]] = {}
        self.calls: list[str] = []
        self.raw_info: dict[str, str] = {}  # id -> verbatim info string (hostile tests)
        self.stopped: list[tuple[str, str, int]] = []  # ("container"|"pod", id, timeout), in order
        self.fail: str | None = None  # a method that fails (a runtime going away)
        self.fail_detail = ""  # more of what the failing method says
        self.deadlines: list[tuple[str, float | None]] = []  # the seconds each call was given

    def handlers(self) -> grpc.GenericRpcHandler:
        def unary(name: str, req_cls: Any, fn: Callable[[Any], Any]) -> grpc.RpcMethodHandler[Any, Any]:
            def call(request: Any, context: Any) -> Any:
                self.calls.append(name)
                self.deadlines.append((name, context.time_remaining()))
                if name == self.fail:
                    raise RuntimeError(f"{name}: the runtime is going away{self.fail_detail}")
                return fn(request)

            return grpc.unary_unary_rpc_method_handler(
                call, request_deserializer=req_cls.FromString, response_serializer=lambda m: m.SerializeToString()
            )

        def info(obj_id: str, data: dict[str, Any]) -> dict[str, str]:
            return {"info": self.raw_info.get(obj_id, json.dumps(data))}

        return grpc.method_handlers_generic_handler(
            "runtime.v1.RuntimeService",
            {
                "ListPodSandbox": unary(
                    "ListPodSandbox",
                    cri.ListPodSandboxRequest,
                    lambda r: cri.ListPodSandboxResponse(items=[p for p, _ in self.pods.values()]),
                ),
                "ListContainers": unary(
                    "ListContainers",
                    cri.ListContainersRequest,
                    lambda r: cri.ListContainersResponse(
                        containers=[
                            c
                            for c, _ in self.containers.values()
                            if not r.filter.pod_sandbox_id or c.pod_sandbox_id == r.filter.pod_sandbox_id
                        ]
                    ),
                ),
                "StopContainer": unary("StopContainer", cri.StopContainerRequest, self._stop_container),
                "StopPodSandbox": unary("StopPodSandbox", cri.StopPodSandboxRequest, self._stop_pod),
                "PodSandboxStatus": unary(
                    "PodSandboxStatus",
                    cri.PodSandboxStatusRequest,
                    lambda r: cri.PodSandboxStatusResponse(info=info(r.pod_sandbox_id, self.pods[r.pod_sandbox_id][1])),
                ),
                "ContainerStatus": unary(
                    "ContainerStatus",
                    cri.ContainerStatusRequest,
                    lambda r: cri.ContainerStatusResponse(
                        info=info(r.container_id, self.containers[r.container_id][1])
                    ),
                ),
            },
        )

    def _stop_container(self, r: Any) -> Any:
        """As a runtime does: the container exits (after SIGTERM, SIGKILL at the timeout)."""
        self.stopped.append(("container", r.container_id, r.timeout))
        if r.container_id in self.containers:
            self.containers[r.container_id][0].state = cri.CONTAINER_EXITED
        return cri.StopContainerResponse()

    def _stop_pod(self, r: Any) -> Any:
        self.stopped.append(("pod", r.pod_sandbox_id, 0))
        if r.pod_sandbox_id in self.pods:
            self.pods[r.pod_sandbox_id][0].state = cri.SANDBOX_NOTREADY
        return cri.StopPodSandboxResponse()

    def add_node(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        """What NRI's Synchronize would hand over, as CRI lists it (verbose info included)."""
        for p in pods:
            sb = cri.PodSandbox(
                id=p.id, state=cri.SANDBOX_READY, labels=dict(p.labels), annotations=dict(p.annotations)
            )
            sb.metadata.name, sb.metadata.uid, sb.metadata.namespace = p.name, p.uid, p.namespace
            info = {
                "pid": 4242,
                "config": {"metadata": {"name": p.name}, "linux": {"cgroup_parent": p.linux.cgroup_parent}},
                "runtimeSpec": {"linux": {"cgroupsPath": p.linux.cgroups_path}},
            }
            self.pods[p.id] = (sb, info)
        for c in containers:
            running = c.state == api.CONTAINER_RUNNING
            ct = cri.Container(
                id=c.id,
                pod_sandbox_id=c.pod_sandbox_id,
                state=cri.CONTAINER_RUNNING if running else cri.CONTAINER_CREATED,
                labels=dict(c.labels),
                annotations=dict(c.annotations),
            )
            ct.metadata.name = c.name
            r = c.linux.resources
            res: dict[str, Any] = {"cpu": {}, "memory": {}}
            if r.cpu.HasField("shares"):
                res["cpu"]["shares"] = r.cpu.shares.value
            if r.cpu.HasField("quota"):
                res["cpu"]["quota"] = r.cpu.quota.value
            if r.cpu.HasField("period"):
                res["cpu"]["period"] = r.cpu.period.value
            if r.memory.HasField("limit"):
                res["memory"]["limit"] = r.memory.limit.value
            info = {
                "sandboxID": c.pod_sandbox_id,
                "pid": 4343 if running else 0,
                "runtimeSpec": {"linux": {"cgroupsPath": c.linux.cgroups_path, "resources": res}},
            }
            self.containers[c.id] = (ct, info)


@contextlib.contextmanager
def serving(rt: FakeRuntime, sock: str) -> Iterator[None]:
    """``rt`` on a unix socket, from a thread pool, until the block ends."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((rt.handlers(),))
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        yield
    finally:
        server.stop(None).wait(5)
