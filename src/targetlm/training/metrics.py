"""What a run records in its ``metrics.jsonl``: the train records of the loss window
(:class:`TrainWindow`), validations and the gradient diversity (:func:`diversity_record`),
appended by rank 0 (:class:`MetricsLog`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import torch

from targetlm import rundir
from targetlm.inference.evaluate import perplexity
from targetlm.tasks import Batch
from targetlm.training import distributed


class MetricsLog:
    """A run's ``metrics.jsonl``: rank 0 appends the records; ``records`` counts them (last.pt
    keeps the count, so a resumed run forgets the records written after it)."""

    def __init__(self, path: Path, processes: distributed.Processes) -> None:
        self.path = path
        self.processes = processes
        self.records = 0

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (rank 0; the other ranks write nothing)."""
        if not self.processes.is_main:
            return
        rundir.append_metrics(self.path, record)
        self.records += 1


class TrainWindow:
    """The train records' window: the main head's summed NLL (float64, on the device) and its
    targets since the last record (last.pt keeps both), and this session's tokens and seconds
    since then (for ``tok_s``).

    Args:
        device: where the steps' summed NLL lives.
    """

    def __init__(self, device: torch.device) -> None:
        self.nll = torch.zeros((), dtype=torch.float64, device=device)
        self.count: int | torch.Tensor = 0  # (a tensor: counted by a compiled step)
        self.started, self.timed_tokens = 0.0, cast(Any, 0)
        self.start_clock()

    def start_clock(self) -> None:
        """Time this session's tokens from now (a tensor on the device when a compiled step
        counts)."""
        self.started, self.timed_tokens = time.perf_counter(), 0

    def add(self, nll: torch.Tensor, count: int | torch.Tensor) -> None:
        """Add one step's summed NLL and number of targets (nothing read from the device)."""
        self.nll += nll
        self.count += count
        self.timed_tokens += count

    def record(self, step: int, epoch: int, lr: float) -> dict[str, Any]:
        """The train record of the window (its mean loss, perplexity, tokens a second) at
        ``step``; the window then starts again."""
        seconds = time.perf_counter() - self.started
        self.count, self.timed_tokens = int(self.count), int(self.timed_tokens)
        loss = float(self.nll) / self.count
        record = {
            "kind": "train",
            "step": step,
            "epoch": epoch,
            "lr": lr,
            "loss": loss,
            "ppl": perplexity(loss),
            "tok_s": self.timed_tokens / max(seconds, 1e-9),
        }
        self.nll, self.count = torch.zeros_like(self.nll), 0
        self.start_clock()
        return record

    def saved(self) -> tuple[float, int]:
        """The window as last.pt keeps it: summed NLL and targets."""
        return float(self.nll), int(self.count)

    def restore(self, window: tuple[float, int]) -> None:
        """Continue the window a checkpoint kept (:meth:`saved`)."""
        nll, self.count = window
        self.nll = torch.tensor(nll, dtype=torch.float64, device=self.nll.device)


def diversity_record(
    model: Any, objective: Any, batch: Batch, state: Any, step: int, epoch: int
) -> dict[str, Any]:
    """The record of the gradient diversity of ``step``'s ``batch`` (on the model's device),
    continuing the carried ``state`` (or None), measured before the step (training
    unchanged)."""
    from targetlm.analysis.diversity import batch_gradient_diversity

    value = batch_gradient_diversity(model, objective, batch.inputs, batch.targets, state)
    return {"kind": "diversity", "step": step, "epoch": epoch, "gradient_diversity": value}
