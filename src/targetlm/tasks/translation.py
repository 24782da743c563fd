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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from targetlm.data.batching import IGNORE, pad
from targetlm.modules.interfaces import ConditionalEncoder
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.registry import ConfigError
from targetlm.tasks.base import TASKS, Batch, Task, TaskData

if TYPE_CHECKING:
    from targetlm.config import Config
    from targetlm.data.parallel import ParallelSplit
    from targetlm.data.vocab import Vocabulary


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


class SentencePairTask(Task[LanguageModel]):
    """A task on sentence pairs (``targetlm.data.parallel``): the data, batches and checks
    that translation and diffusion share, and the decoder interface ``targetlm translate``
    and ``targetlm eval`` use.

    Data: the parallel splits with their joint vocabulary, batched by length under
    ``data.max_tokens`` (:func:`pair_batches`); validation: the teacher-forced perplexity of
    the target side (:meth:`evaluate`). A subclass says how it decodes
    (:meth:`decoding_options`, :meth:`run_decoding`, :meth:`decoder`) and what its final
    figures add to BLEU and chrF (:meth:`split_results`, through :meth:`decode_split`).
    """

    reads = "pairs"
    conditional = True
    # the decoder can be told each output's length (``targetlm translate --oracle-length``)
    decodes_at_lengths = False

    def summary(self, results: dict[str, Any]) -> list[str]:
        """The test perplexity and BLEU (with SacreBLEU's signature)."""
        test = results["test"]
        return [
            f"test perplexity: {test['ppl']:.2f}",
            f"test BLEU: {test['bleu']:.2f} ({test['bleu_signature']})",
        ]

    # --- the data ------------------------------------------------------------------------------
    def load_data(
        self, config: Config, base_vocabulary: Vocabulary | None, log: Callable[[str], None]
    ) -> TaskData:
        from targetlm.data.parallel import load_parallel

        if config.train.init_from:
            raise ConfigError("train.init_from: finetuning is for language models, not translation")
        c = config.data
        corpus = load_parallel(c)
        train = corpus.splits[c.train]
        if train.skipped:
            log(f"skipped {train.skipped} training pairs with an empty side")
        splits = {role: corpus.splits[getattr(c, role)] for role in ("train", "valid", "test")}
        batches = {  # the evaluation batches, made once
            role: self.pairs(splits[role], config, corpus.vocab.eos_id)
            for role in ("valid", "test")
        }
        return TaskData(corpus.vocab, corpus, splits, batches)

    def vocabulary(self, config: Config) -> Vocabulary:
        from targetlm.data.parallel import load_parallel

        return load_parallel(config.data, ()).vocab  # the joint subword vocabulary

    @staticmethod
    def pairs(split: ParallelSplit, config: Config, eos: int) -> list[Batch]:
        return pair_batches(
            split.source,
            split.target,
            eos,
            max_tokens=config.data.max_tokens,
            batch_size=config.data.batch_size,
        )

    def run_data(self, config: Config, vocab: Vocabulary, splits: Sequence[str]) -> TaskData:
        """A finished run's ``splits``, encoded with its vocabulary and tokenizer, and their
        evaluation batches."""
        from targetlm.data.parallel import ParallelSplit, encode_lines, read_parallel

        tokenizer = vocab.require_tokenizer()
        parts = {}
        for split in splits:
            part = read_parallel(config.data, getattr(config.data, split), train=False)
            parts[split] = ParallelSplit(
                part.source_lines,
                part.target_lines,
                encode_lines(tokenizer, vocab, part.source_lines),
                encode_lines(tokenizer, vocab, part.target_lines),
            )
        batches = {split: self.pairs(part, config, vocab.eos_id) for split, part in parts.items()}
        return TaskData(vocab, None, parts, batches)

    def prepare(self, model: LanguageModel) -> None:
        """Pairs the model cannot read (a side, ``<eos>`` included, longer than the encoder's
        ``max_context``): training pairs are left out and counted, as empty ones are; a valid
        or test pair is an error naming it (scores over part of a split would mislead)."""
        from targetlm.data.parallel import languages, split_file
        from targetlm.data.readers import parse_split
        from targetlm.data.vocab import DataError

        c, data = self.config.data, self.data
        context = model.encoder.max_context
        if context is None:  # an encoder-decoder or a denoiser always has one
            raise ValueError(f"a {type(model.encoder).__name__} has no max_context")
        train = data.splits["train"]
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
            part = data.corpus.splits[split]
            for number, pair in enumerate(zip(part.source, part.target), 1):
                for side, lang, ids in zip(("source", "target"), languages(c), pair):
                    if len(ids) > context:
                        path = split_file(c, parse_split(split)[0], lang)
                        raise DataError(
                            f"{path}, pair {number} of split {split!r}: its {side} has "
                            f"{len(ids)} tokens (<eos> included), over the model's max_context "
                            f"{context}"
                        )

    def training_batches(self, lookahead: int) -> Sequence[Batch]:
        return self.pairs(self.data.splits["train"], self.config, self.data.vocab.eos_id)

    def evaluate(self, model: LanguageModel, split: str) -> dict[str, Any]:
        """The teacher-forced ``{"nll", "ppl", "tokens"}`` of ``split``'s target side."""
        from targetlm.inference.translate import evaluate_pairs

        return evaluate_pairs(model, self.data.batches[split], self, self.device)

    # --- decoding --------------------------------------------------------------------------------
    def decoding_options(
        self, ensemble_lambda: float, beam: dict[str, Any], diffusion: dict[str, Any]
    ) -> Any:
        """The decoder's options: the run's defaults with the command line's (``beam``:
        beam search's, ``diffusion``: diffusion decoding's; None: not given); the options of
        the other decoder are refused."""
        raise NotImplementedError

    def translate_texts(
        self,
        model: LanguageModel,
        vocab: Vocabulary,
        sources: Sequence[torch.Tensor],
        options: Any,
        *,
        batch_size: int,
        device: str | torch.device,
        target_lengths: Sequence[int] | None = None,
    ) -> tuple[list[str], float]:
        """The detokenized outputs of ``sources`` (ids) with the run's tokenizer and the
        decoding time in seconds, by :meth:`decoder`; ``target_lengths``: each output's length
        (a decoder that :attr:`decodes_at_lengths`)."""
        from targetlm.inference.translate import timed_texts

        settings: dict[str, Any] = {"batch_size": batch_size, "device": device}
        if target_lengths is not None:
            if not self.decodes_at_lengths:
                raise ConfigError("--oracle-length is for diffusion runs")
            settings["target_lengths"] = target_lengths
        decode = self.decoder()
        return timed_texts(vocab, lambda: decode(model, sources, options, vocab.eos_id, **settings))

    def decoder(self) -> Callable[..., list[list[int]]]:
        """The function that decodes a list of sources: ``(model, sources, options, eos, *,
        batch_size, device[, target_lengths])`` -> the output ids of each."""
        raise NotImplementedError

    def decoding_summary(self, options: Any) -> dict[str, Any]:
        """The decoder's settings, for summaries and results."""
        return {"beam": options.beam}

    def run_decoding(self, ensemble_lambda: float) -> Any:
        """The options the run decodes its splits with (its ``[eval]`` / ``[task]``
        settings), with ``ensemble_lambda``."""
        return self.decoding_options(ensemble_lambda, {}, {})

    def decode_split(
        self, model: LanguageModel, split: str, options: Any, settings: str
    ) -> tuple[dict[str, Any], float]:
        """BLEU and chrF of decoding ``split``'s sources with ``options`` against its
        references, and the sentences decoded per second; logged with ``settings`` (the
        decoder's, in words)."""
        from targetlm.inference.translate import score_translations

        part = self.data.splits[split]
        hypotheses, seconds = self.translate_texts(
            model,
            self.data.vocab,
            part.source,
            options,
            batch_size=self.config.eval.batch_size,
            device=self.device,
        )
        speed = len(hypotheses) / max(seconds, 1e-9)
        scores = score_translations(hypotheses, part.target_lines)
        self.log(
            f"{split}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f} ({settings}, "
            f"{speed:.1f} sentences/s) {scores['bleu_signature']}"
        )
        return scores, speed


