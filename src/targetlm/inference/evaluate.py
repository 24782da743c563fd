"""Perplexity of a token stream, every token scored exactly once."""

from __future__ import annotations

import math

import torch

from targetlm import functional
from targetlm.data.batching import StreamBatches
from targetlm.modules.model import LanguageModel


@torch.no_grad()
def evaluate_stream(
    model: LanguageModel, ids: torch.Tensor, batch_size: int, segment: int, device: str = "cpu"
) -> dict[str, float]:
    """Next-word perplexity of ``ids`` (which start with the context ``<eos>``).

    The stream is cut into ``batch_size`` rows read ``segment`` tokens at a time with
    the encoder state carried across segments (see ``targetlm.data.batching``).
    Returns ``{"ppl", "nll", "tokens"}`` with nll the mean negative log-likelihood in nats.
    """
    was_training = model.training
    model.eval()
    batches = StreamBatches(ids, batch_size, segment, pad=True)
    weight, bias = model.output()  # computed once for the whole evaluation
    state = None
    total, count = 0.0, 0
    for inputs, targets in batches:
        predicted, state = model(inputs.to(device), state)
        logits = functional.logits(predicted, weight, bias).flatten(0, -2)  # (B*T, V)
        _, nll_sum, n = functional.cross_entropy(logits, targets.reshape(-1).to(device))
        total += float(nll_sum)
        count += n
    model.train(was_training)
    nll = total / count
    return {"ppl": perplexity(nll), "nll": nll, "tokens": count}


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
