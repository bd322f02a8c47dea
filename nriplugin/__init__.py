"""nriplugin: a containerd NRI plugin and node QoS agent for LS/BE colocation."""

__version__ = "0.1.0"
