"""The N-gram total loss of Heo, Rim & Choi (2024, 2025) around any objective."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from targetlm import functional
from targetlm.chunked import (
    CHUNK_TOKENS,
    CHUNK_VOCAB,
    auto_chunks,
    check_targets,
    chunked_logit_loss,
)
from targetlm.data.batching import IGNORE
from targetlm.modules.heads import NgramHeads
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.objectives.base import (
    OBJECTIVES,
    Count,
    Divisor,
    LossOutput,
    LossParts,
    LossSums,
    Objective,
)
from targetlm.registry import ConfigError, Fraction, NonNegative, Positive, check_type

if TYPE_CHECKING:
    from targetlm.config import ComponentConfig

NGRAM_ALPHA = "ngram_alpha"  # the [objective] key of α (the wrapped objective never sees it)
# [objective] keys of the N-gram loss itself, popped before the wrapped objective is built,
# with their types and ranges: α, the weight of L₀ (the paper's ½) and the label smoothing
# of the heads' losses (default: the wrapped objective's own, as in the paper)
NGRAM_MAIN_WEIGHT = "ngram_main_weight"
NGRAM_HEADS_LABEL_SMOOTHING = "ngram_heads_label_smoothing"
NGRAM_OPTIONS = {
    NGRAM_ALPHA: ("alpha", NonNegative),
    NGRAM_MAIN_WEIGHT: ("main_weight", Positive),
    NGRAM_HEADS_LABEL_SMOOTHING: ("heads_label_smoothing", Fraction),
}
LossImpl = Literal["full", "chunked", "auto"]


def later_values(
    values: torch.Tensor, real: torch.Tensor, heads: int, columns: int, fill: float = 0.0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What each N-gram head n = 1..``heads`` is scored against at ``columns`` positions t:
    [(the values n columns later (B, columns, ...), where head n scores (B, columns))].

    values (B, L, ...) and real (B, L) bool (True at real words), L ≥ columns (the
    segment's columns, then the lookahead ones when there are any); missing columns are
    ``fill`` and not real. Head n scores at t where y_t..y_{t+n} are all real words
    (padding only ever ends a row, so: the positions that have a target t + n).
    """
    if real.size(1) < columns + heads:
        real = F.pad(real, (0, columns + heads - real.size(1)), value=False)
    out = []
    for n in range(1, heads + 1):
        scored = real.unfold(1, n + 1, 1)[:, :columns].all(-1)  # (B, columns)
        later = values[:, n : n + columns]
        if later.size(1) < columns:  # pad dimension 1 (F.pad's spec runs from the last one)
            spec = (0, 0) * (values.dim() - 2) + (0, columns - later.size(1))
            later = F.pad(later, spec, value=fill)
        out.append((later, scored))
    return out


