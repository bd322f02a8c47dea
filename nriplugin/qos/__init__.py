"""The QoS manager: collect -> assess -> decide -> apply as overlays on the
desired state (the one writer applies them, the reconciler keeps them)."""
