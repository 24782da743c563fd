"""Objectives: what a model is trained to minimise, given x̂ and the output layer's E_out, b.

``objective(predicted, targets, weight, bias) -> LossSums``. predicted (B, T, d),
targets (B, T) with ``IGNORE`` for padding, weight (V, d), bias (V,) or None. Objectives
return their loss summed over the scored positions, with the count (:class:`LossSums`).
The training objectives around them (the N-gram loss, a task's loss such as diffusion's)
return their parts' sums and counts (:class:`LossParts`), and the training step divides each
part once, by its count or the whole batch's (:func:`targetlm.training.step.divide_once`).
"""

from __future__ import annotations

from targetlm.objectives.augmented import AugmentedLossObjective  # registers "augmented"
from targetlm.objectives.base import OBJECTIVES, LossOutput, LossParts, LossSums, Objective
from targetlm.objectives.cross_entropy import CrossEntropyObjective  # registers "cross_entropy"
from targetlm.objectives.ngram import NgramLoss, build_objective

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
