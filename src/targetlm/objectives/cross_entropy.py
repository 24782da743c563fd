"""Next-word cross entropy, the objective the others build on."""

from __future__ import annotations

import torch

from targetlm import functional
from targetlm.chunked import LogitTerms
from targetlm.objectives.base import OBJECTIVES, LossSums, Objective
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
        """The (optionally smoothed) cross entropy of the logits x̂·E_outᵀ + b summed over the
        scored positions, with the objective's other terms (:meth:`with_terms`)."""
        logits = functional.logits(predicted, weight, bias).flatten(0, -2)  # (B*T, V)
        targets = targets.reshape(-1)
        ce_sum, nll_sum, count = functional.cross_entropy(
            logits, targets, self.label_smoothing, reduction="sum"
        )
        return self.with_terms(LossSums(((1.0, ce_sum),), nll_sum, count), logits, targets, weight)

    def with_terms(
        self, ce: LossSums, logits: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor
    ) -> LossSums:
        """The objective's record from the cross entropy's ``ce`` (its one term (1, Σ CE)) on
        the flat logits (B*T, V) and targets (B*T,): here (z_loss, Σ (log Z)²) added when
        asked for."""
        if not (self.z_loss and ce.count):
            return ce
        z_sum = functional.z_loss(logits, targets, reduction="sum")
        return LossSums((*ce.terms, (self.z_loss, z_sum)), ce.nll_sum, ce.count)
