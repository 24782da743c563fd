r"""Cutting a token stream into batches.

Recurrent encoders read **BPTT streams**: the corpus (with one ``<eos>`` put in
front, so the first word is predicted too) is cut into ``B`` contiguous rows that
overlap by one token, so every token is a target exactly once::

    stream    # a b c d e f g h i j k l m        (# = <eos>: 14 tokens, 13 targets, B = 3)
    row 0     inputs # a b c d    targets a b c d e
    row 1     inputs e f g h i    targets f g h i j
    row 2     inputs j k l . .    targets k l m . .    (. = padding, evaluation only)

Then each row is read ``T`` columns at a time (``T`` = BPTT length); the encoder's
state after a segment is detached and carried into the next one, which is what
makes a row one long sequence::

    segment 0 | segment 1 | segment 2 ...      x = inputs[:, i:i+T], y = targets[:, i:i+T]

For training the remainder that does not fill all rows is dropped; for evaluation
short rows are padded (targets ``IGNORE``) so every token is scored once.
Objectives that also predict later words (N-gram heads) ask for a ``lookahead``: each
segment's targets then run ``lookahead`` columns further along the row (``IGNORE`` past
the stream), so the last positions of a segment, and of a row, keep their targets
t+1..t+lookahead::

    lookahead 2, T = 3    x = inputs[:, i:i+3],  y = targets[:, i:i+3+2]
Transformers use the same segments as fixed-length blocks, optionally shuffled,
and do not carry state in training (``train.carry_state = false``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, overload

import torch

from targetlm.data.vocab import DataError

IGNORE = -100  # target id of padding; skipped by every loss


class StreamBatches:
    """A token stream as ``B`` parallel rows read ``segment`` tokens at a time.

    Args:
        ids: (N,) token ids, starting with the context token (``<eos>``).
        batch_size: number of rows B.
        segment: tokens per step T.
        pad: pad short rows (evaluation) instead of dropping the remainder (training).
        pad_id: input id used for padded positions (never a target).
        lookahead: extra target columns per segment, (B, T + lookahead).
    """

    def __init__(
        self,
        ids: torch.Tensor,
        batch_size: int,
        segment: int,
        pad: bool,
        pad_id: int = 0,
        lookahead: int = 0,
    ):
        targets_total = ids.numel() - 1
        if targets_total < 1:
            raise DataError("a stream needs at least two tokens (is a split empty?)")
        if pad:
            length = math.ceil(targets_total / batch_size)
        else:
            length = targets_total // batch_size
            if length == 0:
                raise DataError(
                    f"{targets_total} training tokens are too few for data.batch_size = {batch_size}"
                )
        inputs = torch.full((batch_size, length), pad_id, dtype=torch.long)
        # targets run `lookahead` columns past the row: the next row continues the stream there
        targets = torch.full((batch_size, length + lookahead), IGNORE, dtype=torch.long)
        for row in range(batch_size):
            start = row * length
            stop = min(start + length, targets_total)
            if stop <= start:
                break
            inputs[row, : stop - start] = ids[start:stop]
            reach = min(start + length + lookahead, targets_total)
            targets[row, : reach - start] = ids[start + 1 : reach + 1]
        self.inputs = inputs  # (B, L)
        self.targets = targets[:, :length]  # (B, L): the positions this stream scores
        self._extended = targets  # (B, L + lookahead)
        self.segment = segment
        self.lookahead = lookahead
        self.num_targets = int((self.targets != IGNORE).sum())

    def __len__(self) -> int:
        return math.ceil(self.inputs.size(1) / self.segment)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment ``index``: inputs (B, T) and targets (B, T + lookahead)."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.segment
        stop = min(start + self.segment, self.inputs.size(1))
        return self.inputs[:, start:stop], self._extended[:, start : stop + self.lookahead]

    def __iter__(self):
        for index in range(len(self)):
            yield self[index]


def with_context_token(ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Put one ``<eos>`` in front of a split so its first word is predicted as a sentence start."""
    return torch.cat([torch.tensor([eos_id], dtype=torch.long), ids])


