r"""Decoding an encoder–decoder: greedy and beam search, with the head ensemble inside.

Each step runs the decoder on one more target token (the KV cache carries the prefix; the
source's keys and values are computed once), turns the new column's x̂ into log-probabilities
through the run's output layer, and extends the hypotheses::

    prefix <eos> y₁ … y_{t−1} ──► decoder (cached) ──► x̂_t ──► [ensemble] ──► x̂·E_outᵀ+b ──► log p(y_t)

With N-gram heads and λ > 0 the head ensemble (Heo et al. 2025, §3.3) replaces x̂_t by
``(1−λ)·x̂_t + λ·mean_n ê_n(t)`` *before* the logit layer, exactly as in LM evaluation
(:func:`targetlm.functional.ensemble`, :meth:`targetlm.modules.heads.NgramHeads.reconstruct`):
head n's estimate of the current token comes from the hypothesis's own column t−n, and the
WDR conjugate from the hypothesis's tokens y_{t−n}..y_{t−1} (:class:`HypothesisHeads` keeps
the last N−1 columns of both and is reordered with the beams). The start rule is the LM's:
ê_n(t) exists when t ≥ n; λ = 0 is plain decoding exactly.

Beam search follows fairseq's: at each step the 2k best extensions of the k hypotheses of a
sentence are ranked; an ``<eos>`` among the first k finishes a hypothesis with the score
``log p / length^α`` (α = ``length_penalty``; length counts ``<eos>``); the k best others
continue. A sentence is done when it has k finished hypotheses, or at its maximum length
``a·|source| + b`` (capped by the model's context), where ``<eos>`` is forced; done sentences
leave the batch. Beam 1 is greedy decoding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from targetlm import functional
from targetlm.data.batching import IGNORE, Batch, pad
from targetlm.inference.progress import progress_bar
from targetlm.modules.heads import NgramHeads
from targetlm.modules.model import LanguageModel, evaluating
from targetlm.modules.seq2seq import DecoderState, TransformerSeq2Seq
from targetlm.registry import ConfigError


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode.

    beam: hypotheses per sentence (1: greedy). length_penalty: α of ``score / length^α``.
    max_len_a / max_len_b: the longest output is ``a·|source| + b`` tokens (``<eos>``
    included; |source| counts its ``<eos>``), capped by the model's context.
    ensemble_lambda: λ of the head ensemble (0: off; needs N-gram heads).
    cache: carry keys/values (False recomputes the whole prefix each step: tests).
    """

    beam: int = 5
    length_penalty: float = 1.0
    max_len_a: float = 1.5
    max_len_b: int = 10
    ensemble_lambda: float = 0.0
    cache: bool = True

    def check(self, model: LanguageModel) -> None:
        if self.beam < 1:
            raise ConfigError(f"beam must be >= 1, got {self.beam}")
        if not 0 <= self.ensemble_lambda <= 1:
            raise ConfigError(f"the ensemble λ must be in [0, 1], got {self.ensemble_lambda}")
        if self.ensemble_lambda > 0 and model.num_heads < 1:
            raise ConfigError(
                "the head ensemble needs a model with N-gram heads (model.heads.n >= 2)"
            )
        if self.max_len_a < 0 or self.max_len_b < 1:
            raise ConfigError("max_len_a must be >= 0 and max_len_b >= 1")


class HypothesisHeads:
    """The heads' raw outputs and the tokens of each hypothesis's last N−1 columns.

    raw (N−1, R, K, d) and tokens (R, K), K = N−1, hold columns t−K..t−1 (zeros before the
    start); ``estimates`` gives ê_n(t) for the next column t, ``push`` appends column t.
    """

    def __init__(self, heads: NgramHeads, weight: torch.Tensor, rows: int) -> None:
        self.heads, self.weight = heads, weight.detach()
        self.keep = heads.num_predictions - 1
        d = weight.size(1)
        self.raw = weight.new_zeros(self.keep, rows, self.keep, d)
        self.tokens = torch.zeros(rows, self.keep, dtype=torch.long, device=weight.device)
        self.columns = 0

    def estimates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ê_n(t) (N−1, R, 1, d), available (N−1, 1)): head n's output at column t−n plus
        its conjugate from the tokens of columns t−n..t−1."""
        embeddings = F.pad(self.weight[self.tokens], (0, 0, 0, 1))  # (R, K + 1, d)
        outputs = self.heads.reconstruct(self.raw, embeddings)  # (N−1, R, K, d)
        K = self.keep
        estimates = torch.stack([outputs[n - 1][:, K - n] for n in range(1, K + 1)])[:, :, None]
        steps = torch.arange(1, K + 1, device=self.raw.device)
        return estimates, (self.columns >= steps)[:, None]

    def push(self, raw: torch.Tensor, tokens: torch.Tensor) -> None:
        """Column t's raw outputs (N−1, R, 1, d) and its chosen tokens (R,)."""
        self.raw = torch.cat([self.raw[:, :, 1:], raw], 2)
        self.tokens = torch.cat([self.tokens[:, 1:], tokens[:, None]], 1)
        self.columns += 1

    def select(self, index: torch.Tensor) -> None:
        self.raw = self.raw.index_select(1, index)
        self.tokens = self.tokens.index_select(0, index)


