"""Pure functions for the papers' equations. Each docstring names its equation.

The logit layer and cross entropy, the augmented loss (Inan et al.), the subspace distance,
WDR, the N-gram total loss, the head ensemble (Heo et al.) and gradient diversity. The logit
layer and its loss in tiles, without the (N, V) logits, is
:func:`targetlm.chunked.chunked_logit_loss`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

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
    reduction: Literal["mean", "sum"] = "mean",
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Cross entropy with optional label smoothing (Szegedy et al. 2016).

    logits (N, V), targets (N,). Positions whose target is ``ignore_index`` are skipped.
    The smoothed loss is ``(1 − ε)·NLL + ε·mean_v(−log p_v)`` (the uniform prior spreads
    ε over all V words, as ``torch.nn.functional.cross_entropy`` does).

    Returns ``(loss, nll_sum, count)``: the loss to optimise (its mean over the scored
    positions, or with ``reduction = "sum"`` its sum), the summed unsmoothed negative
    log-likelihood (detached; for perplexity) and the number of scored positions (an int;
    while ``torch.compile`` traces, a tensor: :func:`_cross_entropy_on_device`).
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if torch.compiler.is_compiling():
        return _cross_entropy_on_device(logits, targets, label_smoothing, ignore_index, reduction)
    count = int((targets != ignore_index).sum())
    if count == 0:
        zero = logits.sum() * 0.0
        return zero, zero.detach(), 0
    logits = _at_least_float32(logits)
    if label_smoothing == 0.0:
        nll_sum = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")
        return (nll_sum / count if reduction == "mean" else nll_sum), nll_sum.detach(), count
    log_probs = torch.log_softmax(logits, -1)
    mask = targets != ignore_index
    safe = targets.masked_fill(~mask, 0)
    nll = -log_probs.gather(1, safe[:, None]).squeeze(1)
    uniform = -log_probs.mean(1)
    loss = ((1 - label_smoothing) * nll + label_smoothing * uniform)[mask].sum()
    return (loss / count if reduction == "mean" else loss), nll[mask].sum().detach(), count


def _cross_entropy_on_device(
    logits: torch.Tensor,
    targets: torch.Tensor,
    label_smoothing: float,
    ignore_index: int,
    reduction: Literal["mean", "sum"],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`cross_entropy` with the count a tensor and padding weighted by 0 instead of
    indexed away: the same values with no host synchronisation and static shapes (what a
    compiled step needs)."""
    mask = targets != ignore_index
    count = mask.sum()
    logits = _at_least_float32(logits)
    if label_smoothing == 0.0:
        loss = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")
        nll_sum = loss.detach()
    else:
        log_probs = torch.log_softmax(logits, -1)
        nll = -log_probs.gather(1, targets.masked_fill(~mask, 0)[:, None]).squeeze(1)
        uniform = -log_probs.mean(1)
        weight = mask.to(nll.dtype)
        loss = (((1 - label_smoothing) * nll + label_smoothing * uniform) * weight).sum()
        nll_sum = (nll * weight).sum().detach()
    return (loss / count.clamp(min=1) if reduction == "mean" else loss), nll_sum, count


