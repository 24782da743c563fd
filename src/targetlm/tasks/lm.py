"""``lm``: one causal stream of tokens (BPTT streams for recurrent encoders, blocks for
Transformers, every token scored once in evaluation; ``targetlm.data.batching``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from targetlm.data.batching import StreamBatchSequence
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.tasks.base import TASKS, Batch, StreamTask, TaskData

__all__ = ["LanguageModelingTask", "StreamBatchSequence"]

if TYPE_CHECKING:
    from targetlm.config import Config
    from targetlm.data.vocab import Vocabulary


@TASKS.register("lm")
class LanguageModelingTask(StreamTask):
    """Language modelling on one stream: column t reads token t and predicts token t + 1.

    Data: the corpus's splits (``targetlm.data.load_corpus``), each one stream with the
    context token first; evaluation: every token scored once (perplexity); final figures:
    perplexity, OOV rate and the unigram perplexity of each split.
    """

    finetunable = True

    def load_data(
        self, config: Config, base_vocabulary: Vocabulary | None, log: Callable[[str], None]
    ) -> TaskData:
        from targetlm.data import load_corpus, with_context_token
        from targetlm.data.readers import check_training_tokens

        c = config.data
        corpus = load_corpus(c)
        check_training_tokens(c, corpus)
        vocab = corpus.vocab
        if base_vocabulary is not None:  # finetuning: the source run's words keep their ids
            vocab = base_vocabulary.extend(corpus.splits[c.train])
        ids = {
            split: with_context_token(vocab.encode(tokens), vocab.eos_id)
            for split, tokens in corpus.splits.items()
        }
        splits = {role: ids[getattr(c, role)] for role in ("train", "valid", "test")}
        return TaskData(vocab, corpus, splits)

    def vocabulary(self, config: Config) -> Vocabulary:
        from targetlm.data import load_corpus

        return load_corpus(config.data, (config.data.train,)).vocab  # the tokenizer's, if any

    def training_batches(self, lookahead: int) -> Sequence[Batch]:
        # N-gram heads score words t+1..t+N−1 too: their targets run into the next segment
        c = self.config.data
        return self.batches(
            self.data.splits["train"], c.batch_size, c.bptt, train=True, lookahead=lookahead
        )

    def evaluate(self, model: LanguageModel, split: str) -> dict[str, Any]:
        """``{"ppl", "nll", "tokens"}`` of the model on ``split``'s stream."""
        from targetlm.inference.evaluate import evaluate_stream

        c = self.config
        return evaluate_stream(
            model,
            self.data.splits[split],
            c.eval.batch_size,
            c.eval.segment or c.data.bptt,
            self.device,
            task=self,
            loss_impl=c.train.loss_impl,
        )

    def split_results(self, model: LanguageModel, split: str) -> dict[str, Any]:
        """The perplexity, the OOV rate and the unigram perplexity of ``split``."""
        result = self.evaluate(model, split)
        vocab, tokens = self.data.vocab, self.data.corpus.splits[getattr(self.config.data, split)]
        return {
            "ppl": result["ppl"],
            "tokens": result["tokens"],
            "oov_rate": vocab.oov_rate(tokens),
            "unigram_ppl": vocab.unigram_perplexity(tokens),
        }

    def predict(
        self, model: LanguageModel, batch: Batch, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        return model(batch.inputs, state, run_heads=run_heads)
