"""Training: the loop, optimisers and schedules, checkpoints with exact resume.

One :class:`Trainer` trains every task: the task (``targetlm.tasks``) supplies the data, the
batches, the loss around the objective, the evaluation and the final figures.
"""

from pathlib import Path
from typing import Any

from targetlm.checkpoint import CheckpointError, save_atomic
from targetlm.config import Config
from targetlm.registry import ConfigError
from targetlm.training.optim import LrSchedule, build_optimizer
from targetlm.training.trainer import RunDirError, Trainer, TrainingDiverged


def train(
    config: Config, run_dir: str | Path, resume: bool = False, **kwargs: Any
) -> dict[str, Any]:
    """Convenience: ``Trainer(config, run_dir, resume).train()``."""
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
