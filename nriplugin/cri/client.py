"""A small CRI client over gRPC: unary calls by method name, synchronous (tests, tools) or on
the agent's asyncio loop (``grpc.aio``), against the runtime's CRI socket."""

from __future__ import annotations

from functools import cache
from typing import Any

import grpc
import grpc.aio
from google.protobuf import message

from nriplugin.cri import api_pb2

_SERVICES = ("RuntimeService", "ImageService")
# kubelet's limit: a node's container list outgrows gRPC's 4 MiB default long before its CPU does
_OPTIONS = [("grpc.max_receive_message_length", 16 << 20)]


@cache
def method(name: str) -> tuple[str, type[message.Message]]:
    """(gRPC path, response class) of a CRI method such as ``ListContainers``."""
    for service in _SERVICES:
        svc = api_pb2.DESCRIPTOR.services_by_name[service]
        m = svc.methods_by_name.get(name)
        if m is not None:
            cls: type[message.Message] = getattr(api_pb2, m.output_type.name)
            return f"/runtime.v1.{service}/{name}", cls
    raise ValueError(f"no CRI method {name!r}")


def _serialize(request: message.Message) -> bytes:
    return request.SerializeToString()


class CRI:
    """Blocking calls: ``CRI(path).call("RunPodSandbox", request)``."""

    def __init__(self, socket_path: str, timeout: float = 30.0) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket_path}", options=_OPTIONS)
        self.timeout = timeout
        self._stubs: dict[str, Any] = {}

    def call(self, name: str, request: message.Message, timeout: float | None = None) -> Any:
        stub = self._stubs.get(name)
        if stub is None:
            path, cls = method(name)
            stub = self._stubs[name] = self.channel.unary_unary(
                path, request_serializer=_serialize, response_deserializer=cls.FromString
            )
        return stub(request, timeout=timeout or self.timeout)

    def close(self) -> None:
        self.channel.close()


class AsyncCRI:
    """The same calls on the running event loop; never blocks a hook."""

    def __init__(self, socket_path: str, timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stubs: dict[str, Any] = {}

    async def call(self, name: str, request: message.Message, timeout: float | None = None) -> Any:
        if self._channel is None:  # created on first use: grpc.aio binds to the running loop
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket_path}", options=_OPTIONS)
        stub = self._stubs.get(name)
        if stub is None:
            path, cls = method(name)
            stub = self._stubs[name] = self._channel.unary_unary(
                path, request_serializer=_serialize, response_deserializer=cls.FromString
            )
        return await stub(request, timeout=timeout or self.timeout)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stubs.clear()
