"""Encoders (prefix functions): ``forward(x, state) -> (hidden, state)``.

``x`` is the embedded input (B, T, input_size); ``hidden`` is (B, T, output_size).
Every encoder returns a state that, passed back with the next segment, continues
the same sequence (``None`` starts a new one), so no caller branches on the type.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from targetlm.modules import kv_cache as kv_states
from targetlm.modules.kv_cache import (
    KeyValue,
    RaggedState,
    TransformerState,
    split_state,
    write_columns,
)
from targetlm.registry import Fraction, Positive, Registry, Size

ENCODERS: Registry[Encoder] = Registry("encoder", context=("input_size",))


class Encoder(nn.Module):
    """Base of every registered encoder: ``forward(x, state) -> (hidden, state)``.

    ``x`` (B, T, input_size) -> ``hidden`` (B, T, output_size). Declared capabilities:

    Attributes:
        output_size: width of ``hidden``.
        max_context: the longest window of tokens the encoder sees (a segment may not be
            longer); ``None`` when unbounded (a recurrent state carries the whole past).
        conditional: True when the encoder reads a source besides the stream (an
            encoder–decoder: its state comes from ``start``, made by the translation task),
            so it cannot run a plain language model.
        denoiser: True for a diffusion denoiser (it reads noised target embeddings, and
            trains with the diffusion task only).
        causal: True when output t reads inputs 0..t only (what language modelling and the
            N-gram ensemble need); False for an encoder that reads the whole sequence (a
            bidirectional masked-LM encoder, a diffusion denoiser), which only a task that
            declares ``causal = False`` may run.
    """

    output_size: int
    max_context: int | None = None
    conditional: bool = False
    denoiser: bool = False
    causal: bool = True

    def _check_length(self, length: int, what: str = "a segment") -> None:
        """A ValueError when ``what``, of ``length`` tokens, is longer than ``max_context``."""
        if self.max_context is not None and length > self.max_context:
            raise ValueError(
                f"{what} of {length} tokens exceeds the model's max_context {self.max_context}"
            )


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
LSTM_WEIGHTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")  # an nn.LSTM layer's, by name


@ENCODERS.register("lstm")
class LstmEncoder(Encoder):
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
        dropout_recurrent: dropout on each layer's recurrent state h_{t-1} before the
            hidden-to-hidden product (the variational LSTM of Gal & Ghahramani 2016, used
            by Inan et al. 2017): one mask per sequence row and layer, (B, H), sampled once
            per forward call, i.e. per segment (a carried state gets a fresh mask in the
            next segment), shared by every time step, scaled by 1/(1-p) like the other
            dropouts, whatever ``variational`` says. Needs a per-step loop
            (``lstm_recurrence``) over the layer's own ``nn.LSTM`` weights, so it is slower
            than the fused path, which is kept when it is 0 and in eval mode. The masks come
            from torch's global RNG (after weight_drop's, layer by layer).
        tie_recurrent_mask: Inan et al.'s variant (App. A: "the same mask when they are
            propagated as states in the current layer and when they are used as inputs for the
            next layer"): each layer's recurrent mask also drops its output (to the next layer,
            or the encoder's output for the last), instead of an independent mask; needs
            ``dropout_hidden`` and ``dropout_output`` equal to ``dropout_recurrent``.
        init_range: uniform(-r, r) initialisation of all weights (Zaremba: 0.1); None keeps
            PyTorch's default uniform(-1/sqrt(H), 1/sqrt(H)).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: Size = 200,
        num_layers: Size = 2,
        output_size: Size | None = None,
        dropout_input: Fraction = 0.0,
        dropout_hidden: Fraction = 0.0,
        dropout_output: Fraction = 0.0,
        variational: bool = True,
        weight_drop: Fraction = 0.0,
        init_range: Positive | None = None,
        dropout_recurrent: Fraction = 0.0,
        tie_recurrent_mask: bool = False,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        for name, p in (
            ("dropout_input", dropout_input),
            ("dropout_hidden", dropout_hidden),
            ("dropout_output", dropout_output),
            ("weight_drop", weight_drop),
            ("dropout_recurrent", dropout_recurrent),
        ):
            if not 0 <= p < 1:
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        if tie_recurrent_mask and not dropout_hidden == dropout_output == dropout_recurrent:
            raise ValueError(
                "tie_recurrent_mask drops a layer's state and output with one mask, so "
                "dropout_hidden and dropout_output must equal dropout_recurrent, got "
                f"{dropout_hidden}, {dropout_output} and {dropout_recurrent}"
            )
        self.output_size = output_size or hidden_size
        sizes = [input_size] + [hidden_size] * (num_layers - 1) + [self.output_size]
        self.layers = nn.ModuleList(
            nn.LSTM(sizes[i], sizes[i + 1], batch_first=True) for i in range(num_layers)
        )
        self.drop_input = LockedDropout(dropout_input, variational)
        self.drop_hidden = LockedDropout(dropout_hidden, variational)
        self.drop_output = LockedDropout(dropout_output, variational)
        self.weight_drop = weight_drop
        self.dropout_recurrent = dropout_recurrent
        self.tie_recurrent_mask = tie_recurrent_mask
        if init_range is not None:
            for parameter in self.parameters():
                nn.init.uniform_(parameter, -init_range, init_range)

    def _run_layer(
        self, layer: nn.LSTM, x: torch.Tensor, hx
    ) -> tuple[torch.Tensor, tuple, torch.Tensor | None]:
        """(outputs (B, T, H), (h, c), the recurrent mask (B, H) or None)."""
        if self.training and self.dropout_recurrent > 0:
            weight_ih, weight_hh, bias_ih, bias_hh = (
                layer.get_parameter(f"{name}_l0") for name in LSTM_WEIGHTS
            )
            recurrent = (
                F.dropout(weight_hh, self.weight_drop, True) if self.weight_drop > 0 else weight_hh
            )
            mask = dropout_mask(x, (x.size(0), layer.hidden_size), self.dropout_recurrent)
            return *lstm_recurrence(x, weight_ih, recurrent, bias_ih, bias_hh, hx, mask), mask
        if self.training and self.weight_drop > 0:
            dropped = F.dropout(layer.get_parameter("weight_hh_l0"), self.weight_drop, True)
            return *functional_call(layer, {"weight_hh_l0": dropped}, (x, hx)), None
        return *layer(x, hx), None

    def forward(self, x: torch.Tensor, state: LstmState | None = None):
        x = self.drop_input(x)  # (B, T, input_size)
        new_state: LstmState = []
        for i, layer in enumerate(self.layers):
            lstm = cast(nn.LSTM, layer)  # the ModuleList holds nn.LSTMs only
            x, (h, c), mask = self._run_layer(lstm, x, None if state is None else tuple(state[i]))
            new_state.append((h, c))
            if mask is not None and self.tie_recurrent_mask:
                x = x * mask[:, None]  # the state's mask drops the output too (Inan et al.)
            elif i < len(self.layers) - 1:
                x = self.drop_hidden(x)
            else:
                x = self.drop_output(x)
        return x, new_state  # (B, T, output_size)

    def select_rows(self, state: LstmState | None, rows: torch.Tensor) -> LstmState | None:
        """The state of batch rows ``rows`` (B',) only, in that order."""
        if state is None:
            return None
        return [(h[:, rows], c[:, rows]) for h, c in state]

    def concat_rows(self, states: Sequence[LstmState]) -> LstmState:
        """One state whose rows are those of ``states`` one after the other."""
        return [
            (torch.cat([s[i][0] for s in states], 1), torch.cat([s[i][1] for s in states], 1))
            for i in range(len(states[0]))
        ]


def dropout_mask(like: torch.Tensor, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """Inverted-dropout mask of ``shape``: 0 with probability p, else 1/(1-p).

    Drawn from torch's global RNG, on ``like``'s device and dtype.
    """
    return like.new_empty(shape).bernoulli_(1 - p) / (1 - p)


def lstm_recurrence(
    x: torch.Tensor,
    weight_ih: torch.Tensor,
    weight_hh: torch.Tensor,
    bias_ih: torch.Tensor,
    bias_hh: torch.Tensor,
    hx: tuple[torch.Tensor, torch.Tensor] | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One LSTM layer (``nn.LSTM``'s equations and gate order i, f, g, o) as a per-step loop,
    with ``mask`` on the recurrent state: gates_t = x_t W_ih^T + b_ih + (h_{t-1} * m) W_hh^T + b_hh.

    x: (B, T, I); weight_ih: (4H, I); weight_hh: (4H, H); biases: (4H,); hx: (h, c), each
    (1, B, H), or None for zeros; mask: (B, H), the same at every step (None: no mask).
    The input products of all steps are one matmul; only the recurrence loops.
    Returns the outputs h_1..h_T (B, T, H) and the final (h, c), each (1, B, H), like
    ``nn.LSTM(batch_first=True)``.
    """
    batch, hidden = x.size(0), weight_hh.size(1)
    if hx is None:
        h = c = x.new_zeros(batch, hidden)
    else:
        h, c = hx[0].squeeze(0), hx[1].squeeze(0)  # (B, H)
    inputs = F.linear(x, weight_ih, bias_ih + bias_hh)  # (B, T, 4H)
    weight_hh_t = weight_hh.t()  # (H, 4H)
    outputs = []
    for input_t in inputs.unbind(1):  # (B, 4H)
        gates = torch.addmm(input_t, h if mask is None else h * mask, weight_hh_t)
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, 1), (h.unsqueeze(0), c.unsqueeze(0))


FEEDFORWARD_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


def check_block_options(norm: str, activation: str) -> None:
    """The layer options every Transformer stack's constructor checks (a ValueError naming the
    first wrong one): ``norm`` pre or post, an ``activation`` of the feed-forward block."""
    if norm not in ("pre", "post"):
        raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
    if activation not in FEEDFORWARD_ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {sorted(FEEDFORWARD_ACTIVATIONS)}, got {activation!r}"
        )


def add_positions(module: nn.Module, name: str, kind: str, max_context: int, d: int) -> None:
    """Give ``module`` its absolute positions ``name`` (max_context, d): ``learned``, a parameter
    drawn from N(0, 0.02²) (from torch's global RNG), else the sinusoidal table as a buffer that
    is not saved (it is recomputed)."""
    if kind == "learned":
        setattr(module, name, nn.Parameter(torch.randn(max_context, d) * 0.02))
    else:
        module.register_buffer(name, sinusoidal_positions(max_context, d), persistent=False)


@ENCODERS.register("transformer")
class CausalTransformer(Encoder):
    """Causal Transformer decoder stack (no cross-attention), pre-LN or post-LN.

    Registered as ``transformer``.

    The state is the last ``max_context - 1`` inputs (B, P, input_size), detached:
    given a segment of T tokens, each is encoded with the window of the
    ``max_context - T`` previous inputs plus the segment, positions counted from the
    window's start. So a segment of 1 token continues generation, and evaluation
    with segment S scores each token with between ``max_context - S + 1`` and
    ``max_context`` tokens of context (the usual sliding window).

    KV cache (eval mode only; training keeps the plain window, so training and exact resume
    do not change). While the window has not slid, the state is the tuple ``(window,
    keys_values)``: besides the inputs, every layer's keys and values of the window's
    positions, each (B, heads, P, d/heads). A segment that still fits (P + T ≤ max_context)
    attends to them and only its own T positions are computed, positions continuing from
    the window's start; a segment that makes the window slide recomputes the window as
    above, and the state is the plain window again (its start moved, so the cached keys and
    values of the kept positions no longer hold). Either way every output equals the
    recomputation's. ``kv_cache = False`` (an attribute, not an option) recomputes always.
    :meth:`rewind` drops the last tokens of a cached state (speculative decoding).

    Rows of different lengths (speculative decoding keeps each row's accepted drafts): a
    :class:`RaggedState` (made by :meth:`rewind_rows`, :meth:`select_rows` or
    :meth:`concat_rows`) holds per-row lengths; a segment is read at each row's own
    positions (the new keys and values written after the row's last token, keys past it
    masked), and a row whose window would slide is recomputed from its own last
    ``max_context`` inputs, so every row's output is the one it gets alone.

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
        model_size: Size | None = None,
        num_layers: Size = 6,
        num_heads: Size = 4,
        ff_size: Size = 1024,
        dropout: Fraction = 0.1,
        max_context: Size = 512,
        positions: Literal["learned", "sinusoidal"] = "learned",
        norm: Literal["pre", "post"] = "pre",
        activation: Literal["gelu", "relu"] = "gelu",
    ) -> None:
        super().__init__()
        d = model_size or input_size
        check_block_options(norm, activation)
        if d % num_heads:
            raise ValueError(f"model_size {d} is not divisible by num_heads {num_heads}")
        self.output_size = d
        self.max_context = max_context
        self.input_map = nn.Linear(input_size, d) if d != input_size else nn.Identity()
        add_positions(self, "positions", positions, max_context, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(d, num_heads, ff_size, dropout, norm, activation)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d) if norm == "pre" else nn.Identity()

    max_context: int  # bounded: the positions' table has max_context rows
    positions: torch.Tensor  # (max_context, d): a parameter (learned) or a buffer (sinusoidal)
    kv_cache: bool = True  # eval mode reuses the keys/values of the window (False: recompute)

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | TransformerState | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | TransformerState | None]:
        segment = x.size(1)
        self._check_length(segment)
        if isinstance(state, RaggedState):
            return self._forward_ragged(x, state)
        past, cache = (None, None) if state is None else split_state(state)
        cached = not self.training and self.kv_cache
        if (
            cached
            and past is not None
            and cache is not None
            and past.size(1) + segment <= self.max_context
        ):
            # the window does not slide: only the segment's positions are computed
            start = past.size(1)
            window = torch.cat([past, x], 1)
            h = self.drop(self.input_map(x) + self.positions[start : start + segment])
            keys_values = []
            for block, kv in zip(self.blocks, cache):
                h, kv = block(h, kv)
                keys_values.append(kv)
        else:
            window = slide_window(past, x, self.max_context)
            h = self.drop(self.input_map(window) + self.positions[: window.size(1)])  # (B, L, d)
            keys_values = []
            for block in self.blocks:
                h, kv = block(h)
                keys_values.append(kv)
        length = window.size(1)
        if self.max_context == 1:
            return self.norm(h[:, -segment:]), None
        new_state = window[:, -(self.max_context - 1) :].detach()
        if cached and length < self.max_context:  # the state's window starts where the cache's does
            kv_state = tuple((k.detach(), v.detach()) for k, v in keys_values)
            return self.norm(h[:, -segment:]), (new_state, kv_state)
        return self.norm(h[:, -segment:]), new_state  # (B, T, d)

    def rewind(
        self, state: torch.Tensor | TransformerState | None, n: int
    ) -> TransformerState | None:
        """:func:`targetlm.modules.kv_cache.rewind` (drop the last ``n`` tokens)."""
        return kv_states.rewind(state, n)

    def rewind_rows(
        self, state: torch.Tensor | TransformerState | RaggedState | None, counts: torch.Tensor
    ) -> RaggedState | None:
        """:func:`targetlm.modules.kv_cache.rewind_rows` (drop each row's last tokens)."""
        return kv_states.rewind_rows(state, counts)

    def select_rows(
        self, state: torch.Tensor | TransformerState | RaggedState | None, rows: torch.Tensor
    ) -> torch.Tensor | TransformerState | RaggedState | None:
        """:func:`targetlm.modules.kv_cache.select_rows` (keep rows ``rows``)."""
        return kv_states.select_rows(state, rows)

    def concat_rows(self, states: Sequence) -> RaggedState:
        """:func:`targetlm.modules.kv_cache.concat_rows` (the rows of every state)."""
        return kv_states.concat_rows(states)

    def _forward_ragged(
        self, x: torch.Tensor, state: RaggedState
    ) -> tuple[torch.Tensor, RaggedState]:
        """Read x (B, T, input_size) after each row's own ``state.lengths[b]`` tokens."""
        batch, segment = x.shape[:2]
        offsets = torch.arange(segment, device=x.device)
        total = state.lengths + segment  # (B,) tokens per row after x
        longest = int(total.max())
        cache = state.keys_values if not self.training and self.kv_cache else None
        if cache is not None and longest <= self.max_context:  # no row's window slides
            # written in place where the state has room (it grows by doubling up to the
            # window): a read costs its own tokens, not a copy of every row's cache
            lengths = state.lengths.tolist()
            if len(set(lengths)) == 1:  # rows of one length: slices, and a mask only for T > 1
                start = lengths[0]
                where, positions = start, self.positions[start : start + segment]
                mask = None
                if segment > 1:  # query i sees keys 0..start + i
                    mask = torch.ones(segment, longest, dtype=torch.bool, device=x.device)
                    mask = mask.tril(start)
            else:
                where = state.lengths[:, None] + offsets  # (B, T): each row's own positions
                positions = self.positions[where]
                # query i of row b sees keys 0..lengths[b] + i (later: other drafts, padding)
                mask = (torch.arange(longest, device=x.device) <= where[..., None])[:, None]
            stream = write_columns(state.inputs, x, where, longest, 1, self.max_context)
            h = self.drop(self.input_map(x) + positions)
            keys_values = []
            for block, kv in zip(self.blocks, cache):
                h, kv = block(h, kv, columns=where, mask=mask, room=self.max_context, width=longest)
                keys_values.append(kv)
            return self.norm(h), RaggedState(stream, total, tuple(keys_values))
        columns = state.lengths[:, None] + offsets
        stream = write_columns(state.inputs, x, columns, longest)  # (B, longest, ·)
        # some row's window slides (or nothing is cached): every row reads its own last
        # max_context inputs from position 0, left-aligned (padding after them is not seen)
        window = total.clamp(max=self.max_context)  # (B,)
        width = int(window.max())
        columns = ((total - window)[:, None] + torch.arange(width, device=x.device)).clamp(
            max=longest - 1
        )
        windows = stream.gather(1, columns[..., None].expand(-1, -1, stream.size(2)))
        h = self.drop(self.input_map(windows) + self.positions[:width])
        keys_values = []
        for block in self.blocks:
            h, kv = block(h)
            keys_values.append(kv)
        out = (window - segment)[:, None] + offsets  # (B, T): x's columns in each window
        hidden = self.norm(h.gather(1, out[..., None].expand(-1, -1, h.size(2))))
        if not self.training and self.kv_cache and longest < self.max_context:
            return hidden, RaggedState(windows.detach(), window, tuple(keys_values))
        keep = window.clamp(max=self.max_context - 1)
        kept = ((window - keep)[:, None] + torch.arange(int(keep.max()), device=x.device)).clamp(
            max=width - 1
        )
        inputs = windows.gather(1, kept[..., None].expand(-1, -1, windows.size(2)))
        return hidden, RaggedState(inputs.detach(), keep, None)


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

    def forward(
        self,
        x: torch.Tensor,
        past: KeyValue | None = None,
        columns: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        room: int | None = None,
        width: int | None = None,
    ) -> tuple[torch.Tensor, KeyValue]:
        """x (B, T, d), after the cached keys/values ``past`` of the P previous positions (None:
        x starts the window) -> (B, T, d) and the keys/values of all P + T positions.

        Rows of different lengths: ``columns`` (B, T), where row b's new keys and values go
        in ``past`` (its positions; an int: the same for every row), ``width`` L, the keys
        attended to (default: the mask's), and ``mask`` (B, 1, T, L) or (T, L), the keys each
        query sees (None: all L); the keys/values returned are ``past`` with the new ones
        written there (at least L positions; with ``room``, the most positions a state holds,
        written in place where ``past`` has room, see :func:`~targetlm.modules.kv_cache.write_columns`)."""
        B, T, d = x.shape
        y = self.norm1(x) if self.pre_norm else x  # the attention branch's input
        q, k, v = (
            z.transpose(1, 2)  # (B, heads, T, d/heads)
            for z in self.qkv(y).view(B, T, 3, self.num_heads, d // self.num_heads).unbind(2)
        )
        kv = None
        if columns is not None:  # rows of different lengths: write at each row's positions
            if past is None or (mask is None and width is None):
                raise ValueError("writing at each row's positions needs its keys/values and width")
            width = mask.size(-1) if width is None and mask is not None else width
            assert width is not None
            kv = (
                write_columns(past[0], k, columns, width, 2, room),
                write_columns(past[1], v, columns, width, 2, room),
            )
            k, v = kv[0][:, :, :width], kv[1][:, :, :width]  # the keys the mask covers
        elif past is not None:
            P = past[0].size(2)
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)  # (B, heads, P + T, ·)
            # query i (position P + i) sees keys 0..P + i; one query sees them all
            if T > 1:
                mask = torch.ones(T, P + T, dtype=torch.bool, device=x.device).tril(P)
        attention = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=past is None and mask is None,  # (a cache without a mask: every key)
            dropout_p=self.dropout if self.training else 0.0,
        )
        attended = self.drop(self.proj(attention.transpose(1, 2).reshape(B, T, d)))
        if self.pre_norm:
            x = x + attended
            return x + self.drop(self.ff(self.norm2(x))), kv or (k, v)
        x = self.norm1(x + attended)
        return self.norm2(x + self.drop(self.ff(x))), kv or (k, v)


@dataclass
class RaggedWindow:
    """A :class:`WindowEncoder` state whose rows hold different numbers of past inputs: row b's
    are ``inputs[b, :lengths[b]]`` (what follows is padding, never read).

    inputs: (B, P, input_size); lengths: (B,) long, each ≥ 1.
    """

    inputs: torch.Tensor
    lengths: torch.Tensor


class WindowEncoder(Encoder):
    """Base of encoders whose state is the window of their last ``max_context - 1`` inputs.

    A segment x (B, T, input_size) is encoded with the window of the previous inputs before it
    (positions counted from the window's start): ``_encode(window, T)`` gives the hidden states
    of the window's last T positions. Rows can leave the batch (:meth:`select_rows`) and states
    whose rows hold different numbers of inputs can be put together (:meth:`concat_rows`, a
    :class:`RaggedWindow`); such a batch is read one group of equal lengths at a time, so every
    row's output is the one it gets alone.
    """

    max_context: int  # a window encoder always has a finite context

    def _encode(self, window: torch.Tensor, segment: int) -> torch.Tensor:
        """window (B, L, input_size) -> hidden (B, segment, output_size) of its last positions."""
        raise NotImplementedError

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | RaggedWindow | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | RaggedWindow | None]:
        """x (B, T, input_size), the state -> hidden (B, T, output_size) and the new state."""
        segment = x.size(1)
        self._check_length(segment)
        if isinstance(state, RaggedWindow):
            return self._forward_ragged(x, state)
        window = slide_window(state, x, self.max_context)
        hidden = self._encode(window, segment)
        if self.max_context == 1:
            return hidden, None
        return hidden, window[:, -(self.max_context - 1) :].detach()

    def _forward_ragged(
        self, x: torch.Tensor, state: RaggedWindow
    ) -> tuple[torch.Tensor, torch.Tensor | RaggedWindow | None]:
        """Each group of rows with the same number of past inputs read on its own."""
        hidden = None
        new_states: list[torch.Tensor | None] = [None] * x.size(0)
        for length in state.lengths.unique().tolist():
            rows = (state.lengths == length).nonzero().squeeze(1)
            out, new = self.forward(x[rows], state.inputs[rows, :length])
            assert not isinstance(new, RaggedWindow)  # rows of one length give a plain window
            if hidden is None:
                hidden = out.new_zeros(x.size(0), *out.shape[1:])
            hidden[rows] = out
            for i, row in enumerate(rows.tolist()):
                new_states[row] = None if new is None else new[i : i + 1]
        assert hidden is not None  # the batch has at least one row
        if new_states[0] is None:
            return hidden, None
        return hidden, self.concat_rows(new_states)

    def select_rows(
        self, state: torch.Tensor | RaggedWindow | None, rows: torch.Tensor
    ) -> torch.Tensor | RaggedWindow | None:
        """The state of batch rows ``rows`` (B',) only, in that order."""
        if state is None or isinstance(state, torch.Tensor):
            return None if state is None else state[rows]
        return RaggedWindow(state.inputs[rows], state.lengths[rows])

    def concat_rows(self, states: Sequence) -> torch.Tensor | RaggedWindow:
        """One state whose rows are those of ``states`` one after the other (a plain window
        when every row holds the same number of inputs)."""
        if any(s is None for s in states):
            raise ValueError("concat_rows: a state of no tokens has no rows")
        parts = [
            s
            if isinstance(s, RaggedWindow)
            else RaggedWindow(
                s, torch.full((s.size(0),), s.size(1), dtype=torch.long, device=s.device)
            )
            for s in states
        ]
        lengths = torch.cat([p.lengths for p in parts])
        width = int(lengths.max())
        inputs = torch.cat(
            [
                F.pad(p.inputs[:, :width], (0, 0, 0, width - min(width, p.inputs.size(1))))
                for p in parts
            ]
        )
        if bool((lengths == width).all()):
            return inputs
        return RaggedWindow(inputs, lengths)


def slide_window(past: torch.Tensor | None, x: torch.Tensor, max_context: int) -> torch.Tensor:
    """The window a segment x (B, T, ·) is read in: the last ``max_context - T`` of the inputs
    ``past`` (B, P, ·) before it (None: none), then x."""
    keep = max_context - x.size(1)
    if past is None or past.size(1) == 0 or keep <= 0:
        return x
    return torch.cat([past[:, -keep:], x], 1)


def sinusoidal_positions(length: int, d: int) -> torch.Tensor:
    """Vaswani et al. (2017) positions: sin on even, cos on odd dimensions. (length, d)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(length, d)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d // 2])
    return table
