"""Pure functions for the papers' equations. Each docstring names its equation.

Later issues add the augmented loss (Inan et al.), the subspace distance, WDR,
the N-gram total loss and the head ensemble (Heo et al.) here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def logits(
    predicted: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The logit layer: ``x̂ · E_outᵀ + b``. predicted (..., d), weight (V, d), bias (V,) -> (..., V).

    Pass x̂ with its batch dimensions (B, T, d): for 3-D inputs ``F.linear`` runs a matmul and
    an in-place bias add, while for 2-D ones it first copies the bias into the whole output.
    """
    return F.linear(predicted, weight, bias)


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    label_smoothing: float = 0.0,
    ignore_index: int = IGNORE,
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


def augmented_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    output_embeddings: torch.Tensor,
    tau: float,
    alpha: float,
    detach_target: bool = True,
) -> torch.Tensor:
    """Inan et al. (2017) augmented loss, eqs. (3.1)-(3.3): mean of ``CE_i + α·KL(ỹ_i ‖ ŷ_i)``.

    logits (N, V), targets (N,), output_embeddings E_out (V, d). With temperature τ:
    ``ŷ = softmax(logits / τ)`` and the estimated target ``ỹ = softmax(E_out · E_out[y]ᵀ / τ)``,
    the similarity of the target word's logit-layer embedding to every word's. Natural log.
    ``detach_target`` (default) treats ỹ as a constant, as the paper's analysis (eqs. 3.4-3.5)
    differentiates with respect to the logits only.
    """
    ce = F.cross_entropy(logits.float(), targets, reduction="none")
    return (
        ce + alpha * augmented_kl(logits, targets, output_embeddings, tau, detach_target)
    ).mean()


def augmented_kl(
    logits: torch.Tensor,
    targets: torch.Tensor,
    output_embeddings: torch.Tensor,
    tau: float,
    detach_target: bool = True,
) -> torch.Tensor:
    """Per position ``KL(ỹ ‖ ŷ)`` of :func:`augmented_loss` (N,), in nats."""
    similarity = output_embeddings[targets] @ output_embeddings.t()  # (N, V)
    target_log_probs = torch.log_softmax(similarity.float() / tau, -1)
    if detach_target:
        target_log_probs = target_log_probs.detach()
    log_probs = torch.log_softmax(logits.float() / tau, -1)
    return (target_log_probs.exp() * (target_log_probs - log_probs)).sum(-1)


def subspace_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Distance between the column spaces of x (m, p) and y (m, q): Inan et al. (2017), Appendix B.

    Orthonormal bases Q_x, Q_y by QR; the residual of projecting the basis of the
    smaller space onto the other, ``R = Q_s − Q_l Q_lᵀ Q_s``; ``d = sqrt(trace(RᵀR) / C)``
    with C = min(p, q): the root mean square of the sines of the principal angles.
    0 when one span contains the other, 1 for orthogonal spans; symmetric.
    """
    if x.size(0) != y.size(0):
        raise ValueError(f"x and y need the same number of rows, got {x.size(0)} and {y.size(0)}")
    qx = torch.linalg.qr(x.double()).Q
    qy = torch.linalg.qr(y.double()).Q
    small, large = (qx, qy) if qx.size(1) <= qy.size(1) else (qy, qx)
    residual = small - large @ (large.t() @ small)
    return torch.sqrt((residual * residual).sum() / small.size(1)).clamp(max=1.0)
