"""The heads-only warm-up (``train.heads_only_steps``): the first steps train only the N-gram
heads, at a constant learning rate; the schedule (warm-up, decay) runs over the steps after it.
"""

from __future__ import annotations

from typing import Any

from targetlm.config import TrainConfig
from targetlm.training.optim import LrSchedule


def scheduled_lr(train: TrainConfig, schedule: LrSchedule, step: int, epoch: int) -> float:
    """The learning rate of the step after ``step`` (in ``epoch``). The schedule runs over the
    steps after the heads-only warm-up, so a model with heads trains its body on the schedule
    a model without them follows; during the warm-up the heads train at ``train.lr``."""
    if step < train.heads_only_steps:
        return train.lr
    return schedule.lr(step + 1 - train.heads_only_steps, epoch)


def freeze_body(train: TrainConfig, model: Any, objective: Any, frozen: bool) -> None:
    """Train only the N-gram heads (``frozen``) or everything (after the heads-only warm-up);
    nothing to do without one.

    A model without heads trains nothing in those steps: it reads past their batches, so it
    then sees the batches a heads model sees after its warm-up (a like-for-like base).
    """
    if not train.heads_only_steps:
        return
    heads = set() if model.heads is None else {id(p) for p in model.heads.parameters()}
    for parameter in list(model.parameters()) + list(objective.parameters()):
        if id(parameter) not in heads:
            parameter.requires_grad_(not frozen)
