"""Mean predicted probability of chosen words over a split (Inan et al. 2017's qualitative check).

Inan et al. observe that reusing embeddings and the augmented loss move probability mass
away from ``<unk>`` and frequent function words. For each word w this computes
``mean_t p(w | x_<t)`` over every position t of the split, and the word's frequency there.
"""

from __future__ import annotations

import torch

from targetlm.data.batching import IGNORE
from targetlm.inference.evaluate import evaluate_ids
from targetlm.modules.model import LanguageModel


def mean_word_probabilities(
    model: LanguageModel, ids: torch.Tensor, word_ids: list[int], batch_size: int, segment: int
) -> dict[str, list[float]]:
    """``{"mean_prob": [...], "frequency": [...]}`` for ``word_ids`` over the stream ``ids``.

    Reads the stream with the one evaluation loop (:func:`~targetlm.inference.evaluate_ids`),
    looking at the main head's whole distribution at every scored position."""
    selected = torch.tensor(word_ids)
    totals = torch.zeros(len(word_ids), dtype=torch.float64)
    hits = torch.zeros(len(word_ids), dtype=torch.float64)

    def inspect(logits: torch.Tensor, targets: torch.Tensor) -> None:
        # logits (B, T, V), targets (B, T)
        log_probs = torch.log_softmax(logits.float(), -1)
        mask = targets != IGNORE
        totals.add_(log_probs[mask][:, selected.to(logits.device)].exp().double().sum(0).cpu())
        hits.add_((targets[mask][:, None].cpu() == selected).double().sum(0))

    (main,) = evaluate_ids(model, ids, batch_size=batch_size, segment=segment, inspect=inspect)
    count = main.count
    return {"mean_prob": (totals / count).tolist(), "frequency": (hits / count).tolist()}
