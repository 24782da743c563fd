"""Objectives: what a model is trained to minimise, given x̂ and the output layer's E_out, b.

``objective(predicted, targets, weight, bias) -> LossSums``. predicted (B, T, d),
targets (B, T) with ``IGNORE`` for padding, weight (V, d), bias (V,) or None. Objectives
return their loss summed over the scored positions, with the count (:class:`LossSums`).
The training objectives around them (the N-gram loss, a task's loss such as diffusion's)
return their parts' sums and counts (:class:`LossParts`), and the training step divides each
part once, by its count or the whole batch's (:func:`targetlm.training.step.divide_once`).
"""

from __future__ import annotations

import torch

from targetlm import functional
from targetlm.chunked import LogitTerms
from targetlm.objectives.base import OBJECTIVES, LossOutput, LossParts, LossSums, Objective
from targetlm.registry import Fraction, NonNegative


@OBJECTIVES.register("cross_entropy")
class CrossEntropyObjective(Objective):
    """Next-word cross entropy, optionally label-smoothed (``label_smoothing`` = ε in [0, 1)),
    plus ``z_loss``·mean (log Z)² (:func:`targetlm.functional.z_loss`; 0: none)."""

    chunkable = True  # the N-gram loss may run it through targetlm.chunked (logit_terms)

    def __init__(self, label_smoothing: Fraction = 0.0, z_loss: NonNegative = 0.0) -> None:
        super().__init__()
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        if z_loss < 0:
            raise ValueError(f"z_loss must be >= 0, got {z_loss}")
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss

    def logit_terms(self, weight: torch.Tensor) -> LogitTerms:
        """The same loss per row for :func:`targetlm.chunked.chunked_logit_loss`."""
        return LogitTerms(label_smoothing=self.label_smoothing, z_loss=self.z_loss)

    def forward(
        self,
        predicted: torch.Tensor,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> LossSums:
        logits = functional.logits(predicted, weight, bias).flatten(0, -2)  # (B*T, V)
        targets = targets.reshape(-1)
        ce_sum, nll_sum, count = functional.cross_entropy(
            logits, targets, self.label_smoothing, reduction="sum"
        )
        terms = [(1.0, ce_sum)]
        if self.z_loss and count:
            terms.append((self.z_loss, functional.z_loss(logits, targets, reduction="sum")))
        return LossSums(tuple(terms), nll_sum, count)


from targetlm.objectives.augmented import AugmentedLossObjective  # noqa: E402  (registers "augmented")
from targetlm.objectives.ngram import NgramLoss, build_objective  # noqa: E402

__all__ = [
    "OBJECTIVES",
    "AugmentedLossObjective",
    "CrossEntropyObjective",
    "LossOutput",
    "LossParts",
    "LossSums",
    "NgramLoss",
    "Objective",
    "build_objective",
]
