"""The N-gram total loss of Heo, Rim & Choi (2024, 2025) around any objective."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from targetlm import functional
from targetlm.config import ComponentConfig
from targetlm.data.batching import IGNORE
from targetlm.modules.heads import NgramHeads
from targetlm.modules.model import LanguageModel
from targetlm.objectives.base import OBJECTIVES, LossOutput


class NgramLoss(nn.Module):
    """``½·L₀ + α/(2N−2)·Σ_{n=1}^{N−1} L_n`` (:func:`targetlm.functional.ngram_loss`).

    Each L_n is the wrapped ``objective`` (cross entropy, AL, ...) applied to head n's
    reconstructed prediction x̂_{t+n} with the targets n columns later; L₀ to the main x̂_t.
    ``nll_sum``/``count`` stay L₀'s: perplexity is next-word perplexity.

    ``forward(predicted, targets, weight, bias)``: predicted x̂ (B, T, d); targets
    (B, T + lookahead), the segment's targets followed by ``lookahead = N − 1`` more columns
    of the stream (IGNORE past its end), so the last positions of a BPTT segment are
    scored by every head as well. Fewer columns are padded with IGNORE.

    Args:
        objective: the built per-head objective.
        heads: the model's heads (not owned here: their parameters are the model's).
        alpha: α.
    """

    def __init__(self, objective: nn.Module, heads: NgramHeads, alpha: float = 1.0) -> None:
        super().__init__()
        self.objective = objective
        self.heads = [heads]  # a list so the heads stay registered in the model only
        self.alpha = alpha
        self.lookahead = heads.num_predictions - 1  # extra target columns the trainer supplies

    def head_losses(
        self,
        predicted: torch.Tensor,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> list[LossOutput]:
        """[L₀, L₁, ..., L_{N−1}] as the wrapped objective's records (mean loss, NLL, count)."""
        T = predicted.size(1)
        if targets.size(1) < T + self.lookahead:
            targets = F.pad(targets, (0, T + self.lookahead - targets.size(1)), value=IGNORE)
        records = [self.objective(predicted, targets[:, :T], weight, bias)]
        if self.lookahead == 0:
            return records
        heads = self.heads[0]
        real = targets != IGNORE  # (B, T + N − 1)
        # x_s = E_out[y_s] for the WDR conjugate, which is detached anyway
        embeddings = weight.detach()[targets.masked_fill(~real, 0)]  # (B, T + N − 1, d)
        predictions = heads.reconstruct(heads(predicted), embeddings)
        for n, prediction in enumerate(predictions, 1):
            # head n at t predicts y_{t+n}; it counts where y_t..y_{t+n} are all real words
            # (padding only ever ends a row, so: the positions that have a target t+n)
            scored = real.unfold(1, n + 1, 1)[:, :T].all(-1)  # (B, T)
            shifted = targets[:, n : n + T].masked_fill(~scored, IGNORE)
            records.append(self.objective(prediction, shifted, weight, bias))
        return records

    def forward(
        self,
        predicted: torch.Tensor,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> LossOutput:
        records = self.head_losses(predicted, targets, weight, bias)
        loss = functional.ngram_loss([r.loss for r in records], self.alpha)
        return LossOutput(loss, records[0].nll_sum, records[0].count)


def build_objective(config: ComponentConfig, model: LanguageModel) -> nn.Module:
    """The configured objective for ``model``; wrapped in :class:`NgramLoss` when it has heads."""
    objective = OBJECTIVES.build(
        config.kind, config.options, "objective", embedding=model.embedding
    )
    if model.heads is None:
        return objective
    return NgramLoss(objective, model.heads, model.heads.alpha)
