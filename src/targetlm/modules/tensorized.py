"""The Tensorized Transformer (Ma et al. 2019) as an encoder kind: multi-linear attention.

Multi-linear attention replaces the h scaled dot-product heads by block-term tensor
decomposition: the shared factor matrices Q = XW^q, K = XW^k, V = XW^v (each (L, R)) and
one diagonal core per block (g_c, R weights) give the third-order tensor

    T[i, j, k] = (1/C) Σ_c Σ_r g_{c,r} · q_{i,r} · k_{j,r} · v_{k,r}          (L × L × L)

which "split and concat" turns into an (L, L²) matrix, mapped to the model width by W^O
(L², d): the output at i is Σ_{j,k} T[i, j, k] · W^O[(j, k)]. As the authors' released
code (a Transformer-XL derivative) does, the keys also carry position: a second key factor
p_j (a projection of the sinusoidal embedding of key position j) with two learned query
biases u, w, so the factor product is ((q_i + u) ∘ k_j + (q_i + w) ∘ p_j) ∘ v_k; the layers
are post-LN, with a ReLU feed-forward.

Differences from that code, each for the encoder contract: (1) causality: T[i, j, k] is 0
unless j ≤ i and k ≤ i (the released code forms T over the whole segment and never applies
the causal mask it builds, so each output there also reads later tokens); (2) positions are
counted from the window's start (the released code counts from the segment's end, which
only works when every segment has the same length). W^O indexes pairs of positions, so the
window is bounded: ``max_context`` (32 in the PTB run of the released code).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.modules.encoders import ENCODERS, WindowEncoder, sinusoidal_positions
from targetlm.registry import Fraction, Size


class MultiLinearAttention(nn.Module):
    """Causal multi-linear attention over a window of L ≤ ``max_context`` positions.

    Args:
        model_size: d.
        rank: R, columns of the shared factor matrices (the released code's n_head·d_head).
        num_blocks: C, block terms (diagonal cores) averaged; they share the factor matrices.
        max_context: the longest window; W^O has max_context² inputs.
        dropout: on the attention output.
    """

    sinusoids: torch.Tensor  # (max_context, model_size), a buffer

    def __init__(
        self, model_size: int, rank: int, num_blocks: int, max_context: int, dropout: float
    ) -> None:
        super().__init__()
        self.max_context = max_context
        self.factors = nn.Linear(model_size, 3 * rank, bias=False)  # W^q, W^k, W^v
        self.position_factor = nn.Linear(model_size, rank, bias=False)  # keys' positions
        self.content_bias = nn.Parameter(torch.zeros(rank))  # u
        self.position_bias = nn.Parameter(torch.zeros(rank))  # w
        # the diagonal cores, positive and summing to 1 per block (as the released code's)
        self.cores = nn.Parameter(torch.full((num_blocks, rank), 1.0 / rank))
        self.merge = nn.Linear(max_context * max_context, model_size, bias=False)  # W^O
        self.register_buffer(
            "sinusoids", sinusoidal_positions(max_context, model_size), persistent=False
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, L, d) -> (B, L, d); output i reads positions ≤ i only."""
        length = x.size(1)
        q, k, v = self.factors(x).chunk(3, -1)  # each (B, L, R)
        p = self.position_factor(self.sinusoids[:length])  # (L, R)
        core = self.cores.mean(0)  # (R,): the blocks share the factors, so their mean core
        content = (q + self.content_bias) * core  # (B, L, R)
        position = (q + self.position_bias) * core
        # the key factors of every (i, j) pair, then the product with v over r: T (B, L, L, L)
        pairs = content[:, :, None, :] * k[:, None, :, :] + position[:, :, None, :] * p  # (B,L,L,R)
        tensor = torch.matmul(pairs.flatten(1, 2), v.transpose(1, 2)).view(
            -1, length, length, length
        )
        index = torch.arange(length, device=x.device)
        visible = index[None, :] <= index[:, None]  # (L, L): j ≤ i
        mask = visible[:, :, None] & visible[:, None, :]  # (L, L, L): j ≤ i and k ≤ i
        tensor = tensor * mask
        weight = self.merge.weight.view(-1, self.max_context, self.max_context)[:, :length, :length]
        merged = F.linear(tensor.flatten(2), weight.reshape(weight.size(0), -1))  # (B, L, d)
        return self.drop(merged)


class TensorizedLayer(nn.Module):
    """Post-LN layer: LN(x + MultiLinear(x)), then LN(h + FF(h)) with a ReLU feed-forward."""

    def __init__(
        self,
        model_size: int,
        rank: int,
        num_blocks: int,
        ff_size: int,
        max_context: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.attention = MultiLinearAttention(model_size, rank, num_blocks, max_context, dropout)
        self.norm1 = nn.LayerNorm(model_size)
        self.ff = nn.Sequential(
            nn.Linear(model_size, ff_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(ff_size, model_size),
            nn.Dropout(dropout),
        )
        self.norm2 = nn.LayerNorm(model_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, d) -> (B, L, d)."""
        h = self.norm1(x + self.attention(x))
        return self.norm2(h + self.ff(h))


@ENCODERS.register("tensorized_transformer")
class TensorizedTransformer(WindowEncoder):
    """Tensorized Transformer decoder stack (Ma et al. 2019), causal.

    The defaults are the released code's PTB run with Heo et al.'s (2024) Table 5 change
    (3 layers): width 256, rank 40 (1 head of 40), one block term, feed-forward 2100,
    dropout 0.3, windows of 32 tokens.

    The state is the last ``max_context - 1`` inputs (B, P, input_size), detached; a segment
    is encoded with the window of the previous inputs before it, positions counted from the
    window's start (as :class:`~targetlm.modules.encoders.CausalTransformer` does).

    Args:
        input_size: embedding size (supplied by the builder); a linear map is added when
            ``model_size`` differs.
        model_size: d.
        num_layers: depth.
        rank: R, the width of the shared factor matrices.
        num_blocks: block terms (cores) per layer.
        ff_size: feed-forward width.
        dropout: on the input, the attention output, inside and after the feed-forward and
            on the encoder's output.
        max_context: the window (W^O has max_context² inputs per layer).
    """

    def __init__(
        self,
        input_size: int,
        model_size: Size | None = None,
        num_layers: Size = 3,
        rank: Size = 40,
        num_blocks: Size = 1,
        ff_size: Size = 2100,
        dropout: Fraction = 0.3,
        max_context: Size = 32,
    ) -> None:
        super().__init__()
        d = model_size or input_size
        self.output_size = d
        self.max_context = max_context
        self.input_map = nn.Linear(input_size, d) if d != input_size else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TensorizedLayer(d, rank, num_blocks, ff_size, max_context, dropout)
            for _ in range(num_layers)
        )

    def _encode(self, window: torch.Tensor, segment: int) -> torch.Tensor:
        """window (B, L, input_size) -> hidden (B, segment, d) of its last positions."""
        h = self.drop(self.input_map(window))  # (B, L, d)
        for layer in self.layers:
            h = layer(h)
        return self.drop(h[:, -segment:])
