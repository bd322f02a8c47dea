"""kubelet's part of a pod's birth, between a CRI client and the runtime: every CRI call is
passed through as it is, but a RunPodSandbox whose pod names no cgroup parent gets the one
kubelet would give it.

A client that talks CRI straight to the runtime (cri-tools' critest, on the cgroupfs driver)
leaves the parent empty, and the runtime puts such a pod under its own ``/k8s.io`` group, where
no kubelet ever puts one; nriplugin, rightly, does not manage a pod it cannot place. Through
this proxy the same pods live where kubelet's would, so the agent treats them as it treats a
real node's and its answers are in the path of every call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from nriplugin.cri import api_pb2

_LIMITS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def deadline(context: grpc.ServicerContext) -> float | None:
    """The caller's time left, for the call upstream; None when it gave no deadline (gRPC then
    says a time no timeout can take: a pull with no deadline would fail at once)."""
    left = context.time_remaining()
    return left if left is not None and left < 365 * 86400 else None


class CRIProxy:
    """A CRI server on ``socket`` that forwards to the runtime's ``upstream`` socket, raw."""

    def __init__(self, upstream: str, socket: Path, cgroup_parent: Callable[[Any], str]) -> None:
        self.upstream, self.socket, self.cgroup_parent = upstream, socket, cgroup_parent
        self.placed = 0  # pods given a parent
        self.channel: grpc.Channel | None = None
        self.server: grpc.Server | None = None
        self.streaming = {
            f"/{service.full_name}/{m.name}"
            for service in api_pb2.DESCRIPTOR.services_by_name.values()
            for m in service.methods
            if m.server_streaming
        }

    @property
    def address(self) -> str:
        return f"unix://{self.socket}"

    def run_pod_sandbox(self, raw: bytes) -> bytes:
        req = api_pb2.RunPodSandboxRequest.FromString(raw)
        if req.config.linux.cgroup_parent:
            return raw
        req.config.linux.cgroup_parent = self.cgroup_parent(req.config)
        self.placed += 1
        return bytes(req.SerializeToString())

    def start(self) -> None:
        self.channel = grpc.insecure_channel(f"unix://{self.upstream}", options=_LIMITS)
        channel = self.channel
        proxy = self

        def unary(method: str) -> grpc.RpcMethodHandler[Any, Any]:
            call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)

            def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
                if method.endswith("/RunPodSandbox"):
                    request = proxy.run_pod_sandbox(request)
                try:
                    return bytes(call(request, timeout=deadline(context)))
                except grpc.RpcError as e:
                    context.abort(e.code(), e.details() or "")
                    raise  # abort raises; this line only tells the type checker so

            return grpc.unary_unary_rpc_method_handler(forward)

        def stream(method: str) -> grpc.RpcMethodHandler[Any, Any]:
            call: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(method)

            def forward(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
                responses = call(request, timeout=deadline(context))

                def cancel() -> None:  # the client went: so does the call upstream
                    responses.cancel()

                context.add_callback(cancel)
                try:
                    yield from responses
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.CANCELLED:
                        context.abort(e.code(), e.details() or "")

            return grpc.unary_stream_rpc_method_handler(forward)

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
                method: str = details.method
                return stream(method) if method in proxy.streaming else unary(method)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=_LIMITS)
        self.server.add_generic_rpc_handlers((Handler(),))
        self.server.add_insecure_port(self.address)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=2).wait(10)
            self.server = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
