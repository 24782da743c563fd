"""Objective registry and the loss record every objective returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from targetlm.registry import Registry

# builders may hand objectives the built input embedding (Inan et al.'s analysis builds ỹ from it)
OBJECTIVES: Registry[Objective] = Registry("objective", context=("embedding",))


class Objective(nn.Module):
    """Base of the per-position objectives: ``forward(predicted, targets, weight, bias)`` ->
    :class:`LossOutput`.

    ``chunkable``: the objective also gives its loss per row as
    :meth:`logit_terms` (for :func:`targetlm.chunked.chunked_logit_loss`), so the N-gram loss
    may run it without a (tokens x V) logit matrix; declared by each objective (a property
    where it depends on the options).
    """

    chunkable: bool = False

    def logit_terms(self, weight: torch.Tensor) -> Any:
        """The loss per row for the chunked path (only where ``chunkable``)."""
        raise ValueError(f"{type(self).__name__} has no chunked form")


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar to back-propagate (mean over scored positions)
    nll_sum: torch.Tensor  # summed next-word negative log-likelihood, detached (perplexity)
    count: int  # scored positions
