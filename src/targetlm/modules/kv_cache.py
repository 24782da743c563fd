"""The KV cache of :class:`~targetlm.modules.encoders.CausalTransformer`: its states and what
is done to them without the model.

In eval mode, while the window has not slid, a transformer's state is
:data:`TransformerState`, ``(window, keys_values)``: the window's inputs (B, P, input_size)
and every layer's keys and values of its positions, each (B, heads, P, d/heads). Rows of
different lengths (speculative decoding keeps each row's accepted drafts) are a
:class:`RaggedState`, which holds per-row lengths: a row's new keys and values are written
after its last token (:func:`write_columns`, in place where the state has room) and the keys
past it are masked. :func:`rewind`, :func:`rewind_rows`, :func:`select_rows` and
:func:`concat_rows` are the encoder's methods of the same names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import torch
import torch.nn.functional as F

KeyValue = tuple[torch.Tensor, torch.Tensor]  # keys and values, each (B, heads, L, d/heads)
TransformerState = tuple[torch.Tensor, tuple[KeyValue, ...]]  # (window inputs, per-layer cache)


@dataclass
class RaggedState:
    """A :class:`CausalTransformer` state whose rows hold different numbers of tokens: row b's
    window is its first ``lengths[b]`` inputs (and, when cached, keys and values); what lies
    after them is padding or dropped drafts, never attended to.

    inputs: (B, L, input_size); lengths: (B,) long, each ≥ 1; keys_values: per layer keys and
    values, each (B, heads, L', d/heads) with L' ≥ every length, or None (the next read
    recomputes every row's window).
    """

    inputs: torch.Tensor
    lengths: torch.Tensor
    keys_values: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None


def as_ragged(state) -> RaggedState | None:
    """Any transformer state as a :class:`RaggedState` (None: no tokens read yet)."""
    if state is None or isinstance(state, RaggedState):
        return state
    past, cache = split_state(state)
    lengths = torch.full((past.size(0),), past.size(1), dtype=torch.long, device=past.device)
    return RaggedState(past, lengths, cache)


def write_columns(
    cache: torch.Tensor,
    new: torch.Tensor,
    columns: torch.Tensor | int,
    width: int,
    dim: int = 1,
    room: int | None = None,
) -> torch.Tensor:
    """``cache`` (rows first, positions on ``dim``) with row b's ``new`` positions (T of them,
    on the same ``dim``) written at ``columns[b]`` ((B, T) long), or, an int, at every row's
    positions ``columns``..``columns + T − 1``.

    ``room`` None: a copy cut or padded to ``width`` positions. ``room`` (the most positions a
    state holds): written in place when ``cache`` holds ``width`` positions already (only
    positions at or after a row's length change: padding or dropped drafts, which no state
    reads), else a copy with room to grow (twice the positions, at most ``room``, at least
    ``width``); without autograd only (a tensor that needs gradients is copied)."""
    in_place = (
        room is not None
        and cache.size(dim) >= width
        and not (torch.is_grad_enabled() and (cache.requires_grad or new.requires_grad))
    )
    if in_place:
        out = cache
    else:
        shape = list(cache.shape)
        if room is not None:
            width = max(width, min(room, 2 * cache.size(dim)))
        shape[dim] = width
        out = cache.new_zeros(shape)
        kept = min(width, cache.size(dim))
        out.narrow(dim, 0, kept).copy_(cache.narrow(dim, 0, kept))
    if isinstance(columns, int):
        out.narrow(dim, columns, new.size(dim)).copy_(new)
        return out
    view = [columns.size(0)] + [1] * (new.dim() - 1)
    view[dim] = columns.size(1)
    out.scatter_(dim, columns.view(view).expand_as(new), new.to(out.dtype))
    return out


@overload
def split_state(state: torch.Tensor) -> tuple[torch.Tensor, None]: ...


@overload
def split_state(state: TransformerState) -> tuple[torch.Tensor, tuple[KeyValue, ...]]: ...


def split_state(
    state: torch.Tensor | TransformerState | RaggedState,
) -> tuple[torch.Tensor, tuple[KeyValue, ...] | None]:
    """A transformer state as (window inputs (B, P, input_size), per-layer keys and values or
    None); a checkpointed state comes back as lists (``state_to_list``)."""
    if isinstance(state, torch.Tensor):
        return state, None
    if isinstance(state, RaggedState):
        raise ValueError("a state with rows of different lengths has no common window")
    past, cache = state
    return past, tuple((k, v) for k, v in cache)


def rewind(state: torch.Tensor | TransformerState | None, n: int) -> TransformerState | None:
    """The state as if its last ``n`` tokens had not been read, or None where that is
    unknown: only a cached state (eval mode, window not slid) holding more than ``n``
    tokens keeps what reading fewer tokens would have given (the same window start)."""
    if state is None:
        return None
    past, cache = split_state(state)
    if cache is None or not 0 <= n < past.size(1):
        return None
    if n == 0:
        return past, cache
    return past[:, :-n], tuple((k[:, :, :-n], v[:, :, :-n]) for k, v in cache)


def rewind_rows(
    state: torch.Tensor | TransformerState | RaggedState | None, counts: torch.Tensor
) -> RaggedState | None:
    """The state as if row b had not read its last ``counts[b]`` tokens ((B,) long), or
    None where that is unknown (no cached keys and values, or more tokens than a row
    holds). Only the lengths change: the dropped keys and values stay, masked."""
    ragged = as_ragged(state)
    if ragged is None or ragged.keys_values is None:
        return None
    lengths = ragged.lengths - counts.to(ragged.lengths)
    if bool((lengths < 1).any()):
        return None
    return RaggedState(ragged.inputs, lengths, ragged.keys_values)


def select_rows(
    state: torch.Tensor | TransformerState | RaggedState | None, rows: torch.Tensor
) -> torch.Tensor | TransformerState | RaggedState | None:
    """The state of batch rows ``rows`` (B',) only, in that order."""
    if state is None or isinstance(state, torch.Tensor):
        return None if state is None else state[rows]
    if isinstance(state, RaggedState):
        cache = state.keys_values
        return RaggedState(
            state.inputs[rows],
            state.lengths[rows],
            None if cache is None else tuple((k[rows], v[rows]) for k, v in cache),
        )
    past, cache = split_state(state)
    return past[rows], tuple((k[rows], v[rows]) for k, v in cache)


def concat_rows(states: Sequence) -> RaggedState:
    """One state whose rows are those of ``states`` one after the other (a
    :class:`RaggedState`; cached keys and values only if every part has them)."""
    parts: list[RaggedState] = []
    for s in states:
        part = as_ragged(s)
        if part is None:
            raise ValueError("concat_rows: a state of no tokens has no rows")
        parts.append(part)
    width = max(p.inputs.size(1) for p in parts)
    inputs = torch.cat([F.pad(p.inputs, (0, 0, 0, width - p.inputs.size(1))) for p in parts])
    lengths = torch.cat([p.lengths for p in parts])
    caches = [p.keys_values for p in parts if p.keys_values is not None]
    if len(caches) < len(parts):
        return RaggedState(inputs, lengths, None)
    cache: list[KeyValue] = []
    for layer in range(len(caches[0])):
        pairs = [part_cache[layer] for part_cache in caches]
        keys, values = (
            torch.cat([F.pad(kv[i], (0, 0, 0, width - kv[i].size(2))) for kv in pairs])
            for i in (0, 1)
        )
        cache.append((keys, values))
    return RaggedState(inputs, lengths, tuple(cache))
