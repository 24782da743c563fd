r"""Greedy speculative decoding: drafts from the model's own N-gram heads (Stern et al. 2018's
blockwise parallel decoding, with the heads of Heo et al. 2024/2025 or Medusa's as the
proposers), from the text itself (prompt lookup: the tokens that followed the last n-gram's
latest earlier occurrence), or both; one forward verifies a whole draft.

One step, from the prediction x̂_t at the last read column t of a row (``targetlm.modules.heads``
has the index picture)::

    draft    d_0 = argmax logits(x̂_t)                       greedy's own token, known already:
                                                             the previous verification's g_k
             d_n = argmax logits(x̂_{t+n}),  n = 1..k         head n's output at column t only,
                   x̂_{t+n} = reconstruct(raw^n(h_t), x_t..x_{t+n−1})   made a target vector as in
                   the head ensemble: WDR heads add the conjugate of the words before y_{t+n},
                   the drafted d_0..d_{n−1} standing in for the unknown ones; heads that read no
                   words (simple, medusa) draft all k in one matrix product with the output layer
             or d_1..d_k = what followed the latest earlier occurrence of the row's last tokens
    verify   one forward of d_0..d_k: g_i = argmax logits(x̂ after d_i)
    accept   d_1..d_j while d_{i+1} = g_i (j ≤ k); emit d_0..d_j, and g_j is the next d_0

Only top-1 tokens are needed, so no softmax is computed anywhere: a draft is the argmax of its
logits. Heads over a window of columns (gloeckle, mtp) draft incrementally
(:mod:`targetlm.inference.drafters`: their own keys/values per row, trimmed like the body's),
the others by :func:`draft` at column t. Every emitted token is the one greedy decoding picks after the same prefix, so each
row's output is greedy decoding's.

Each row keeps its own accepted length j: the encoder's state is rewound per row
(:class:`~targetlm.modules.interfaces.RaggedEncoder`: the Transformer's ragged KV cache, or
the hf backbone's cache with each row's dropped tokens left as masked holes; rows at their
own positions), or, for an encoder that cannot rewind (the LSTM), the rows that kept the same
number of tokens re-read them from the saved state before the verification (one short
forward per distinct length; :class:`~targetlm.modules.interfaces.RowConcatenableEncoder`
puts the groups back together). An encoder that can do neither advances all rows by the
smallest accepted length among them. Rows that finish leave the batch (their state rows are
dropped).

While a draft would not fit into the encoder's ``max_context`` together with every row's
stream read so far (reading k + 1 tokens at once gives each the context it gets token by
token only then), a step verifies d_0 alone: a plain greedy step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

import torch

from targetlm import functional
from targetlm.inference.drafters import window_drafter
from targetlm.modules.heads import NgramHeads
from targetlm.modules.interfaces import (
    RaggedEncoder,
    RewindableEncoder,
    RowConcatenableEncoder,
    RowSelectableEncoder,
)
from targetlm.modules.model import LanguageModel

__all__ = [
    "DRAFTERS",
    "LOOKUP_TOKENS",
    "PromptLookup",
    "SpeculativeStats",
    "draft",
    "speculative_decode",
]

Drafter = Literal["heads", "lookup", "both"]
DRAFTERS: tuple[Drafter, ...] = ("heads", "lookup", "both")
LOOKUP_TOKENS = 4  # tokens prompt lookup drafts per step when no heads set the draft length


class Rows(Protocol):
    """Where the emitted tokens go (``generate._Continuations``): ``done[row]`` once it ended."""

    done: list[bool]

    def add(self, row: int, ids: Sequence[int]) -> None: ...


def draft(
    heads: NgramHeads,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    first: torch.Tensor,
    predicted: torch.Tensor,
    length: int,
    words: torch.Tensor | None = None,
) -> torch.Tensor:
    """Greedy drafts d_0..d_length (B, length + 1) from one column t: d_0 = ``first`` (B,),
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


