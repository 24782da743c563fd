"""Encoders (prefix functions): ``forward(x, state) -> (hidden, state)``.

``x`` is the embedded input (B, T, input_size); ``hidden`` is (B, T, output_size).
Every encoder returns a state that, passed back with the next segment, continues
the same sequence (``None`` starts a new one), so no caller branches on the type.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from targetlm.registry import Registry

ENCODERS: Registry[nn.Module] = Registry("encoder", context=("input_size",))


class LockedDropout(nn.Module):
    """Variational dropout (Gal & Ghahramani 2016): one mask per sequence, shared over time.

    x: (B, T, D). With ``variational=False`` it is ordinary dropout (Zaremba et al.).
    """

    def __init__(self, p: float, variational: bool = True) -> None:
        super().__init__()
        self.p = p
        self.variational = variational

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if not self.variational:
            return F.dropout(x, self.p, True)
        mask = x.new_empty(x.size(0), 1, x.size(2)).bernoulli_(1 - self.p) / (1 - self.p)
        return x * mask


LstmState = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (h, c), each (1, B, H)


@ENCODERS.register("lstm")
class LstmEncoder(nn.Module):
    """Stacked LSTM with the regularisers of Zaremba et al., Gal & Ghahramani and AWD-LSTM.

    Args:
        input_size: embedding size (supplied by the builder).
        hidden_size: units per layer.
        num_layers: layers.
        output_size: units of the last layer (default hidden_size), e.g. the
            embedding size so a tied output needs no projection.
        dropout_input / dropout_hidden / dropout_output: dropout on the encoder input,
            between layers and on the output.
        variational: share the dropout mask across time steps (Gal & Ghahramani, Inan et al.);
            false gives per-step dropout (Zaremba et al.).
        weight_drop: DropConnect on the hidden-to-hidden matrices (Merity et al. 2018),
            resampled each forward; done with ``torch.func.functional_call`` so the
            module's parameters are never replaced.
        init_range: uniform(-r, r) initialisation of all weights (Zaremba: 0.1); None keeps
            PyTorch's default uniform(-1/sqrt(H), 1/sqrt(H)).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 200,
        num_layers: int = 2,
        output_size: int | None = None,
        dropout_input: float = 0.0,
        dropout_hidden: float = 0.0,
        dropout_output: float = 0.0,
        variational: bool = True,
        weight_drop: float = 0.0,
        init_range: float | None = None,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        for name, p in (
            ("dropout_input", dropout_input),
            ("dropout_hidden", dropout_hidden),
            ("dropout_output", dropout_output),
            ("weight_drop", weight_drop),
        ):
            if not 0 <= p < 1:
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        self.output_size = output_size or hidden_size
        sizes = [input_size] + [hidden_size] * (num_layers - 1) + [self.output_size]
        self.layers = nn.ModuleList(
            nn.LSTM(sizes[i], sizes[i + 1], batch_first=True) for i in range(num_layers)
        )
        self.drop_input = LockedDropout(dropout_input, variational)
        self.drop_hidden = LockedDropout(dropout_hidden, variational)
        self.drop_output = LockedDropout(dropout_output, variational)
        self.weight_drop = weight_drop
        if init_range is not None:
            for parameter in self.parameters():
                nn.init.uniform_(parameter, -init_range, init_range)

    def _run_layer(self, layer: nn.LSTM, x: torch.Tensor, hx) -> tuple[torch.Tensor, tuple]:
        if self.training and self.weight_drop > 0:
            dropped = F.dropout(layer.weight_hh_l0, self.weight_drop, True)
            return functional_call(layer, {"weight_hh_l0": dropped}, (x, hx))
        return layer(x, hx)

    def forward(self, x: torch.Tensor, state: LstmState | None = None):
        x = self.drop_input(x)  # (B, T, input_size)
        new_state: LstmState = []
        for i, layer in enumerate(self.layers):
            x, (h, c) = self._run_layer(layer, x, None if state is None else tuple(state[i]))
            new_state.append((h, c))
            if i < len(self.layers) - 1:
                x = self.drop_hidden(x)
        return self.drop_output(x), new_state  # (B, T, output_size)


FEEDFORWARD_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


