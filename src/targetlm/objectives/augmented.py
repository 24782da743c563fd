"""The augmented loss of Inan, Khosravi & Socher (2017)."""

from __future__ import annotations

from typing import Literal

import torch

from targetlm import functional
from targetlm.chunked import LogitTerms
from targetlm.data.batching import IGNORE
from targetlm.modules.interfaces import EmbeddingTable
from targetlm.objectives.base import OBJECTIVES, LossSums
from targetlm.objectives.cross_entropy import CrossEntropyObjective
from targetlm.registry import Fraction, NonNegative, Positive, Probability


@OBJECTIVES.register("augmented")
class AugmentedLossObjective(CrossEntropyObjective):
    """``J + α·KL(ỹ ‖ ŷ)`` (AL; eq. 3.3), or the analysis form ``β·τ²·|V|·J_aug + (1−β)·J``.

    J is the (optionally label-smoothed) cross entropy; ``J_aug`` the mean KL term of
    :func:`targetlm.functional.augmented_kl`. Works with every output layer: it only
    needs ``E_out``.

    Args:
        tau: temperature τ (paper: 20).
        gamma: α = γ·τ when ``alpha`` is not given (paper: 0.5-0.8 on PTB, 1.0-1.5 on WikiText-2).
        alpha: the KL weight, overriding γ·τ.
        beta: use the analysis form with this β in [0, 1] instead of J + α·KL.
        label_smoothing: ε of the cross-entropy term.
        z_loss: weight of the z-loss mean (log Z)² added to either form (0: none).
        detach_target: treat ỹ as a constant (the paper's analysis); false lets gradients
            reach ``E_out`` through ỹ as well.
        target_source: ``input`` (the paper's, eq. 3.6 and §4: "⟨u_t, l_j⟩") builds ỹ from
            the input embedding L, ``ỹ = softmax(L · L[y]ᵀ / τ)``: only then does the KL term
            pull an untied W into the span of L (Fig. 1). ``output`` builds it from ``E_out``
            instead, which pulls W towards itself (an option; for tied models the two coincide).
        embedding: the model's input embedding (supplied by the builder).
    """

    def __init__(
        self,
        tau: Positive = 20.0,
        gamma: NonNegative = 0.5,
        alpha: NonNegative | None = None,
        beta: Probability | None = None,
        label_smoothing: Fraction = 0.0,
        z_loss: NonNegative = 0.0,
        detach_target: bool = True,
        target_source: Literal["input", "output"] = "input",
        embedding: EmbeddingTable | None = None,
    ) -> None:
        super().__init__(label_smoothing, z_loss)
        if target_source == "input" and embedding is None:
            raise ValueError(
                "target_source = 'input' needs the model's input embedding "
                "(pass embedding=..., or target_source='output')"
            )
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if beta is not None and not 0 <= beta <= 1:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.tau = tau
        self.alpha = gamma * tau if alpha is None else alpha
        self.beta = beta
        self.detach_target = detach_target
        # :meth:`logit_terms` exists only for a constant ỹ (the chunked path's)
        self.chunkable = detach_target
        # a list so the embedding's parameters stay owned (and counted) by the model only
        self.embedding = [embedding] if target_source == "input" and embedding is not None else None

    def _table(self, weight: torch.Tensor) -> torch.Tensor:
        """L of ỹ = softmax(L · L[y]ᵀ / τ): the input embedding's table or E_out."""
        return weight if self.embedding is None else self.embedding[0].table()

    def logit_terms(self, weight: torch.Tensor) -> LogitTerms:
        """The same loss per row for :func:`targetlm.chunked.chunked_logit_loss`
        (``detach_target`` only: gradients through ỹ need the full path)."""
        if not self.detach_target:
            raise ValueError("the chunked AL treats ỹ as a constant: needs detach_target = true")
        if self.beta is None:
            ce_weight, kl_weight = 1.0, self.alpha
        else:
            ce_weight, kl_weight = 1 - self.beta, self.beta * self.tau**2 * weight.size(0)
        return LogitTerms(
            ce_weight=ce_weight,
            label_smoothing=self.label_smoothing,
            z_loss=self.z_loss,
            kl_weight=kl_weight,
            tau=self.tau,
            soft_table=self._table(weight),
        )

    def with_terms(
        self, ce: LossSums, logits: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor
    ) -> LossSums:
        """Terms (1, Σ CE) and (α, Σ KL), or (β·τ²·|V|, Σ KL) and (1 − β, Σ CE); then
        (z_loss, Σ (log Z)²) when asked for; all over the scored positions."""
        ce_sum, count = ce.terms[0][1], ce.count
        compiling = torch.compiler.is_compiling()  # count is a tensor: no branch on it
        if not compiling and count == 0:
            return ce
        z_sum = functional.z_loss(logits, targets, reduction="sum") if self.z_loss else None
        table = self._table(weight)
        if compiling:  # static shapes: padding weighted by 0
            mask = targets != IGNORE
            kl = functional.augmented_kl(
                logits, targets.masked_fill(~mask, 0), table, self.tau, self.detach_target
            )
            kl_sum = (kl * mask).sum()
        else:
            if count < targets.numel():  # padding: score only real targets (a copy of the logits)
                mask = targets != IGNORE
                logits, targets = logits[mask], targets[mask]
            kl_sum = functional.augmented_kl(
                logits, targets, table, self.tau, self.detach_target
            ).sum()
        if self.beta is None:
            terms = [(1.0, ce_sum), (self.alpha, kl_sum)]
        else:
            terms = [(self.beta * self.tau**2 * weight.size(0), kl_sum), (1 - self.beta, ce_sum)]
        if z_sum is not None:
            terms.append((self.z_loss, z_sum))
        return LossSums(tuple(terms), ce.nll_sum, count)
