"""A small CRI client (kubernetes/cri-api v1) over gRPC, for driving containerd like kubelet.

The message classes are built at run time from the vendored ``protos/cri/api.proto``
(compiled to a descriptor set by grpcio-tools, cached by content hash) into a private
descriptor pool, so no generated CRI code is committed and nothing clashes with NRI's types.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
CACHE = Path(os.environ.get("NRIPLUGIN_CACHE", Path.home() / ".cache" / "nriplugin"))


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    src = (PROTOS / "cri" / "api.proto").read_bytes() + (
        PROTOS / "github.com/gogo/protobuf/gogoproto/gogo.proto"
    ).read_bytes()
    out = CACHE / f"cri-{hashlib.sha256(src).hexdigest()[:16]}.pb"
    if not out.exists():
        import grpc_tools
        from grpc_tools import protoc

        wkt = Path(grpc_tools.__file__).parent / "_proto"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        args = [
            "protoc",
            f"-I{PROTOS}",
            f"-I{wkt}",
            "--include_imports",
            f"--descriptor_set_out={tmp}",
            "cri/api.proto",
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on protos/cri/api.proto")
        tmp.replace(out)
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return pool


def msg(name: str, **fields: Any) -> Any:
    """A new ``runtime.v1.<name>`` message."""
    cls = message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"runtime.v1.{name}"))
    return cls(**fields)


class CRI:
    """``call("RunPodSandbox", request)`` on RuntimeService or ImageService."""

    def __init__(self, socket_path: str, timeout: float = 30.0) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.timeout = timeout
        self._stubs: dict[str, Any] = {}

    def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        stub = self._stubs.get(method)
        if stub is None:
            pool = _pool()
            service = "RuntimeService"
            try:
                pool.FindMethodByName(f"runtime.v1.RuntimeService.{method}")
            except KeyError:
                service = "ImageService"
            m = pool.FindMethodByName(f"runtime.v1.{service}.{method}")
            out_cls = message_factory.GetMessageClass(m.output_type)
            stub = self.channel.unary_unary(
                f"/runtime.v1.{service}/{method}",
                request_serializer=lambda r: r.SerializeToString(),
                response_deserializer=out_cls.FromString,
            )
            self._stubs[method] = stub
        return stub(request, timeout=timeout or self.timeout)

    def close(self) -> None:
        self.channel.close()