@ENCODERS.register("transformer")
class TransformerEncoder(nn.Module):
    """Causal Transformer decoder stack (no cross-attention), pre-LN or post-LN.

    The state is the last ``max_context - 1`` inputs (B, P, input_size), detached:
    given a segment of T tokens, each is encoded with the window of the
    ``max_context - T`` previous inputs plus the segment, positions counted from the
    window's start. So a segment of 1 token continues generation, and evaluation
    with segment S scores each token with between ``max_context - S + 1`` and
    ``max_context`` tokens of context (the usual sliding window).

    Args:
        input_size: embedding size (supplied by the builder).
        model_size: width of the residual stream (default input_size; a linear map
            is added when it differs).
        num_layers / num_heads / ff_size: depth, attention heads, feed-forward width.
        dropout: on attention weights, residual branches and the input.
        max_context: the longest window the positions cover.
        positions: ``learned`` or ``sinusoidal`` absolute positions.
        norm: ``pre`` (x + f(LN(x)), a final LayerNorm; GPT-2) or ``post``
            (LN(x + f(x)), no final LayerNorm; Vaswani et al. 2017, fairseq's default).
        activation: of the feed-forward block, ``gelu`` or ``relu`` (Vaswani et al.).
    """

    def __init__(
        self,
        input_size: int,
        model_size: int | None = None,
        num_layers: int = 6,
        num_heads: int = 4,
        ff_size: int = 1024,
        dropout: float = 0.1,
        max_context: int = 512,
        positions: Literal["learned", "sinusoidal"] = "learned",
        norm: Literal["pre", "post"] = "pre",
        activation: Literal["gelu", "relu"] = "gelu",
    ) -> None:
        super().__init__()
        d = model_size or input_size
        if norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
        if activation not in FEEDFORWARD_ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(FEEDFORWARD_ACTIVATIONS)}, got {activation!r}"
            )
        if d % num_heads:
            raise ValueError(f"model_size {d} is not divisible by num_heads {num_heads}")
        self.output_size = d
        self.max_context = max_context
        self.input_map = nn.Linear(input_size, d) if d != input_size else nn.Identity()
        if positions == "learned":
            self.positions = nn.Parameter(torch.randn(max_context, d) * 0.02)
        else:
            self.register_buffer(
                "positions", sinusoidal_positions(max_context, d), persistent=False
            )
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(d, num_heads, ff_size, dropout, norm, activation)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d) if norm == "pre" else nn.Identity()

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None):
        segment = x.size(1)
        if segment > self.max_context:
            raise ValueError(f"segment of {segment} tokens exceeds max_context {self.max_context}")
        if state is not None and state.size(1) > 0:
            keep = self.max_context - segment
            window = torch.cat([state[:, -keep:], x], 1) if keep > 0 else x
        else:
            window = x
        new_state = window[:, -(self.max_context - 1) :].detach() if self.max_context > 1 else None
        length = window.size(1)
        h = self.drop(self.input_map(window) + self.positions[:length])  # (B, L, d)
        for block in self.blocks:
            h = block(h)
        return self.norm(h[:, length - segment :]), new_state  # (B, T, d)


class TransformerBlock(nn.Module):
    """Causal self-attention and feed-forward, through ``scaled_dot_product_attention``.

    ``pre``: x + Attn(LN(x)); x + FF(LN(x)).  ``post``: LN(x + Attn(x)); LN(x + FF(x)).
    """

    def __init__(
        self,
        d: int,
        num_heads: int,
        ff_size: int,
        dropout: float,
        norm: Literal["pre", "post"] = "pre",
        activation: Literal["gelu", "relu"] = "gelu",
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.pre_norm = norm == "pre"
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(
            nn.Linear(d, ff_size), FEEDFORWARD_ACTIVATIONS[activation](), nn.Linear(ff_size, d)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self._attend(self.norm1(x))
            return x + self.drop(self.ff(self.norm2(x)))
        x = self.norm1(x + self._attend(x))
        return self.norm2(x + self.drop(self.ff(x)))

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        """The dropped-out attention branch, (B, T, d) -> (B, T, d)."""
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, d // self.num_heads).unbind(2)
        attention = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),  # (B, heads, T, d/heads)
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.drop(self.proj(attention.transpose(1, 2).reshape(B, T, d)))


def sinusoidal_positions(length: int, d: int) -> torch.Tensor:
    """Vaswani et al. (2017) positions: sin on even, cos on odd dimensions. (length, d)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(length, d)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d // 2])
    return table
