"""Training a translation model: the LM trainer with sentence pairs for data.

Everything but the data is :class:`~targetlm.training.trainer.Trainer`'s: the step (the
task's ``predict``, then the run's objective, N-gram heads included), the schedule, the
checkpoints with exact resume, early stopping on the validation loss. The data are the
parallel splits (:mod:`targetlm.data.parallel`), batched by length under a token budget
(:func:`targetlm.tasks.translation.pair_batches`); validation is the teacher-forced
perplexity of the target side, and the final results add BLEU and chrF of beam search
(``eval.beam``) on the validation and test splits.
"""

from __future__ import annotations

from typing import Any

from targetlm.data.datasets import parse_split
from targetlm.data.parallel import ParallelSplit, load_parallel, split_file
from targetlm.data.vocab import DataError
from targetlm.inference.translate import (
    DecodeOptions,
    evaluate_pairs,
    score_translations,
    translate_texts,
)
from targetlm.registry import ConfigError
from targetlm.tasks.translation import pair_batches
from targetlm.training.trainer import Trainer


class TranslationTrainer(Trainer):
    """``task.kind = "translation"``: trains an encoder–decoder on ``data.source_lang`` →
    ``data.target_lang`` pairs."""

    def _load_data(self) -> None:
        c = self.config
        if c.train.init_from:
            raise ConfigError("train.init_from: finetuning is for language models, not translation")
        self.corpus = load_parallel(c.data)
        self.vocab = self.corpus.vocab
        train = self.corpus.splits[c.data.train]
        if train.skipped:
            self.log(f"skipped {train.skipped} training pairs with an empty side")
        self.eval_batches = {
            name: self._pairs(self.corpus.splits[getattr(c.data, name)])
            for name in ("valid", "test")
        }
        return None

    def _pairs(self, split: ParallelSplit) -> list:
        c = self.config.data
        return pair_batches(
            split.source,
            split.target,
            self.vocab.eos_id,
            max_tokens=c.max_tokens,
            batch_size=c.batch_size,
        )

    def _training_batches(self) -> list:
        self._fit_context()
        return self._pairs(self.corpus.splits[self.config.data.train])

    def _fit_context(self) -> None:
        """Pairs the model cannot read (a side, ``<eos>`` included, longer than the encoder's
        ``max_context``): training pairs are left out and counted, as empty ones are; a valid
        or test pair is an error naming it (scores over part of a split would mislead).
        Runs before the run directory is made, so an error writes nothing."""
        c = self.config.data
        context = self.model.encoder.max_context
        train = self.corpus.splits[c.train]
        keep = [
            i
            for i, (s, t) in enumerate(zip(train.source, train.target))
            if max(len(s), len(t)) <= context
        ]
        if len(keep) < len(train.source):
            if not keep:
                raise DataError(
                    f"no training pair of {c.train!r} fits the model's max_context {context}"
                )
            self.log(
                f"skipped {len(train.source) - len(keep)} training pairs longer than the "
                f"model's max_context {context}"
            )
            for name in ("source", "target", "source_lines", "target_lines"):
                rows = getattr(train, name)
                setattr(train, name, [rows[i] for i in keep])
        for split in dict.fromkeys([c.valid, c.test]):
            part = self.corpus.splits[split]
            for number, pair in enumerate(zip(part.source, part.target), 1):
                for side, lang, ids in zip(
                    ("source", "target"), (c.source_lang, c.target_lang), pair
                ):
                    if len(ids) > context:
                        path = split_file(c, parse_split(split)[0], lang)
                        raise DataError(
                            f"{path}, pair {number} of split {split!r}: its {side} has "
                            f"{len(ids)} tokens (<eos> included), over the model's max_context "
                            f"{context}"
                        )

    def _evaluate(self, split: str) -> dict[str, Any]:
        return evaluate_pairs(self.model, self.eval_batches[split], self.task, self.device)

    def _split_results(self, split: str) -> dict[str, Any]:
        c = self.config
        result = self._evaluate(split)
        part = self.corpus.splits[getattr(c.data, split)]
        hypotheses, seconds = translate_texts(
            self.model,
            self.vocab,
            part.source,
            DecodeOptions(beam=c.eval.beam),
            batch_size=c.eval.batch_size,
            device=self.device,
        )
        scores = score_translations(hypotheses, part.target_lines)
        self.log(
            f"{split}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f} (beam {c.eval.beam}, "
            f"{len(hypotheses) / seconds:.1f} sentences/s) {scores['bleu_signature']}"
        )
        return {
            "ppl": result["ppl"],
            "nll": result["nll"],
            "tokens": result["tokens"],
            **scores,
            "beam": c.eval.beam,
            "sentences_per_s": len(hypotheses) / seconds,
        }
