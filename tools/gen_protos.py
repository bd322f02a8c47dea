"""Regenerate the Python modules for the vendored .proto files.

Usage: python tools/gen_protos.py [OUTPUT_DIR]   (default: nriplugin/)

Gives ``nri/api_pb2.py`` (the NRI wire types) and ``cri/api_pb2.py`` (kubelet's CRI, used to
take inventory when no NRI Synchronize comes). CRI's proto imports gogo's options file by its
Go path (``github.com/...``), which is no Python package name: its module is written next to
CRI's as ``cri/gogo_pb2.py`` and the one import line is rewritten to match. The descriptors
keep their upstream file names, so protobuf's pool resolves the dependency as usual. NRI's
``Field`` enum (v0.10+) has a value named ``None``, which protoc writes into the stub file as
``None: ...``, not valid Python: those lines are commented out (the value stays reachable at run
time as ``api.Field.Value("None")``).

The output is byte-for-byte reproducible for a given grpcio-tools version (pinned in
pyproject.toml's test extra); tests/test_protos.py regenerates into a temporary folder and
fails if the committed modules differ.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Paths relative to protos/: descriptors are registered as "nri/api.proto" and "cri/api.proto",
# so the two api.proto files cannot clash in protobuf's global pool.
PROTOS = ["nri/api.proto", "cri/api.proto", "github.com/gogo/protobuf/gogoproto/gogo.proto"]
GENERATED = [
    "nri/api_pb2.py",
    "nri/api_pb2.pyi",
    "cri/api_pb2.py",
    "cri/api_pb2.pyi",
    "cri/gogo_pb2.py",
    "cri/gogo_pb2.pyi",
]
GOGO_MODULE = "github.com.gogo.protobuf.gogoproto"
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
    gogo_dir = out / "github/com/gogo/protobuf/gogoproto"
    for ext in ("py", "pyi"):
        shutil.move(gogo_dir / f"gogo_pb2.{ext}", out / "cri" / f"gogo_pb2.{ext}")
        api = out / "cri" / f"api_pb2.{ext}"
        text = api.read_text()
        old = f"from {GOGO_MODULE} import gogo_pb2"
        if old not in text:
            raise SystemExit(f"unexpected generated import in {api}")
        api.write_text(text.replace(old, "from nriplugin.cri import gogo_pb2"))
    shutil.rmtree(out / "github")
    stub = out / "nri" / "api_pb2.pyi"
    stub.write_text(NONE_NAME.sub(r"\1# None: ", stub.read_text()))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "nriplugin")
