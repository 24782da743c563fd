"""Translation: an encoder–decoder reads the source sentence, its decoder the target prefix.

A batch holds sentence pairs of similar lengths::

    source        x₁ … x_n <eos> <pad> …          (B, S), source_mask True at real tokens
    inputs        <eos> y₁ … y_m <pad> …           (B, T)  the decoder reads the prefix
    targets       y₁ … y_m <eos> IGNORE …          (B, T)  column t predicts y_{t+1}

so the decoder's column t is an LM's column t: x̂ and the heads' outputs go through the run's
output layer, N-gram loss and combiners unchanged (the N-gram heads' later targets are the
same row's later columns; past the sentence end they are IGNORE). Pairs are sorted by length
and cut into batches of at most ``max_tokens`` (source or target, padding included), whose
order the trainer shuffles (``data.shuffle``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from targetlm.data.batching import IGNORE
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.tasks.base import TASKS, Batch, Task


def pad(rows: Sequence[torch.Tensor], value: int) -> torch.Tensor:
    """Right-padded (len(rows), max length) tensor."""
    return torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True, padding_value=value)


def make_batch(source: Sequence[torch.Tensor], target: Sequence[torch.Tensor], eos: int) -> Batch:
    """One :class:`Batch` of pairs (each side's ids end with ``<eos>``)."""
    src = pad(source, 0)
    lengths = torch.tensor([len(s) for s in source])
    mask = torch.arange(src.size(1))[None, :] < lengths[:, None]
    inputs = pad([torch.cat([torch.tensor([eos]), t[:-1]]) for t in target], eos)
    targets = pad(target, IGNORE)
    return Batch(inputs, targets, source=src, source_mask=mask)


def pair_batches(
    source: Sequence[torch.Tensor],
    target: Sequence[torch.Tensor],
    eos: int,
    *,
    max_tokens: int = 0,
    batch_size: int = 32,
) -> list[Batch]:
    """Pairs sorted by (target, source) length, cut into batches of at most ``max_tokens``
    padded source or target tokens (a longer pair alone), or ``batch_size`` pairs when
    ``max_tokens`` is 0. Every pair is in exactly one batch; the order is deterministic."""
    order = sorted(range(len(source)), key=lambda i: (len(target[i]), len(source[i]), i))
    groups: list[list[int]] = []
    group: list[int] = []
    longest = 0
    for i in order:
        size = max(len(source[i]), len(target[i]))
        if group:
            width = max(longest, size)
            full = width * (len(group) + 1) > max_tokens if max_tokens else len(group) >= batch_size
            if full:
                groups.append(group)
                group, longest = [], 0
        group.append(i)
        longest = max(longest, size)
    if group:
        groups.append(group)
    return [make_batch([source[i] for i in g], [target[i] for i in g], eos) for g in groups]


@TASKS.register("translation")
class TranslationTask(Task):
    """Sentence pairs (``targetlm.data.parallel``); the model's encoder must be an
    encoder–decoder (``model.encoder.kind = "transformer_seq2seq"``)."""

    conditional = True

    def predict(
        self, model: LanguageModel, batch: Batch, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        """Encode the source, read the whole target prefix; the state is not carried (each
        batch is new sentences), so the returned one is None."""
        if batch.source is None or batch.source_mask is None:
            raise ValueError("a translation batch needs its source and source_mask")
        start = model.encoder.start(model.embedding(batch.source), batch.source_mask)
        prediction = model(batch.inputs, start, run_heads=run_heads)
        return Prediction(prediction.main, prediction.heads, None)