class PromptLookup:
    """Prompt-lookup drafting (Saxena 2023; transformers' ``prompt_lookup_num_tokens``): a
    row's draft is what followed the latest earlier occurrence of its last n tokens (d_0
    included), the longest n ≤ ``max_ngram`` that occurred, down to ``min_ngram``.

    ``min_ngram`` is 2 where Saxena's code and transformers go down to a single token: a draft
    after one repeated token keeps fewer tokens than the wide verification it costs. On
    SmolLM2-135M (``benchmarks/lookup.py``: 12 prompts, batch 1, 10 drafted tokens) 2 was faster
    than 1 in every round (docs/benchmarks.md, "Prompt lookup: no draft from a single repeated
    token").

    An index per row maps every n-gram of its text to the position after its latest
    occurrence, updated as tokens are appended, so a proposal costs ``max_ngram`` look-ups.
    """

    def __init__(self, texts: Sequence[Sequence[int]], max_ngram: int = 3, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.texts = [list(t) for t in texts]
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in texts]
        for row in range(len(self.texts)):
            self._register(row, 1)

    def _register(self, row: int, start: int) -> None:
        """Index the n-grams that end before positions start..len − 1 (each has a next token)."""
        text, index = self.texts[row], self.index[row]
        for position in range(max(start, 1), len(text)):
            for n in range(1, min(self.max_ngram, position) + 1):
                index[tuple(text[position - n : position])] = position

    def append(self, row: int, tokens: Sequence[int]) -> None:
        start = len(self.texts[row])
        self.texts[row].extend(tokens)
        self._register(row, start)

    def propose(self, row: int, first: int, length: int) -> list[int]:
        """``length`` tokens to follow ``first`` in ``row`` ([] when nothing matches).

        A copy that reaches the end of the text goes on copying itself: the text is taken to
        keep repeating from the match, so a loop (which greedy text of small models often is)
        is drafted ``length`` tokens ahead, not only up to the end of its latest period."""
        text = self.texts[row] + [first]
        for n in range(min(self.max_ngram, len(text)), self.min_ngram - 1, -1):
            position = self.index[row].get(tuple(text[-n:]))
            if position is not None:
                proposal = text[position : position + length]
                while len(proposal) < length:  # position + j lies past the text: a drafted token
                    proposal.append(proposal[position + len(proposal) - len(text)])
                return proposal
        return []

    def select(self, rows: Sequence[int]) -> None:
        """Keep these rows only, in this order."""
        self.texts = [self.texts[r] for r in rows]
        self.index = [self.index[r] for r in rows]


class SpeculativeStats:
    """Counts of a decoding: ``steps`` verifications that checked drafts, ``row_steps`` the
    rows they covered, ``accepted`` the drafted tokens those rows kept."""

    def __init__(self) -> None:
        self.steps = self.row_steps = self.accepted = 0

    @property
    def acceptance(self) -> float | None:
        """Drafted tokens accepted per row and verification step (None: nothing drafted)."""
        return self.accepted / self.row_steps if self.row_steps else None


class Abilities:
    """What the encoder can do with a state, checked once per decoding (the protocols'
    ``isinstance`` checks cost tens of microseconds each)."""

    def __init__(self, encoder) -> None:
        self.ragged = isinstance(encoder, RaggedEncoder)  # rewinds each row on its own
        self.rewindable = isinstance(encoder, RewindableEncoder)
        self.selectable = isinstance(encoder, RowSelectableEncoder)
        self.regroupable = self.selectable and isinstance(encoder, RowConcatenableEncoder)
        self.per_row = self.ragged or self.regroupable  # every row keeps its own length


def per_row(model: LanguageModel) -> bool:
    """Whether every row keeps its own accepted length with this model's encoder."""
    return Abilities(model.encoder).per_row


