"""nriplugin: a containerd NRI plugin and node QoS agent for LS/BE colocation."""

from typing import Any


def __getattr__(name: str) -> Any:
    """``__version__``, from the installed package's metadata (pyproject.toml's, the one place
    it is written), looked up when asked: not on the start-up path that must register fast."""
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("nriplugin")
        except PackageNotFoundError:  # run from a tree that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'nriplugin' has no attribute {name!r}")
