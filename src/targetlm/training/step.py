"""The whole step's loss as one module, so that torch's data-parallel engines can wrap it,
and the one place where a loss is divided by its counts (:func:`divide_once`)."""

from __future__ import annotations

from typing import Any, Literal, Protocol

import torch
from torch import nn

from targetlm.modules.model import LanguageModel, detach_state
from targetlm.modules.outputs import OutputLayer
from targetlm.objectives import LossOutput, LossParts
from targetlm.tasks import Batch, Task


class Processes(Protocol):
    """What :func:`divide_once` asks of the run's processes
    (:class:`~targetlm.training.distributed.Processes`)."""

    @property
    def several(self) -> bool: ...
    @property
    def world_size(self) -> int: ...
    @property
    def device(self) -> torch.device: ...

    def sum_tensor(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``values`` over the processes, on their device."""
        ...


def divide_once(parts: LossParts, processes: Processes | None = None) -> LossOutput:
    """The step's loss from the objective's undivided ``parts``: each part's sum divided once.

    One process: by the part's own count. Several (``processes``): rank r divides its sum
    S_n^r by the whole batch's count over the K processes, C_n / K with C_n = Σ_r c_n^r,
    so that the ranks' averaged gradients are the whole batch's (each N-gram head's mean,
    the diffusion loss's MSEs, anchor and length losses, weighing every rank by its scored
    positions). The counts are all-reduced on the device in one collective, with no host
    sync; the returned loss has the whole batch's value (its gradient this rank's share),
    and ``nll_sum`` and ``count`` are the whole batch's (one more collective, after the
    division), so every rank logs and checks for NaN what one process would.
    """
    if processes is None or not processes.several:
        return parts.divided(parts.counts)
    world_size = processes.world_size
    device = processes.device
    if all(isinstance(c, int) for c in parts.counts):  # counted on the host: one copy
        local = torch.tensor(parts.counts, dtype=torch.float64, device=device)
    else:
        local = torch.stack(
            [torch.as_tensor(c, dtype=torch.float64, device=device) for c in parts.counts]
        )
    divisors = processes.sum_tensor(local) / world_size
    out = parts.divided(list(divisors.unbind()))
    local = torch.stack(
        [
            out.loss.detach().double(),
            out.nll_sum.detach().double(),
            torch.as_tensor(out.count, dtype=torch.float64, device=device),
        ]
    )
    loss_sum, nll_sum, count = processes.sum_tensor(local).unbind()
    # the value of the whole batch's loss (Σ_r of the ranks' K·L^r / K), the gradient of
    # this rank's share
    mean = (loss_sum / world_size).to(out.loss.dtype)
    loss = out.loss + (mean - out.loss.detach())
    return LossOutput(loss, nll_sum, count.long())


class TrainingStep(nn.Module):
    """The loss of one (micro-)batch: the task's ``predict``, the model's output layer and the
    objective, in one ``forward`` (what :class:`~torch.nn.parallel.DistributedDataParallel`
    wraps: every parameter the loss reads is one of this module's).

    Args:
        task: reads the batch with the model (not a module: it has no parameters).
        model: the language model (``model``), trained.
        objective: the loss around the output layer (``objective``), trained too: returns
            :class:`~targetlm.objectives.LossParts`, divided here (:func:`divide_once`).
        processes: the run's processes (several: each part divided by the whole batch's
            count); None: one process.
        loss_reduction: ``train.loss_reduction``: ``mean``, or ``sum_over_time`` (the
            mean times the batch's T steps).
    """

    def __init__(
        self,
        task: Task,
        model: LanguageModel,
        objective: nn.Module,
        processes: Processes | None = None,
        loss_reduction: Literal["mean", "sum_over_time"] = "mean",
    ) -> None:
        super().__init__()
        self.task = task
        self.model = model
        self.objective = objective
        self.processes = processes
        self.sum_over_time = loss_reduction == "sum_over_time"

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
        out = divide_once(self.objective(prediction, batch.targets, weight, bias), self.processes)
        if self.sum_over_time:
            out = LossOutput(out.loss * batch.inputs.size(1), out.nll_sum, out.count)
        return out, detach_state(prediction.state) if carry_state else None

    def may_leave_parameters_unused(self) -> bool:
        """Whether a step may leave some parameter without a gradient: a module (GroC's sparse
        output updates) declares it. (DDP then searches each step's graph for them.)"""
        return any(
            isinstance(module, OutputLayer) and module.may_leave_parameters_unused
            for module in self.modules()
        )
