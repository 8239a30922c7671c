"""ckpt-tui: open a distributed-training checkpoint and make it usable."""

__version__ = "0.1.0"
