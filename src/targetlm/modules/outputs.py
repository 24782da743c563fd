"""Output layers: the logit-layer embeddings ``E_out(V)`` (V, d) and bias ``b(V)`` (V,).

Every objective and combiner works with ``logits = x̂ · E_outᵀ + b``, so an output
layer only has to say what ``E_out`` and ``b`` are. ``forward()`` returns them for
the vocabulary the layer was built with; compositional layers (``char_cnn``, ``groc``
in :mod:`targetlm.modules.groc_output`) also embed any list of strings with
``embed_words(words)``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.modules.interfaces import EmbeddingTable
from targetlm.registry import MAX_VOCAB, Count, Fraction, Positive, Range, Registry

# builders supply: the vocabulary size and its word strings, the encoder's output size,
# the built input embedding, and (for GroC) the lexicon of the vocabulary
OUTPUT_LAYERS: Registry[OutputLayer] = Registry(
    "output layer", context=("vocab_size", "words", "hidden_size", "embedding", "lexicon")
)


class OutputLayer(nn.Module):
    """Base class: ``forward() -> (E_out (V, d), b (V,) or None)``; ``embedding_dim`` is d.

    ``may_leave_parameters_unused``: a training step may leave some of its parameters without
    a gradient (data-parallel training then searches each step's graph for them).
    """

    embedding_dim: int
    may_leave_parameters_unused: bool = False

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
        self,
        vocab_size: int,
        hidden_size: int,
        bias: bool = True,
        init_range: Positive | None = None,
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

    Receives the input embedding module, any kind with a ``table()`` (V, d) (a lookup table
    or the composed GroC input table); d is its size (the model adds a projection from the
    encoder's output size when the two differ).
    """

    def __init__(self, embedding: nn.Module, vocab_size: int, bias: bool = True) -> None:
        super().__init__()
        if not isinstance(embedding, EmbeddingTable):
            raise ValueError(f"cannot tie to a {type(embedding).__name__}: it has no table()")
        self.embedding = [embedding]  # a list so the shared weight is owned (and counted) once
        self.embedding_dim = embedding.size
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.embedding[0].table(), self.bias


@OUTPUT_LAYERS.register("bilinear")
class BilinearOutput(OutputLayer):
    """Bilinear mapping of the input embeddings (Gulordava et al. 2018): ``E_out = E_in · W``.

    E_in (V, e) is the input embedding's table, W (e, d) with d = the encoder's output size.

    Args:
        bias: learn a bias per word.
    """

    def __init__(
        self, vocab_size: int, embedding: EmbeddingTable, hidden_size: int, bias: bool = True
    ) -> None:
        super().__init__()
        self.embedding = [embedding]  # a list: the shared table is owned (and counted) once
        self.embedding_dim = hidden_size
        self.weight = nn.Parameter(torch.empty(embedding.size, hidden_size))
        nn.init.normal_(self.weight, std=embedding.size**-0.5)
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.embedding[0].table() @ self.weight, self.bias  # (V, e) @ (e, d)


ACTIVATIONS = {"relu": torch.relu, "selu": F.selu, "tanh": torch.tanh}


def variational_dropout(embeddings: torch.Tensor, p: float) -> torch.Tensor:
    """Drop the same coordinates of every row (one mask over d): (V, d) -> (V, d)."""
    mask = embeddings.new_empty(1, embeddings.size(1)).bernoulli_(1 - p)
    return embeddings * mask / (1 - p)


class ResidualNetwork(nn.Module):
    """Deep residual output network (Pappas & Henderson 2019):
    ``E^(j) = g_j(E^(j−1)) + E^(0)``, ``g_j(E) = act(drop(E) · U_j + b_j)``, j = 1..depth.

    The dropout is variational over the words: one mask over the d dimensions, shared by
    every row, so each word's embedding loses the same coordinates. Depth 0 is the identity.

    Args:
        size: d. depth: k. activation: relu | selu | tanh. dropout: drop probability.
    """

    def __init__(
        self,
        size: int,
        depth: Count = 2,
        activation: Literal["relu", "selu", "tanh"] = "relu",
        dropout: Fraction = 0.0,
    ) -> None:
        super().__init__()
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.layers = nn.ModuleList(nn.Linear(size, size) for _ in range(depth))
        self.activation = ACTIVATIONS[activation]
        self.dropout = dropout

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """embeddings E^(0) (N, d) -> E^(depth) (N, d)."""
        hidden = embeddings
        for layer in self.layers:
            if self.training and self.dropout > 0:
                hidden = variational_dropout(hidden, self.dropout)  # same mask for every word
            hidden = self.activation(layer(hidden)) + embeddings
        return hidden


@OUTPUT_LAYERS.register("deep_residual")
class DeepResidualOutput(OutputLayer):
    """Deep residual output layer (Pappas & Henderson 2019): a :class:`ResidualNetwork` over
    the input embeddings, ``E_out = E^(k)`` with ``E^(0) = E_in``; d = the embedding size.

    Args:
        depth / activation / dropout: the residual network's (depth 0 gives ``E_out = E_in``).
        bias: learn a bias per word.
    """

    def __init__(
        self,
        vocab_size: int,
        embedding: EmbeddingTable,
        depth: Count = 2,
        activation: Literal["relu", "selu", "tanh"] = "relu",
        dropout: Fraction = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.embedding = [embedding]
        self.embedding_dim = embedding.size
        self.network = ResidualNetwork(embedding.size, depth, activation, dropout)
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.network(self.embedding[0].table()), self.bias


@OUTPUT_LAYERS.register("adaptive")
class AdaptiveOutput(OutputLayer):
    """Adaptive embeddings (Baevski & Auli 2019) as the output matrix.

    The ids are frequency-ranked, so ``cutoffs`` split them into bins: bin i holds ids
    ``[c_{i-1}, c_i)`` with its own table of dimension ``d / factor**i`` and a projection
    to d (d = the encoder's output size): frequent words get more capacity.
    ``E_out = cat_i(T_i · P_i)``. Cutoffs at or past the vocabulary size are ignored.

    Args:
        cutoffs: bin boundaries (increasing). factor: dimension shrink per bin.
        bias: learn a bias per word.
        dropout: variational dropout on E_out in training (one mask over d shared by every
            word; Pappas et al. 2020 §4.1 "variational dropout to all output embeddings").
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        cutoffs: tuple[Annotated[int, Range(1, MAX_VOCAB)], ...] = (2000, 10000),
        factor: Annotated[float, Range(1)] = 4.0,
        bias: bool = True,
        dropout: Fraction = 0.0,
    ) -> None:
        super().__init__()
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.dropout = dropout
        if list(cutoffs) != sorted(set(cutoffs)) or (cutoffs and cutoffs[0] < 1):
            raise ValueError(f"cutoffs must be positive and increasing, got {list(cutoffs)}")
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        self.embedding_dim = hidden_size
        edges = [0, *(c for c in cutoffs if c < vocab_size), vocab_size]
        self.bins = list(zip(edges[:-1], edges[1:]))
        self.tables = nn.ParameterList()
        self.projections = nn.ModuleList()
        for i, (start, end) in enumerate(self.bins):
            size = max(1, int(hidden_size // factor**i))
            self.tables.append(nn.Parameter(torch.randn(end - start, size) * size**-0.5))
            self.projections.append(
                nn.Linear(size, hidden_size, bias=False) if i else nn.Identity()
            )
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        parts = [project(table) for table, project in zip(self.tables, self.projections)]
        weight = torch.cat(parts)  # (V, d): bin i's rows (n_i, d_i) -> (n_i, d)
        if self.training and self.dropout > 0:
            weight = variational_dropout(weight, self.dropout)
        return weight, self.bias