@torch.no_grad()
def speculative_decode(
    model: LanguageModel,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    predicted: torch.Tensor,
    state,
    read: Sequence[int],
    rows: Rows,
    texts: Sequence[Sequence[int]],
    drafter: Drafter = "heads",
    draft_tokens: int | None = None,
    history: torch.Tensor | None = None,
) -> SpeculativeStats:
    """Generate until every row of ``rows`` is done, from the main x̂ ``predicted`` (B, d) at
    the last column each row read (``read[b]`` tokens in row b, their ids ``texts``) and
    ``state``.

    drafter: ``heads`` (the N-gram heads), ``lookup`` (prompt lookup) or ``both`` (lookup
    where the row's text has a match, the heads elsewhere). draft_tokens: drafted tokens per
    step (default: the heads' N − 1, or :data:`LOOKUP_TOKENS` for lookup alone; the heads
    draft at most N − 1). history: (B, P, d), the main x̂ of the last P columns every row
    read (ending with ``predicted``), for heads that attend over ``window`` columns (None:
    column t alone). Emits into ``rows`` and returns the counts.
    """
    encoder: Any = model.encoder  # what it can do: ``abilities``
    heads = model.heads
    use_heads = drafter in ("heads", "both")
    if use_heads and (heads is None or model.num_heads < 1):
        raise ValueError(f"drafter {drafter!r} drafts with the N-gram heads: the model has none")
    length = draft_tokens or (model.num_heads if use_heads else LOOKUP_TOKENS)
    if use_heads:
        length = min(length, model.num_heads)
    lookup = PromptLookup(texts) if drafter in ("lookup", "both") else None
    context = encoder.max_context
    abilities = Abilities(encoder)
    alive = list(range(predicted.size(0)))  # the generating rows, as rows of the batch
    lengths = list(read)  # tokens read per row
    first = functional.logits(predicted[:, None], weight, bias)[:, 0].argmax(-1)  # (B,) d_0
    # heads over columns draft incrementally (their own keys/values): from the last ≤ context
    # columns' x̂ and the words y read after all but the last
    windowed = None
    if use_heads and heads is not None and heads.window > 1:
        columns = predicted[:, None] if history is None else history[:, -heads.context :]
        known = columns.size(1) - 1  # (a row that ended before speculation began has fewer: zeros)
        words = torch.tensor(
            [[0] * max(known - len(t), 0) + (list(t[-known:]) if known else []) for t in texts],
            dtype=torch.long,
            device=predicted.device,
        ).view(len(texts), known)
        windowed = window_drafter(heads, weight, bias, columns, words, length)
    stats = SpeculativeStats()
    while alive:
        fits = context is None or max(lengths) + length + 1 <= context
        drafted = first[:, None]
        if fits and windowed is not None:
            drafted = windowed.propose(first)
        elif fits and use_heads and heads is not None:
            drafted = draft(heads, weight, bias, first, predicted, length)
        if fits and lookup is not None:
            drafted = _looked_up(lookup, drafted, length)
        verified = model(drafted, state, run_heads=False)
        greedy = functional.logits(verified.main, weight, bias).argmax(-1)  # (B, k + 1)
        agree = (greedy[:, :-1] == drafted[:, 1:]).cumprod(1).sum(1)  # (B,)
        if not abilities.per_row:
            active = torch.tensor([not rows.done[r] for r in alive], device=agree.device)
            agree = agree[active].min().expand_as(agree)
        keep = agree + 1  # tokens each row keeps: d_0..d_j
        # the one read-back of the step: each row's kept count and drafted tokens
        host = torch.cat([keep[:, None], drafted], 1).tolist()
        kept = [h[0] for h in host]
        state = _kept_state(model, state, verified.state, drafted, keep, kept, abilities)
        if all(k == kept[0] for k in kept):  # (always at batch 1) a column of each
            predicted, first = verified.main[:, kept[0] - 1], greedy[:, kept[0] - 1]
        else:
            batch = torch.arange(len(alive), device=keep.device)
            predicted, first = verified.main[batch, keep - 1], greedy[batch, keep - 1]
        if windowed is not None:
            windowed.advance(verified.main, drafted, keep, kept, predicted)
        if drafted.size(1) > 1:
            stats.steps += 1
            stats.row_steps += len(alive)
            stats.accepted += sum(kept) - len(kept)
        for b, (row, tokens) in enumerate(zip(alive, host)):
            lengths[b] += tokens[0]
            rows.add(row, tokens[1 : 1 + tokens[0]])
            if lookup is not None:
                lookup.append(b, tokens[1 : 1 + tokens[0]])
        staying = [b for b, row in enumerate(alive) if not rows.done[row]]
        if len(staying) == len(alive) or not abilities.selectable:
            if not staying:
                break
            continue
        if not staying:
            break
        index = torch.tensor(staying, device=predicted.device)
        state = encoder.select_rows(state, index)
        predicted, first = predicted[index], first[index]
        lengths = [lengths[b] for b in staying]
        if windowed is not None:
            windowed.select(index)
        alive = [alive[b] for b in staying]
        if lookup is not None:
            lookup.select(staying)
    return stats


