"""The core chain (desired state, overlays) pinned at its boundaries (the kept mutation score)."""
