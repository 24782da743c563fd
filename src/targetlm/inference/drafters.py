"""The drafters speculative decoding chooses from: prompt lookup, a model's heads, both.

Each is a :class:`~targetlm.modules.drafting.Drafter` (the interface, and the heads' own
drafters, live in ``targetlm.modules.drafting``): :func:`build_drafter` makes the one a
:data:`Speculation` names, so the decoding loop never asks what drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, get_args

import torch

from targetlm.modules.drafting import Drafter, DraftStart, Verified

__all__ = [
    "HEADS_BREAK_EVEN",
    "LOOKUP_TOKENS",
    "SPECULATIONS",
    "CombinedDrafter",
    "LookupDrafter",
    "PromptLookup",
    "Speculation",
    "build_drafter",
]

Speculation = Literal["heads", "lookup", "both"]
"""What drafts: the model's heads, prompt lookup, or lookup where it matches and the heads
elsewhere (:class:`CombinedDrafter`)."""
SPECULATIONS: tuple[Speculation, ...] = get_args(Speculation)

# Tokens prompt lookup drafts per step. 10 was the fastest on SmolLM2-135M (benchmarks/lookup.py:
# 1.62× greedy at 10 against 1.41× at 4, batch 1, one thread): a wrong draft costs only the
# verification's width, and a copy that holds is kept whole.
LOOKUP_TOKENS = 10

# Drafted tokens the heads must have had accepted per step (the mean over their steps) to go on
# drafting where lookup finds no match: below it, the wider verification and the heads' own
# forward cost more than the tokens they add (Medusa heads on SmolLM2-135M: 0.8 on one CPU
# thread, docs/benchmarks.md). Judged after HEADS_TRIAL of their row-steps.
HEADS_BREAK_EVEN = 0.8
HEADS_TRIAL = 32


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


def _padded(rows: list[list[int]], device: Any) -> torch.Tensor:
    """Drafts of different lengths (each row d_0 first) as one (B, longest) tensor, each row
    padded with its own last token (a wrong draft costs width, never a wrong output)."""
    longest = max(len(r) for r in rows)
    return torch.tensor([r + [r[-1]] * (longest - len(r)) for r in rows], device=device)


class LookupDrafter:
    """Prompt lookup as a :class:`~targetlm.modules.drafting.Drafter`: each row's text (its
    :class:`PromptLookup` index) grows by the tokens it keeps; ``length`` tokens a proposal.
    ``lookup`` builds the index (tests and benchmarks vary its n-gram bounds)."""

    def __init__(self, texts: Sequence[Sequence[int]], length: int | None = None, lookup=None):
        self.length = LOOKUP_TOKENS if length is None else length
        self.lookup = (lookup or PromptLookup)(texts)

    def proposals(self, first: torch.Tensor) -> list[list[int]]:
        """Each row's looked-up tokens after its d_0 ([] where nothing matches)."""
        return [
            self.lookup.propose(b, token, self.length) for b, token in enumerate(first.tolist())
        ]

    def propose(self, first: torch.Tensor) -> torch.Tensor:
        proposals = self.proposals(first)
        if not any(proposals):
            return first[:, None]
        return _padded([[t, *p] for t, p in zip(first.tolist(), proposals)], first.device)

    def accept(self, verified: Verified) -> None:
        for b, tokens in enumerate(verified.tokens):
            self.lookup.append(b, tokens)

    def select(self, rows: torch.Tensor) -> None:
        self.lookup.select(rows.tolist())


class CombinedDrafter:
    """Prompt lookup where a row's text has a match, the heads where it has none, so that the
    combination does no worse than the better of the two on the same prompt:

    - where lookup matches, its draft (up to ``lookup.length`` tokens copied from the text,
      free to make and, on the copies that greedy text is full of, accepted longer than heads
      draft: 1.62× greedy for lookup against 0.51–0.70× for trained Medusa-style heads on
      SmolLM2-135M) is the one lookup alone would verify, and the heads are not run for it;
    - where it finds none, lookup alone verifies d_0 by itself (a plain greedy step), and the
      heads' draft can only add tokens, at the price of their forward and a wider
      verification. That price is paid back when the heads' drafts are accepted often enough:
      after their first :data:`HEADS_TRIAL` row-steps, the heads draft on only while their
      mean accepted length per step is at least :data:`HEADS_BREAK_EVEN`; below it they are
      dropped for the rest of the decoding (and their drafter no longer follows the rows), and
      the combination is lookup alone.

    The longer draft of the two (rather than lookup first) would verify the heads' guesses
    where a copy is at hand, and a copy's draft is already the longer one wherever it exists.
    """

    def __init__(
        self,
        lookup: LookupDrafter,
        heads: Drafter,
        break_even: float = HEADS_BREAK_EVEN,
        trial: int = HEADS_TRIAL,
    ) -> None:
        self.lookup = lookup
        self.heads: Drafter | None = heads  # None once they no longer pay
        self.length = max(lookup.length, heads.length)
        self.break_even, self.trial = break_even, trial
        self.heads_steps = self.heads_accepted = 0  # the heads' row-steps, their kept drafts
        self.by_heads: list[bool] = []  # the rows the heads drafted in the last proposal

    @property
    def heads_pay(self) -> bool:
        """Whether the heads go on drafting: during their trial, then while they pay."""
        steps = self.heads_steps
        return steps < self.trial or self.heads_accepted >= self.break_even * steps

    def propose(self, first: torch.Tensor) -> torch.Tensor:
        proposals = self.lookup.proposals(first)
        ids = first.tolist()
        rows = [[t, *p] for t, p in zip(ids, proposals)]
        self.by_heads = [False] * len(rows)
        if self.heads is not None and not all(proposals):
            drafted = self.heads.propose(first).tolist()
            for b, proposal in enumerate(proposals):
                if not proposal and len(drafted[b]) > 1:
                    rows[b], self.by_heads[b] = drafted[b], True
        if all(len(r) == 1 for r in rows):
            return first[:, None]
        return _padded(rows, first.device)

    def accept(self, verified: Verified) -> None:
        self.lookup.accept(verified)
        if self.heads is None:
            return
        for b, by_heads in enumerate(self.by_heads):
            if by_heads:
                self.heads_steps += 1
                self.heads_accepted += verified.kept[b] - 1
        self.by_heads = []
        if not self.heads_pay:
            self.heads = None  # lookup alone from here on
            return
        self.heads.accept(verified)

    def select(self, rows: torch.Tensor) -> None:
        self.lookup.select(rows)
        if self.heads is not None:
            self.heads.select(rows)


def build_drafter(speculation: Speculation, start: DraftStart) -> Drafter:
    """The drafter ``speculation`` names, for the rows ``start`` describes (``start.model``:
    the model whose heads draft; ``start.length``: tokens a step, None for each drafter's
    default: N − 1 for heads, :data:`LOOKUP_TOKENS` for lookup)."""
    if speculation == "lookup":
        return LookupDrafter(start.texts, start.length)
    heads = start.model.heads
    if heads is None or not heads.drafts or start.model.num_heads < 1:
        raise ValueError(f"speculation {speculation!r} drafts with the heads: the model has none")
    if speculation == "heads":
        return heads.drafter(start)
    lookup = LookupDrafter(start.texts, start.length)
    width = 1 + max(lookup.length, start.length or start.model.num_heads)
    return CombinedDrafter(lookup, heads.drafter(replace(start, width=width)))
