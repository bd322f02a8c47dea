"""The vendored NRI interface and the committed generated code."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_vendored_proto_is_the_recorded_version() -> None:
    """protos/README.md records the checksum of the verbatim upstream file."""
    readme = (ROOT / "protos" / "README.md").read_text()
    for rel in (
        "nri/api.proto",
        "ttrpc/request.proto",
        "cri/api.proto",
    ):
        digest = hashlib.sha256((ROOT / "protos" / rel).read_bytes()).hexdigest()
        assert f"{digest}  {rel}" in readme, f"{rel} differs from the recorded upstream version"
    assert "Copyright The containerd Authors" in (ROOT / "protos" / "nri" / "api.proto").read_text()


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.fail("grpcio-tools (the test extra) is required to check the generated code")
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "tools" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    gen_protos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_protos)
    gen_protos.generate(tmp_path)
    for rel in gen_protos.GENERATED:
        fresh = (tmp_path / rel).read_bytes()
        committed = (ROOT / "nriplugin" / rel).read_bytes()
        assert fresh == committed, f"nriplugin/{rel} is stale: run `python tools/gen_protos.py`"
