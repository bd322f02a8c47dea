"""Regenerate the Python modules for the vendored .proto files.

Usage: python tools/gen_protos.py [OUTPUT_DIR]   (default: nriplugin/)

Gives ``nri/api_pb2.py`` (the NRI wire types) and ``cri/api_pb2.py`` (kubelet's CRI, used to
take inventory when no NRI Synchronize comes, and by the e2e tests to drive containerd). NRI's
``Field`` enum (v0.10+) has a value named ``None``, which protoc writes into the stub file as
``None: ...``, not valid Python: those lines are commented out (the value stays reachable at run
time as ``api.Field.Value("None")``).

The output is byte-for-byte reproducible for a given grpcio-tools version (pinned in
pyproject.toml's test extra); tests/test_protos.py regenerates into a temporary folder and
fails if the committed modules differ.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Paths relative to protos/: descriptors are registered as "nri/api.proto" and "cri/api.proto",
# so the two api.proto files cannot clash in protobuf's global pool.
PROTOS = ["nri/api.proto", "cri/api.proto"]
GENERATED = ["nri/api_pb2.py", "nri/api_pb2.pyi", "cri/api_pb2.py", "cri/api_pb2.pyi"]
NONE_NAME = re.compile(r"^(\s*)None: ", re.MULTILINE)  # an enum value named None (not Python)


def generate(out: Path) -> None:
    from grpc_tools import protoc  # imported here: only needed by developers

    out.mkdir(parents=True, exist_ok=True)
    include = ROOT / "protos"
    wkt = Path(protoc.__file__).parent / "_proto"
    for name in PROTOS:
        args = ["protoc", f"-I{include}", f"-I{wkt}", f"--python_out={out}", f"--pyi_out={out}", str(include / name)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {name}")
    stub = out / "nri" / "api_pb2.pyi"
    stub.write_text(NONE_NAME.sub(r"\1# None: ", stub.read_text()))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "nriplugin")
