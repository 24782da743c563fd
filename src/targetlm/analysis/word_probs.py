"""Mean predicted probability of chosen words over a split (Inan et al. 2017's qualitative check).

Inan et al. observe that reusing embeddings and the augmented loss move probability mass
away from ``<unk>`` and frequent function words. For each word w this computes
``mean_t p(w | x_<t)`` over every position t of the split, and the word's frequency there.
"""

from __future__ import annotations

import torch

from targetlm.data.batching import IGNORE, StreamBatches
from targetlm.modules.model import LanguageModel


@torch.no_grad()
def mean_word_probabilities(
    model: LanguageModel, ids: torch.Tensor, word_ids: list[int], batch_size: int, segment: int
) -> dict[str, list[float]]:
    """``{"mean_prob": [...], "frequency": [...]}`` for ``word_ids`` over the stream ``ids``."""
    model.eval()
    batches = StreamBatches(ids, batch_size, segment, pad=True)
    selected = torch.tensor(word_ids)
    totals = torch.zeros(len(word_ids), dtype=torch.float64)
    hits = torch.zeros(len(word_ids), dtype=torch.float64)
    count, state = 0, None
    for inputs, targets in batches:
        log_probs, state = model.log_probs(inputs, state)  # (B, T, V)
        mask = targets != IGNORE
        totals += log_probs[mask][:, selected].exp().double().sum(0)
        hits += (targets[mask][:, None] == selected).double().sum(0)
        count += int(mask.sum())
    return {"mean_prob": (totals / count).tolist(), "frequency": (hits / count).tolist()}
