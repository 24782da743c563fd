"""Objective registry and the loss records objectives return."""

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
    :class:`LossSums` (summed, not yet divided by the scored positions).

    ``chunkable``: the objective also gives its loss per row as
    :meth:`logit_terms` (for :func:`targetlm.chunked.chunked_logit_loss`), so the N-gram loss
    may run it without a (tokens x V) logit matrix; declared by each objective (a property
    where it depends on the options).
    """

    chunkable: bool = False

    def logit_terms(self, weight: torch.Tensor) -> Any:
        """The loss per row for the chunked path (only where ``chunkable``)."""
        raise ValueError(f"{type(self).__name__} has no chunked form")


@dataclass(frozen=True)
class LossSums:
    """A loss over ``count`` scored positions, as sums not yet divided by them.

    ``terms``: ((w_1, S_1), (w_2, S_2), ...), each a weight and a summed loss (a scalar
    tensor, with its graph), e.g. cross entropy's (1, Σ CE) and AL's (α, Σ KL); the loss is
    ``Σ_i w_i·(S_i / count)`` (:meth:`normalised`). Kept apart so that whoever normalises
    can divide by another count (the whole batch's over several processes) once, and so that
    each term is divided as its mean was (the same bits as ``w·S.mean()``).

    ``nll_sum``: the summed next-word negative log-likelihood (detached; perplexity); None
    for a loss that is no word's likelihood (the diffusion loss's squared errors).
    ``count``: the scored positions (for a loss over vectors, positions x dimensions).
    """

    terms: tuple[tuple[float, torch.Tensor], ...]
    nll_sum: torch.Tensor | None
    count: int  # (a tensor on the device while torch.compile traces: no host sync)

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("a loss needs at least one term")

    def normalised(self, divisor: float | None = None) -> torch.Tensor:
        """``Σ_i w_i·(S_i / divisor)``, divisor the ``count`` by default (another: the
        whole batch's count over the number of processes). Nothing to divide by (0): the
        sums times 0, which keeps the graph (every parameter gets a zero gradient)."""
        divisor = self.count if divisor is None else divisor
        total: torch.Tensor | None = None
        for weight, summed in self.terms:
            if isinstance(divisor, torch.Tensor):  # a compiled step's count: no host sync
                mean = summed / divisor.clamp(min=1)  # (0 scored: the sum is 0)
            else:
                mean = summed / divisor if divisor else summed * 0.0
            term = mean if weight == 1 else weight * mean
            total = term if total is None else total + term
        assert total is not None
        return total

    @property
    def loss(self) -> torch.Tensor:
        """The loss to back-propagate: the mean over this record's own scored positions."""
        return self.normalised()


@dataclass
class LossOutput:
    """What the training objective gives the trainer: the loss, normalised."""

    loss: torch.Tensor  # scalar to back-propagate (each part a mean over its scored positions)
    nll_sum: torch.Tensor  # summed next-word negative log-likelihood, detached (perplexity)
    count: int  # scored positions of the next word