class NgramLoss(nn.Module):
    """``½·L₀ + α/(2N−2)·Σ_{n=1}^{N−1} L_n`` (:func:`targetlm.functional.ngram_loss`).

    The training objective the trainer calls: each L_n is the wrapped ``objective`` (cross
    entropy, AL, ...) applied to head n's reconstructed prediction x̂_{t+n} with the targets n
    columns later; L₀ to the main x̂_t. Without heads (N = 1) it is the wrapped objective
    itself. ``nll_sum``/``count`` stay L₀'s: perplexity is next-word perplexity.

    ``loss_impl``: ``full`` runs the wrapped objective on each head's (B·T, V) logits;
    ``chunked`` stacks the rows of every head (their shifted targets, and per-row weights
    w_n / (head n's divisor) with w_0 = ½ and w_n = α/(2N−2)) into one
    :func:`targetlm.chunked.chunked_logit_loss` call with the objective's
    ``logit_terms``: E_out (and AL's table) is built and read once per step, and no
    (tokens × V) matrix exists. It forms the gradient in the forward pass, so it runs when
    the step divides (:meth:`LossParts.divided`), with the divisors in its row weights. ``auto``: chunked when the objective allows it and the step
    has at least ``AUTO_CHUNK_ELEMENTS`` logits, rows (all heads) × V. Equal results
    within float tolerance.

    ``forward(prediction, targets, weight, bias)`` -> :class:`LossParts`, one part per head
    (its summed loss and scored positions), divided once by the training step: the model's
    :class:`Prediction` (x̂ (B, T, d), heads' raw outputs (N−1, B, T, d)); targets
    (B, T + lookahead), the segment's targets followed by ``lookahead = N − 1`` more columns
    of the stream (IGNORE past its end), so the last positions of a BPTT segment are scored
    by every head as well. Fewer columns are padded with IGNORE. One process divides head n's
    sum by its count c_n; several divide rank r's S_n^r by the whole batch's C_n / K, so the
    processes' averaged gradients are the whole batch's
    (:func:`~targetlm.training.step.divide_once`).

    Args:
        objective: the built per-head objective.
        heads: the model's heads (not owned here: their parameters are the model's); only
            their ``reconstruct`` (the WDR conjugate, from the true words) is used. None: N = 1.
        alpha: α (``objective.ngram_alpha``).
        loss_impl: ``full`` | ``chunked`` | ``auto`` (``train.loss_impl``).
        chunk_tokens, chunk_vocab: the chunked path's tile (``train.loss_chunk_tokens``,
            ``train.loss_chunk_vocab``).
        main_weight: the weight of L₀ (the paper's ½; ``objective.ngram_main_weight``).
        heads_objective: the objective of L_1..L_{N−1} when it differs from the main one
            (e.g. without label smoothing: ``objective.ngram_heads_label_smoothing``);
            None: ``objective``.
    """

    def __init__(
        self,
        objective: Objective,
        heads: NgramHeads | None = None,
        alpha: float = 1.0,
        loss_impl: LossImpl = "full",
        chunk_tokens: int = CHUNK_TOKENS,
        chunk_vocab: int = CHUNK_VOCAB,
        main_weight: float = 0.5,
        heads_objective: Objective | None = None,
    ) -> None:
        super().__init__()
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not main_weight > 0:
            raise ValueError(f"main_weight must be > 0, got {main_weight}")
        if loss_impl not in ("full", "chunked", "auto"):
            raise ValueError(f"loss_impl must be full, chunked or auto, got {loss_impl!r}")
        if chunk_tokens < 1 or chunk_vocab < 1:
            raise ValueError(f"the loss tile must be >= 1 x 1, got {chunk_tokens} x {chunk_vocab}")
        heads_objective = objective if heads_objective is None else heads_objective
        for each in {id(objective): objective, id(heads_objective): heads_objective}.values():
            if loss_impl == "chunked" and not each.chunkable:
                raise ValueError(
                    f"loss_impl = 'chunked': {type(each).__name__} cannot run chunked "
                    "(AL needs detach_target = true); use 'full' or 'auto'"
                )
        self.loss_impl = loss_impl
        self.chunk = (chunk_tokens, chunk_vocab)
        self.objective = objective
        self.heads_objective = heads_objective
        self.main_weight = main_weight
        # the heads' WDR conjugate (from the true words); the heads themselves (and their
        # parameters) are the model's, so only this function of theirs is kept here
        self.reconstruct: Callable[..., torch.Tensor] | None = (
            None if heads is None else heads.reconstruct
        )
        self.alpha = alpha
        # extra target columns the trainer supplies
        self.lookahead = 0 if heads is None else heads.num_predictions - 1

    def head_losses(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> list[LossSums]:
        """[L₀, L₁, ..., L_{N−1}] as the wrapped objective's records (summed loss, NLL,
        count), each on its own full logits."""
        return self.row_losses(self.head_rows(prediction, targets, weight), weight, bias)

    def row_losses(
        self,
        rows: list[tuple[torch.Tensor, torch.Tensor]],
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> list[LossSums]:
        """The wrapped objectives' records of :meth:`head_rows`' rows (the main head's
        objective for row 0, the heads' for the others)."""
        return [
            (self.objective if n == 0 else self.heads_objective)(p, t, weight, bias)
            for n, (p, t) in enumerate(rows)
        ]

    def head_rows(
        self, prediction: Prediction, targets: torch.Tensor, weight: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """[(x̂, targets)] of the main head and each head n: x̂_{t+n} (B, T, d) with the targets
        n columns later (B, T), IGNORE where a head has no target."""
        predicted = prediction.main
        T = predicted.size(1)
        if targets.size(1) < T + self.lookahead:
            targets = F.pad(targets, (0, T + self.lookahead - targets.size(1)), value=IGNORE)
        rows = [(predicted, targets[:, :T])]
        if self.lookahead == 0:
            return rows
        if prediction.heads is None or self.reconstruct is None:
            raise ValueError("the N-gram loss needs the heads' outputs: call the model with them")
        real = targets != IGNORE  # (B, T + N − 1)
        # x_s = E_out[y_s] for the WDR conjugate, which is detached anyway
        embeddings = weight.detach()[targets.masked_fill(~real, 0)]  # (B, T + N − 1, d)
        predictions = self.reconstruct(prediction.heads, embeddings)  # (N−1, B, T, d)
        later = later_values(targets, real, self.lookahead, T, IGNORE)
        for head_prediction, (shifted, scored) in zip(predictions, later):
            rows.append((head_prediction, shifted.masked_fill(~scored, IGNORE)))
        return rows

    def uses_chunked(self, rows: int, vocab_size: int, device: torch.device | None = None) -> bool:
        """Whether a step of ``rows`` scored rows (all heads) over ``vocab_size`` words runs
        chunked: always (``chunked``), never (``full``), or by :func:`~targetlm.chunked.auto_chunks`
        (``auto``)."""
        if self.loss_impl == "auto":
            chunkable = self.objective.chunkable and self.heads_objective.chunkable
            return chunkable and auto_chunks(rows, vocab_size, device)
        return self.loss_impl == "chunked"

    def forward(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> LossParts:
        check_targets(targets, weight.size(0))
        rows = self.head_rows(prediction, targets, weight)
        positions = prediction.main.shape[:-1].numel() * len(rows)
        if self.uses_chunked(positions, weight.size(0), weight.device):
            # each head's scored positions: one host read (none while compiling)
            scored = torch.stack([(t != IGNORE).sum() for _, t in rows])
            counts = list(scored.unbind()) if torch.compiler.is_compiling() else scored.tolist()
            return LossParts(
                counts,
                counts[0],
                functools.partial(self.chunked, prediction, rows, counts[0], weight, bias),
            )
        records = self.row_losses(rows, weight, bias)
        main = records[0]
        if main.nll_sum is None:
            raise TypeError(f"{type(self.objective).__name__} gives no next-word likelihood")
        combine = functools.partial(
            functional.ngram_loss, alpha=self.alpha, main_weight=self.main_weight
        )
        return LossParts.of_sums(records, combine, main.nll_sum, main.count)

    def chunked(
        self,
        prediction: Prediction,
        heads: list[tuple[torch.Tensor, torch.Tensor]],
        count: Count,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        divisors: Sequence[Divisor],
    ) -> LossOutput:
        """The same loss in one :func:`~targetlm.chunked.chunked_logit_loss` call over the
        stacked rows of every head (:meth:`head_rows`; ``count``: the main head's scored
        positions); each row weighted by its head's weight over the head's divisor."""
        d = prediction.main.size(-1)
        predicted = torch.cat([p.reshape(-1, d) for p, _ in heads])  # (N·B·T, d)
        stacked = torch.cat([t.reshape(-1) for _, t in heads])  # (N·B·T,)
        # functional.ngram_loss's weights: ½ (main_weight) and α/(2N−2), or 1 without heads
        head_weights = (
            [1.0]
            if self.lookahead == 0
            else [self.main_weight] + [self.alpha / (2 * self.lookahead)] * self.lookahead
        )
        dtype = torch.promote_types(predicted.dtype, torch.float32)
        row_weights = torch.cat(
            [
                _row_weights(w, divisor, t.numel(), dtype, t.device)
                for (_, t), w, divisor in zip(heads, head_weights, divisors)
            ]
        )
        main = heads[0][1].numel()
        if self.heads_objective is self.objective:  # every head's rows in one call
            parts = [(slice(None), self.objective)]
        else:  # the main rows and the heads' rows each with their own logit terms
            parts = [(slice(0, main), self.objective), (slice(main, None), self.heads_objective)]
        outs = [
            chunked_logit_loss(
                predicted[rows],
                weight,
                bias,
                stacked[rows],
                objective.logit_terms(weight),
                row_weights[rows],
                "sum",
                *self.chunk,
            )
            for rows, objective in parts
        ]
        loss = outs[0].loss if len(outs) == 1 else outs[0].loss + outs[1].loss
        scored = stacked[:main] != IGNORE
        nll_sum = (outs[0].log_norm[:main] - outs[0].target_logits[:main])[scored].sum()
        return LossOutput(loss, nll_sum, count)


def _row_weights(
    weight: float, divisor: Divisor, rows: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``rows`` copies of ``weight / divisor`` (a divisor of 0: 1), computed in float64 and
    rounded to ``dtype`` once, whether the divisor is a number or a tensor on the device."""
    if not isinstance(divisor, torch.Tensor):
        return torch.full((rows,), weight / (divisor or 1), dtype=dtype, device=device)
    divisor = torch.where(divisor > 0, divisor, 1).to(torch.float64)
    return (weight / divisor).to(dtype).expand(rows)


def split_ngram_options(
    options: Mapping[str, Any], has_heads: bool
) -> tuple[dict[str, float], dict[str, Any]]:
    """``[objective]`` options -> (the N-gram loss's own options, the wrapped objective's).

    The N-gram loss's keys: ``ngram_alpha`` (α, default 1) weighs the heads' losses,
    ``ngram_main_weight`` (default ½) L₀, ``ngram_heads_label_smoothing`` (default: the
    objective's ``label_smoothing``) smooths the heads' targets only. Each is an error
    without heads. Returned as ``{"alpha", "main_weight"[, "heads_label_smoothing"]}``."""
    rest = dict(options)
    ngram = {"alpha": 1.0, "main_weight": 0.5}
    for key, (name, kind) in NGRAM_OPTIONS.items():
        if key not in rest:
            continue
        value = rest.pop(key)
        if not has_heads:
            raise ConfigError(
                f"objective.{key}: applies to the N-gram heads' losses, but the model has no "
                "heads (model.heads.kind = 'none')"
            )
        ngram[name] = float(check_type(f"objective.{key}", value, kind))
    return ngram, rest


def build_objective(
    config: ComponentConfig,
    model: LanguageModel,
    loss_impl: LossImpl = "auto",
    chunk_tokens: int = CHUNK_TOKENS,
    chunk_vocab: int = CHUNK_VOCAB,
) -> NgramLoss:
    """The training objective for ``model``: the configured objective inside :class:`NgramLoss`
    (the wrapped objective alone when the model has no heads), computed ``loss_impl``
    (``train.loss_impl``) with ``chunk_tokens`` x ``chunk_vocab`` tiles when chunked."""
    ngram, options = split_ngram_options(config.options, model.heads is not None)
    objective = OBJECTIVES.build(config.kind, options, "objective", embedding=model.embedding)
    heads_objective = None
    if "heads_label_smoothing" in ngram:
        if "label_smoothing" not in OBJECTIVES.options(config.kind):
            raise ConfigError(
                f"objective.{NGRAM_HEADS_LABEL_SMOOTHING}: objective {config.kind!r} has no "
                "label_smoothing"
            )
        smoothing = {**options, "label_smoothing": ngram["heads_label_smoothing"]}
        heads_objective = OBJECTIVES.build(
            config.kind, smoothing, "objective", embedding=model.embedding
        )
    if loss_impl == "chunked" and not all(
        o.chunkable for o in (objective, heads_objective or objective)
    ):
        raise ConfigError(
            f"train.loss_impl = 'chunked': objective {config.kind!r} with these options cannot "
            "run chunked (AL: needs detach_target = true); use 'full' or 'auto'"
        )
    return NgramLoss(
        objective,
        model.heads,
        ngram["alpha"],
        loss_impl,
        chunk_tokens,
        chunk_vocab,
        main_weight=ngram["main_weight"],
        heads_objective=heads_objective,
    )
