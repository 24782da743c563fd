"""The encoder–decoder Transformer (Vaswani et al. 2017) as an encoder of the pipeline.

The translation model is the same :class:`~targetlm.modules.model.LanguageModel` as every LM:
its input embedding reads the target prefix, this module's decoder turns it into h_t, and x̂_t
goes through the run's output layer, heads, objectives and combiners unchanged. What makes
it conditional is the *state*: :meth:`TransformerSeq2Seq.start` encodes the source once
into a :class:`DecoderState` (the memory, its padding mask and, while decoding, the KV
cache), and ``forward(x, state)`` continues the target prefix that state describes, so
training (the whole prefix at once), greedy and beam search (one token at a time, the
cache carried) use the ``forward(x, state) -> (h, state)`` contract of every encoder::

    source ids ──► embedding ──► start(): encoder stack ──► DecoderState(memory, mask)
    target prefix ──► embedding ──► forward(x, state): decoder stack ──► h ──► x̂ ──► logits

The source and the target share the input embedding (one joint subword vocabulary), as
the decoder's input embedding is tied to the output layer (``model.output.kind = "tied"``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.modules.encoders import (
    ENCODERS,
    FEEDFORWARD_ACTIVATIONS,
    Encoder,
    add_positions,
    check_block_options,
)
from targetlm.registry import Fraction, Size

KeyValue = tuple[torch.Tensor, torch.Tensor]  # (B, heads, L, d/heads) each


@dataclass(frozen=True)
class DecoderState:
    """What the decoder continues: the encoded source and the target prefix read so far.

    memory: (B, S, d) the encoder's output. memory_mask: (B, S) bool, True at real source
    tokens. length: target tokens already read (the positions of the next ones). self_kv:
    per decoder layer the keys and values of those tokens (None: nothing read yet, or the
    cache is off). memory_kv: per layer the cross-attention keys and values of the memory
    (computed once, on the first step).
    """

    memory: torch.Tensor
    memory_mask: torch.Tensor
    length: int = 0
    self_kv: tuple[KeyValue, ...] | None = None
    memory_kv: tuple[KeyValue, ...] | None = None

    def select(self, index: torch.Tensor) -> DecoderState:
        """The state of batch rows ``index``: :meth:`select_source` and :meth:`select_prefix`."""
        return self.select_source(index).select_prefix(index)

    def select_source(self, index: torch.Tensor) -> DecoderState:
        """The source side (memory, mask, memory keys/values) of rows ``index``; the prefix's
        cache is left as it is (beam search moves it with :meth:`select_prefix`)."""
        return DecoderState(
            self.memory.index_select(0, index),
            self.memory_mask.index_select(0, index),
            self.length,
            self.self_kv,
            _pick(self.memory_kv, index),
        )

    def select_prefix(self, index: torch.Tensor) -> DecoderState:
        """The prefix's keys/values of rows ``index`` (beams reordered within their sentences
        read the same source, so only this moves)."""
        return replace(self, self_kv=_pick(self.self_kv, index))


def _pick(pairs: tuple[KeyValue, ...] | None, index: torch.Tensor) -> tuple[KeyValue, ...] | None:
    if pairs is None:
        return None
    return tuple((k.index_select(0, index), v.index_select(0, index)) for k, v in pairs)


class Attention(nn.Module):
    """Multi-head attention through ``scaled_dot_product_attention``: one (3d × d) input
    projection for queries, keys and values (``nn.MultiheadAttention``'s layout), used whole
    for self-attention (one matmul) and split for cross-attention (keys/values of the memory
    computed once); keys/values may be carried (the decoder's cache)."""

    def __init__(self, d: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        if d % num_heads:
            raise ValueError(f"model_size {d} is not divisible by num_heads {num_heads}")
        self.num_heads, self.dropout, self.d = num_heads, dropout, d
        self.in_proj = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, d) -> (B, heads, L, d/heads)."""
        B, L, d = x.shape
        return x.view(B, L, self.num_heads, d // self.num_heads).transpose(1, 2)

    def keys_values(self, x: torch.Tensor) -> KeyValue:
        """Keys and values of x (B, L, d), each (B, heads, L, d/heads)."""
        d = self.d
        k, v = F.linear(x, self.in_proj.weight[d:], self.in_proj.bias[d:]).chunk(2, -1)
        return self.split(k), self.split(v)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        d = self.d
        return self.split(F.linear(x, self.in_proj.weight[:d], self.in_proj.bias[:d]))

    def self_attend(
        self,
        x: torch.Tensor,
        past: KeyValue | None = None,
        *,
        causal: bool = True,
        key_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KeyValue]:
        """Self-attention of x (B, T, d) after the carried keys/values ``past`` (causal: each
        query sees the keys up to its own position): the output and all keys/values (past + x's)."""
        q, k, v = (self.split(y) for y in self.in_proj(x).chunk(3, -1))
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        return self.attend(q, (k, v), causal=causal, key_mask=key_mask), (k, v)

    def forward(
        self, x: torch.Tensor, kv: KeyValue, key_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Cross-attention: x (B, T, d) attends to the keys/values ``kv`` (B, heads, L, d/heads)
        of another sequence; key_mask (B, L): True = attend."""
        return self.attend(self.queries(x), kv, key_mask=key_mask)

    def attend(
        self,
        q: torch.Tensor,
        kv: KeyValue,
        *,
        causal: bool = False,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Queries q (B, heads, T, d/heads) attend to keys/values (B, heads, L, d/heads); causal:
        query t (the last T of the L positions) sees keys up to its own position; key_mask
        (B, L): True = attend."""
        B, _, T, _ = q.shape
        k, v = kv
        mask = None
        if key_mask is not None:
            mask = key_mask[:, None, None, :]  # (B, 1, 1, L)
        if causal and T > 1:
            L = k.size(2)
            allowed = torch.ones(T, L, dtype=torch.bool, device=q.device).tril(L - T)
            mask = allowed if mask is None else mask & allowed
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(out.transpose(1, 2).reshape(B, T, self.d))


class _Block(nn.Module):
    """Residual sublayers, pre-LN (x + f(LN(x))) or post-LN (LN(x + f(x)))."""

    def __init__(
        self, d: int, ff_size: int, dropout: float, norm: str, activation: str, sublayers: int
    ) -> None:
        super().__init__()
        self.pre_norm = norm == "pre"
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(sublayers))
        self.ff = nn.Sequential(
            nn.Linear(d, ff_size), FEEDFORWARD_ACTIVATIONS[activation](), nn.Linear(ff_size, d)
        )
        self.drop = nn.Dropout(dropout)

    def residual(self, i: int, x: torch.Tensor, f) -> torch.Tensor:
        if self.pre_norm:
            return x + self.drop(f(self.norms[i](x)))
        return self.norms[i](x + self.drop(f(x)))


class EncoderLayer(_Block):
    def __init__(self, d, num_heads, ff_size, dropout, attention_dropout, norm, activation):
        super().__init__(d, ff_size, dropout, norm, activation, sublayers=2)
        self.attention = Attention(d, num_heads, attention_dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.residual(
            0, x, lambda y: self.attention.self_attend(y, causal=False, key_mask=mask)[0]
        )
        return self.residual(1, x, self.ff)


class DecoderLayer(_Block):
    def __init__(self, d, num_heads, ff_size, dropout, attention_dropout, norm, activation):
        super().__init__(d, ff_size, dropout, norm, activation, sublayers=3)
        self.self_attention = Attention(d, num_heads, attention_dropout)
        self.cross_attention = Attention(d, num_heads, attention_dropout)

    def forward(
        self,
        x: torch.Tensor,
        past: KeyValue | None,
        memory_kv: KeyValue,
        memory_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, KeyValue]:
        """x (B, T, d), the keys/values of the earlier positions -> (B, T, d), all keys/values."""
        kv: KeyValue = (torch.empty(0), torch.empty(0))

        def attend(y: torch.Tensor) -> torch.Tensor:
            nonlocal kv
            out, kv = self.self_attention.self_attend(y, past)
            return out

        x = self.residual(0, x, attend)
        x = self.residual(1, x, lambda y: self.cross_attention(y, memory_kv, key_mask=memory_mask))
        return self.residual(2, x, self.ff), kv


def check_stack_options(
    norm: str, activation: str, positions: str, encoder_layers: int, decoder_layers: int
) -> None:
    """The options an encoder–decoder stack's constructor checks (ValueError naming the first)."""
    check_block_options(norm, activation)
    if positions not in ("learned", "sinusoidal"):
        raise ValueError(f"positions must be 'learned' or 'sinusoidal', got {positions!r}")
    if min(encoder_layers, decoder_layers) < 1:
        raise ValueError("encoder_layers and decoder_layers must be >= 1")


class LayerOptions(NamedTuple):
    """What every layer of an encoder–decoder's two stacks is built with, after the width d."""

    num_heads: int
    ff_size: int
    dropout: float
    attention_dropout: float
    norm: str
    activation: str


class SourceConditioned(Encoder):
    """Base of the encoders that read a source besides the stream: the embedded source (scaled,
    mapped to the model width d, positioned) through a stack of :class:`EncoderLayer` is the
    memory that every layer of a decoder stack cross-attends to (``cross_attention``)."""

    conditional = True  # needs a source: forward's state comes from start()
    max_context: int  # bounded: the positions' tables have max_context rows
    drop: nn.Dropout
    encoder_layers: nn.ModuleList
    decoder_layers: nn.ModuleList

    def __init__(self, input_size: int, d: int, max_context: int, scale_embedding: bool) -> None:
        super().__init__()
        self.output_size, self.max_context = d, max_context
        self.scale = math.sqrt(input_size) if scale_embedding else 1.0
        self.source_map = nn.Linear(input_size, d) if d != input_size else nn.Identity()

    def _build_stacks(
        self,
        d: int,
        layer: LayerOptions,
        encoder_layers: int,
        decoder_layers: int,
        decoder_layer: type[DecoderLayer],
    ) -> None:
        """The two stacks of ``layer``'s layers, and each stack's final LayerNorm when pre-LN."""
        self.encoder_layers = nn.ModuleList(EncoderLayer(d, *layer) for _ in range(encoder_layers))
        self.decoder_layers = nn.ModuleList(decoder_layer(d, *layer) for _ in range(decoder_layers))
        self.encoder_norm = nn.LayerNorm(d) if layer.norm == "pre" else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if layer.norm == "pre" else nn.Identity()

    def _encode_source(
        self, source: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The memory (B, S, d) of the embedded source (B, S, input_size), mask (B, S) True at
        real tokens, ``positions`` the source's table."""
        S = source.size(1)
        self._check_length(S, "a source")
        h = self.drop(self.source_map(source * self.scale) + positions[:S])
        for layer in self.encoder_layers:
            h = layer(h, mask)
        return self.encoder_norm(h)

    def _memory_keys_values(self, memory: torch.Tensor) -> tuple[KeyValue, ...]:
        """Every decoder layer's cross-attention keys and values of ``memory`` (B, S, d)."""
        layers = cast("Iterable[DecoderLayer]", self.decoder_layers)  # their cross_attention
        return tuple(layer.cross_attention.keys_values(memory) for layer in layers)


@ENCODERS.register("transformer_seq2seq")
class TransformerSeq2Seq(SourceConditioned):
    """Encoder–decoder Transformer: a bidirectional encoder over the source, a causal decoder
    with cross-attention over it (fairseq's ``transformer``; Heo et al.'s Small Enc-Dec TF is
    d 512, ff 1024, 6 + 6 layers, 4 heads, post-LN).

    Needs a :class:`DecoderState` from :meth:`start` (the ``translation`` task makes it);
    ``forward(x, None)`` is an error. The decoder keeps keys and values in the returned state
    (``cache=True`` in :meth:`start`) so decoding one token at a time costs one position.

    Args:
        input_size: the embedding size (supplied by the builder).
        model_size: the residual width (default input_size; linear maps otherwise).
        encoder_layers / decoder_layers / num_heads / ff_size: the stacks' shape.
        dropout: on residual branches and the (scaled, positioned) inputs.
        attention_dropout: on attention weights (fairseq's default 0).
        max_context: the longest source or target the positions cover.
        positions: ``sinusoidal`` (Vaswani et al., fairseq) or ``learned``.
        norm: ``post`` (Vaswani et al., fairseq's default, Heo et al.'s fairseq models) or
            ``pre`` (a final LayerNorm on both stacks).
        activation: the feed-forward activation, ``relu`` (Vaswani et al.) or ``gelu``.
        scale_embedding: multiply the embedded tokens by √d (Vaswani et al., fairseq).
    """

    positions: torch.Tensor  # (max_context, d): a parameter (learned) or a buffer (sinusoidal)

    def __init__(
        self,
        input_size: int,
        model_size: Size | None = None,
        encoder_layers: Size = 6,
        decoder_layers: Size = 6,
        num_heads: Size = 4,
        ff_size: Size = 1024,
        dropout: Fraction = 0.3,
        attention_dropout: Fraction = 0.0,
        max_context: Size = 256,
        positions: Literal["learned", "sinusoidal"] = "sinusoidal",
        norm: Literal["pre", "post"] = "post",
        activation: Literal["gelu", "relu"] = "relu",
        scale_embedding: bool = True,
    ) -> None:
        d = model_size or input_size
        check_stack_options(norm, activation, positions, encoder_layers, decoder_layers)
        super().__init__(input_size, d, max_context, scale_embedding)
        self.target_map = nn.Linear(input_size, d) if d != input_size else nn.Identity()
        add_positions(self, "positions", positions, max_context, d)
        self.drop = nn.Dropout(dropout)
        layer = LayerOptions(num_heads, ff_size, dropout, attention_dropout, norm, activation)
        self._build_stacks(d, layer, encoder_layers, decoder_layers, DecoderLayer)

    def start(
        self, source: torch.Tensor, mask: torch.Tensor, *, cache: bool = False
    ) -> DecoderState:
        """Encode the embedded source (B, S, input_size) with mask (B, S) (True = a real
        token): the state a target prefix starts from. ``cache``: keep keys/values while
        decoding (one token per call)."""
        state = DecoderState(self._encode_source(source, mask, self.positions), mask)
        if cache:
            state = replace(state, self_kv=(), memory_kv=self._memory_keys_values(state.memory))
        return state

    def forward(
        self, x: torch.Tensor, state: DecoderState | None = None
    ) -> tuple[torch.Tensor, DecoderState]:
        """The embedded target prefix x (B, T, input_size), continuing ``state`` -> h (B, T, d)
        and the state after it (its cache grown by T positions when the cache is on)."""
        if not isinstance(state, DecoderState):
            raise ValueError(
                "the transformer_seq2seq encoder needs a source: its state comes from start() "
                "(use task.kind = 'translation')"
            )
        T, start = x.size(1), state.length
        self._check_length(start + T, "a target prefix")
        h = self.drop(self.target_map(x * self.scale) + self.positions[start : start + T])
        cached = state.self_kv is not None
        memory_kv = state.memory_kv or self._memory_keys_values(state.memory)
        new_kv = []
        for i, layer in enumerate(self.decoder_layers):
            past = state.self_kv[i] if cached and state.self_kv else None
            h, kv = layer(h, past, memory_kv[i], state.memory_mask)
            new_kv.append(kv)
        new_state = DecoderState(
            state.memory,
            state.memory_mask,
            start + T,
            tuple(new_kv) if cached else None,
            state.memory_kv,
        )
        return self.decoder_norm(h), new_state