def _looked_up(lookup: PromptLookup, drafted: torch.Tensor, length: int) -> torch.Tensor:
    """``drafted`` (B, 1 + k: d_0 and the heads' drafts, or d_0 alone) with each row's prompt
    lookup proposal in place of the heads' where it has one; without heads, the rows'
    proposals padded with their last token to the longest (d_0 alone when none has one)."""
    first = drafted[:, 0].tolist()
    proposals = [lookup.propose(b, token, length) for b, token in enumerate(first)]
    if drafted.size(1) > 1:  # the heads drafted: lookup replaces them where it matched
        drafted = drafted.clone()
        for b, proposal in enumerate(proposals):
            if proposal:
                drafted[b, 1 : 1 + len(proposal)] = torch.tensor(proposal)
        return drafted
    longest = max(len(p) for p in proposals)
    if longest == 0:
        return drafted
    rows = [[t, *p] + [(p or [t])[-1]] * (longest - len(p)) for t, p in zip(first, proposals)]
    return torch.tensor(rows, device=drafted.device)


def _kept_state(
    model: LanguageModel,
    before,
    after,
    drafted: torch.Tensor,
    keep: torch.Tensor,
    kept: Sequence[int],
    abilities: Abilities,
):
    """The state after each row read its first ``keep[b]`` drafted tokens (B, k + 1) from
    ``before`` (``kept``: the same counts, as ints): ``after`` (which read all of them) rewound
    per row, or re-read; with one ``keep`` for all rows (an encoder without rows of their own
    lengths) the encoder's :meth:`rewind` or a re-read."""
    width = drafted.size(1)
    if all(k == width for k in kept):
        return after
    dropped = width - keep  # (B,)
    encoder: Any = model.encoder  # what it can do: ``abilities``
    if not abilities.per_row:
        n = width - kept[0]
        if abilities.rewindable:
            state = encoder.rewind(after, n)
            if state is not None:
                return state
        return model(drafted[:, : drafted.size(1) - n], before, run_heads=False).state
    if abilities.ragged:
        state = encoder.rewind_rows(after, dropped.to(drafted.device))
        if state is not None:
            return state
    # the rows that keep the same number of tokens re-read them from the saved state
    if not abilities.regroupable:
        raise ValueError(
            f"{type(encoder).__name__}: rows that keep different numbers of drafted tokens are "
            "re-read in groups, which needs states whose rows can be selected and concatenated"
        )
    parts, order = [], []
    for count in sorted(set(kept)):
        index = torch.nonzero(keep == count).squeeze(1).to(drafted.device)
        if count == width:
            parts.append(encoder.select_rows(after, index))
        else:
            part = encoder.select_rows(before, index)
            parts.append(model(drafted[index, :count], part, run_heads=False).state)
        order.append(index)
    inverse = torch.argsort(torch.cat(order))
    return encoder.select_rows(encoder.concat_rows(parts), inverse)
