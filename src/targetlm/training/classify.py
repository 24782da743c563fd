"""Finetuning a (masked) language model for sequence classification.

The step, schedule, checkpoints with exact resume and early stopping are
:class:`~targetlm.training.trainer.Trainer`'s: the task's ``predict`` gives the pooled vector,
the classifier is the model's ``output()``, and the run's objective (cross entropy) scores it
against the label. What is task-specific (the labelled examples, the model around the
pretrained body, the batches, the metrics) delegates to
:class:`~targetlm.tasks.classify.SequenceClassificationTask`; this subclass only routes the
trainer's hooks to it. Validation keeps the model of the lowest validation loss; the final
results add accuracy, macro-F1 (and F1 / Matthews for two classes) on valid and test.

``train.init_from`` names the pretrained run (its best checkpoint): its vocabulary and its
embedding, encoder and output layer are taken as they are (words unseen in pretraining read
``<unk>``); without it the classifier trains from scratch on a vocabulary of its training
sentences.
"""

from __future__ import annotations

from typing import Any

from targetlm import runs
from targetlm.data.vocab import Vocabulary
from targetlm.objectives import build_objective
from targetlm.tasks.classify import SequenceClassificationTask, SequenceClassifier
from targetlm.tasks.mlm import CLS
from targetlm.training import finetune
from targetlm.training.optim import build_optimizer
from targetlm.training.trainer import Trainer


class ClassificationTrainer(Trainer):
    """``task.kind = "classification"``: finetunes ``train.init_from``'s model on labelled
    sentences (``data.name``: ``brown`` genres or a ``glue`` task)."""

    task: SequenceClassificationTask
    model: SequenceClassifier

    def _load_data(self) -> None:
        c = self.config
        self.splits, self.label_names = self.task.examples(c.data)
        if not self.restart:  # a resumed run: its own vocabulary (the source may be gone)
            self.vocab = Vocabulary.load(self.run_dir / runs.VOCAB)
        elif c.train.init_from:
            _, self.vocab, _ = runs.read_best(c.train.init_from)
        else:
            words = [w for text in self.splits["train"].texts for s in text for w in s.split()]
            self.vocab = Vocabulary.build(words).extend([CLS])
        self.eval_batches = {
            name: self.task.batches(self.splits[name], self.vocab, c.eval.batch_size, train=False)
            for name in ("valid", "test")
        }
        return None

    def _setup(self) -> None:
        """The base setup builds the language model for ``model``; it becomes the body of the
        classifier (the pretrained weights loaded first, on a new run), and the objective and
        optimiser are built again for the classifier's parameters."""
        super()._setup()
        c = self.config
        body = self.model
        if c.train.init_from and self.restart:
            state, vocab, where = finetune.source_of(c.train.init_from)
            runs.load_state_into(body, state, vocab, where)
        self.model = self.task.build_model(body, len(self.label_names)).to(self.device)
        self.objective = build_objective(
            c.objective, self.model, c.train.loss_impl, c.train.loss_chunk_tokens
        ).to(self.device)
        self.optimizer = build_optimizer(
            c.train, list(self.model.parameters()) + list(self.objective.parameters())
        )

    def _training_batches(self) -> Any:
        c = self.config
        return self.task.batches(
            self.splits["train"], self.vocab, c.data.batch_size, train=True, seed=c.train.seed
        )

    def _evaluate(self, split: str) -> dict[str, Any]:
        return self.task.evaluate(
            self.model, self.eval_batches[split], len(self.label_names), self.device
        )

    def _split_results(self, split: str) -> dict[str, Any]:
        result = self._evaluate(split)
        figures = ", ".join(
            f"{k} {result[k]:.4f}"
            for k in ("accuracy", "macro_f1", "f1", "matthews")
            if k in result
        )
        self.log(f"{split}: {figures} ({result['examples']} examples)")
        return {**result, "labels": list(self.label_names)}
