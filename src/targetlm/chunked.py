r"""The logit layer and its loss in tiles: never the whole (tokens × vocabulary) matrix.

For rows i = 1..M (x̂_i, target y_i, weight w_i) and vocabulary V the logits are
``z_i = E_out · x̂_i + b`` and ``Z_i = logsumexp_v z_iv``. Each scored row's loss is

    ℓ_i = c·[(1 − ε)·(Z_i − z_{i,y_i}) + ε·(Z_i − mean_v z_iv)]      cross entropy, smoothed
        + ζ·Z_i²                                                     z-loss (PaLM)
        + κ·KL(ỹ_i ‖ softmax(z_i / τ))                               AL (Inan et al. eq. 3.3)

with the estimated target ``ỹ_i = softmax(L · L[y_i]ᵀ / τ)`` (L: the table AL reads, a
constant here, as in the paper's analysis) and
``KL = Σ_v ỹ log ỹ − Σ_v ỹ·z/τ + logsumexp(z/τ)``. Rows whose target is ``IGNORE`` give 0.
The loss is ``Σ_i w_i ℓ_i`` (``sum``), that over the number of scored rows (``mean``) or
the ``w_i ℓ_i`` themselves (``none``). Per-row weights let every N-gram head's rows share
one call: E_out is read once for all of them.

How. Rows go in tiles of ``chunk_tokens``, the vocabulary in tiles of ``chunk_vocab``; Z,
logsumexp(z/τ) and AL's normaliser ``logsumexp(s/τ)`` with its ỹ-weighted sums are running
(online) statistics over the vocabulary tiles, rescaled whenever a tile raises the maximum.
The gradient with respect to the logits is, per row,

    ∂ℓ_i/∂z_iv = (c + 2ζ·Z_i)·p_iv − c·(1 − ε)·[v = y_i] − c·ε/V + κ·(q_iv − ỹ_iv)/τ

(p = softmax(z), q = softmax(z/τ)), which goes to ``x̂`` (``∂z·E_out``), ``E_out``
(``∂zᵀ·x̂``) and ``b`` (column sums) tile by tile. For a scalar loss (``mean``/``sum``)
with gradients wanted, the forward pass computes them straight away (as Liger-Kernel's fused
linear cross entropy does: no logit matmul is recomputed when a row's tiles cover the whole
vocabulary) and the backward pass scales them; for ``none`` the backward pass recomputes
each tile. Memory beyond the inputs: O(M + V) statistics and gradients, plus a few
(chunk_tokens × chunk_vocab) tiles. A GPU kernel (``torch.compile`` of :func:`_logit_tile`,
Liger-Kernel, Cut Cross-Entropy) would slot in at :func:`chunked_logit_loss`; none is wired.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

IGNORE = -100  # = targetlm.data.batching.IGNORE (functional must not import data)

# "auto" on the CPU runs the chunked path when rows × V reaches this many logits (128 MB in
# float32): the one threshold of training and evaluation there (auto_chunks)
AUTO_CHUNK_ELEMENTS = 2**25
# "auto" on a GPU: the full logits while they take at most this share of the memory the device
# had free when first asked (float32 logits, their softmax and gradient: about 3 copies)
AUTO_GPU_SHARE = 1 / 8
# the default tile (train.loss_chunk_tokens / loss_chunk_vocab repeat it, a test checks):
CHUNK_TOKENS = 256  # 256 rows ...
CHUNK_VOCAB = 65_536  # ... times the whole vocabulary up to 65,536 words (one pass per row tile)

Reduction = Literal["mean", "sum", "none"]


def auto_chunks(rows: int, vocab_size: int, device: torch.device | None = None) -> bool:
    """Whether ``loss_impl = "auto"`` runs the logit layer chunked for ``rows`` rows (all heads'
    in a training step; a segment's positions in evaluation) over ``vocab_size`` words.

    On the CPU from :data:`AUTO_CHUNK_ELEMENTS` logits on (the tile loop is as fast there and
    bounds the memory). On a GPU the full logits are faster (one matmul and one fused loss
    instead of a loop of tiles; ``benchmarks/gpu_step.py`` measures both), so they are used
    while three float32 copies of them fit in :data:`AUTO_GPU_SHARE` of the device's free
    memory."""
    if device is not None and device.type == "cuda":
        return 3 * 4 * rows * vocab_size > AUTO_GPU_SHARE * _free_memory(device.index)
    return rows * vocab_size >= AUTO_CHUNK_ELEMENTS


_FREE_MEMORY: dict[int | None, int] = {}


def _free_memory(index: int | None) -> int:
    """Bytes free on CUDA device ``index`` when first asked (cached: a constant to a compiled
    step, which ``training.compile`` marks it as; marking it here would import the compiler
    into every process that imports targetlm)."""
    if index not in _FREE_MEMORY:
        _FREE_MEMORY[index] = torch.cuda.mem_get_info(index)[0]
    return _FREE_MEMORY[index]


@dataclass(frozen=True)
class LogitTerms:
    """What an objective asks of the logit layer, per scored row (the module docstring's ℓ_i).

    Args:
        ce_weight: c, the cross entropy's weight.
        label_smoothing: ε in [0, 1).
        z_loss: ζ ≥ 0.
        kl_weight: κ, the weight of AL's KL term (0: none).
        tau: τ > 0 of the KL term.
        soft_table: L (V, e): ỹ_i = softmax(L · L[y_i]ᵀ / τ); needed when κ > 0. Detached.
    """

    ce_weight: float = 1.0
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    kl_weight: float = 0.0
    tau: float = 1.0
    soft_table: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        if self.kl_weight != 0 and self.soft_table is None:
            raise ValueError("a KL term (kl_weight != 0) needs the soft_table L")

    @property
    def has_kl(self) -> bool:
        return self.kl_weight != 0


class ChunkedLoss(NamedTuple):
    """``loss`` (scalar, or (M,) for ``none``); per row, detached: ``log_norm`` Z_i (M,) and
    ``target_logits`` z_{i,y_i} (M,) (0 where ignored): the NLL is their difference."""

    loss: torch.Tensor
    log_norm: torch.Tensor
    target_logits: torch.Tensor


def check_targets(targets: torch.Tensor, vocab_size: int) -> None:
    """One clear error for a target id outside ``[0, vocab_size)`` that is not ``IGNORE``
    (eagerly; a compiled training step's batches are checked once, before training)."""
    if torch.compiler.is_compiling():
        return
    bad = (targets != IGNORE) & ((targets < 0) | (targets >= vocab_size))
    if bool(bad.any()):
        value = int(targets[bad][0])
        raise ValueError(
            f"target id {value} is outside the vocabulary of {vocab_size} words "
            f"(ids 0..{vocab_size - 1}, or {IGNORE} for padding)"
        )


def chunked_logit_loss(
    predicted: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    terms: LogitTerms | None = None,
    row_weights: torch.Tensor | None = None,
    reduction: Reduction = "mean",
    chunk_tokens: int = CHUNK_TOKENS,
    chunk_vocab: int = CHUNK_VOCAB,
) -> ChunkedLoss:
    """The logit layer's loss without the (M, V) logits (see the module docstring).

    predicted x̂ (M, d), weight E_out (V, d), bias b (V,) or None, targets (M,) with ``IGNORE``
    for padding, row_weights w (M,) or None (all 1). Returns :class:`ChunkedLoss`.
    """
    terms = terms or LogitTerms()
    if chunk_tokens < 1 or chunk_vocab < 1:
        raise ValueError(f"tile sizes must be >= 1, got {chunk_tokens} x {chunk_vocab}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be mean, sum or none, got {reduction!r}")
    if predicted.dim() != 2 or targets.shape != predicted.shape[:1]:
        raise ValueError(
            f"predicted (M, d) and targets (M,) expected, got {tuple(predicted.shape)} "
            f"and {tuple(targets.shape)}"
        )
    check_targets(targets, weight.size(0))
    scored = targets != IGNORE
    coefficients = scored.to(torch.promote_types(predicted.dtype, torch.float32))
    if row_weights is not None:
        coefficients = coefficients * row_weights.detach()
    if reduction == "mean":
        coefficients = coefficients / max(int(scored.sum()), 1)
    table = terms.soft_table.detach() if terms.soft_table is not None and terms.has_kl else None
    wanted = (
        predicted.requires_grad,
        weight.requires_grad,
        bias is not None and bias.requires_grad,
    )
    fused = reduction != "none" and torch.is_grad_enabled() and any(wanted)
    plan = _Plan(terms, chunk_tokens, chunk_vocab, reduction, fused, wanted)
    loss, log_norm, target_logits = _ChunkedLogitLoss.apply(
        predicted, weight, bias, targets, coefficients, table, plan
    )
    return ChunkedLoss(loss, log_norm, target_logits)


@torch.no_grad()
def logit_statistics(
    predicted: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
    chunk_vocab: int = CHUNK_VOCAB,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log Z, z_y)`` of each position without the logits (evaluation; no gradients).

    predicted (..., d), targets (...) or None (then z_y is 0) -> two (...) tensors: the
    log-sum-exp of ``x̂ · E_outᵀ + b`` over the words of ``weight`` and the target's logit
    (0 where the target is ``IGNORE``).
    """
    shape = predicted.shape[:-1]
    flat = predicted.reshape(-1, predicted.size(-1))
    if targets is None:
        targets = torch.full(shape, IGNORE, dtype=torch.long, device=predicted.device)
    out = chunked_logit_loss(
        flat, weight, bias, targets.reshape(-1), None, None, "none", chunk_tokens, chunk_vocab
    )
    return out.log_norm.view(shape), out.target_logits.view(shape)


@dataclass(frozen=True)
class _Plan:
    terms: LogitTerms
    chunk_tokens: int
    chunk_vocab: int
    reduction: Reduction
    fused: bool  # compute the gradients in the forward pass (scalar loss)
    wanted: tuple[bool, bool, bool]  # gradients for x̂, E_out, b


class _ChunkedLogitLoss(torch.autograd.Function):
    """Autograd wrapper of :func:`_run`: forward (and, fused, the gradients) tile by tile."""

    @staticmethod
    def forward(ctx, predicted, weight, bias, targets, coefficients, table, plan):  # noqa: D102
        grads = _Grads.zeros(predicted, weight, bias, plan.wanted) if plan.fused else None
        row_loss, stats = _run(predicted, weight, bias, targets, table, plan, coefficients, grads)
        ctx.plan = plan
        if plan.fused:
            ctx.save_for_backward(grads.x, grads.weight, grads.bias)
        else:
            ctx.save_for_backward(predicted, weight, bias, targets, coefficients, table, *stats)
        loss = row_loss * coefficients
        if plan.reduction != "none":
            loss = loss.sum()
        log_norm, target_logits = stats[0], stats[1]
        ctx.mark_non_differentiable(log_norm, target_logits)
        return loss, log_norm, target_logits  # float32 or float64, as the statistics

    @staticmethod
    def backward(ctx, grad_loss, _grad_log_norm, _grad_target):  # noqa: D102
        plan = ctx.plan
        if plan.fused:
            saved = ctx.saved_tensors
            out = [None if g is None else g * grad_loss.to(g.dtype) for g in saved]
            return out[0], out[1], out[2], None, None, None, None
        predicted, weight, bias, targets, coefficients, table, *stats = ctx.saved_tensors
        grads = _Grads.zeros(predicted, weight, bias, plan.wanted)
        _backward(
            predicted, weight, bias, targets, table, plan, coefficients * grad_loss, stats, grads
        )
        return grads.x, grads.weight, grads.bias, None, None, None, None


@dataclass
class _Grads:
    x: torch.Tensor | None
    weight: torch.Tensor | None
    bias: torch.Tensor | None

    @staticmethod
    def zeros(predicted, weight, bias, wanted) -> _Grads:
        made = [
            torch.zeros_like(t) if w else None for t, w in zip((predicted, weight, bias), wanted)
        ]
        return _Grads(*made)


def _tiles(size: int, chunk: int) -> list[tuple[int, int]]:
    return [(start, min(start + chunk, size)) for start in range(0, size, chunk)]


def _logit_tile(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """z = x · Wᵀ + b for one tile: x (m, d), W (v, d), b (v,) -> (m, v), at least float32."""
    z = x @ weight.t() if bias is None else torch.addmm(bias, x, weight.t())
    return z.float() if z.dtype in (torch.float16, torch.bfloat16) else z


class _SoftRows(NamedTuple):
    """AL's targets of one row tile, per distinct target word (running text repeats words)."""

    vectors: torch.Tensor  # (U, e): L[u] for the tile's distinct targets u
    inverse: torch.Tensor  # (m,): each row's index into u


def _soft_rows(table: torch.Tensor, safe_targets: torch.Tensor) -> _SoftRows:
    unique, inverse = torch.unique(safe_targets, return_inverse=True)
    return _SoftRows(table[unique], inverse)


def _soft_tile(soft: _SoftRows, table: torch.Tensor, tau: float) -> torch.Tensor:
    """s/τ = L[u] · L_tileᵀ / τ: (U, v), at least float32."""
    return _logit_tile(soft.vectors, table, None) / tau


def _online(
    running_max: torch.Tensor, running_sum: torch.Tensor, tile: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of the online log-sum-exp over a row's tiles.

    Returns the new max m', the new sum ``Σ exp(t − m')``, the tile's ``exp(t − m')`` and the
    factor ``exp(m − m')`` that rescales any other running sum kept relative to m."""
    new_max = torch.maximum(running_max, tile.amax(-1))
    scale = torch.exp(running_max - new_max)
    exps = (tile - new_max[:, None]).exp_()
    return new_max, running_sum * scale + exps.sum(-1), exps, scale


def _run(predicted, weight, bias, targets, table, plan, coefficients, grads):
    """Forward over every row tile: per-row losses (M,) and the statistics the backward needs.

    Statistics (M,) each: Z, z_y, logsumexp(z/τ) and logsumexp(s/τ) of each row's target
    (the last two only with a KL term). With ``grads`` the gradients are accumulated too.
    """
    M = predicted.size(0)
    dtype = torch.promote_types(predicted.dtype, torch.float32)
    row_loss = predicted.new_zeros(M, dtype=dtype)
    names = ("log_norm", "target", "log_norm_tau", "soft_log_norm")
    stats = {name: predicted.new_zeros(M, dtype=dtype) for name in names}
    for start, end in _tiles(M, plan.chunk_tokens):
        rows = _row_tile(
            predicted[start:end],
            weight,
            bias,
            targets[start:end],
            table,
            plan,
            None if grads is None else coefficients[start:end],
            grads,
            start,
        )
        row_loss[start:end] = rows.pop("loss")
        for name, value in rows.items():
            stats[name][start:end] = value
    return row_loss, [stats[name] for name in names]


def _row_tile(x, weight, bias, targets, table, plan, coefficients, grads, offset):
    """One row tile's loss and statistics (a dict of (m,) tensors); its gradients if asked."""
    terms, V = plan.terms, weight.size(0)
    m = x.size(0)
    safe = targets.clamp(min=0)  # IGNORE rows: any word; their coefficient is 0
    vocab_tiles = _tiles(V, plan.chunk_vocab)
    single = len(vocab_tiles) == 1
    dtype = torch.promote_types(x.dtype, torch.float32)
    minus_inf = torch.full((m,), -torch.inf, dtype=dtype, device=x.device)
    zero = torch.zeros(m, dtype=dtype, device=x.device)
    lse_max, lse_sum, target, logit_sum = minus_inf, zero, zero, zero
    soft = _soft_rows(table, safe) if terms.has_kl else None
    if soft is not None:
        U = soft.vectors.size(0)
        tau_max, tau_sum, soft_dot = minus_inf, zero, zero  # Σ e^{s−m}·z/τ per row
        soft_max = torch.full((U,), -torch.inf, dtype=dtype, device=x.device)
        soft_sum, soft_self = soft_max.new_zeros(U), soft_max.new_zeros(U)  # Σ e, Σ e·s/τ
    kept = None
    for start, end in vocab_tiles:
        z = _logit_tile(x, weight[start:end], None if bias is None else bias[start:end])
        lse_max, lse_sum, exps, scale = _online(lse_max, lse_sum, z)
        inside = (safe >= start) & (safe < end)
        local = (safe - start).clamp(0, end - start - 1)
        target = target + torch.where(inside, z.gather(1, local[:, None]).squeeze(1), 0.0)
        if terms.label_smoothing:
            logit_sum = logit_sum + z.sum(-1)
        if soft is not None:
            scaled = z / terms.tau
            tau_max, tau_sum, tau_exps, _ = _online(tau_max, tau_sum, scaled)
            s = _soft_tile(soft, table[start:end], terms.tau)  # (U, v)
            soft_max, soft_sum, soft_exps, soft_scale = _online(soft_max, soft_sum, s)
            soft_self = soft_self * soft_scale + torch.linalg.vecdot(soft_exps, s)
            soft_dot = soft_dot * soft_scale[soft.inverse] + torch.linalg.vecdot(
                soft_exps[soft.inverse], scaled
            )
        if single:  # kept for the gradient: softmax = exps / Σ exps once the sums are final
            kept = (z, exps, tau_exps, soft_exps) if soft is not None else (z, exps, None, None)
    log_norm = lse_max + lse_sum.log()
    target = torch.where(targets != IGNORE, target, 0.0)
    nll = log_norm - target
    loss = terms.ce_weight * nll
    if terms.label_smoothing:
        eps = terms.label_smoothing
        loss = terms.ce_weight * ((1 - eps) * nll + eps * (log_norm - logit_sum / V))
    if terms.z_loss:
        loss = loss + terms.z_loss * log_norm.square()
    out = {"loss": loss, "log_norm": log_norm, "target": target}
    if soft is not None:
        soft_log_norm = soft_max + soft_sum.log()  # (U,)
        neg_entropy = soft_self / soft_sum - soft_log_norm  # Σ ỹ log ỹ
        cross = soft_dot / soft_sum[soft.inverse]  # Σ ỹ z/τ
        log_norm_tau = tau_max + tau_sum.log()
        kl = neg_entropy[soft.inverse] - cross + log_norm_tau
        out.update(
            loss=loss + terms.kl_weight * kl,
            log_norm_tau=log_norm_tau,
            soft_log_norm=soft_log_norm[soft.inverse],
        )
    if grads is not None:
        stats = _TileStats(log_norm, out.get("log_norm_tau"), out.get("soft_log_norm"), soft)
        if single:  # the tile is still here: no recomputation
            z, exps, tau_exps, soft_exps = kept
            at_hand = _Tile(
                z,
                exps.div_(lse_sum[:, None]),  # p
                None if soft is None else tau_exps.div_(tau_sum[:, None]),  # q
                None if soft is None else soft_exps.div_(soft_sum[:, None]),  # ỹ per target
            )
            _tile_backward(x, weight, bias, safe, table, plan, coefficients, stats, grads, offset,
                           (0, V), at_hand)  # fmt: skip
        else:
            for tile in vocab_tiles:
                _tile_backward(
                    x, weight, bias, safe, table, plan, coefficients, stats, grads, offset, tile
                )
    return out


class _Tile(NamedTuple):
    """One tile's logits (m, v) and its softmaxes p, q (m, v) and ỹ (U, v), when still at hand."""

    logits: torch.Tensor
    probs: torch.Tensor
    tau_probs: torch.Tensor | None
    soft_probs: torch.Tensor | None


class _TileStats(NamedTuple):
    log_norm: torch.Tensor  # (m,) Z
    log_norm_tau: torch.Tensor | None  # (m,) logsumexp(z/τ)
    soft_log_norm: torch.Tensor | None  # (m,) logsumexp(s/τ) of each row's target
    soft: _SoftRows | None


def _backward(predicted, weight, bias, targets, table, plan, coefficients, stats, grads):
    """Recompute every tile and accumulate the gradients (``coefficients`` include ∂loss)."""
    log_norm, _, log_norm_tau, soft_log_norm = stats
    for start, end in _tiles(predicted.size(0), plan.chunk_tokens):
        safe = targets[start:end].clamp(min=0)
        soft = _soft_rows(table, safe) if plan.terms.has_kl else None
        tile_stats = _TileStats(
            log_norm[start:end],
            log_norm_tau[start:end] if soft is not None else None,
            soft_log_norm[start:end] if soft is not None else None,
            soft,
        )
        for tile in _tiles(weight.size(0), plan.chunk_vocab):
            _tile_backward(
                predicted[start:end], weight, bias, safe, table, plan,
                coefficients[start:end], tile_stats, grads, start, tile,
            )  # fmt: skip


def _tile_backward(
    x, weight, bias, safe, table, plan, coefficients, stats, grads, offset, tile, at_hand=None
):
    """∂loss/∂z on one tile (the module docstring's formula, times each row's coefficient),
    accumulated into the gradients of x̂, E_out and b. ``at_hand``: the tile's :class:`_Tile`
    when the forward pass still has it (else it is recomputed)."""
    terms = plan.terms
    start, end = tile
    V = weight.size(0)
    tile_weight = weight[start:end]
    if at_hand is None:
        z = _logit_tile(x, tile_weight, None if bias is None else bias[start:end])
        probs = (z - stats.log_norm[:, None]).exp_()
    else:
        z, probs = at_hand.logits, at_hand.probs
    coefficients = coefficients.to(z.dtype)
    grad = probs.mul_(
        (coefficients * (terms.ce_weight + 2 * terms.z_loss * stats.log_norm))[:, None]
    )
    eps = terms.label_smoothing
    if eps:
        grad.sub_((coefficients * (terms.ce_weight * eps / V))[:, None])
    inside = ((safe >= start) & (safe < end)).nonzero().squeeze(1)
    if inside.numel():
        hit = coefficients[inside] * (terms.ce_weight * (1 - eps))
        grad.index_put_((inside, safe[inside] - start), -hit, accumulate=True)
    if stats.soft is not None:
        factor = (coefficients * (terms.kl_weight / terms.tau))[:, None]
        if at_hand is None:
            q = (z / terms.tau).sub_(stats.log_norm_tau[:, None]).exp_()
            s = _soft_tile(stats.soft, table[start:end], terms.tau)[stats.soft.inverse]
            soft_probs = s.sub_(stats.soft_log_norm[:, None]).exp_()
        else:
            q, soft_probs = at_hand.tau_probs, at_hand.soft_probs[stats.soft.inverse]
        grad.add_(q.mul_(factor)).sub_(soft_probs.mul_(factor))  # κ·(q − ỹ)/τ
    grad = grad.to(x.dtype)
    rows = slice(offset, offset + x.size(0))
    if grads.x is not None:
        grads.x[rows].addmm_(grad, tile_weight)
    if grads.weight is not None:
        grads.weight[start:end].addmm_(grad.t(), x)
    if grads.bias is not None:
        grads.bias[start:end] += grad.sum(0)
