"""Input embeddings: token ids (B, T) -> vectors (B, T, size)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.registry import Fraction, Positive, Registry, Size

# builders supply the vocabulary size, its word strings and (for GroC) its lexicon
INPUT_EMBEDDINGS: Registry[nn.Module] = Registry(
    "input embedding", context=("vocab_size", "words", "lexicon")
)


@INPUT_EMBEDDINGS.register("lookup")
class LookupEmbedding(nn.Module):
    """A lookup table.

    Args:
        vocab_size: rows (supplied by the builder).
        size: embedding dimension.
        dropout: embedding dropout (Gal & Ghahramani 2016): drops whole word types,
            the same types at every position of the batch, in training.
        init_range: uniform(-r, r) initialisation; None gives N(0, init_std²).
        init_std: the standard deviation of the normal initialisation (default 1, PyTorch's;
            fairseq's Transformers use size^−½ with their √size input scaling).
        unit_norm: constrain every row to unit L2 norm (Inan et al.'s subspace analysis);
            the rows are normalised in the forward pass, so the constraint holds exactly.
    """

    def __init__(
        self,
        vocab_size: int,
        size: Size = 200,
        dropout: Fraction = 0.0,
        init_range: Positive | None = None,
        unit_norm: bool = False,
        init_std: Positive = 1.0,
    ) -> None:
        super().__init__()
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.size = size
        self.dropout = dropout
        self.unit_norm = unit_norm
        self.weight = nn.Parameter(torch.empty(vocab_size, size))
        if init_range is None:
            nn.init.normal_(self.weight, std=init_std)
        else:
            nn.init.uniform_(self.weight, -init_range, init_range)

    def table(self) -> torch.Tensor:
        """The effective (V, size) table: the weight, row-normalised when ``unit_norm``."""
        return F.normalize(self.weight, dim=1) if self.unit_norm else self.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        weight = self.table()
        if self.training and self.dropout > 0:
            keep = weight.new_empty(weight.size(0), 1).bernoulli_(1 - self.dropout)
            weight = weight * keep / (1 - self.dropout)
        return F.embedding(tokens, weight)  # (B, T, size)
