"""The embedded reconciler: keeps every managed file at the one desired state while containers
run (inotify-driven repair, periodic full resync, fight detection)."""

from nriplugin.reconciler.reconciler import Reconciler

__all__ = ["Reconciler"]