def z_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = IGNORE,
    reduction: Literal["mean", "sum"] = "mean",
) -> torch.Tensor:
    """The z-loss (Chowdhery et al. 2022, PaLM): ``mean_i (log Z_i)²`` over the scored positions
    (with ``reduction = "sum"``: the sum).

    logits (N, V), targets (N,). ``log Z_i = logsumexp_v z_iv``; it keeps the normaliser near 1.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    mask = targets != ignore_index
    if torch.compiler.is_compiling():  # static shapes: padding weighted by 0
        log_norm = torch.logsumexp(_at_least_float32(logits), -1)
        summed = (log_norm.square() * mask).sum()
        return summed / mask.sum().clamp(min=1) if reduction == "mean" else summed
    log_norm = torch.logsumexp(_at_least_float32(logits[mask]), -1)
    summed = log_norm.square().sum()
    return summed / max(int(mask.sum()), 1) if reduction == "mean" else summed


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
    ce = F.cross_entropy(_at_least_float32(logits), targets, reduction="none")
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
    """Per position ``KL(ỹ ‖ ŷ)`` of :func:`augmented_loss` (N,), in nats.

    ỹ depends only on the target word, so it is computed once per distinct target (running
    text repeats its frequent words). With ``detach_target`` ỹ is built without autograd and
    the KL goes through :class:`_DetachedTargetKL`, whose backward is the paper's eq. (3.4),
    ``∂KL/∂logits = (ŷ − ỹ)/τ``, in a few fused passes over the (N, V) logits.
    """
    if torch.compiler.is_compiling():  # static shapes: ỹ of every position (U = N)
        unique, inverse = targets, torch.arange(targets.numel(), device=targets.device)
    else:
        unique, inverse = torch.unique(targets, return_inverse=True)  # (U,), (N,)
    with torch.set_grad_enabled(torch.is_grad_enabled() and not detach_target):
        similarity = output_embeddings[unique] @ output_embeddings.t()  # (U, V)
        target_log_probs = torch.log_softmax(_at_least_float32(similarity) / tau, -1)
        target_probs = target_log_probs.exp()
        neg_entropy = (target_probs * target_log_probs).sum(-1)  # (U,): Σ ỹ log ỹ
    if detach_target:
        return _DetachedTargetKL.apply(logits, target_probs, neg_entropy, inverse, tau)
    scaled = _at_least_float32(logits) / tau  # (N, V)
    # Σ ỹ log ŷ = ỹ · logits/τ − logsumexp(logits/τ), as Σ ỹ = 1
    cross = torch.linalg.vecdot(target_probs[inverse], scaled) - torch.logsumexp(scaled, -1)
    return neg_entropy[inverse] - cross


class _DetachedTargetKL(torch.autograd.Function):
    """``KL(ỹ_i ‖ softmax(z_i/τ))`` for a constant ỹ, with the gradient ``(ŷ − ỹ)/τ`` written out.

    Autograd through log-softmax, gather, product and sum makes about five times as many
    passes over the (N, V) logits; at vocabulary 10k those passes, not the matmuls, were
    most of AL's cost.
    """

    @staticmethod
    def forward(ctx, logits, target_probs, neg_entropy, inverse, tau):  # noqa: D102
        # logits (N, V); target_probs (U, V) and neg_entropy (U,) per distinct target; inverse (N,)
        scaled = _at_least_float32(logits) / tau
        log_normaliser = torch.logsumexp(scaled, -1)  # (N,)
        cross = torch.linalg.vecdot(target_probs[inverse], scaled) - log_normaliser
        ctx.save_for_backward(logits, log_normaliser, target_probs, inverse)
        ctx.tau = tau
        return neg_entropy[inverse] - cross

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        logits, log_normaliser, target_probs, inverse = ctx.saved_tensors
        tau = ctx.tau
        grad_logits = (_at_least_float32(logits) / tau).sub_(log_normaliser[:, None]).exp_()  # ŷ
        grad_logits.sub_(target_probs[inverse]).mul_(grad[:, None] / tau)
        return grad_logits.to(logits.dtype), None, None, None, None


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """Softmax statistics in float32 for half/bfloat16 inputs; float64 stays float64 (gradcheck)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


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


# --- Heo, Rim & Choi (2024, 2025): N-gram prediction, word difference representations ---


