"""Galaxy control plane: controller, node agent, CLI, config and RPC helpers."""

__version__ = "0.1.0"
