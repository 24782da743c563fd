"""Per-token scoring of a text with the inference-time combiners of Pappas et al. (2020).

Open vocabulary: the evaluation vocabulary is ``V_train ∪ V_text`` as strings (training ids
first, new words appended in order of appearance). Compositional output layers (anything with
``embed_words``, e.g. char-CNN and GroC) embed the new words and score them like any other;
closed layers (lookup, tied, bilinear, residual, adaptive) give them no mass, so their
distribution is interpolated with a uniform one over the evaluation vocabulary and unseen
words get a finite loss. On the input side, a compositional input embedding (anything with
``for_words``, e.g. GroC's) reads the new words as themselves: the model reads ids of
``V_eval`` through the embedding rebuilt for it ("any word's input embedding can be calculated
compositionally", Pappas et al. §3.1); a lookup table reads them as ``<unk>``.

Then, in this order, per target word y_t:
1. new-word down-weighting: ``p(w) ← p(w)·ω / (1 − (1 − ω)·P_new)`` for new words and
   ``p(w) / (1 − (1 − ω)·P_new)`` for the others (P_new = the mass on new words), which
   keeps a distribution and tempers how much a model bets on words it never saw;
2. the unigram cache, then 3. the neural cache (``targetlm.inference.caches``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from targetlm import functional
from targetlm.data.batching import IGNORE, StreamBatches
from targetlm.data.vocab import EOS, Vocabulary
from targetlm.inference.caches import NeuralCache, UnigramCache, interpolate
from targetlm.inference.evaluate import perplexity
from targetlm.modules.model import LanguageModel


@dataclass(frozen=True)
class Combiners:
    """What is mixed into the model's prediction at evaluation time.

    Args:
        uniform_weight: μ of ``(1 − μ)·p_model + μ/|V_eval|`` for closed output layers in open
            vocabulary (None: 0.01 when the text has new words, else 0); compositional layers
            are never mixed with the uniform distribution.
        new_word_weight: ω of the new-word down-weighting (1: off).
        unigram_cache: λ of the unigram cache (0: off).
        neural_cache: λ of the neural cache (0: off).
        neural_theta: θ of the neural cache.
        neural_window: positions the neural cache remembers per row.

    The cross-domain values of Pappas et al. (App. C.4) are λ = 0.034 for either cache (their
    λ = 0.966 weights the model), θ = 0.5 and a window of 10,000 (the defaults here), and
    ω = 0.1 for GroC (§5.1).
    """

    uniform_weight: float | None = None
    new_word_weight: float = 1.0
    unigram_cache: float = 0.0
    neural_cache: float = 0.0
    neural_theta: float = 0.5  # Pappas et al. App. C.4: "θ = 0.5 for neural cache"
    neural_window: int = 10_000  # App. C.4: "at test time we used 10,000"

    def __post_init__(self) -> None:
        for name in ("uniform_weight", "unigram_cache", "neural_cache"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if not 0 < self.new_word_weight <= 1:
            raise ValueError(f"new_word_weight must be in (0, 1], got {self.new_word_weight}")


@dataclass
class TokenScores:
    """Log-probabilities of every target token of a text, in text order."""

    log_probs: torch.Tensor  # (N,) natural log
    is_new: torch.Tensor  # (N,) bool: the target is not a training-vocabulary word
    targets: list[str]  # (N,) the target words

    def summary(self) -> dict[str, Any]:
        """ppl over all tokens, over new (OOV) and known ones, and the OOV rate."""
        nll = -self.log_probs.double()
        new = self.is_new

        def ppl(mask: torch.Tensor) -> float | None:
            return perplexity(float(nll[mask].mean())) if bool(mask.any()) else None

        return {
            "ppl": ppl(torch.ones_like(new)),
            "ppl_new": ppl(new),
            "ppl_known": ppl(~new),
            "nll": float(nll.mean()),
            "tokens": int(nll.numel()),
            "new_tokens": int(new.sum()),
            "oov_rate": float(new.float().mean()),
        }


@torch.no_grad()
def score_text(
    model: LanguageModel,
    vocab: Vocabulary,
    tokens: Sequence[str],
    *,
    open_vocabulary: bool = False,
    combiners: Combiners = Combiners(),
    batch_size: int = 10,
    segment: int = 35,
    lexicon: Any = None,
    device: str | torch.device = "cpu",
) -> TokenScores:
    """Score every token of ``tokens`` (a split as read, ending with ``<eos>``).

    ``open_vocabulary=False`` is the usual closed evaluation: new words are ``<unk>`` targets
    and inputs (and count as OOV). ``lexicon``: what GroC layers (input and output) ground the
    evaluation vocabulary in (None: each layer's own lexicon merged with WordNet's entries for
    the new words). The stream layout, and so the result, is that of ``evaluate_stream``.
    """
    was_training = model.training
    model.eval()
    text = [EOS, *tokens]  # the context token, as in every evaluation path
    eval_words = list(vocab.itos)
    if open_vocabulary:
        seen = set(eval_words)
        for word in tokens:
            if word not in seen:
                seen.add(word)
                eval_words.append(word)
    eval_index = {w: i for i, w in enumerate(eval_words)}
    unk = vocab.unk_id
    target_ids = torch.tensor([eval_index.get(w, unk) for w in text])  # (N + 1,)
    known = len(vocab)
    new_words = len(eval_words) - known
    embedding = model.embedding
    if new_words and hasattr(embedding, "for_words"):  # the input side reads them too
        grounding = _grounding(embedding, eval_words[known:], lexicon)
        embedding = embedding.for_words(eval_words, grounding)
        input_ids = target_ids  # ids of V_eval
    else:
        input_ids = target_ids.masked_fill(target_ids >= known, unk)
    weight, bias = model.output()
    compositional = open_vocabulary and hasattr(model.output, "embed_words")
    if compositional and new_words:
        grounding = _grounding(model.output, eval_words[known:], lexicon)
        weight, bias = model.output.embed_words(eval_words, grounding)
    scored_size = weight.size(0)  # V_train, or V_eval for a compositional layer
    if compositional:  # it scores new words itself
        uniform = 0.0
    elif combiners.uniform_weight is None:
        uniform = 0.01 if open_vocabulary and new_words else 0.0
    else:
        uniform = combiners.uniform_weight

    def stream(ids: torch.Tensor) -> StreamBatches:
        return StreamBatches(ids, batch_size, segment, pad=True)

    inputs, targets = stream(input_ids), stream(target_ids)
    order = stream(torch.arange(len(text)))  # its "targets" are text positions
    unigram = UnigramCache(batch_size, len(eval_words), device) if combiners.unigram_cache else None
    neural = (
        NeuralCache(combiners.neural_window, combiners.neural_theta)
        if combiners.neural_cache
        else None
    )
    log_probs = torch.empty(len(text) - 1)
    state = None
    with _input_embedding(model, embedding):
        for index in range(len(inputs)):
            x = inputs[index][0].to(device)
            y = targets[index][1].to(device)
            predicted, state = model(x, state)
            logits = functional.logits(predicted, weight, bias).float()  # (B, T, V_scored)
            log_norm = torch.logsumexp(logits, -1)
            valid = y != IGNORE
            in_scored = valid & (y < scored_size)
            gathered = logits.gather(-1, y.clamp(0, scored_size - 1)[..., None]).squeeze(-1)
            probs = torch.where(in_scored, (gathered - log_norm).exp(), torch.zeros_like(log_norm))
            if uniform:
                probs = (1 - uniform) * probs + uniform / len(eval_words)
            if combiners.new_word_weight < 1 and new_words:
                omega = combiners.new_word_weight
                if compositional:
                    new_mass = (torch.logsumexp(logits[..., known:], -1) - log_norm).exp()
                else:
                    new_mass = torch.full_like(probs, uniform * new_words / len(eval_words))
                is_new = y >= known
                probs = probs * torch.where(is_new, omega, 1.0) / (1 - (1 - omega) * new_mass)
            if unigram is not None:
                cache_probs, available = unigram(y)
                probs = interpolate(probs, cache_probs, available, combiners.unigram_cache)
            if neural is not None:
                cache_probs, available = neural(predicted, y)
                probs = interpolate(probs, cache_probs, available, combiners.neural_cache)
            positions = order[index][1]  # (B, T): text index of each target
            keep = positions != IGNORE
            log_probs[positions[keep] - 1] = probs.log().cpu()[keep.cpu()]
    model.train(was_training)
    is_new = torch.tensor([w not in vocab for w in tokens])
    return TokenScores(log_probs, is_new, list(tokens))


def _grounding(layer: Any, new_words: list[str], lexicon: Any) -> Any:
    """The lexicon a GroC layer grounds ``V_eval`` in: ``lexicon`` when given, else the layer's
    own (which only knows the training words) merged with WordNet's entries for the new
    words; None for a layer without a lexicon (char-CNN, or relations and definitions off)."""
    own = getattr(layer, "lexicon", None)
    if lexicon is not None or own is None:
        return lexicon
    from targetlm.lexicon import load_lexicon

    return own.merged(load_lexicon(new_words, own.max_relations, own.max_definition))


@contextmanager
def _input_embedding(model: LanguageModel, embedding: nn.Module) -> Iterator[None]:
    """``model`` reads its input through ``embedding`` (e.g. one rebuilt for V_eval) inside the
    block, through its own again after it."""
    own = model.embedding
    model.embedding = embedding
    try:
        yield
    finally:
        model.embedding = own