@TASKS.register("translation")
class TranslationTask(SentencePairTask):
    """Sentence pairs (``targetlm.data.parallel``); the model's encoder must be an
    encoder–decoder (``model.encoder.kind = "transformer_seq2seq"``). Validation: the
    teacher-forced perplexity of the target side; final figures: it, with BLEU and chrF of
    beam search (``eval.beam``) on valid and test."""

    def predict(
        self, model: LanguageModel, batch: Batch, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        """Encode the source, read the whole target prefix; the state is not carried (each
        batch is new sentences), so the returned one is None."""
        if batch.source is None or batch.source_mask is None:
            raise ValueError("a translation batch needs its source and source_mask")
        encoder = model.encoder
        if not isinstance(encoder, ConditionalEncoder):
            raise ValueError(f"a {type(encoder).__name__} reads no source sentence")
        start = encoder.start(model.embed_source(batch.source), batch.source_mask)
        prediction = model(batch.inputs, start, run_heads=run_heads)
        return Prediction(prediction.main, prediction.heads, None)

    def split_results(self, model: LanguageModel, split: str) -> dict[str, Any]:
        """The teacher-forced perplexity, and BLEU and chrF of beam search (``eval.beam``)."""
        result = self.evaluate(model, split)
        options = self.run_decoding(0.0)
        scores, speed = self.decode_split(model, split, options, f"beam {options.beam}")
        return {
            "ppl": result["ppl"],
            "nll": result["nll"],
            "tokens": result["tokens"],
            **scores,
            "beam": options.beam,
            "sentences_per_s": speed,
        }

    def run_decoding(self, ensemble_lambda: float) -> Any:
        return self.decoding_options(ensemble_lambda, {"beam": self.config.eval.beam}, {})

    def decoding_options(
        self, ensemble_lambda: float, beam: dict[str, Any], diffusion: dict[str, Any]
    ) -> Any:
        from targetlm.inference.translate import DecodeOptions

        if any(value is not None and value is not False for value in diffusion.values()):
            raise ConfigError(
                "--steps, --length-beam, --samples, --seed, --sampler and --oracle-length are "
                "for diffusion runs"
            )
        given = {key: value for key, value in beam.items() if value is not None}
        return DecodeOptions(ensemble_lambda=ensemble_lambda, **given)

    def decoder(self) -> Callable[..., list[list[int]]]:
        from targetlm.inference.translate import translate_ids

        return translate_ids

    def evaluate_run(
        self, model: LanguageModel, split: str, ensemble_lambda: float
    ) -> dict[str, Any]:
        """Teacher-forced loss and perplexity, and BLEU / chrF of beam search (``eval.beam``;
        ``ensemble_lambda``: inside the search)."""
        options = self.run_decoding(ensemble_lambda)
        options.check(model)
        loss = self.evaluate(model, split)
        scores, speed = self.decode_split(model, split, options, f"beam {options.beam}")
        return {
            "split": getattr(self.config.data, split),
            **loss,
            **scores,
            "beam": options.beam,
            "ensemble_lambda": ensemble_lambda,
            "sentences_per_s": speed,
        }

    def describe(self, split: str, result: dict[str, Any]) -> str:
        r = result
        return (
            f"{split} ({r['split']}): loss {r['nll']:.3f}, ppl {r['ppl']:.2f} over "
            f"{r['tokens']:,} target tokens; BLEU {r['bleu']:.2f}, chrF {r['chrf']:.2f} "
            f"(beam {r['beam']}, λ {r['ensemble_lambda']:g}) {r['bleu_signature']}"
        )
