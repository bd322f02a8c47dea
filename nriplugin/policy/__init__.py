"""Policy: QoS classes and (for now) the embedded default policy."""
