"""Tasks: what is learned, from which data, and how it is judged (corpus -> typed Batch ->
model -> Prediction; evaluation, final figures, decoding).

Everything below the logit layer (output layers, heads, objectives, combiners) is shared by
every task; a task says how its data load and batch, how the model reads a batch, its loss
around the run's objective, how a split is evaluated and what a finished run reports
(:class:`~targetlm.tasks.base.Task`). A new task is one module here, registered in
:data:`TASKS` and imported below.
"""

from targetlm.tasks.base import TASKS, Batch, StreamTask, Task, TaskData, build_task
from targetlm.tasks.classify import SequenceClassificationTask
from targetlm.tasks.diffusion import DiffusionTask
from targetlm.tasks.lm import LanguageModelingTask
from targetlm.tasks.mlm import MaskedLmTask
from targetlm.tasks.translation import SentencePairTask, TranslationTask, pair_batches

__all__ = [
    "TASKS",
    "Batch",
    "DiffusionTask",
    "LanguageModelingTask",
    "MaskedLmTask",
    "SentencePairTask",
    "SequenceClassificationTask",
    "StreamTask",
    "Task",
    "TaskData",
    "TranslationTask",
    "build_task",
    "pair_batches",
]
