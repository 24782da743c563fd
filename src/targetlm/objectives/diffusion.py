r"""The loss of embedding-space diffusion (Difformer / DINOISER), with or without N-gram heads.

:class:`DiffusionLoss` reads a diffusion task's :class:`~targetlm.modules.model.Prediction`:
x̂₀ (``main``), the heads' raw outputs (``heads``) and :class:`DiffusionInputs` (``extras``:
the clean embeddings x₀, the real positions, the times, the length classifier's logits), and
returns ``w·MSE + anchor·CE(x̂₀) + length_weight·CE(length)``
(:mod:`targetlm.tasks.diffusion` describes the task). Each part is a sum with its count
(:class:`~targetlm.objectives.base.LossSums`), divided once by the training step as the
N-gram loss's heads are (:func:`~targetlm.training.step.divide_once`: by the whole batch's
counts when several processes share the rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from targetlm import functional
from targetlm.modules.heads import NgramHeads
from targetlm.modules.model import Prediction
from targetlm.objectives.base import LossParts, LossSums, Objective
from targetlm.objectives.ngram import NgramLoss, later_values
from targetlm.registry import ConfigError


@dataclass(frozen=True)
class DiffusionInputs:
    """What the diffusion loss reads besides x̂₀ (a diffusion :class:`Prediction`'s ``extras``).

    clean: x₀ (B, T, d); mask (B, T) True at real target positions; time (B,);
    length_logits (B, 2m + 1) and length_classes (B,) (target − source length + m).
    """

    clean: torch.Tensor
    mask: torch.Tensor
    time: torch.Tensor
    length_logits: torch.Tensor
    length_classes: torch.Tensor


def squared_error(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> LossSums:
    """‖x̂ − x‖² summed over the positions ``mask`` (B, T) and the d dimensions; its count:
    the positions times d (the mean squared error, once divided)."""
    weights = mask.to(predicted.dtype)[..., None]
    summed = ((predicted - target) ** 2 * weights).sum()
    return LossSums(((1.0, summed),), None, int(mask.sum()) * predicted.size(-1))


class DiffusionLoss(nn.Module):
    """``w·MSE + anchor·CE(x̂₀) + length_weight·CE(length)`` of a diffusion :class:`Prediction`.

    MSE: L₀ = ‖x̂₀ − x₀‖² (mean over real positions and dimensions); with N-gram heads
    ``½·L₀ + α/(2N−2)·Σ_n L_n`` (:func:`targetlm.functional.ngram_loss`), L_n the MSE between
    head n's reconstruction at s, ``heads.reconstruct`` (WDR: MLPⁿ(x̂₀[s]) + Δʳ_n x₀[s], the
    detached conjugate of x₀[s..s+n−1]), and x₀[s+n], over the s where s + n is a real position.
    The anchor CE is the run's objective (cross entropy, label smoothing...) on the logit
    layer's logits of x̂₀ read in x₀'s scale, (x̂₀ / s)·E_outᵀ + b; its NLL is the perplexity
    the trainer logs.

    Args:
        objective: the built per-position objective (``[objective]``).
        heads: the model's heads, whose ``reconstruct`` is kept (their parameters stay the
            model's); None: no heads.
        alpha: α (``objective.ngram_alpha``); main_weight: the weight of L₀ among the MSEs.
        embedding_scale: s of x₀ = s·norm(E_out)[y]; diffusion_weight, anchor_weight,
            length_weight: the weights of the three terms (the diffusion task's options).

    ``forward`` returns :class:`LossParts`, as :class:`~targetlm.objectives.ngram.NgramLoss`
    does: every part's sum with its count (the MSEs, the anchor's target tokens, the length
    loss's sentences), divided once by the training step.
    """

    lookahead = 0  # pair batches carry the whole target

    def __init__(
        self,
        objective: Objective,
        heads: NgramHeads | None,
        alpha: float,
        *,
        embedding_scale: float = 1.0,
        diffusion_weight: float = 1.0,
        anchor_weight: float = 1.0,
        length_weight: float = 0.1,
        main_weight: float = 0.5,
    ) -> None:
        super().__init__()
        self.objective, self.alpha, self.main_weight = objective, alpha, main_weight
        self.reconstruct: Callable[..., torch.Tensor] | None = (
            None if heads is None else heads.reconstruct
        )
        self.embedding_scale = embedding_scale
        self.diffusion_weight, self.anchor_weight = diffusion_weight, anchor_weight
        self.length_weight = length_weight

    def parts(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> tuple[list[LossSums], torch.Tensor]:
        """Every part's sums, undivided: [L₀'s, L_1's .. L_{N−1}'s squared errors, the
        anchor's (the objective's :class:`LossSums`), the length loss's], and the length
        classifier's accuracy over these rows."""
        extras: DiffusionInputs = prediction.extras
        clean, mask = extras.clean, extras.mask
        squared = [squared_error(prediction.main, clean, mask)]
        if self.reconstruct is not None and prediction.heads is not None:
            rebuilt = self.reconstruct(prediction.heads, clean.detach())  # (N−1, B, T, d)
            # head n at s: x₀[s + n], where s + n is a real position
            later = later_values(clean, mask, rebuilt.size(0), clean.size(1))
            for estimate, (shifted, scored) in zip(rebuilt, later):
                squared.append(squared_error(estimate, shifted, scored))
        anchor = self.objective(prediction.main / self.embedding_scale, targets, weight, bias)
        length_sum = F.cross_entropy(
            extras.length_logits.float(), extras.length_classes, reduction="sum"
        )
        length = LossSums(((1.0, length_sum),), None, extras.length_classes.numel())
        correct = (extras.length_logits.argmax(-1) == extras.length_classes).float().mean()
        return [*squared, anchor, length], correct

    def combine(self, means: list[torch.Tensor]) -> dict[str, Any]:
        """The total and its terms from the parts' means (in :meth:`parts`' order):
        ``loss``, ``diffusion`` (the MSEs' N-gram total), ``mse`` (L₀), ``head_mse``
        ([L_1..L_{N−1}]) and ``length``."""
        *mse, anchor_loss, length_loss = means
        diffusion = functional.ngram_loss(mse, self.alpha, self.main_weight)
        loss = (
            self.diffusion_weight * diffusion
            + self.anchor_weight * anchor_loss
            + self.length_weight * length_loss
        )
        return {
            "loss": loss,
            "diffusion": diffusion,
            "mse": mse[0],
            "head_mse": mse[1:],
            "length": length_loss,
        }

    def terms(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> dict[str, Any]:
        """Every term of these rows alone (each part divided by its own count; an
        evaluation reads its rows alone): :meth:`combine`'s, with ``anchor`` (the
        objective's :class:`LossSums`) and ``length_accuracy``."""
        parts, correct = self.parts(prediction, targets, weight, bias)
        terms: dict[str, Any] = self.combine([part.normalised() for part in parts])
        return {**terms, "anchor": parts[-2], "length_accuracy": correct}

    def forward(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> LossParts:
        parts, _ = self.parts(prediction, targets, weight, bias)
        anchor = parts[-2]
        if anchor.nll_sum is None:
            raise TypeError(f"{type(self.objective).__name__} gives no next-word likelihood")
        return LossParts.of_sums(
            parts, lambda means: self.combine(means)["loss"], anchor.nll_sum, anchor.count
        )


def diffusion_loss(ngram: NgramLoss, heads: NgramHeads | None, **weights: float) -> DiffusionLoss:
    """The diffusion loss around the run's built objective (an ``NgramLoss``: its wrapped
    objective, α and L₀'s weight) with the model's ``heads`` and the task's ``weights``
    (:class:`DiffusionLoss`'s keyword arguments)."""
    if ngram.heads_objective is not ngram.objective:
        raise ConfigError(
            "objective.ngram_heads_label_smoothing: the diffusion heads' losses are MSEs, "
            "with no targets to smooth"
        )
    return DiffusionLoss(
        ngram.objective, heads, ngram.alpha, main_weight=ngram.main_weight, **weights
    )
