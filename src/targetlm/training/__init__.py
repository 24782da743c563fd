"""Training: the loop, optimisers and schedules, checkpoints with exact resume."""

from targetlm.checkpoint import CheckpointError, save_atomic
from targetlm.training.optim import LrSchedule, build_optimizer
from targetlm.training.trainer import RunDirError, Trainer, TrainingDiverged, train

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
