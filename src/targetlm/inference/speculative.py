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
logits. What drafts is a :class:`~targetlm.modules.drafting.Drafter` (its contract is there):
prompt lookup, the heads' own drafter (``heads.drafter``: heads over a window of columns,
gloeckle and mtp, draft incrementally with their own keys/values per row, trimmed like the
body's; the others by ``modules.drafting.draft`` at column t) or both
(``inference.drafters``). The loop runs the phases draft, verify, accept and rewind, and never
asks what drafts. Every emitted token is the one greedy decoding picks after the same prefix,
so each row's output is greedy decoding's.

Each row keeps its own accepted length j: the encoder's state is rewound per row
(:class:`~targetlm.modules.interfaces.RaggedEncoder`: the Transformer's ragged KV cache, or
the hf backbone's cache with each row's dropped tokens left as masked holes; rows at their
own positions), or, for an encoder that cannot rewind (the LSTM), the rows that kept the same
number of tokens re-read them from the saved state before the verification (one short
forward per distinct length; :class:`~targetlm.modules.interfaces.RowConcatenableEncoder`
puts the groups back together). An encoder that can do neither advances all rows by the
smallest accepted length among them. Rows that finish leave the batch (their state rows are
dropped).

A draft is cut to what fits into the encoder's ``max_context`` together with every row's
stream read so far (reading k + 1 tokens at once gives each the context it gets token by
token only then); where nothing fits, a step verifies d_0 alone: a plain greedy step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from targetlm import functional
from targetlm.modules.drafting import Drafter, Verified
from targetlm.modules.interfaces import (
    RaggedEncoder,
    RewindableEncoder,
    RowConcatenableEncoder,
    RowSelectableEncoder,
)
from targetlm.modules.model import LanguageModel

__all__ = ["SpeculativeStats", "per_row", "speculative_decode"]


class Rows(Protocol):
    """Where the emitted tokens go (``generate._Continuations``): ``done[row]`` once it ended."""

    done: list[bool]

    def add(self, row: int, ids: Sequence[int]) -> None: ...


class SpeculativeStats:
    """Counts of a decoding: ``forwards`` the body's forwards (verifications, with or without
    a draft), ``steps`` the verifications that checked drafts, ``row_steps`` the
    rows they covered, ``accepted`` the drafted tokens those rows kept, ``accepted_at[i]`` the
    row-steps that kept draft i + 1 (and every one before it); ``draft_seconds`` and
    ``verify_seconds`` the wall time of the drafter's proposals and of the verifications
    (the forward, its argmaxes and the read-back of what each row kept)."""

    def __init__(self) -> None:
        self.forwards = self.steps = self.row_steps = self.accepted = 0
        self.accepted_at: list[int] = []
        self.draft_seconds = self.verify_seconds = 0.0

    @property
    def acceptance(self) -> float | None:
        """Drafted tokens accepted per row and verification step (None: nothing drafted)."""
        return self.accepted / self.row_steps if self.row_steps else None

    def add(self, other: SpeculativeStats) -> None:
        """Add the counts and timings of another decoding (e.g. a benchmark's batches)."""
        self.forwards += other.forwards
        self.steps += other.steps
        self.row_steps += other.row_steps
        self.accepted += other.accepted
        self.draft_seconds += other.draft_seconds
        self.verify_seconds += other.verify_seconds
        self.accepted_at += [0] * (len(other.accepted_at) - len(self.accepted_at))
        for i, count in enumerate(other.accepted_at):
            self.accepted_at[i] += count

    def record(self, verified: Verified) -> None:
        """Count one verification."""
        self.forwards += 1
        if verified.drafted.size(1) == 1:
            return
        self.steps += 1
        self.row_steps += len(verified.kept)
        self.accepted += sum(verified.kept) - len(verified.kept)
        width = verified.drafted.size(1) - 1
        self.accepted_at += [0] * (width - len(self.accepted_at))
        for kept in verified.kept:
            for i in range(kept - 1):
                self.accepted_at[i] += 1


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
    drafter: Drafter,
) -> SpeculativeStats:
    """Generate until every row of ``rows`` is done, from the main x̂ ``predicted`` (B, d) at
    the last column each row read (``read[b]`` tokens in row b) and ``state``, with the drafts
    of ``drafter`` (built for these rows). ``weight`` (V, d) and ``bias`` (V,): the output
    layer's. Emits into ``rows`` and returns the counts."""
    encoder: Any = model.encoder  # what it can do: ``abilities``
    abilities = Abilities(encoder)
    alive = list(range(predicted.size(0)))  # the generating rows, as rows of the batch
    lengths = list(read)  # tokens read per row
    first = functional.logits(predicted[:, None], weight, bias)[:, 0].argmax(-1)  # (B,) d_0
    stats = SpeculativeStats()
    while alive:
        room = _room(encoder.max_context, lengths, drafter.length)
        drafted = _draft(drafter, first, room, stats)
        started = time.perf_counter()
        prediction = model(drafted, state, run_heads=False)  # verify
        verified = _accept(prediction, drafted, weight, bias, abilities, rows, alive)
        stats.verify_seconds += time.perf_counter() - started
        state = _kept_state(model, state, prediction.state, drafted, verified, abilities)
        drafter.accept(verified)
        stats.record(verified)
        predicted, first = verified.predicted, verified.first
        for b, (row, tokens) in enumerate(zip(alive, verified.tokens)):
            lengths[b] += len(tokens)
            rows.add(row, tokens)
        staying = [b for b, row in enumerate(alive) if not rows.done[row]]
        if not staying:
            break
        if len(staying) < len(alive) and abilities.selectable:  # finished rows leave
            index = torch.tensor(staying, device=predicted.device)
            state = encoder.select_rows(state, index)
            predicted, first = predicted[index], first[index]
            drafter.select(index)
            lengths = [lengths[b] for b in staying]
            alive = [alive[b] for b in staying]
    return stats