@dataclass(frozen=True)
class Batch:
    """One step's data.

    inputs: (B, T) what the model reads.
    targets: (B, T + lookahead) the target of each of the T columns, then ``lookahead`` more
        columns (the N-gram heads' later words); ``IGNORE`` marks padding.
    positions: (B, T) the index of each column's target in the text (evaluation, per-token
        output), ``IGNORE`` for padding; None when not asked for.
    source: (B, S) the source sentences a conditional task reads (translation), padded;
        None for language modelling. source_mask: (B, S) bool, True at real source tokens.
    part: (first row, rows of the whole batch) when these B rows are one process's share of
        a larger batch (several processes); None: the whole batch. A task that draws
        randomness per row (diffusion) draws the whole batch's and keeps these rows, so
        each row gets what it gets in one process.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor | None = None
    source: torch.Tensor | None = None
    source_mask: torch.Tensor | None = None
    part: tuple[int, int] | None = None

    @property
    def whole_rows(self) -> int:
        """The rows of the whole batch these rows belong to."""
        return self.inputs.size(0) if self.part is None else self.part[1]

    def of_whole(self, drawn: torch.Tensor) -> torch.Tensor:
        """This batch's rows of ``drawn`` (``whole_rows``, ...), one row per row of the whole
        batch: all of it when the batch is whole."""
        if self.part is None:
            return drawn
        first = self.part[0]
        return drawn[first : first + self.inputs.size(0)]

    def to(self, device: torch.device | str) -> Batch:
        def move(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        return Batch(
            self.inputs.to(device),
            self.targets.to(device),
            move(self.positions),
            move(self.source),
            move(self.source_mask),
            self.part,
        )


def pad(rows: Sequence[torch.Tensor], value: int) -> torch.Tensor:
    """Right-padded (len(rows), max length) tensor."""
    return torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True, padding_value=value)


B = TypeVar("B", bound=Batch)


class BatchList(Sequence[B], Generic[B]):
    """A sequence of batches made when read: a subclass gives ``len`` and :meth:`_batch`
    (one index, as given); a slice reads each of its indices."""

    def _batch(self, index: int) -> B:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> B: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[B]: ...
    def __getitem__(self, index: int | slice) -> B | Sequence[B]:
        if isinstance(index, slice):
            return [self._batch(i) for i in range(*index.indices(len(self)))]
        return self._batch(index)


class StreamBatchSequence(BatchList[Batch]):
    """The segments of a :class:`~targetlm.data.batching.StreamBatches` stream as :class:`Batch` es.

    Args:
        targets: the stream of ``ids`` (its inputs are read unless ``inputs`` is given).
        inputs: the same layout over the ids the model reads, or None.
        positions: the same layout over text positions (its targets are the indices), or None.
    """

    def __init__(
        self,
        targets: StreamBatches,
        inputs: StreamBatches | None = None,
        positions: StreamBatches | None = None,
    ) -> None:
        self.stream = targets
        self.inputs = inputs
        self.positions = positions

    @property
    def num_targets(self) -> int:
        return self.stream.num_targets

    def __len__(self) -> int:
        return len(self.stream)

    def _batch(self, index: int) -> Batch:
        inputs, targets = self.stream[index]
        if self.inputs is not None:
            inputs = self.inputs[index][0]
        positions = None
        if self.positions is not None:
            positions = self.positions[index][1][:, : inputs.size(1)]
        return Batch(inputs, targets, positions)


def stream_batches(
    ids: torch.Tensor,
    batch_size: int,
    segment: int,
    *,
    train: bool,
    lookahead: int = 0,
    input_ids: torch.Tensor | None = None,
    positions: bool = False,
) -> StreamBatchSequence:
    """The language-modelling batches of a token stream ``ids`` (N + 1,), the context token
    first (see the module; the ``lm`` task's :meth:`batches`)."""

    def stream(values: torch.Tensor, extra: int = 0) -> StreamBatches:
        return StreamBatches(values, batch_size, segment, pad=not train, lookahead=extra)

    return StreamBatchSequence(
        stream(ids, lookahead),
        None if input_ids is None else stream(input_ids),
        stream(torch.arange(len(ids))) if positions else None,
    )
