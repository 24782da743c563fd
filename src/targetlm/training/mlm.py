"""Training a masked LM: the LM trainer with masked blocks for data.

Everything but the data and the figures is :class:`~targetlm.training.trainer.Trainer`'s: the
step (the task's ``predict`` keeps the masked columns, then the run's objective, N-gram / WDR
heads included), the schedule, checkpoints with exact resume (the training masks come from
torch's RNG, which last.pt restores), early stopping on the validation loss. The data are the
splits' token streams cut into ``<cls>``-led blocks (:class:`~targetlm.tasks.mlm.MaskedBlocks`);
validation and the final results are the masked tokens' perplexity under fixed masks.

What is task-specific here (the vocabulary with ``<cls>`` and ``<mask>``, the batches, the
figures) delegates to :class:`~targetlm.tasks.mlm.MaskedLmTask`; this subclass only routes
the trainer's data hooks to it.
"""

from __future__ import annotations

from typing import Any

from targetlm.data.datasets import check_training_tokens, load_corpus
from targetlm.inference.translate import evaluate_pairs
from targetlm.registry import ConfigError
from targetlm.tasks.mlm import MaskedLmTask
from targetlm.training.trainer import Trainer


class MaskedLmTrainer(Trainer):
    """``task.kind = "mlm"``: pretrains a bidirectional encoder on ``data``'s training split."""

    task: MaskedLmTask

    def _load_data(self) -> None:
        c = self.config
        if c.train.init_from:
            raise ConfigError(
                "train.init_from: a masked-LM run pretrains from scratch (finetune it with "
                "task.kind = 'classification')"
            )
        self.corpus = load_corpus(c.data)
        check_training_tokens(c.data, self.corpus)
        self.vocab = self.task.vocabulary(self.corpus.vocab)
        ids = {split: self.vocab.encode(tokens) for split, tokens in self.corpus.splits.items()}
        self.train_ids = ids[c.data.train]
        self.eval_batches = {
            name: self.task.batches(
                ids[getattr(c.data, name)],
                c.eval.batch_size,
                c.data.bptt,
                vocab=self.vocab,
                train=False,
            )
            for name in ("valid", "test")
        }
        return None

    def _training_batches(self) -> Any:
        c = self.config
        batches = self.task.batches(
            self.train_ids,
            c.data.batch_size,
            c.data.bptt,
            vocab=self.vocab,
            train=True,
            lookahead=self.objective.lookahead,
        )
        if not len(batches):
            raise ConfigError(
                f"data.batch_size: the training split fills no batch of {c.data.batch_size} "
                f"rows of {c.data.bptt} tokens"
            )
        return batches

    def _evaluate(self, split: str) -> dict[str, Any]:
        """The masked tokens' ``{"nll", "ppl", "tokens"}`` on ``split`` (fixed masks)."""
        return evaluate_pairs(self.model, self.eval_batches[split], self.task, self.device)

    def _split_results(self, split: str) -> dict[str, Any]:
        result = self._evaluate(split)
        return {
            "ppl": result["ppl"],
            "nll": result["nll"],
            "masked_tokens": result["tokens"],
            "mask_rate": self.task.mask_rate,
        }
