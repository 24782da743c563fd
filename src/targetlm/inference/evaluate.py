"""The one evaluation loop: a token stream, every token scored exactly once, with any combiners.

:func:`evaluate_ids` reads the stream as ``batch_size`` rows, ``segment`` tokens at a time, the
encoder state carried across segments (``targetlm.data.batching``). Per segment the model runs
once (with its heads when a vector combiner needs them); the vector combiner (head ensemble)
makes one x̂ per stream, the logit layer runs once per stream and the probability combiners
(``targetlm.inference.combiners``, in their documented order) act on each stream's p(y_t).
Perplexity (:func:`evaluate_stream`), the head ensemble (``evaluate_ensemble``), per-token
scoring with open vocabulary and caches (``score_text``) and the word-probability analysis
are this loop with different combiners and outputs.

The logit layer runs full (the (B, T, V) logits) or chunked (:func:`targetlm.chunked.logit_statistics`:
log Z and the target's logit tile by tile, never the (B, T, V) matrix); ``loss_impl = "auto"``
(the default) chunks from ``AUTO_CHUNK_ELEMENTS`` logits per segment and stream,
unless an ``inspect`` callback asks for the logits. The open-vocabulary mixture reads its
new-word mass in tiles too (:meth:`StreamLogits.log_mass`); the caches need no logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import nn

from targetlm import functional
from targetlm.chunked import auto_chunks, logit_statistics
from targetlm.data.batching import IGNORE, Batch, stream_batches
from targetlm.inference.combiners import BuiltCombiners, ScoringContext, Segment, StreamLogits
from targetlm.inference.progress import progress_bar
from targetlm.modules.model import LanguageModel, Prediction, evaluating


class StreamReader(Protocol):
    """What evaluation asks of a stream task (:class:`targetlm.tasks.StreamTask` is one):
    how a stream becomes batches and how the model reads one. A protocol, so that inference
    sits below the tasks that call it."""

    def batches(
        self, ids: torch.Tensor, batch_size: int, segment: int, **options: Any
    ) -> Sequence[Batch]:
        """The batches of the stream ``ids``; ``options``: those of
        :func:`~targetlm.data.batching.stream_batches`."""

    def predict(
        self, model: LanguageModel, batch: Batch, state: Any = None, *, run_heads: bool = True
    ) -> Prediction: ...


@dataclass
class StreamResult:
    """One stream's result: summed NLL (nats) over ``count`` targets, and per-token
    log-probabilities (N,) in text order when asked for (else None)."""

    nll_sum: float
    count: int
    log_probs: torch.Tensor | None = None

    @property
    def nll(self) -> float:
        return self.nll_sum / self.count


# called with the main stream's logits (B, T, V) and targets (B, T) of every segment
Inspector = Callable[[torch.Tensor, torch.Tensor], None]


@torch.no_grad()
def evaluate_ids(
    model: LanguageModel,
    target_ids: torch.Tensor,
    *,
    batch_size: int,
    segment: int,
    combiners: BuiltCombiners | None = None,
    context: ScoringContext | None = None,
    input_ids: torch.Tensor | None = None,
    output: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    embedding: nn.Module | None = None,
    per_token: bool = False,
    inspect: Inspector | None = None,
    task: StreamReader | None = None,
    device: str | torch.device = "cpu",
    loss_impl: Literal["full", "chunked", "auto"] = "auto",
) -> list[StreamResult]:
    """Score every target of a stream; one :class:`StreamResult` per stream (the main head's
    first, then one per vector-combiner stream, e.g. per λ).

    Args:
        target_ids: (N + 1,) ids starting with the context token; targets are ids 1..N (ids of
            the evaluation vocabulary: ≥ ``context.scored_size`` gets no mass from the logits).
        combiners: built combiners (None: none).
        context: the vocabularies (default: closed, ``E_out``'s rows).
        input_ids: (N + 1,) what the model reads (default ``target_ids``; e.g. ``<unk>`` for
            new words of a lookup input embedding).
        output: ``(E_out, b)`` to score with (default ``model.output()``, computed once).
        embedding: an input embedding to read with instead of the model's (e.g. rebuilt for
            V_eval), for this evaluation only.
        per_token: also return per-token log-probabilities.
        inspect: called with the main stream's logits and targets of every segment (it needs
            the full logit layer: not with ``loss_impl = "chunked"``).
        task: how the stream becomes batches and the model reads them (a
            :class:`~targetlm.tasks.StreamTask`; None: language modelling, the ``lm`` task's).
        loss_impl: the logit layer ``full``, ``chunked`` or ``auto`` (see the module docstring).
    """
    if inspect is not None and loss_impl == "chunked":
        raise ValueError(
            "evaluate_ids: inspect reads the (B, T, V) logits, which loss_impl = 'chunked' never "
            "builds; use 'full' or 'auto'"
        )
    with evaluating(model):
        return _score_stream(
            model, target_ids, batch_size, segment, combiners or BuiltCombiners(), context,
            input_ids, output, embedding, per_token, inspect, task,
            device, loss_impl,
        )  # fmt: skip


def _score_stream(
    model: LanguageModel,
    target_ids: torch.Tensor,
    batch_size: int,
    segment: int,
    combiners: BuiltCombiners,
    context: ScoringContext | None,
    input_ids: torch.Tensor | None,
    output: tuple[torch.Tensor, torch.Tensor | None] | None,
    embedding: nn.Module | None,
    per_token: bool,
    inspect: Inspector | None,
    task: StreamReader | None,
    device: str | torch.device,
    loss_impl: Literal["full", "chunked", "auto"],
) -> list[StreamResult]:
    """:func:`evaluate_ids`'s loop, the model in eval mode: the combiners started, then
    every segment's streams scored (:func:`_segment_nll`)."""
    weight, bias = output if output is not None else model.output()
    if context is None:
        rows = weight.size(0)
        context = ScoringContext(rows, rows, rows, batch_size=batch_size, device=device)
    vector, probability = combiners.vector, combiners.probability
    if vector is not None:
        vector.start(model, weight)
    for combiner in probability:
        combiner.start(context)
    exact_probs = per_token or bool(probability)  # else: summed cross entropy, as in training

    make_batches = stream_batches if task is None else task.batches
    batches = make_batches(
        target_ids, batch_size, segment, train=False, input_ids=input_ids, positions=per_token
    )
    streams = 1 + (len(vector.names) if vector is not None else 0)
    totals, count = [0.0] * streams, 0
    log_probs = [torch.empty(len(target_ids) - 1) for _ in range(streams)] if per_token else []
    state, buffers = None, _LogitBuffers()
    bar = progress_bar(len(target_ids) - 1, "tok", "scoring")
    with _reading_with(model, embedding), bar:
        for batch in batches:
            batch = batch.to(device)
            y = batch.targets  # (B, T)
            prediction = _predict(model, task, batch, state, run_heads=vector is not None)
            state = prediction.state
            current = Segment(prediction, y)
            predicted = [prediction.main, *(vector.streams(current) if vector else [])]
            for combiner in probability:
                combiner.observe(current)
            valid = y != IGNORE
            scored = int(valid.sum())
            count += scored
            bar.update(scored)
            done: dict[int, tuple[float, torch.Tensor | None]] = {}  # λ = 0 is the main x̂
            for s, vectors in enumerate(predicted):
                if id(vectors) not in done:
                    done[id(vectors)] = _segment_nll(
                        vectors, weight, bias, current, context, probability, loss_impl,
                        inspect if s == 0 else None, exact_probs, buffers,
                    )  # fmt: skip
                nll_sum, token_log_probs = done[id(vectors)]
                totals[s] += nll_sum
                if batch.positions is not None and token_log_probs is not None:
                    positions = batch.positions.cpu()  # (B, T): index in target_ids
                    keep = positions != IGNORE
                    log_probs[s][positions[keep] - 1] = token_log_probs.cpu()[keep]
    if count == 0:
        raise ValueError("nothing to score")
    return [
        StreamResult(totals[s], count, log_probs[s] if per_token else None) for s in range(streams)
    ]


def _predict(model: LanguageModel, task: StreamReader | None, batch: Batch, state, run_heads: bool):
    """The task's prediction of ``batch``; a language model's (the ``lm`` task's) for None."""
    if task is None:
        return model(batch.inputs, state, run_heads=run_heads)
    return task.predict(model, batch, state, run_heads=run_heads)


def _segment_nll(
    vectors: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    current: Segment,
    context: ScoringContext,
    probability: list,
    loss_impl: str,
    inspect: Inspector | None,
    exact_probs: bool,
    buffers: _LogitBuffers,
) -> tuple[float, torch.Tensor | None]:
    """One stream's summed NLL over a segment (and its per-token log-probabilities when
    ``exact_probs``): the summed cross entropy, as in training, where nothing needs the
    probabilities (float32: in ``buffers``' logit and log-softmax buffers); else
    :func:`_stream_log_probs` (full or chunked logits)."""
    y = current.targets
    chunked = loss_impl == "chunked" or (
        loss_impl == "auto"
        and inspect is None
        and auto_chunks(vectors.shape[:-1].numel(), weight.size(0), weight.device)
    )
    fast = not exact_probs and not chunked
    # float32 only: cross_entropy computes lower precisions in float32
    if fast and inspect is None and vectors.dtype == weight.dtype == torch.float32:
        return buffers.nll_sum(vectors, weight, bias, y), None
    if fast:
        logits = functional.logits(vectors, weight, bias)  # (B, T, V_scored)
        if inspect is not None:
            inspect(logits, y)
        nll_sum = functional.cross_entropy(logits.flatten(0, -2), y.reshape(-1))[1]
        return float(nll_sum), None
    return _stream_log_probs(
        vectors, weight, bias, current, context, probability, chunked, inspect, exact_probs
    )


class _LogitBuffers:
    """The (N, V) logits and log-softmax of one evaluation's segments, allocated once and
    reused: a fresh pair per segment is two allocations of N·V floats (28 MB for 20 × 35 rows
    of PTB's 10k words), which glibc's allocator may hand out as new mmap'd pages, faulted in
    again on every segment (measured: 94 instead of 59 ms a segment on one core)."""

    def __init__(self) -> None:
        self.logits = self.log_probs = torch.empty(0)

    def nll_sum(
        self, vectors: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
        targets: torch.Tensor,
    ) -> float:  # fmt: skip
        """Σ −log softmax(x̂ Eᵀ + b)[y] over the targets that are not IGNORE, as
        :func:`functional.cross_entropy`'s ``nll_sum`` (log-softmax, then NLL, in float32)."""
        x = vectors.reshape(-1, vectors.size(-1))
        rows, size = x.size(0), weight.size(0)
        if self.logits.size(0) < rows or self.logits.size(1) != size:
            self.logits = x.new_empty(rows, size)
            self.log_probs = torch.empty_like(self.logits)
        logits, log_probs = self.logits[:rows], self.log_probs[:rows]
        if bias is None:
            torch.mm(x, weight.t(), out=logits)
        else:
            torch.addmm(bias, x, weight.t(), out=logits)
        torch.log_softmax(logits, -1, out=log_probs)
        nll = nn.functional.nll_loss(
            log_probs, targets.reshape(-1), ignore_index=IGNORE, reduction="sum"
        )
        return float(nll)


def _stream_log_probs(
    vectors: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    segment: Segment,
    context: ScoringContext,
    probability: list,
    chunked: bool,
    inspect: Inspector | None,
    exact_probs: bool,
) -> tuple[float, torch.Tensor | None]:
    """One stream's summed NLL and, with ``exact_probs``, its log p(y_t) (B, T) after the
    probability combiners; the logit layer full or chunked."""
    targets = segment.targets
    stream, gathered = _stream_logits(vectors, weight, bias, targets, context, chunked)
    if inspect is not None:
        assert stream.logits is not None  # inspect runs unchunked (_segment_nll, evaluate_ids)
        inspect(stream.logits, targets)
    if exact_probs:
        return _combined_log_probs(stream, gathered, targets, context, probability, segment)
    valid = targets != IGNORE
    return float((stream.log_norm - gathered)[valid].double().sum()), None


def _stream_logits(
    vectors: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    context: ScoringContext,
    chunked: bool,
) -> tuple[StreamLogits, torch.Tensor]:
    """One stream's logit layer: its :class:`StreamLogits` and each target's logit (B, T) (any
    value where the target is padding or beyond the scored words). Full: the logits in float32;
    chunked: log Z and the target logits tile by tile."""
    scored = context.scored_size
    if chunked:
        in_scored = (targets != IGNORE) & (targets < scored)
        log_norm, gathered = logit_statistics(
            vectors, weight, bias, targets.masked_fill(~in_scored, IGNORE)
        )
        return StreamLogits(vectors, weight, bias, log_norm), gathered
    logits = functional.logits(vectors, weight, bias).float()  # (B, T, V_scored)
    log_norm = torch.logsumexp(logits, -1)  # (B, T)
    gathered = logits.gather(-1, targets.clamp(0, scored - 1)[..., None]).squeeze(-1)
    return StreamLogits(vectors, weight, bias, log_norm, logits), gathered


def _combined_log_probs(
    stream: StreamLogits,
    gathered: torch.Tensor,
    targets: torch.Tensor,
    context: ScoringContext,
    probability: list,
    segment: Segment,
) -> tuple[float, torch.Tensor]:
    """log p(y_t) (B, T) of one stream after the probability combiners, and its summed NLL."""
    valid = targets != IGNORE
    in_scored = valid & (targets < context.scored_size)
    log_norm = stream.log_norm
    probs = torch.where(in_scored, (gathered - log_norm).exp(), torch.zeros_like(log_norm))
    for combiner in probability:
        probs = combiner.combine(probs, stream, segment)
    token_log_probs = probs.log()
    return float(-token_log_probs[valid].double().sum()), token_log_probs


@contextmanager
def _reading_with(model: LanguageModel, embedding: nn.Module | None) -> Iterator[None]:
    """``model`` reads its input through ``embedding`` (e.g. one rebuilt for V_eval) inside the
    block, through its own again after it."""
    if embedding is None:
        yield
        return
    own = model.embedding
    model.embedding = embedding
    try:
        yield
    finally:
        model.embedding = own


def evaluate_stream(
    model: LanguageModel,
    ids: torch.Tensor,
    batch_size: int,
    segment: int,
    device: str | torch.device = "cpu",
    task: StreamReader | None = None,
    loss_impl: Literal["full", "chunked", "auto"] = "auto",
) -> dict[str, float]:
    """Next-word perplexity of ``ids`` (which start with the context ``<eos>``).

    The stream is cut into ``batch_size`` rows read ``segment`` tokens at a time with
    the encoder state carried across segments (see ``targetlm.data.batching``); the logit
    layer is read ``loss_impl`` (``train.loss_impl``).
    Returns ``{"ppl", "nll", "tokens"}`` with nll the mean negative log-likelihood in nats.
    """
    (main,) = evaluate_ids(
        model,
        ids,
        batch_size=batch_size,
        segment=segment,
        task=task,
        device=device,
        loss_impl=loss_impl,
    )
    return {"ppl": perplexity(main.nll), "nll": main.nll, "tokens": main.count}


def perplexity(nll: float) -> float:
    """exp(mean NLL); ``inf`` for a loss beyond float range (a diverged model) instead of an error."""
    return math.exp(nll) if nll < 709.0 else math.inf


def per_word(result: dict, words: int) -> dict:
    """``result`` (mean NLL ``nll`` per token over ``tokens``) with the per-word perplexity:
    the same total NLL over the text's ``words`` (whitespace words + one per line end, as a
    word model's ``<eos>``), so models with different tokenizers compare. Equal to ``ppl``
    for a whitespace tokenizer, whose tokens are the words.

        word_ppl = exp(nll · tokens / words)
    """
    return {
        **result,
        "word_ppl": perplexity(result["nll"] * result["tokens"] / words),
        "words": words,
    }
