"""A bidirectional Transformer encoder in the style of CrammedBERT (Geiping & Goldstein 2023).

Every position attends to every other real position of its sequence (no causal mask), so it
reads the right context too: it serves the masked-LM and sequence-classification tasks
(``causal = False``), never a causal language model. CrammedBERT's choices, from its
``arch/crammed-bert.yaml`` (github.com/JonasGeiping/cramming)::

    x = LN(E[tokens] + scaled sinusoidal positions)     embedding LayerNorm ("normalization")
    x = x + Attn(LN(x))                                 pre-LN; Q, K, V and output without bias
    x = x + FF(LN(x))                                   FF: gated GELU, no biases (GELUglu)
    h = LN(x)                                           final LayerNorm ("final_norm")

The input embedding (a lookup table) and the tied output layer without a bias (the yaml's
``tie_weights`` and ``decoder_bias = False``) are the model's other components; with
``model_size`` equal to the embedding size no transform sits before the logit layer
(``skip_head_transform``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.modules.encoders import ENCODERS, Encoder, sinusoidal_positions
from targetlm.registry import Fraction, Positive, Size


class GatedGeluFeedForward(nn.Module):
    """CrammedBERT's ``GELUglu`` feed-forward without biases: ``W_o (GELU(a) ⊙ b)`` with
    ``[a; b] = W_i x``. ``ff_size`` is W_i's output width (the yaml's ``intermed_size``), so
    the gated width is ``ff_size / 2``. (B, T, d) -> (B, T, d)."""

    def __init__(self, d: int, ff_size: int) -> None:
        super().__init__()
        if ff_size % 2:
            raise ValueError(
                f"ff_size must be even (it is split into a gate and a value), got {ff_size}"
            )
        self.inner = nn.Linear(d, ff_size, bias=False)
        self.outer = nn.Linear(ff_size // 2, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.inner(x).chunk(2, -1)
        return self.outer(F.gelu(gate) * value)


class BidirectionalBlock(nn.Module):
    """Pre-LN block ``x + Attn(LN(x))``, ``x + FF(LN(x))``; attention over the real keys of the
    row (``key_mask``), no bias in any linear map."""

    def __init__(self, d: int, num_heads: int, ff_size: int, dropout: float, eps: float) -> None:
        super().__init__()
        self.num_heads, self.dropout = num_heads, dropout
        self.norm1 = nn.LayerNorm(d, eps=eps)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.norm2 = nn.LayerNorm(d, eps=eps)
        self.ff = GatedGeluFeedForward(d, ff_size)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """x (B, T, d); key_mask (B, 1, 1, T) bool, True at keys to attend to, or None (all)."""
        B, T, d = x.shape
        q, k, v = (
            y.transpose(1, 2)  # (B, heads, T, d/heads)
            for y in self.qkv(self.norm1(x)).view(B, T, 3, self.num_heads, -1).unbind(2)
        )
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=key_mask, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.drop(self.proj(attended.transpose(1, 2).reshape(B, T, d)))
        return x + self.drop(self.ff(self.norm2(x)))


@ENCODERS.register("crammed_bert")
class CrammedBertEncoder(Encoder):
    """Bidirectional pre-LN Transformer encoder (CrammedBERT; Geiping & Goldstein 2023).

    ``forward(x, state)``: x (B, T, input_size) -> hidden (B, T, model_size). A bidirectional
    encoder carries no stream state; ``state`` is what it reads besides x: None (every column
    is real) or a (B, T) bool mask, True at real tokens, so padded columns are never attended
    to (a row's outputs are those of the row alone). The returned state is None.

    Args:
        input_size: embedding size (supplied by the builder).
        model_size: width of the residual stream (default input_size; a linear map without
            bias is added when it differs).
        num_layers / num_heads: depth and attention heads (CrammedBERT: 16 and 12 at 768).
        ff_size: the feed-forward's inner width before the GELU gate halves it (3072).
        dropout: on attention weights, residual branches and the embedding (0.1; CrammedBERT
            pretrains with dropout off and finetunes with it on).
        max_context: the longest sequence (CrammedBERT: 128).
        norm_eps: the LayerNorms' epsilon (1e-12).
        init_std: N(0, std²) initialisation of every linear map (0.02).
    """

    causal = False
    positions: torch.Tensor  # (max_context, d) sinusoidal positions, a buffer

    def __init__(
        self,
        input_size: int,
        model_size: Size | None = None,
        num_layers: Size = 16,
        num_heads: Size = 12,
        ff_size: Size = 3072,
        dropout: Fraction = 0.1,
        max_context: Size = 128,
        norm_eps: Positive = 1e-12,
        init_std: Positive = 0.02,
    ) -> None:
        super().__init__()
        d = model_size or input_size
        if d % num_heads:
            raise ValueError(f"model_size {d} is not divisible by num_heads {num_heads}")
        self.output_size = d
        self.max_context = max_context
        self.input_map = nn.Linear(input_size, d, bias=False) if d != input_size else nn.Identity()
        self.register_buffer("positions", sinusoidal_positions(max_context, d), persistent=False)
        # scaled sinusoidal positions: one learned scale, starting at d^-1/2
        self.position_scale = nn.Parameter(torch.tensor(1.0 / math.sqrt(d)))
        self.embedding_norm = nn.LayerNorm(d, eps=norm_eps)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            BidirectionalBlock(d, num_heads, ff_size, dropout, norm_eps) for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d, eps=norm_eps)
        for module in self.modules():  # (a meta tensor, built to check options, has no values)
            if isinstance(module, nn.Linear) and not module.weight.is_meta:
                nn.init.normal_(module.weight, std=init_std)

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, None]:
        length = x.size(1)
        self._check_length(length, "a sequence")
        h = self.input_map(x) + self.position_scale * self.positions[:length]
        h = self.drop(self.embedding_norm(h))  # (B, T, d)
        key_mask = None if state is None else state.bool()[:, None, None, :]  # (B, 1, 1, T)
        for block in self.blocks:
            h = block(h, key_mask)
        return self.final_norm(h), None
