r"""Cache models: the evaluation text read so far adapts the next-word prediction.

Both caches only score the target word, ``p(y_t) = (1 − λ)·p_model(y_t) + λ·p_cache(y_t)``,
which is all perplexity needs, so no (B, T, V) cache distribution is ever built.

They read the (B, T) segments of a :class:`~targetlm.data.batching.StreamBatches` stream.
Each of the B rows is a contiguous piece of the text with its own history, carried from
segment to segment like the encoder state::

    row 0   # a b c | d e f | g h        the cache of row 0 at "e" holds a b c d
    row 1   h i j k | l m n | o .        the cache of row 1 at "m" holds i j k l

With ``batch_size = 1`` a cache sees the whole text before each token. A position whose
cache is still empty (the first target of a row) is predicted by the model alone.
"""

from __future__ import annotations

import torch

from targetlm.data.batching import IGNORE


class UnigramCache:
    """``p_cache(w)`` = count of w among the row's previous targets / their number.

    The unigram cache of Pappas et al. (2020): counts of the evaluation text seen so far.

    Args:
        batch_size: rows B of the stream.
        vocab_size: size of the evaluation vocabulary (ids of the targets).
    """

    def __init__(self, batch_size: int, vocab_size: int, device: torch.device | str = "cpu"):
        self.counts = torch.zeros(batch_size, vocab_size, device=device)  # (B, V)
        self.total = torch.zeros(batch_size, device=device)  # (B,)

    def __call__(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """targets (B, T) -> (p_cache(y_t) (B, T), cache non-empty (B, T)); then remembers them."""
        valid = targets != IGNORE
        safe = targets.clamp_min(0)
        # earlier positions of this segment with the same target: [b, t, s] for s < t
        same = (safe[:, :, None] == safe[:, None, :]) & valid[:, None, :]
        earlier = torch.ones(targets.size(1), targets.size(1), dtype=torch.bool).tril(-1)
        count = self.counts.gather(1, safe) + (same & earlier.to(same.device)).sum(-1)
        seen = self.total[:, None] + (valid.cumsum(1) - valid.long())  # targets before t
        probs = count / seen.clamp_min(1)
        self.counts.scatter_add_(1, safe, valid.float())
        self.total += valid.sum(1)
        return probs, seen > 0


class NeuralCache:
    """Continuous cache of Grave et al. (2017), eq. (2): a window of (vector, next word) pairs.

    ``p_cache(w) ∝ Σ_{i < t, t − i ≤ window, y_i = w} exp(θ · x̂_t · x̂_i)``, with x̂ the vector the
    logit layer scores (the encoder output, projected to the output embedding size).

    Args:
        window: how many previous positions of the row are remembered.
        theta: θ, the inverse temperature of the similarities.
    """

    def __init__(self, window: int, theta: float):
        if window < 1:
            raise ValueError(f"the neural cache window must be >= 1, got {window}")
        self.window = window
        self.theta = theta
        self.keys: torch.Tensor | None = None  # (B, M, d) last M <= window vectors of each row
        self.values: torch.Tensor | None = None  # (B, M) their targets
        self.positions: torch.Tensor | None = None  # (M,) their column in the row
        self.offset = 0  # row column of the next segment's first position

    def __call__(
        self, predicted: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """predicted x̂ (B, T, d), targets (B, T) -> (p_cache(y_t) (B, T), cache non-empty (B, T))."""
        steps = targets.size(1)
        current = torch.arange(self.offset, self.offset + steps, device=targets.device)  # (T,)
        if self.keys is None or self.values is None or self.positions is None:  # set together
            keys, values, positions = predicted, targets, current
        else:
            keys = torch.cat([self.keys, predicted], 1)  # (B, M + T, d)
            values = torch.cat([self.values, targets], 1)
            positions = torch.cat([self.positions, current])
        distance = current[:, None] - positions[None, :]  # (T, M + T)
        allowed = ((distance > 0) & (distance <= self.window))[None] & (values != IGNORE)[:, None]
        scores = self.theta * (predicted.float() @ keys.float().transpose(1, 2))  # (B, T, M + T)
        scores = scores.masked_fill(~allowed, -torch.inf)
        available = allowed.any(-1)  # (B, T)
        weights = torch.softmax(scores.masked_fill(~available[..., None], 0.0), -1)
        match = values[:, None, :] == targets[:, :, None]  # (B, T, M + T)
        probs = (weights * (match & allowed)).sum(-1)
        self.keys = keys[:, -self.window :].detach()
        self.values = values[:, -self.window :]
        self.positions = positions[-self.window :]
        self.offset += steps
        return probs, available


def interpolate(
    probs: torch.Tensor, cache_probs: torch.Tensor, available: torch.Tensor, weight: float
) -> torch.Tensor:
    """``(1 − λ)·p + λ·p_cache`` where the cache has entries, ``p`` where it is empty."""
    mixed = (1 - weight) * probs + weight * cache_probs
    return torch.where(available, mixed, probs)
