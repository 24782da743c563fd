"""Output layers: the logit-layer embeddings ``E_out(V)`` (V, d) and bias ``b(V)`` (V,).

Every objective and combiner works with ``logits = x̂ · E_outᵀ + b``, so an output
layer only has to say what ``E_out`` and ``b`` are. ``forward()`` returns them for
the vocabulary the layer was built with.
"""

from __future__ import annotations

import torch
from torch import nn

from targetlm.registry import Registry

OUTPUT_LAYERS: Registry[nn.Module] = Registry(
    "output layer", context=("vocab_size", "hidden_size", "embedding")
)


class OutputLayer(nn.Module):
    """Base class: ``forward() -> (E_out (V, d), b (V,) or None)``; ``embedding_dim`` is d."""

    embedding_dim: int

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:  # pragma: no cover
        raise NotImplementedError


@OUTPUT_LAYERS.register("lookup")
class LookupOutput(OutputLayer):
    """Untied output embeddings: a free (V, d) matrix, d = the encoder's output size.

    Args:
        bias: learn a bias per word.
        init_range: uniform(-r, r) initialisation; None: N(0, 1/d).
    """

    def __init__(
        self, vocab_size: int, hidden_size: int, bias: bool = True, init_range: float | None = None
    ) -> None:
        super().__init__()
        self.embedding_dim = hidden_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None
        if init_range is None:
            nn.init.normal_(self.weight, std=hidden_size**-0.5)
        else:
            nn.init.uniform_(self.weight, -init_range, init_range)
            if self.bias is not None:
                nn.init.uniform_(self.bias, -init_range, init_range)

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight, self.bias


@OUTPUT_LAYERS.register("tied")
class TiedOutput(OutputLayer):
    """Reused embeddings (Inan et al. 2017; Press & Wolf 2017): ``E_out = E_in``.

    Receives the input embedding module; d is its size (the model adds a projection
    from the encoder's output size when the two differ).
    """

    def __init__(self, embedding: nn.Module, bias: bool = True) -> None:
        super().__init__()
        self.embedding = [embedding]  # a list so the shared weight is owned (and counted) once
        self.embedding_dim = embedding.size
        self.bias = nn.Parameter(torch.zeros(embedding.weight.size(0))) if bias else None

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.embedding[0].table(), self.bias
