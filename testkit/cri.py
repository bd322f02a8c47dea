"""CRI for the end-to-end tests: the product's client (``nriplugin.cri``) and a message helper."""

from __future__ import annotations

from typing import Any

from nriplugin.cri import api_pb2
from nriplugin.cri.client import CRI

__all__ = ["CRI", "msg"]


def msg(name: str, **fields: Any) -> Any:
    """A new ``runtime.v1.<name>`` message."""
    return getattr(api_pb2, name)(**fields)
