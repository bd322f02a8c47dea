"""Policy: the model and its embedded default, the versioned rule cache with hot reload, QoS classes."""
