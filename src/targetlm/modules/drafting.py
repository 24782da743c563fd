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
them (``tests/test_layering.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = ["DraftStart", "Drafter", "Verified"]


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
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    texts: Sequence[Sequence[int]]
    columns: torch.Tensor
    length: int | None = None
    model: Any = None


@dataclass
class Verified:
    """What one verification step gives a drafter (B rows, the batch before any row leaves).

    drafted: (B, 1 + k) long, the tokens the verification read: d_0..d_k of this step's
        proposal (k = 0: a step without drafts, when the drafts would not fit into the
        encoder's context; :meth:`Drafter.propose` was then not called).
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

        drafted = drafter.propose(first)   # unless the drafts would not fit the context
        ...verify, accept...
        drafter.accept(verified)           # every step, whether propose was called or not
        drafter.select(rows)               # when rows left the batch (finished)

    ``length``: the most tokens :meth:`propose` drafts after d_0 (k); the loop checks that
    1 + length columns fit the encoder's context before it asks for a proposal.

    :meth:`propose` ``first`` (B,) long: each row's d_0. Returns (B, 1 + j) long on the same
    device, 0 ≤ j ≤ ``length``, column 0 being ``first``: the drafts of every row (a row with
    fewer than j drafts pads its own, e.g. by repeating its last token: a wrong draft costs
    verification width, never a wrong output). j = 0 (``first[:, None]``): nothing drafted,
    the step is a plain greedy step. Every proposal is verified and followed by
    :meth:`accept` of that step.

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
