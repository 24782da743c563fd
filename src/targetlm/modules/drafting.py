r"""The drafter interface of greedy speculative decoding, and the drafters of the N-gram heads.

Speculative decoding (``targetlm.inference.speculative``) repeats four phases over a batch of
rows, each row at its own pace::

    draft    drafter.propose(first)     d_0 (greedy's own next token, known already) and up
                                        to ``drafter.length`` drafted tokens d_1..d_k per row
    verify   one forward of d_0..d_k    g_i = argmax logits(x̂ after d_i)
    accept   d_1..d_j while d_{i+1} = g_i; row b keeps d_0..d_j (keep[b] = j + 1 tokens),
             and g_j is the next step's d_0
    rewind   the body's state forgets each row's dropped tokens; drafter.accept(verified)
             does the same with the drafter's own state

The loop never asks what a drafter is: prompt lookup, a model's heads and their combination
are all a :class:`Drafter`. A head kind that drafts (``heads.drafts``) builds its own::

    heads.drafter(start: DraftStart) -> Drafter

(:class:`DraftStart`: what the loop knows once every prompt is read), so a new kind of head
(its module and its drafter, both in ``targetlm.modules``) needs no change in the loop. The
base :class:`~targetlm.modules.heads.NgramHeads` builds :class:`ColumnDrafter` (heads at
column t alone); heads over a window of columns build their incremental drafters.

The interface lives here, beside the model's components, and not in ``targetlm.inference``:
the heads (``targetlm.modules``) build drafters, and components never import what drives
them (``tests/project/test_layering.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from targetlm import functional
from targetlm.modules.encoders import TransformerBlock

__all__ = [
    "ColumnDrafter",
    "DraftStart",
    "Drafter",
    "GloeckleDrafter",
    "MtpDrafter",
    "Verified",
    "draft",
]


@dataclass
class DraftStart:
    """What a drafter starts from: B rows, every prompt read, nothing drafted yet.

    weight, bias: the output layer, ``logits = x̂ · weightᵀ + bias`` (weight (V, d), bias (V,)
        or None); a draft is an argmax of logits (no softmax anywhere).
    texts: each row's token ids read so far (the start ``<eos>``, the prompt and any tokens
        generated before speculation began); row b's last column t read ``texts[b][-1]``.
    columns: (B, P, d), the main x̂ (the model's output before its logit layer) of each row's
        last P columns, ending at column t; P = ``heads.context`` for a model with heads, else 1.
        A row that read fewer than P columns has zeros before its first.
    length: the drafted tokens per step the user asked for (``--draft-tokens``; None: the
        drafter's own default). A drafter may draft fewer (its ``length`` says how many).
    model: the :class:`~targetlm.modules.model.LanguageModel` (its embeddings, encoder and
        heads), for drafters that read more of it than the output layer.
    width: the most tokens one verification reads, 1 + the longest draft of every drafter
        the loop combines (prompt lookup may draft longer than the heads); None (or less):
        1 + this drafter's own ``length``. A row may keep up to that many tokens in one step.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    texts: Sequence[Sequence[int]]
    columns: torch.Tensor
    length: int | None = None
    model: Any = None
    width: int | None = None


@dataclass
class Verified:
    """What one verification step gives a drafter (B rows, the batch before any row leaves).

    drafted: (B, 1 + k) long, the tokens the verification read: d_0..d_k of this step's
        proposal, or its first columns where the context had room for fewer (k = 0: a step
        without drafts, no room at all; :meth:`Drafter.propose` was then not called).
    main: (B, 1 + k, d), the main x̂ after each of them (the verification's ``prediction.main``).
    keep: (B,) long, on the model's device: how many of ``drafted`` each row kept, 1 + its
        accepted drafts (d_0 is always kept).
    kept: ``keep`` as ints.
    tokens: each row's kept tokens, ``drafted[b, :keep[b]]`` as ints (appended to its text).
    predicted: (B, d), the main x̂ of each row's last kept column: column t of the next step.
    first: (B,) long, the next step's d_0 (greedy's token from ``predicted``).
    prediction: the verification forward's whole :class:`~targetlm.modules.model.Prediction`
        (``state`` holds all 1 + k columns; the loop rewinds the body's copy, not this one).
    """

    drafted: torch.Tensor
    main: torch.Tensor
    keep: torch.Tensor
    kept: list[int]
    tokens: list[list[int]]
    predicted: torch.Tensor
    first: torch.Tensor
    prediction: Any = None


class Drafter(Protocol):
    """Proposes greedy speculative decoding's drafts for a batch of rows, and follows the rows.

    The loop calls, step after step::

        drafted = drafter.propose(first)   # not where no draft fits into the context
        ...verify, accept...
        drafter.accept(verified)           # every step, whether propose was called or not
        drafter.select(rows)               # when rows left the batch (finished)

    ``length``: the most tokens :meth:`propose` drafts after d_0 (k). Where fewer than
    1 + length columns fit into the encoder's context, the loop verifies only the proposal's
    first columns (``verified.drafted`` is then narrower than the proposal), or, where no
    draft fits, does not call :meth:`propose` at all.

    :meth:`propose` ``first`` (B,) long: each row's d_0. Returns (B, 1 + j) long on the same
    device, 0 ≤ j ≤ ``length``, column 0 being ``first``: the drafts of every row (a row with
    fewer than j drafts pads its own, e.g. by repeating its last token: a wrong draft costs
    verification width, never a wrong output). j = 0 (``first[:, None]``): nothing drafted,
    the step is a plain greedy step. Every proposal is verified (its first columns at least)
    and followed by :meth:`accept` of that step. A row may keep up to 1 + the longest draft
    verified, which a combination of drafters makes longer than this drafter's own
    (``DraftStart.width`` says how long).

    :meth:`accept` ``verified`` (:class:`Verified`): row b kept ``verified.kept[b]`` of the
    tokens verified (its accepted drafts + 1); the drafter appends them to what it holds of
    the row and drops, like the body's cache, whatever it computed for the rest (rewind).
    Called after every verification, including steps without drafts (``drafted`` (B, 1),
    every row keeping 1 token).

    :meth:`select` ``rows`` (B',) long, on the model's device: keep these rows only, in this
    order (the others finished). The next ``propose`` gets B' rows.

    Every emitted token is verified by the body, so a drafter changes how fast the text comes,
    never what it is: any proposal gives greedy decoding's output.
    """

    length: int

    def propose(self, first: torch.Tensor) -> torch.Tensor: ...

    def accept(self, verified: Verified) -> None: ...

    def select(self, rows: torch.Tensor) -> None: ...


def draft(
    heads: Any,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    first: torch.Tensor,
    predicted: torch.Tensor,
    length: int,
    words: torch.Tensor | None = None,
) -> torch.Tensor:
    """Greedy drafts d_0..d_length (B, length + 1) from one column t by N-gram ``heads``
    (:class:`~targetlm.modules.heads.NgramHeads`): d_0 = ``first`` (B,),
    greedy's token there, and heads 1..length run on the main x̂ ``predicted``: (B, d) of
    column t, or (B, P, d) of the last P ≤ ``heads.window`` columns ending at t (heads that
    attend over columns). ``words`` (B, P − 1): the ids y of columns t−P+1..t−1, the tokens
    read after them (None when P = 1). ``weight`` (V, d) and ``bias`` (V,): the output
    layer's. Only argmaxes of logits."""
    if predicted.dim() == 2:
        predicted = predicted[:, None]
    batch, columns, d = predicted.shape
    raw = heads(predicted)[:length]  # (length, B, P, d)
    if not heads.reads_words:  # x̂_{t+n} needs no drafted word: every head in one product
        padding = predicted.new_zeros(batch, columns + length, d)
        vectors = heads.reconstruct(raw, padding)[:, :, -1]  # (length, B, d) at column t
        tokens = functional.logits(vectors, weight, bias).argmax(-1)  # (length, B)
        return torch.cat([first[:, None], tokens.t()], 1)
    drafted = [first]
    if columns == 1:  # one column: head n's x̂_{t+n} from x_t..x_{t+n−1} alone
        words_read = predicted.new_empty(batch, length, d)
        for n in range(1, length + 1):
            words_read[:, n - 1] = weight[drafted[-1]]
            vector = heads.predict_at(raw[:n, :, 0], words_read[:, :n])
            drafted.append(functional.logits(vector[:, None], weight, bias)[:, 0].argmax(-1))
        return torch.stack(drafted, 1)
    # x_s = E_out of the words y_s from column t−P+1 on: the read ones, then the drafted ones
    # (zeros where not drafted yet: head n reads x_t..x_{t+n−1} only, drafted by then;
    # reconstruct defines column t only where x_{t+n} exists, hence P + n columns for heads 1..n)
    embeddings = predicted.new_zeros(batch, columns + length, d)
    if columns > 1:
        embeddings[:, : columns - 1] = weight[words]
    for n in range(1, length + 1):
        embeddings[:, columns + n - 2] = weight[drafted[-1]]
        # heads 1..n (reconstruct numbers them from 1), of which head n's x̂_{t+n} (B, d)
        vector = heads.reconstruct(raw[:n], embeddings[:, : columns + n])[-1, :, -1]
        drafted.append(functional.logits(vector[:, None], weight, bias)[:, 0].argmax(-1))
    return torch.stack(drafted, 1)


def _length(heads: Any, asked: int | None) -> int:
    """Tokens N-gram heads draft per step: the ``asked`` ones, at most their N − 1."""
    depths = heads.num_predictions - 1
    if depths < 1:
        raise ValueError("heads with N = 1 draft nothing")
    return depths if asked is None else min(asked, depths)


def _words_before(texts: Sequence[Sequence[int]], known: int, device: Any) -> torch.Tensor:
    """(B, known) long: the ids of each row's last ``known`` tokens, zeros before a row's first
    (the words read after all but the last of the columns a drafter starts from)."""
    rows = [[0] * max(known - len(t), 0) + (list(t[-known:]) if known else []) for t in texts]
    return torch.tensor(rows, dtype=torch.long, device=device).view(len(texts), known)


class ColumnDrafter:
    """The drafter of N-gram heads that read column t alone (``simple``, ``wdr``, ``medusa``:
    the base :class:`~targetlm.modules.heads.NgramHeads`): :func:`draft` from the main x̂ of
    each row's last column, which is all it keeps."""

    def __init__(self, heads: Any, start: DraftStart) -> None:
        self.heads, self.weight, self.bias = heads, start.weight, start.bias
        self.length = _length(heads, start.length)
        self.predicted = start.columns[:, -1]  # x̂_t (B, d)

    def propose(self, first: torch.Tensor) -> torch.Tensor:
        return draft(self.heads, self.weight, self.bias, first, self.predicted, self.length)

    def accept(self, verified: Verified) -> None:
        self.predicted = verified.predicted

    def select(self, rows: torch.Tensor) -> None:
        self.predicted = self.predicted[rows]


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
    """A pre-norm :class:`~targetlm.modules.encoders.TransformerBlock` (eval mode) split where
    incremental drafting needs it: :meth:`project` (queries, keys and values of new columns)
    and :meth:`finish` (the attention's output projection and the feed-forward), each through
    the block's own submodules, so that a drafter attends over keys/values it caches itself."""

    def __init__(self, block: TransformerBlock) -> None:
        if not block.pre_norm:
            raise ValueError("drafting runs pre-norm blocks")
        self.block, self.heads = block, block.num_heads

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, d) -> its queries, keys and values (B, T, 3, heads, d/heads)."""
        block = self.block
        return block.qkv(block.norm1(x)).view(*x.shape[:2], 3, self.heads, -1)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """x (…, d) and its attention output (…, d, the heads side by side) -> the block's."""
        block = self.block
        x = x + block.proj(attended)
        return x + block.ff(block.norm2(x))

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

    def __init__(self, heads: Any, start: DraftStart) -> None:
        self.length = length = _length(heads, start.length)
        self.blocks = [_Block(b) for b in list(heads.layers.blocks)[:length]]
        self.weight, self.bias, self.window = start.weight, start.bias, heads.window
        columns = start.columns[:, -self.window :]
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

    def accept(self, verified: Verified) -> None:
        """Each row's kept columns' keys/values join its cache, the last one's query is the
        next step's."""
        keep, kept = verified.keep, verified.kept
        query, cache = self._project(verified.main)
        equal = _equal(kept)
        self.cache = _shift(self.cache, cache, keep, equal, 3)
        if equal is not None:
            self.query = query[:, :, equal - 1 : equal]
        else:
            index = (keep - 1).view(-1, 1, 1, 1).expand(-1, query.size(1), 1, query.size(3))
            self.query = query.gather(2, index)
        self.last = verified.predicted
        self.seen = (self.seen + torch.tensor(kept)).clamp_(max=self.window)

    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows only, in this order."""
        index = rows
        self.cache, self.query, self.last = self.cache[index], self.query[index], self.last[index]
        self.seen = self.seen[index.cpu()]


class MtpDrafter:
    """Incremental drafting with :class:`~targetlm.modules.heads.SequentialMtpHeads`: each
    depth's keys/values of the columns final for every depth, and a span of the last S columns
    recomputed each step (their main x̂ and words kept here)."""

    def __init__(self, heads: Any, start: DraftStart) -> None:
        self.length = length = _length(heads, start.length)
        self.heads, self.weight, self.bias = heads, start.weight, start.bias
        self.depths = length
        self.blocks = [_Block(b) for b in list(heads.layers.blocks)[:length]]
        self.norms = list(zip(heads.hidden_norms, heads.word_norms, heads.output_norms))
        self.projections: list[Any] = [p.weight for p in heads.projections]
        self.window = heads.window
        self.cached = self.window - 1  # L: the keys before the span's first column
        # S: the k + 1 columns a row may keep (k: the longest draft verified, K when the heads
        # draft alone), the K − 1 reading drafts
        self.span = max(start.width or 0, 1 + length) - 1 + length
        columns = start.columns[:, -heads.context :]
        words = _words_before(start.texts, columns.size(1) - 1, columns.device)
        position = torch.arange(self.cached + self.span)
        query = torch.arange(self.span)[:, None] + self.cached
        self.band = (position <= query) & (position > query - self.window)  # (S, L + S)
        self.itself = position == query
        self.steady = self.band.to(start.weight.device)  # once every row read L + S columns
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

    def accept(self, verified: Verified) -> None:
        """Row b read its first ``keep[b]`` of the drafted tokens: the span's first ``keep[b]``
        columns, final now, join the cache, and the span moves on by as many."""
        drafted, keep, kept = verified.drafted, verified.keep, verified.kept
        computed = self.computed
        if computed is None:  # nothing drafted this step (the context was full): the span's
            # final columns read no draft, so zeros in their place do
            _, computed = self._run(self.columns, self._words(drafted[:, 0]), self.cache, None)
        equal = _equal(kept)
        self.cache = _shift(self.cache, computed, keep, equal, 4)
        self.columns = _shift(self.columns, verified.main, keep, equal, 1)
        self.words = _shift(self.words, drafted, keep, equal, 1)
        self.seen = (self.seen + torch.tensor(kept)).clamp_(max=self.cached + self.span)
        self.computed = None

    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows only, in this order."""
        index = rows
        self.cache, self.columns, self.words = (
            self.cache[index],
            self.columns[index],
            self.words[index],
        )
        self.seen = self.seen[index.cpu()]
        if self.computed is not None:
            self.computed = self.computed[index]