def _room(context: int | None, lengths: Sequence[int], length: int) -> int:
    """How many drafted tokens after d_0 fit into the encoder's ``context`` with every row's
    stream read so far, at most ``length`` (0: the step verifies d_0 alone, a greedy step)."""
    if context is None:
        return length
    return max(0, min(length, context - max(lengths) - 1))


def _draft(
    drafter: Drafter, first: torch.Tensor, room: int, stats: SpeculativeStats
) -> torch.Tensor:
    """The draft phase: d_0..d_k (B, 1 + k), k ≤ ``room`` (the drafter's proposal cut to the
    room left in the context), or d_0 alone (B, 1) where no draft fits."""
    if room == 0:
        return first[:, None]
    started = time.perf_counter()
    drafted = drafter.propose(first)[:, : 1 + room]
    stats.draft_seconds += time.perf_counter() - started
    return drafted


def _accept(
    prediction,
    drafted: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    abilities: Abilities,
    rows: Rows,
    alive: Sequence[int],
) -> Verified:
    """The accept phase: row b keeps d_0..d_j while d_{i+1} = g_i, greedy's token after d_i
    (every row the smallest j of the rows still generating where the encoder cannot keep rows
    of their own lengths); its last kept column's x̂ and g_j start the next step."""
    greedy = functional.logits(prediction.main, weight, bias).argmax(-1)  # (B, k + 1)
    agree = (greedy[:, :-1] == drafted[:, 1:]).cumprod(1).sum(1)  # (B,)
    if not abilities.per_row:
        active = torch.tensor([not rows.done[r] for r in alive], device=agree.device)
        agree = agree[active].min().expand_as(agree)
    keep = agree + 1  # tokens each row keeps: d_0..d_j
    # the one read-back of the step: each row's kept count and drafted tokens
    host = torch.cat([keep[:, None], drafted], 1).tolist()
    kept = [h[0] for h in host]
    main = prediction.main
    if all(k == kept[0] for k in kept):  # (always at batch 1) a column of each
        predicted, first = main[:, kept[0] - 1], greedy[:, kept[0] - 1]
    else:
        batch = torch.arange(len(kept), device=keep.device)
        predicted, first = main[batch, keep - 1], greedy[batch, keep - 1]
    tokens = [h[1 : 1 + h[0]] for h in host]
    return Verified(drafted, main, keep, kept, tokens, predicted, first, prediction)


def _kept_state(
    model: LanguageModel,
    before,
    after,
    drafted: torch.Tensor,
    verified: Verified,
    abilities: Abilities,
):
    """The rewind phase: the state after each row read its first ``keep[b]`` drafted tokens
    (B, k + 1) from ``before``: ``after`` (which read all of them) rewound per row, or re-read;
    with one ``keep`` for all rows (an encoder without rows of their own lengths) the
    encoder's :meth:`rewind` or a re-read."""
    keep, kept = verified.keep, verified.kept
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
