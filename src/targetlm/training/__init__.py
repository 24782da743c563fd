"""Training: the loop, optimisers and schedules, checkpoints with exact resume."""

from pathlib import Path
from typing import Any

from targetlm.checkpoint import CheckpointError, save_atomic
from targetlm.config import Config
from targetlm.registry import ConfigError
from targetlm.training.optim import LrSchedule, build_optimizer
from targetlm.training.trainer import RunDirError, Trainer, TrainingDiverged
from targetlm.training.translation import TranslationTrainer


def trainer_for(config: Config) -> type[Trainer]:
    """The trainer of ``config``'s task: the sentence-pair one for ``translation``, its
    diffusion subclass for ``diffusion``, the masked-block one for ``mlm``, the labelled
    sentences' one for ``classification``."""
    if config.task.kind == "mlm":  # data hooks routed to tasks/mlm.py
        from targetlm.training.mlm import MaskedLmTrainer

        return MaskedLmTrainer
    if config.task.kind == "classification":  # data hooks routed to tasks/classify.py
        from targetlm.training.classify import ClassificationTrainer

        return ClassificationTrainer
    if config.task.kind == "diffusion":
        from targetlm.training.diffusion import DiffusionTrainer

        return DiffusionTrainer
    return TranslationTrainer if config.task.kind == "translation" else Trainer


def train(
    config: Config, run_dir: str | Path, resume: bool = False, **kwargs: Any
) -> dict[str, Any]:
    """Convenience: ``trainer_for(config)(config, run_dir, resume).train()``."""
    if not isinstance(config, Config):
        raise ConfigError("train() takes a targetlm.config.Config")
    return trainer_for(config)(config, run_dir, resume, **kwargs).train()


__all__ = [
    "CheckpointError",
    "LrSchedule",
    "RunDirError",
    "Trainer",
    "TranslationTrainer",
    "TrainingDiverged",
    "build_optimizer",
    "save_atomic",
    "train",
    "trainer_for",
]
