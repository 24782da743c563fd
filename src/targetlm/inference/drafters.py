r"""Incremental drafting for the heads that attend over a window of columns (``gloeckle``,
``mtp``): each keeps its layers' keys and values of the columns already read, so a decoding
step computes only the new columns, where recomputing the window costs one transformer layer
per head over up to ``window`` columns (and, for MTP's sequential depths, every depth again for
each drafted token).

A drafter starts from the main x̂ of the last ``heads.context`` columns a row read (and the words
read after them); then, step after step, :meth:`propose` drafts d_1..d_k after greedy's d_0 from
the last column t, and :meth:`advance` takes the verified columns each row kept (its accepted
length: rows move at their own pace) and trims the caches like the body's. Rows that leave the
batch are dropped by :meth:`select`. Only argmaxes of logits, no softmax.

Caches are right-aligned per row: position p of a cache of L columns is the column L − 1 − p
before the row's newest cached one, whatever the row's own length; ``seen`` (CPU) counts the
columns a row has actually read, so while a row has read fewer than the cache holds, its
missing positions (zeros) are masked out of the attention. Every query also sees itself, so
no row ever attends to nothing.

``gloeckle`` (one layer per head over the trunk's x̂, parallel heads): a layer's keys/values
at column s depend on x̂_s alone, so the last ``window`` columns' are cached, and drafting
runs each head's query at column t only. The drafts are those of the layer over the row's last
``window`` columns (``speculative.draft``).

``mtp`` (DeepSeek-V3's sequential depths): depth k at column s reads depth k − 1's output at s
and the word y_{s+k−1}, so it is final once that word is read (s ≤ t − k + 1) and reads the
drafted d_{s+k−1−t} after that. Each depth caches the keys/values of the columns final for every
depth (up to t − K + 1, K the depths run), and a step runs every depth over the last S = k + K
columns (the span: the columns a row may keep, k + 1, and the K − 1 that read drafts) after that
cache. The drafts are those of the depths over the whole text read, each layer over its own last
``window`` columns (the training-time forward with the drafted words after column t) — once
the row has read ``heads.context`` columns; recomputing a window of columns per step instead
(``speculative.draft``) gives depth k ≥ 2 a shorter context at the window's first columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from targetlm import functional
from targetlm.modules.encoders import TransformerBlock
from targetlm.modules.heads import NgramHeads, ParallelTransformerHeads, SequentialMtpHeads

__all__ = ["GloeckleDrafter", "MtpDrafter", "window_drafter"]


def window_drafter(
    heads: NgramHeads,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    columns: torch.Tensor,
    words: torch.Tensor,
    length: int,
) -> GloeckleDrafter | MtpDrafter:
    """The incremental drafter of heads over a window of columns: ``columns`` (B, P, d) the main
    x̂ of each row's last P columns, ``words`` (B, P − 1) the ids read after all but the last,
    ``length`` the tokens drafted per step; ``weight`` (V, d) and ``bias`` (V,): the output
    layer's."""
    if isinstance(heads, ParallelTransformerHeads):
        return GloeckleDrafter(heads, weight, bias, columns, length)
    if isinstance(heads, SequentialMtpHeads):
        return MtpDrafter(heads, weight, bias, columns, words, length)
    raise TypeError(f"{type(heads).__name__}: no incremental drafter (window {heads.window})")


def _shift(
    buffer: torch.Tensor, new: torch.Tensor, keep: torch.Tensor, equal: int | None, dim: int
) -> torch.Tensor:
    """``buffer`` (right-aligned, L positions on ``dim``) after row b appended the first
    ``keep[b]`` positions of ``new``: the last L positions of each row's (a slice when every row
    keeps ``equal`` positions)."""
    width = buffer.size(dim)
    joined = torch.cat([buffer, new], dim)
    if equal is not None:
        return joined.narrow(dim, equal, width)
    shape = [1] * joined.dim()
    shape[0], shape[dim] = keep.size(0), width
    index = (keep[:, None] + torch.arange(width, device=keep.device)).view(shape)
    size = list(joined.shape)
    size[dim] = width
    return joined.gather(dim, index.expand(size))


def _equal(kept: Sequence[int]) -> int | None:
    return kept[0] if all(k == kept[0] for k in kept) else None


