"""Tasks: where x̂ and the targets come from (corpus ids -> typed Batch -> model -> Prediction).

Everything below the logit layer (output layers, heads, objectives, combiners) is shared by
every task; a task only says what a :class:`Batch` holds and how the model reads it.
"""

from targetlm.tasks.base import TASKS, Batch, StreamTask, Task
from targetlm.tasks.classify import SequenceClassificationTask
from targetlm.tasks.diffusion import DiffusionTask
from targetlm.tasks.lm import LanguageModelingTask
from targetlm.tasks.mlm import MaskedLmTask
from targetlm.tasks.translation import TranslationTask, pair_batches

__all__ = [
    "TASKS",
    "Batch",
    "DiffusionTask",
    "LanguageModelingTask",
    "MaskedLmTask",
    "SequenceClassificationTask",
    "StreamTask",
    "Task",
    "TranslationTask",
    "pair_batches",
]
