"""Training: the loop, optimisers and schedules, checkpoints with exact resume.

One :class:`Trainer` trains every task: the task (``targetlm.tasks``) supplies the data, the
batches, the loss around the objective, the evaluation and the final figures.

The trainer, its optimisers and torch.distributed (about a second to import) load when first
asked for, so a command that does not train (``targetlm eval``, ``--help``) does not pay for
them; the errors load at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from targetlm.checkpoint import CheckpointError, save_atomic
from targetlm.config import Config
from targetlm.registry import ConfigError
from targetlm.rundir import RunDirError
from targetlm.training.guards import TrainingDiverged

if TYPE_CHECKING:
    from targetlm.training.optim import LrSchedule, build_optimizer
    from targetlm.training.trainer import Trainer

_LAZY = {
    "Trainer": "targetlm.training.trainer",
    "LrSchedule": "targetlm.training.optim",
    "build_optimizer": "targetlm.training.optim",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def train(
    config: Config, run_dir: str | Path, resume: bool = False, **kwargs: Any
) -> dict[str, Any]:
    """Convenience: ``Trainer(config, run_dir, resume).train()``."""
    from targetlm.training.trainer import Trainer

    if not isinstance(config, Config):
        raise ConfigError("train() takes a targetlm.config.Config")
    return Trainer(config, run_dir, resume, **kwargs).train()


__all__ = [
    "CheckpointError",
    "LrSchedule",
    "RunDirError",
    "Trainer",
    "TrainingDiverged",
    "build_optimizer",
    "save_atomic",
    "train",
]