class _Block:
    """A pre-norm :class:`~targetlm.modules.encoders.TransformerBlock` in eval mode through
    ``torch.nn.functional`` on its own parameters (the same operations as the module's, without
    the modules' call overhead: drafting runs small ones many times)."""

    def __init__(self, block: TransformerBlock) -> None:
        if not block.pre_norm:
            raise ValueError("drafting runs pre-norm blocks")
        first, activation, last = block.ff
        assert isinstance(first, torch.nn.Linear) and isinstance(last, torch.nn.Linear)
        self.block, self.heads = block, block.num_heads
        self.norm1, self.norm2 = block.norm1, block.norm2
        self.qkv, self.proj, self.first, self.last = block.qkv, block.proj, first, last
        self.activation = activation

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, d) -> its queries, keys and values (B, T, 3, heads, d/heads)."""
        n = self.norm1
        x = F.layer_norm(x, n.normalized_shape, n.weight, n.bias, n.eps)
        return F.linear(x, self.qkv.weight, self.qkv.bias).view(*x.shape[:2], 3, self.heads, -1)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """x (…, d) and its attention output (…, d, the heads side by side) -> the block's."""
        x = x + F.linear(attended, self.proj.weight, self.proj.bias)
        n = self.norm2
        y = F.layer_norm(x, n.normalized_shape, n.weight, n.bias, n.eps)
        activation = self.activation
        y = F.linear(y, self.first.weight, self.first.bias)
        if isinstance(activation, torch.nn.GELU):
            y = F.gelu(y, approximate=activation.approximate)
        elif isinstance(activation, torch.nn.ReLU):
            y = F.relu(y)
        else:
            y = activation(y)
        return x + F.linear(y, self.last.weight, self.last.bias)

    def __call__(
        self,
        x: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, d) after the cached ``keys``/``values`` (B, heads, L, d/heads): (B, T, d)
        and the new columns' keys and values (B, heads, T, ·). mask (B, 1, T, L + T) or
        (T, L + T) bool, or None (every key)."""
        B, T, d = x.shape
        q, k, v = (y.transpose(1, 2) for y in self.project(x).unbind(2))
        attended = F.scaled_dot_product_attention(
            q, torch.cat([keys, k], 2), torch.cat([values, v], 2), attn_mask=mask
        )
        return self.finish(x, attended.transpose(1, 2).reshape(B, T, d)), k, v


def _rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """``norm`` (an ``nn.RMSNorm``) over x, without the module call."""
    return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)


class GloeckleDrafter:
    """Incremental drafting with :class:`~targetlm.modules.heads.ParallelTransformerHeads`:
    the keys/values of each head's layer over the last ``window`` columns, the queries of the
    last column."""

    def __init__(
        self,
        heads: ParallelTransformerHeads,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        columns: torch.Tensor,
        length: int,
    ) -> None:
        self.blocks = [_Block(b) for b in list(heads.layers.blocks)[:length]]  # type: ignore[arg-type]
        self.weight, self.bias, self.window = weight, bias, heads.window
        columns = columns[:, -self.window :]
        batch, read, _ = columns.shape
        self.seen = torch.full((batch,), read, dtype=torch.long)  # columns read (CPU), ≤ window
        query, cache = self._project(columns)
        self.query = query[:, :, -1:]  # (B, n·heads, 1, ·)
        self.cache = F.pad(cache, (0, 0, self.window - read, 0))  # (B, 2, n·heads, window, ·)
        self.last = columns[:, -1]  # x̂_t (B, d)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x̂ (B, T, d) -> every head's queries (B, n·heads, T, ·) and keys/values
        (B, 2, n·heads, T, ·)."""
        qkv = torch.stack([b.project(x) for b in self.blocks], 3)  # (B, T, 3, n, heads, ·)
        qkv = qkv.flatten(3, 4).permute(0, 2, 3, 1, 4)  # (B, 3, n·heads, T, ·)
        return qkv[:, 0], qkv[:, 1:]

    def propose(self, first: torch.Tensor) -> torch.Tensor:
        """Drafts (B, 1 + n): d_0 = ``first`` (B,), then each head's argmax at column t."""
        mask = None
        if int(self.seen.min()) < self.window:  # rows that read fewer columns than the window
            position = torch.arange(self.window)
            mask = (position >= self.window - self.seen[:, None])[:, None, None]
            mask = mask.to(self.last.device)
        attended = F.scaled_dot_product_attention(
            self.query, self.cache[:, 0], self.cache[:, 1], attn_mask=mask
        )  # (B, n·heads, 1, ·)
        batch, count = self.last.size(0), len(self.blocks)
        attended = attended.view(batch, count, -1)  # the heads' (·) side by side: (B, n, d)
        vectors = [block.finish(self.last, attended[:, i]) for i, block in enumerate(self.blocks)]
        tokens = functional.logits(torch.stack(vectors, 1), self.weight, self.bias).argmax(-1)
        return torch.cat([first[:, None], tokens], 1)

    def advance(
        self,
        verified: torch.Tensor,
        drafted: torch.Tensor,
        keep: torch.Tensor,
        kept: Sequence[int],
        predicted: torch.Tensor,
    ) -> None:
        """Row b read its first ``keep[b]`` (``kept``: the same, as ints) of the verified
        columns' x̂ (B, k + 1, d); ``predicted`` (B, d): the x̂ of each row's last one."""
        query, cache = self._project(verified)
        equal = _equal(kept)
        self.cache = _shift(self.cache, cache, keep, equal, 3)
        if equal is not None:
            self.query = query[:, :, equal - 1 : equal]
        else:
            index = (keep - 1).view(-1, 1, 1, 1).expand(-1, query.size(1), 1, query.size(3))
            self.query = query.gather(2, index)
        self.last = predicted
        self.seen = (self.seen + torch.tensor(kept)).clamp_(max=self.window)

    def select(self, index: torch.Tensor) -> None:
        """Keep these rows only, in this order."""
        self.cache, self.query, self.last = self.cache[index], self.query[index], self.last[index]
        self.seen = self.seen[index.cpu()]


