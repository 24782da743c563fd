"""The N-gram total loss of Heo, Rim & Choi (2024, 2025) around any objective."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from targetlm import functional
from targetlm.data.batching import IGNORE
from targetlm.modules.heads import NgramHeads
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.objectives.base import OBJECTIVES, LossOutput
from targetlm.registry import ConfigError

if TYPE_CHECKING:
    from targetlm.config import ComponentConfig

NGRAM_ALPHA = "ngram_alpha"  # the [objective] key of α (the wrapped objective never sees it)


class NgramLoss(nn.Module):
    """``½·L₀ + α/(2N−2)·Σ_{n=1}^{N−1} L_n`` (:func:`targetlm.functional.ngram_loss`).

    The training objective the trainer calls: each L_n is the wrapped ``objective`` (cross
    entropy, AL, ...) applied to head n's reconstructed prediction x̂_{t+n} with the targets n
    columns later; L₀ to the main x̂_t. Without heads (N = 1) it is the wrapped objective
    itself. ``nll_sum``/``count`` stay L₀'s: perplexity is next-word perplexity.

    ``forward(prediction, targets, weight, bias)``: the model's :class:`Prediction` (x̂
    (B, T, d), heads' raw outputs (N−1, B, T, d)); targets (B, T + lookahead), the segment's
    targets followed by ``lookahead = N − 1`` more columns of the stream (IGNORE past its
    end), so the last positions of a BPTT segment are scored by every head as well. Fewer
    columns are padded with IGNORE.

    Args:
        objective: the built per-head objective.
        heads: the model's heads (not owned here: their parameters are the model's); only
            their ``reconstruct`` (the WDR conjugate, from the true words) is used. None: N = 1.
        alpha: α (``objective.ngram_alpha``).
    """

    def __init__(
        self, objective: nn.Module, heads: NgramHeads | None = None, alpha: float = 1.0
    ) -> None:
        super().__init__()
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.objective = objective
        self.heads = [heads]  # a list so the heads stay registered in the model only
        self.alpha = alpha
        # extra target columns the trainer supplies
        self.lookahead = 0 if heads is None else heads.num_predictions - 1

    def head_losses(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> list[LossOutput]:
        """[L₀, L₁, ..., L_{N−1}] as the wrapped objective's records (mean loss, NLL, count)."""
        predicted = prediction.main
        T = predicted.size(1)
        if targets.size(1) < T + self.lookahead:
            targets = F.pad(targets, (0, T + self.lookahead - targets.size(1)), value=IGNORE)
        records = [self.objective(predicted, targets[:, :T], weight, bias)]
        if self.lookahead == 0:
            return records
        heads = self.heads[0]
        if prediction.heads is None:
            raise ValueError("the N-gram loss needs the heads' outputs: call the model with them")
        real = targets != IGNORE  # (B, T + N − 1)
        # x_s = E_out[y_s] for the WDR conjugate, which is detached anyway
        embeddings = weight.detach()[targets.masked_fill(~real, 0)]  # (B, T + N − 1, d)
        predictions = heads.reconstruct(prediction.heads, embeddings)  # (N−1, B, T, d)
        for n, head_prediction in enumerate(predictions, 1):
            # head n at t predicts y_{t+n}; it counts where y_t..y_{t+n} are all real words
            # (padding only ever ends a row, so: the positions that have a target t+n)
            scored = real.unfold(1, n + 1, 1)[:, :T].all(-1)  # (B, T)
            shifted = targets[:, n : n + T].masked_fill(~scored, IGNORE)
            records.append(self.objective(head_prediction, shifted, weight, bias))
        return records

    def forward(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> LossOutput:
        records = self.head_losses(prediction, targets, weight, bias)
        if len(records) == 1:
            return records[0]
        loss = functional.ngram_loss([r.loss for r in records], self.alpha)
        return LossOutput(loss, records[0].nll_sum, records[0].count)


def split_ngram_options(
    options: Mapping[str, Any], has_heads: bool
) -> tuple[float, dict[str, Any]]:
    """``[objective]`` options -> (α, the wrapped objective's options).

    ``ngram_alpha`` (default 1) weighs the heads' losses; it is an error without heads."""
    rest = dict(options)
    if NGRAM_ALPHA not in rest:
        return 1.0, rest
    alpha = rest.pop(NGRAM_ALPHA)
    if not has_heads:
        raise ConfigError(
            f"objective.{NGRAM_ALPHA}: weighs the N-gram heads' losses, but the model has no "
            "heads (model.heads.kind = 'none')"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ConfigError(f"objective.{NGRAM_ALPHA}: expected a number, got {alpha!r}")
    if alpha < 0:
        raise ConfigError(f"objective.{NGRAM_ALPHA}: must be >= 0, got {alpha}")
    return float(alpha), rest


def build_objective(config: ComponentConfig, model: LanguageModel) -> NgramLoss:
    """The training objective for ``model``: the configured objective inside :class:`NgramLoss`
    (the wrapped objective alone when the model has no heads)."""
    alpha, options = split_ngram_options(config.options, model.heads is not None)
    objective = OBJECTIVES.build(config.kind, options, "objective", embedding=model.embedding)
    return NgramLoss(objective, model.heads, alpha)