def wdr(x: torch.Tensor, n: int) -> torch.Tensor:
    """n-level word difference representation along time (Heo et al. 2025, eqs. 7-8).

    x (B, T, d) -> (B, T, d) by the recursion ``Δ_0 x_t = x_t``,
    ``Δ_n x_t = Δ_{n−1} x_{t+1} − Δ_{n−1} x_t`` for t < T, and eq. 8's boundary rule
    ``Δ_n x_T = x_T`` at the last step (so ``Δ_{n−1} x_T = x_T`` inside the recursion).
    For t ≤ T−n it equals eq. (9), ``Σ_{i=0}^{n} C(n,i)(−1)^i x_{t+n−i}``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    last = x[:, -1:]  # x_T, every level's value at t = T
    for _ in range(n):
        x = torch.cat([x[:, 1:] - x[:, :-1], last], 1)
    return x


def wdr_conjugate(x: torch.Tensor, n: int) -> torch.Tensor:
    """Conjugate of the n-level WDR: ``Δ^r_n x_t = −Σ_{i=1}^{n} C(n,i)(−1)^i x_{t+n−i}``, detached.

    x (B, T, d) -> (B, T, d). It reads x_t..x_{t+n−1} only, and ``Δ_n x_t + Δ^r_n x_t = x_{t+n}``
    (eq. 9), so a head that predicts Δ_n x_t plus the conjugate of the true preceding words
    predicts x_{t+n}. Zero for t > T−n, where x_{t+n} does not exist. Detached: a constant
    offset, so no gradient reaches ``E_out`` through it.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    x = x.detach()
    out = torch.zeros_like(x)
    valid = max(x.size(1) - n, 0)  # positions t (0-based) with t + n < T
    for i in range(1, n + 1):
        out[:, :valid] -= math.comb(n, i) * (-1) ** i * x[:, n - i : n - i + valid]
    return out


def ngram_loss(
    losses: Sequence[torch.Tensor], alpha: float = 1.0, main_weight: float = 0.5
) -> torch.Tensor:
    """N-gram total loss (Heo et al. 2024): ``½·L₀ + α/(2N−2)·Σ_{n=1}^{N−1} L_n``.

    losses: [L_0, ..., L_{N−1}] scalars, L_0 the next-word loss. α = 1 is the 2024 paper's
    form (main and future heads weigh half each). One loss (N = 1) is returned unchanged.
    ``main_weight`` replaces the ½ on L₀ (an ablation: 1 keeps the main loss at full weight).
    """
    if not losses:
        raise ValueError("ngram_loss needs at least the main loss L_0")
    if len(losses) == 1:
        return losses[0]
    heads = len(losses) - 1  # N − 1
    return main_weight * losses[0] + alpha / (2 * heads) * torch.stack(list(losses[1:])).sum()


def ensemble(
    main: torch.Tensor,
    head_predictions: torch.Tensor,
    lam: float,
    available: torch.Tensor | None = None,
) -> torch.Tensor:
    """Head ensemble (Heo et al. 2025): ``x̂_ens = (1−λ)·x̂_t + λ/(N−1)·Σ_{n=1}^{N−1} ê_n``.

    main (B, T, d): the main head's x̂_t. head_predictions (N−1, B, T, d): the heads'
    estimates ê_n of the same word, each made from h_{t−n}. available (N−1, T) or
    (N−1, B, T), bool: which ê_n exist. Rule where some do not (the start of a stream):
    the mean runs over the available heads only; with none available the result is x̂_t.
    λ = 0 returns ``main`` itself.
    """
    if lam == 0 or head_predictions.size(0) == 0:
        return main
    if available is None:
        return (1 - lam) * main + lam * head_predictions.mean(0)
    weights = available.to(main.dtype)
    if weights.dim() == 2:
        weights = weights[:, None]  # (N−1, 1, T): the same for every row
    weights = weights[..., None]  # (N−1, B or 1, T, 1)
    count = weights.sum(0)  # (B or 1, T, 1)
    mean = (head_predictions * weights).sum(0) / count.clamp(min=1)
    return torch.where(count > 0, (1 - lam) * main + lam * mean, main)


def gradient_diversity(per_example_grads: torch.Tensor) -> torch.Tensor:
    """Gradient diversity (Yin et al. 2018; Heo et al. 2025 eq. 14): ``Σ_i ‖g_i‖² / ‖Σ_i g_i‖²``.

    per_example_grads (B, P): one flattened gradient per example (or micro-batch). 1/B when
    all gradients are equal, 1 when they are orthogonal, larger when they cancel: the more
    diverse, the larger. Computed in float64.
    """
    g = per_example_grads.double()
    return (g * g).sum() / g.sum(0).pow(2).sum()