class Stepper:
    """One decoding step for R rows: the next token's log-probabilities (R, V)."""

    def __init__(
        self, model: LanguageModel, start: DecoderState, options: DecodeOptions, eos: int
    ) -> None:
        self.model, self.options, self.eos = model, options, eos
        self.weight, self.bias = model.output()
        self.lam = options.ensemble_lambda
        self.heads = (
            HypothesisHeads(model.heads, self.weight, start.memory.size(0))
            if self.lam > 0 and model.heads is not None
            else None
        )
        self.start = start
        self.state = start
        self.prefix = torch.full(
            (start.memory.size(0), 1), eos, dtype=torch.long, device=start.memory.device
        )

    def log_probs(self) -> torch.Tensor:
        """The next token's log-probabilities (R, V)."""
        return torch.log_softmax(self.logits().float(), -1)

    def logits(self) -> torch.Tensor:
        """The next token's logits (R, V) (greedy decoding needs no softmax)."""
        run_heads = self.heads is not None
        if self.options.cache:
            tokens = self.prefix[:, -1:]
            prediction = self.model(tokens, self.state, run_heads=run_heads)
            self.state = prediction.state
        else:  # the whole prefix again, from the encoded source
            prediction = self.model(self.prefix, self.start, run_heads=run_heads)
        main = prediction.main[:, -1:]  # (R, 1, d)
        if self.heads is not None:
            estimates, available = self.heads.estimates()
            main = functional.ensemble(main, estimates, self.lam, available)
            self.pending = prediction.heads[:, :, -1:]
        return F.linear(main[:, 0], self.weight, self.bias)

    def advance(
        self,
        tokens: torch.Tensor,
        rows: torch.Tensor | None = None,
        sources: torch.Tensor | None = None,
    ) -> None:
        """Keep ``rows`` (the hypotheses extended; None: all, in order) and append ``tokens``.

        ``sources``: the rows whose encoded source each kept row reads (None: the source
        rows stay as they are: beams reordered within their sentences share the source)."""
        if sources is not None:
            self.start = self.start.select(sources)
            self.state = self.state.select_source(sources)
        if rows is not None:
            self.prefix = self.prefix.index_select(0, rows)
            self.state = self.state.select_prefix(rows)
            if self.heads is not None:
                self.heads.select(rows)
                self.pending = self.pending.index_select(1, rows)
        if self.heads is not None:
            self.heads.push(self.pending, tokens)
        self.prefix = torch.cat([self.prefix, tokens[:, None]], 1)


def seq2seq_of(model: LanguageModel) -> TransformerSeq2Seq:
    """``model``'s encoder, an encoder-decoder (a one-line error for any other)."""
    if not isinstance(model.encoder, TransformerSeq2Seq):
        raise ConfigError(
            "greedy and beam-search decoding need an encoder-decoder: model.encoder.kind = "
            f"'transformer_seq2seq', got a {type(model.encoder).__name__}"
        )
    return model.encoder


def _start(
    model: LanguageModel, source: torch.Tensor, mask: torch.Tensor, cache: bool
) -> DecoderState:
    return seq2seq_of(model).start(model.embed_source(source), mask, cache=cache)


def max_lengths(mask: torch.Tensor, options: DecodeOptions, context: int) -> torch.Tensor:
    lengths = mask.sum(1).float() * options.max_len_a + options.max_len_b
    return lengths.long().clamp(1, context)


