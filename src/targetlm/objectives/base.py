"""Objective registry and the loss records objectives return."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from torch import nn

from targetlm.registry import Registry

# builders may hand objectives the built input embedding (Inan et al.'s analysis builds ỹ from it)
OBJECTIVES: Registry[Objective] = Registry("objective", context=("embedding",))
# scored positions: an int, or a tensor on the device while torch.compile traces (no host sync)
Count: TypeAlias = "int | torch.Tensor"
# what a part's sum is divided by: its count, or the whole batch's count over the processes
Divisor: TypeAlias = "int | float | torch.Tensor"


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
    ``Σ_i w_i·(S_i / count)`` (:meth:`normalised`). Kept apart so that the training step can
    divide by another count (the whole batch's over several processes) once, and so that
    each term is divided as its mean was (the same bits as ``w·S.mean()``).

    ``nll_sum``: the summed next-word negative log-likelihood (detached; perplexity); None
    for a loss that is no word's likelihood (the diffusion loss's squared errors).
    ``count``: the scored positions (for a loss over vectors, positions x dimensions).
    """

    terms: tuple[tuple[float, torch.Tensor], ...]
    nll_sum: torch.Tensor | None
    count: Count

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("a loss needs at least one term")

    def normalised(self, divisor: Divisor | None = None) -> torch.Tensor:
        """``Σ_i w_i·(S_i / divisor)``, divisor the ``count`` by default (the training step
        passes the whole batch's count over the number of processes, a tensor on the
        device). Nothing to divide by (0): the sums times 0 (a tensor divisor: the sums,
        which are 0), which keeps the graph (every parameter gets a zero gradient)."""
        divisor = self.count if divisor is None else divisor
        total: torch.Tensor | None = None
        for weight, summed in self.terms:
            mean = divide(summed, divisor)
            term = mean if weight == 1 else weight * mean
            total = term if total is None else total + term
        assert total is not None
        return total

    @property
    def loss(self) -> torch.Tensor:
        """The loss to back-propagate: the mean over this record's own scored positions."""
        return self.normalised()


def divide(summed: torch.Tensor, divisor: Divisor) -> torch.Tensor:
    """``summed / divisor``; a divisor of 0 gives the sum times 0 (a host number) or the sum
    itself (a tensor: no host sync; a sum over no position is 0). A floating tensor divisor
    (the whole batch's count over the processes) is rounded to the sum's precision first,
    as a Python number is, so both give the same bits."""
    if not isinstance(divisor, torch.Tensor):
        return summed / divisor if divisor else summed * 0.0
    divisor = torch.where(divisor > 0, divisor, 1)
    if divisor.is_floating_point():
        compute = torch.promote_types(summed.dtype, torch.float32)
        return (summed.to(compute) / divisor.to(compute)).to(summed.dtype)
    return summed / divisor


@dataclass
class LossOutput:
    """The training step's loss of a batch, divided (:func:`targetlm.training.step.divide_once`)."""

    loss: torch.Tensor  # scalar to back-propagate (each part a mean over its scored positions)
    nll_sum: torch.Tensor  # summed next-word negative log-likelihood, detached (perplexity)
    count: Count  # scored positions of the next word


class LossParts:
    """What a training objective returns: its loss in parts, each a sum not yet divided, with
    each part's scored positions (``counts``), e.g. each N-gram head's summed loss and its
    targets. The training step divides each part once (:meth:`divided`), by its own count
    (one process) or by the whole batch's over the number of processes
    (:func:`targetlm.training.step.divide_once`), so no objective divides by itself.

    ``count``: the next word's scored positions (perplexity's). ``divide``: the divisors,
    one per part, -> the :class:`LossOutput` (the loss from the parts' means, with the
    summed next-word NLL). For most losses it divides sums already made
    (:meth:`of_sums`); the chunked logit loss folds each part's division into its per-row
    weights (its gradient is formed in the forward pass), so it makes its sums there.
    """

    def __init__(
        self,
        counts: Sequence[Count],
        count: Count,
        divide: Callable[[Sequence[Divisor]], LossOutput],
    ) -> None:
        self.counts = tuple(counts)
        self.count = count
        self._divide = divide
        self._alone: LossOutput | None = None

    @classmethod
    def of_sums(
        cls,
        parts: Sequence[LossSums],
        combine: Callable[[list[torch.Tensor]], torch.Tensor],
        nll_sum: torch.Tensor,
        count: Count,
    ) -> LossParts:
        """The parts ``parts`` (each's sums and count); the loss ``combine`` of their means,
        e.g. ``½·L₀ + α/(2N−2)·Σ L_n`` of the heads' (:func:`targetlm.functional.ngram_loss`)."""
        parts = tuple(parts)

        def divided(divisors: Sequence[Divisor]) -> LossOutput:
            means = [part.normalised(d) for part, d in zip(parts, divisors)]
            return LossOutput(combine(means), nll_sum, count)

        return cls([part.count for part in parts], count, divided)

    def divided(self, divisors: Sequence[Divisor]) -> LossOutput:
        """The loss with part i's sum divided by ``divisors[i]`` (each once)."""
        if len(divisors) != len(self.counts):
            raise ValueError(f"{len(self.counts)} parts, {len(divisors)} divisors")
        return self._divide(divisors)

    @property
    def alone(self) -> LossOutput:
        """The loss of these rows alone: each part divided by its own count (made once)."""
        if self._alone is None:
            self._alone = self.divided(self.counts)
        return self._alone

    @property
    def loss(self) -> torch.Tensor:
        """:attr:`alone`'s loss (these rows' mean)."""
        return self.alone.loss

    @property
    def nll_sum(self) -> torch.Tensor:
        """The summed next-word negative log-likelihood (detached)."""
        return self.alone.nll_sum
