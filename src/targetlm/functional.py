"""Pure functions for the papers' equations. Each docstring names its equation.

Later issues add the augmented loss (Inan et al.), the subspace distance, WDR,
the N-gram total loss and the head ensemble (Heo et al.) here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def logits(predicted: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The logit layer: ``x̂ · E_outᵀ + b``. predicted (..., d), weight (V, d), bias (V,) -> (..., V)."""
    return F.linear(predicted, weight, bias)


def cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0, ignore_index: int = IGNORE
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Cross entropy with optional label smoothing (Szegedy et al. 2016).

    logits (N, V), targets (N,). Positions whose target is ``ignore_index`` are skipped.
    The smoothed loss is ``(1 − ε)·NLL + ε·mean_v(−log p_v)`` (the uniform prior spreads
    ε over all V words, as ``torch.nn.functional.cross_entropy`` does).

    Returns ``(loss, nll_sum, count)``: the mean smoothed loss to optimise, the
    summed unsmoothed negative log-likelihood (detached; for perplexity) and the
    number of scored positions.
    """
    count = int((targets != ignore_index).sum())
    if count == 0:
        zero = logits.sum() * 0.0
        return zero, zero.detach(), 0
    logits = logits.float()
    if label_smoothing == 0.0:
        nll_sum = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")
        return nll_sum / count, nll_sum.detach(), count
    log_probs = torch.log_softmax(logits, -1)
    mask = targets != ignore_index
    safe = targets.masked_fill(~mask, 0)
    nll = -log_probs.gather(1, safe[:, None]).squeeze(1)
    uniform = -log_probs.mean(1)
    loss = ((1 - label_smoothing) * nll + label_smoothing * uniform)[mask].sum() / count
    return loss, nll[mask].sum().detach(), count