@torch.no_grad()
def greedy(
    model: LanguageModel, source: torch.Tensor, mask: torch.Tensor, options: DecodeOptions, eos: int
) -> list[list[int]]:
    """The most probable next token at each step, batched; each output without its ``<eos>``."""
    limits = max_lengths(mask, options, seq2seq_of(model).max_context)
    stepper = Stepper(model, _start(model, source, mask, options.cache), options, eos)
    B = source.size(0)
    outputs = torch.full((B, int(limits.max())), eos, dtype=torch.long, device=source.device)
    finished = torch.zeros(B, dtype=torch.bool, device=source.device)
    for t in range(int(limits.max())):
        tokens = stepper.logits().argmax(-1)
        tokens = torch.where(finished | (t + 1 >= limits), torch.full_like(tokens, eos), tokens)
        outputs[:, t] = tokens
        finished |= tokens == eos
        if bool(finished.all()):
            break
        stepper.advance(tokens)
    return [until_eos(row, eos) for row in outputs.tolist()]


def until_eos(tokens: list[int], eos: int) -> list[int]:
    """``tokens`` up to their first ``eos`` (left out), or all of them."""
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


@torch.no_grad()
def beam_search(
    model: LanguageModel, source: torch.Tensor, mask: torch.Tensor, options: DecodeOptions, eos: int
) -> list[list[int]]:
    """The best finished hypothesis of each sentence (without its ``<eos>``); see the module."""
    k = options.beam
    B, device = source.size(0), source.device
    limits = max_lengths(mask, options, seq2seq_of(model).max_context)
    rows = torch.arange(B, device=device).repeat_interleave(k)
    stepper = Stepper(model, _start(model, source, mask, options.cache).select(rows), options, eos)
    alive = torch.arange(B, device=device)  # the sentences still decoding, in batch order
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    tokens = torch.zeros(B * k, 0, dtype=torch.long, device=device)  # alive hypotheses' tokens
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    step = 0
    while alive.numel():
        log_probs = stepper.log_probs()  # (A·k, V)
        V = log_probs.size(1)
        at_limit = (step + 1 >= limits[alive]).repeat_interleave(k)
        if bool(at_limit.any()):  # force <eos> at the maximum length
            forced = torch.full_like(log_probs[0], float("-inf"))
            forced[eos] = 0.0
            log_probs = torch.where(at_limit[:, None], forced, log_probs)
        candidates = (scores.reshape(-1, 1) + log_probs).view(alive.numel(), k * V)
        top_scores, top = candidates.topk(min(2 * k, k * V), 1)  # (A, 2k)
        beams, words = top // V, top % V
        is_eos = (words == eos) & torch.isfinite(top_scores)
        length = step + 1
        for a, j in (is_eos[:, :k]).nonzero().tolist():  # <eos> among the first k: finished
            sentence = int(alive[a])
            if len(finished[sentence]) < k:
                hypothesis = tokens[a * k + int(beams[a, j])].tolist()
                score = float(top_scores[a, j]) / length**options.length_penalty
                finished[sentence].append((score, hypothesis))
        # the k best candidates that are not <eos> continue
        rank = is_eos.long() * top.size(1) + torch.arange(top.size(1), device=device)
        keep = rank.argsort(1)[:, :k]  # (A, k)
        scores = top_scores.gather(1, keep)
        scores = scores.masked_fill(is_eos.gather(1, keep), float("-inf"))
        parents = torch.arange(alive.numel(), device=device)[:, None] * k + beams.gather(1, keep)
        new_words = words.gather(1, keep).reshape(-1)
        done = torch.tensor(
            [len(finished[int(s)]) >= k for s in alive.tolist()], dtype=torch.bool, device=device
        )
        done |= ~torch.isfinite(scores).any(1)
        still = (~done).nonzero().squeeze(1)
        parents = parents.index_select(0, still).reshape(-1)
        tokens = torch.cat(
            [tokens.index_select(0, parents), new_words.view(-1, k)[still].reshape(-1, 1)], 1
        )
        scores = scores.index_select(0, still)
        alive = alive.index_select(0, still)
        if alive.numel():
            sources = None
            if still.numel() < done.numel():  # sentences left: their source rows go too
                sources = (still[:, None] * k + torch.arange(k, device=device)).reshape(-1)
            stepper.advance(new_words.view(-1, k)[still].reshape(-1), parents, sources)
        step += 1
    return [max(f, key=lambda item: item[0])[1] if f else [] for f in finished]


