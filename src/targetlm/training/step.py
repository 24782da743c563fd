"""The whole step's loss as one module, so that torch's data-parallel engines can wrap it."""

from __future__ import annotations

from typing import Any

from torch import nn

from targetlm.modules.model import LanguageModel, detach_state
from targetlm.modules.outputs import OutputLayer
from targetlm.objectives import LossOutput
from targetlm.tasks import Batch, Task


class TrainingStep(nn.Module):
    """The loss of one (micro-)batch: the task's ``predict``, the model's output layer and the
    objective, in one ``forward`` (what :class:`~torch.nn.parallel.DistributedDataParallel`
    wraps: every parameter the loss reads is one of this module's).

    Args:
        task: reads the batch with the model (not a module: it has no parameters).
        model: the language model (``model``), trained.
        objective: the loss around the output layer (``objective``), trained too.
    """

    def __init__(self, task: Task, model: LanguageModel, objective: nn.Module) -> None:
        super().__init__()
        self.task = task
        self.model = model
        self.objective = objective

    def forward(self, batch: Batch, state: Any, carry_state: bool) -> tuple[LossOutput, Any]:
        """The loss of ``batch`` continuing the carried ``state``, and the state that continues
        the stream after it (detached: the next step does not back-propagate into it).

        Args:
            batch: inputs and targets (B, T) (a translation batch: with its source).
            state: the encoder state carried from the previous batch, or None.
            carry_state: return the state after ``batch`` (else None).
        """
        prediction = self.task.predict(self.model, batch, state)
        weight, bias = self.model.output()
        out = self.objective(prediction, batch.targets, weight, bias)
        return out, detach_state(prediction.state) if carry_state else None

    def may_leave_parameters_unused(self) -> bool:
        """Whether a step may leave some parameter without a gradient: a module (GroC's sparse
        output updates) declares it. (DDP then searches each step's graph for them.)"""
        return any(
            isinstance(module, OutputLayer) and module.may_leave_parameters_unused
            for module in self.modules()
        )
