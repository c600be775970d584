"""hisparse-sim: traces, exact eviction replay and a serving model for hierarchical sparse KV memory."""

__version__ = "0.1.0"
