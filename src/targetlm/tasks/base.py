"""The task interface and the typed batch every task produces.

A task turns a corpus into :class:`Batch` es and runs the model on one, returning its
:class:`~targetlm.modules.model.Prediction`; the trainer's step and the evaluation loop only
talk to this interface, so a new task (translation: an encoder reads the source and the
decoder's x̂ goes through the same output layer; diffusion: a denoiser predicts x̂₀ for every
position) plugs in beside ``lm`` with its own batches and ``predict``, and output layers,
heads, objectives and combiners stay as they are: they read ``Prediction`` and the targets.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from targetlm.modules.model import LanguageModel, Prediction
from targetlm.registry import Registry


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
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor | None = None
    source: torch.Tensor | None = None
    source_mask: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        def move(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        return Batch(
            self.inputs.to(device),
            self.targets.to(device),
            move(self.positions),
            move(self.source),
            move(self.source_mask),
        )


class Task(ABC):
    """How the model reads a batch; :class:`StreamTask` s also say how a stream becomes batches.

    ``conditional``: the task reads a source besides the target stream (translation) and
    needs an encoder that is conditional (``Encoder.conditional``); a stream task needs one
    that is not. ``causal``: the task predicts from the past only and needs an encoder whose
    output t reads inputs 0..t (``Encoder.causal``); a task that declares False (masked LM,
    classification, diffusion) needs one that reads the whole sequence.
    """

    conditional: bool = False
    causal: bool = True

    @abstractmethod
    def predict(
        self, model: LanguageModel, batch: Batch, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        """Run ``model`` on ``batch`` (continuing ``state``): its :class:`Prediction`."""


class StreamTask(Task):
    """A task over one token stream per split (language modelling)."""

    @abstractmethod
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
    ) -> Sequence[Batch]:
        """The batches of a token stream ``ids`` (N + 1,), the context token first.

        train: drop what does not fill the batch (training) or pad it (evaluation: every
        target scored once). lookahead: extra target columns per batch. input_ids: what the
        model reads instead of ``ids`` (same length; e.g. ``<unk>`` for new words).
        positions: fill :attr:`Batch.positions`.
        """


TASKS: Registry[Task] = Registry("task")
