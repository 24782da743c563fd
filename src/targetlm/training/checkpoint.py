"""Checkpoints (moved to :mod:`targetlm.checkpoint`, readable without the training package)."""

from targetlm.checkpoint import CheckpointError, load, save_atomic

__all__ = ["CheckpointError", "load", "save_atomic"]