class MtpDrafter:
    """Incremental drafting with :class:`~targetlm.modules.heads.SequentialMtpHeads`: each
    depth's keys/values of the columns final for every depth, and a span of the last S columns
    recomputed each step (their main x̂ and words kept here)."""

    def __init__(
        self,
        heads: SequentialMtpHeads,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        columns: torch.Tensor,
        words: torch.Tensor,
        length: int,
    ) -> None:
        self.heads, self.weight, self.bias = heads, weight, bias
        self.depths = length
        self.blocks = [_Block(b) for b in list(heads.layers.blocks)[:length]]  # type: ignore[arg-type]
        self.norms = list(zip(heads.hidden_norms, heads.word_norms, heads.output_norms))
        self.projections: list[Any] = [p.weight for p in heads.projections]
        self.window = heads.window
        self.cached = self.window - 1  # L: the keys before the span's first column
        self.span = 2 * length  # S: the k + 1 columns a row may keep, the K − 1 reading drafts
        position = torch.arange(self.cached + self.span)
        query = torch.arange(self.span)[:, None] + self.cached
        self.band = (position <= query) & (position > query - self.window)  # (S, L + S)
        self.itself = position == query
        self.steady = self.band.to(weight.device)  # the mask once every row read L + S columns
        self.attention_heads = self.blocks[0].heads
        batch, read, d = columns.shape
        self.seen = torch.full((batch,), read, dtype=torch.long)  # columns read (CPU)
        width = max(read, self.span)
        if read < width:  # too few columns for the span: zeros before them, masked out
            columns = F.pad(columns, (0, 0, width - read, 0))
            words = F.pad(words, (width - read, 0))
        shape = (batch, 2, length, self.attention_heads, self.cached, d // self.attention_heads)
        empty = columns.new_zeros(shape)
        # all depths over every column given, after nothing cached; the span's last S − 1 words
        # and zeros in place of drafts
        tail = words.new_zeros(batch, length)
        _, computed = self._run(columns, torch.cat([words, tail], 1), empty, None)
        self.cache = empty
        if width > self.span:  # the columns before the span: the cache's
            before = computed.narrow(4, 0, width - self.span)
            self.cache = torch.cat([empty, before], 4)[:, :, :, :, -self.cached :]
        self.columns = columns[:, -self.span :]  # (B, S, d): the span's x̂
        self.words = words[:, -(self.span - 1) :]  # (B, S − 1): the ids read after them
        self.computed: torch.Tensor | None = None  # the span's keys/values of the last propose

    def _mask(self, columns: int) -> torch.Tensor | None:
        """The keys each query of T = ``columns`` span columns sees: (T, L + T) bool, the
        window's band, once every row read all the columns the cache and the span hold (None if
        the window covers them all), else (B, 1, T, L + T) without the positions a row lacks."""
        keys = self.cached + columns
        if columns == self.span:
            band, itself = self.band, self.itself
            if int(self.seen.min()) >= keys:
                return self.steady
        else:
            position = torch.arange(keys)
            query = torch.arange(columns)[:, None] + self.cached
            band = (position <= query) & (position > query - self.window)
            itself = position == query
        if int(self.seen.min()) >= keys:
            return None if self.window >= keys else band.to(self.weight.device)
        valid = torch.arange(keys) >= keys - self.seen[:, None]  # (B, L + T)
        return (band & (valid[:, None] | itself))[:, None].to(self.weight.device)

    def _run(
        self,
        columns: torch.Tensor,
        words: torch.Tensor,
        cache: torch.Tensor,
        first: torch.Tensor | None,
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Every depth over the span ``columns`` (B, T, d) after ``cache``; ``words`` (B, T + K − 1):
        the ids read after the span's columns, then d_1..d_{K−1} (filled here when drafting:
        ``first`` = d_0, else the zeros given). Returns d_1..d_K (B,) each (drafting; else []) and
        the span's keys/values (B, 2, K, heads, T, ·)."""
        batch, span, _ = columns.shape
        mask = self._mask(span)
        vectors = self.weight[words]  # x_s = E_out[y_s]: (B, T + K − 1, d)
        hidden, drafted, computed = columns, [], []
        for k, (block, (hidden_norm, word_norm, output_norm), projection) in enumerate(
            zip(self.blocks, self.norms, self.projections)
        ):
            words_k = _rms_norm(word_norm, vectors[:, k : k + span])
            joined = torch.cat([_rms_norm(hidden_norm, hidden), words_k], -1)
            hidden, keys, values = block(
                F.linear(joined, projection), cache[:, 0, k], cache[:, 1, k], mask
            )
            computed.append(torch.stack([keys, values], 1))
            if first is not None:
                vector = _rms_norm(output_norm, hidden[:, -1:])
                token = functional.logits(vector, self.weight, self.bias)[:, 0].argmax(-1)
                drafted.append(token)
                if k + 1 < self.depths:  # the word depth k + 1 reads at column t
                    vectors[:, span + k] = self.weight[token]
        return drafted, torch.stack(computed, 2)

    def _words(self, first: torch.Tensor) -> torch.Tensor:
        tail = self.words.new_zeros(self.words.size(0), self.depths - 1)
        return torch.cat([self.words, first[:, None], tail], 1)

    def propose(self, first: torch.Tensor) -> torch.Tensor:
        """Drafts (B, 1 + K): d_0 = ``first`` (B,), then depth k's argmax at column t."""
        drafted, self.computed = self._run(self.columns, self._words(first), self.cache, first)
        return torch.stack([first, *drafted], 1)

    def advance(
        self,
        verified: torch.Tensor,
        drafted: torch.Tensor,
        keep: torch.Tensor,
        kept: Sequence[int],
        predicted: torch.Tensor,
    ) -> None:
        """Row b read its first ``keep[b]`` (``kept``: the same, as ints) of the ``drafted``
        tokens (B, k + 1), whose columns' x̂ are ``verified`` (B, k + 1, d): the span's first
        ``keep[b]`` columns, final now, join the cache."""
        computed = self.computed
        if computed is None:  # nothing drafted this step (the context was full): the span's
            # final columns read no draft, so zeros in their place do
            _, computed = self._run(self.columns, self._words(drafted[:, 0]), self.cache, None)
        equal = _equal(kept)
        self.cache = _shift(self.cache, computed, keep, equal, 4)
        self.columns = _shift(self.columns, verified, keep, equal, 1)
        self.words = _shift(self.words, drafted, keep, equal, 1)
        self.seen = (self.seen + torch.tensor(kept)).clamp_(max=self.cached + self.span)
        self.computed = None

    def select(self, index: torch.Tensor) -> None:
        """Keep these rows only, in this order."""
        self.cache, self.columns, self.words = (
            self.cache[index],
            self.columns[index],
            self.words[index],
        )
        self.seen = self.seen[index.cpu()]
        if self.computed is not None:
            self.computed = self.computed[index]
