"""Checkpoints: plain state dicts, written atomically, loaded with ``weights_only=True``.

Outside the training package so that a checkpoint is readable without it (``runs``,
``eval``, ``generate``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from targetlm.files import atomic_write

# the directory beside last.pt that holds a sharded run's model and optimiser
# (train.parallel = "fsdp"); last.pt names it in its "sharded" entry
SHARDED_DIRECTORY = re.compile(r"last-step[0-9]+\.dcp")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model/vocabulary."""


def save_atomic(obj: Any, path: str | Path) -> None:
    """``torch.save`` ``obj`` to ``path`` whole or not at all (:func:`targetlm.files.atomic_write`).

    A crash or Ctrl-C at any moment leaves either the old file or the new one, never half of one.
    """
    atomic_write(path, lambda handle: torch.save(obj, handle))


def load(path: str | Path, required: Sequence[str] = ()) -> dict[str, Any]:
    """The checkpoint at ``path`` (a dict of tensors and plain values), on the CPU.

    Raises :class:`CheckpointError` (one line) when it is missing, unreadable, or not a dict
    holding every key of ``required`` (e.g. a bare ``model.state_dict()`` saved as best.pt),
    or when its ``"sharded"`` entry is anything but the name of a directory beside it
    (``last-step<N>.dcp``: not a path, so a checkpoint cannot send its reader elsewhere).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(
            f"{path} is empty (0 bytes): an interrupted write or a full disk? It holds no "
            "checkpoint"
        )
    try:
        with warnings.catch_warnings():  # (torch's note on a pickle protocol it did not write)
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling errors come in many types
        raise CheckpointError(f"{path}: unreadable checkpoint ({load_failure(error)})") from None
    missing = [key for key in required if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise CheckpointError(f"{path}: not a targetlm checkpoint (no {missing[0]!r})")
    if isinstance(checkpoint, dict) and "sharded" in checkpoint:
        sharded = checkpoint["sharded"]
        if not isinstance(sharded, str) or not SHARDED_DIRECTORY.fullmatch(sharded):
            raise CheckpointError(
                f"{path}: its 'sharded' entry {sharded!r} is not the name of a directory "
                "last-step<N>.dcp beside it; refused"
            )
    return checkpoint


def load_failure(error: Exception) -> str:
    """The cause of a failed ``torch.load`` in one line. Torch's message for a file holding
    more than tensors and plain values advises loading it with ``weights_only=False``, which
    would run whatever code the file names: only its cause is kept."""
    message = str(error).strip()
    if "Weights only load failed" not in message:
        return message.splitlines()[0] if message else type(error).__name__
    causes = [
        line.strip()
        for line in message.splitlines()[1:]
        if line.strip() and "weights_only" not in line
    ]
    cause = causes[0].rstrip(".") if causes else "unsupported content"
    return f"not a plain state dict: {cause}; targetlm loads tensors and plain values only"
