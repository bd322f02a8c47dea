"""Regenerate the Python modules for the vendored .proto files.

Usage: python tools/gen_protos.py [OUTPUT_DIR]   (default: nriplugin/, giving nriplugin/nri/api_pb2.py)

The output is byte-for-byte reproducible for a given grpcio-tools version (pinned in
pyproject.toml's test extra); tests/test_protos.py regenerates into a temporary folder and
fails if the committed modules differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Paths relative to protos/: the descriptor is registered as "nri/api.proto", so it cannot
# clash with other files named api.proto (CRI's) in protobuf's global pool.
PROTOS = ["nri/api.proto"]
GENERATED = ["nri/api_pb2.py", "nri/api_pb2.pyi"]


def generate(out: Path) -> None:
    from grpc_tools import protoc  # imported here: only needed by developers

    out.mkdir(parents=True, exist_ok=True)
    include = ROOT / "protos"
    for name in PROTOS:
        args = ["protoc", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}", str(include / name)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {name}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "nriplugin")