def decode(
    model: LanguageModel, source: torch.Tensor, mask: torch.Tensor, options: DecodeOptions, eos: int
) -> list[list[int]]:
    """Greedy for beam 1, beam search otherwise."""
    options.check(model)
    if options.beam == 1:
        return greedy(model, source, mask, options, eos)
    return beam_search(model, source, mask, options, eos)


def decode_in_batches(
    model: LanguageModel,
    sources: Sequence[torch.Tensor],
    decode_batch: Callable[[torch.Tensor, torch.Tensor, list[int]], list[list[int]]],
    batch_size: int,
    device: str | torch.device,
) -> list[list[int]]:
    """``decode_batch(source (B, S), mask (B, S), index)`` over every source, batched by
    length (``index``: the batch's positions in ``sources``), outputs in input order; in eval
    mode, the model left in the mode it was in."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[list[int]] = [[] for _ in sources]
    with evaluating(model), progress_bar(len(sources), "sent", "translating") as bar:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            source = pad([sources[i] for i in chunk], 0).to(device)
            lengths = torch.tensor([len(sources[i]) for i in chunk], device=device)
            mask = torch.arange(source.size(1), device=device)[None] < lengths[:, None]
            for i, output in zip(chunk, decode_batch(source, mask, chunk)):
                outputs[i] = output
            bar.update(len(chunk))
    return outputs


def translate_ids(
    model: LanguageModel,
    sources: Sequence[torch.Tensor],
    options: DecodeOptions,
    eos: int,
    *,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
) -> list[list[int]]:
    """Output ids of every source (each ending with ``<eos>``), batched by length, in order.
    The model decodes in eval mode and is left in the mode it was in."""
    return decode_in_batches(
        model,
        sources,
        lambda source, mask, _: decode(model, source, mask, options, eos),
        batch_size,
        device,
    )


def timed_texts(vocab: Any, translate: Callable[[], list[list[int]]]) -> tuple[list[str], float]:
    """The detokenized outputs of ``translate()`` (ids) with the run's tokenizer, and the
    decoding time in seconds."""
    from targetlm.data.parallel import decode_ids

    start = time.perf_counter()
    outputs = translate()
    seconds = time.perf_counter() - start
    return [decode_ids(vocab.tokenizer, vocab, ids) for ids in outputs], seconds


@torch.no_grad()
def evaluate_pairs(
    model: LanguageModel, batches: Sequence[Batch], task: Any, device: str | torch.device = "cpu"
) -> dict[str, float]:
    """Teacher-forced next-token NLL of the main head over the target sides: ``{"nll",
    "ppl", "tokens"}`` (per subword token, ``<eos>`` included). The model is evaluated in
    eval mode and left in the mode it was in (training continues with dropout)."""
    total, count = 0.0, 0
    with evaluating(model):
        weight, bias = model.output()
        for batch in batches:
            batch = batch.to(device)
            prediction = task.predict(model, batch, run_heads=False)
            logits = F.linear(prediction.main, weight, bias).float()
            total += float(
                F.cross_entropy(
                    logits.flatten(0, 1),
                    batch.targets.reshape(-1),
                    ignore_index=IGNORE,
                    reduction="sum",
                )
            )
            count += int((batch.targets != IGNORE).sum())
    nll = total / max(count, 1)
    return {"nll": nll, "ppl": float(torch.exp(torch.tensor(nll))), "tokens": count}


def _sacrebleu() -> Any:
    try:
        import sacrebleu
    except ImportError:
        raise ConfigError(
            "BLEU needs the sacrebleu package: pip install -e '.[nmt]' (or pip install sacrebleu)"
        ) from None
    return sacrebleu


def score_translations(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """SacreBLEU's corpus BLEU (13a tokenization, exponential smoothing) and chrF on
    detokenized text, with their signatures."""
    sacrebleu = _sacrebleu()
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} translations but {len(references)} references: they must align"
        )
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    refs = [list(references)]
    b, c = bleu.corpus_score(list(hypotheses), refs), chrf.corpus_score(list(hypotheses), refs)
    return {
        "bleu": b.score,
        "chrf": c.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }
