"""``lm``: one causal stream of tokens (BPTT streams for recurrent encoders, blocks for
Transformers, every token scored once in evaluation; ``targetlm.data.batching``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import torch

from targetlm.data.batching import StreamBatches
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.tasks.base import TASKS, Batch, StreamTask


class StreamBatchSequence(Sequence[Batch]):
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

    @overload
    def __getitem__(self, index: int) -> Batch: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Batch]: ...
    def __getitem__(self, index: int | slice) -> Batch | Sequence[Batch]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        inputs, targets = self.stream[index]
        if self.inputs is not None:
            inputs = self.inputs[index][0]
        positions = None
        if self.positions is not None:
            positions = self.positions[index][1][:, : inputs.size(1)]
        return Batch(inputs, targets, positions)


@TASKS.register("lm")
class LanguageModelingTask(StreamTask):
    """Language modelling on one stream: column t reads token t and predicts token t + 1."""

    def batches(
        self,
        ids: torch.Tensor,
        batch_size: int,
        segment: int,
        *,
        train: bool,
        lookahead: int = 0,
        input_ids: torch.Tensor | None = None,
        positions: bool = False,
    ) -> StreamBatchSequence:
        def stream(values: torch.Tensor, extra: int = 0) -> StreamBatches:
            return StreamBatches(values, batch_size, segment, pad=not train, lookahead=extra)

        return StreamBatchSequence(
            stream(ids, lookahead),
            None if input_ids is None else stream(input_ids),
            stream(torch.arange(len(ids))) if positions else None,
        )

    def predict(
        self, model: LanguageModel, batch: Batch, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        return model(batch.inputs, state, run_heads=run_heads)
