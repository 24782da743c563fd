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

Then the combiners of ``targetlm.inference.combiners`` apply in their documented order (head
ensemble on x̂; uniform mixture, new-word down-weighting, unigram cache, neural cache on
p(y_t)), all in the one evaluation loop (``targetlm.inference.evaluate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from targetlm.data.vocab import EOS, Vocabulary
from targetlm.inference.combiners import Combiners, ScoringContext, build_combiners
from targetlm.inference.evaluate import evaluate_ids, perplexity
from targetlm.modules.interfaces import OpenVocabularyEmbedding, OpenVocabularyOutput
from targetlm.modules.model import LanguageModel

if TYPE_CHECKING:
    from targetlm.lexicon.lexicon import Lexicon

__all__ = ["Combiners", "TokenScores", "score_streams", "score_text"]


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


def score_text(
    model: LanguageModel, vocab: Vocabulary, tokens: Sequence[str], **options: Any
) -> TokenScores:
    """Score every token of ``tokens`` (a split as read, ending with ``<eos>``): the main
    head's scores of :func:`score_streams`, whose keyword ``options`` it takes."""
    return score_streams(model, vocab, tokens, **options)[0]


@torch.no_grad()
def score_streams(
    model: LanguageModel,
    vocab: Vocabulary,
    tokens: Sequence[str],
    *,
    open_vocabulary: bool = False,
    combiners: Combiners | None = None,
    batch_size: int = 10,
    segment: int = 35,
    lexicon: Any = None,
    device: str | torch.device = "cpu",
) -> list[TokenScores]:
    """Score every token of ``tokens`` (a split as read, ending with ``<eos>``) for every
    stream in one pass: the main head's scores first, then one per λ of
    ``combiners.ensemble_lambdas``, each with the probability combiners applied.

    ``open_vocabulary=False`` is the usual closed evaluation: new words are ``<unk>`` targets
    and inputs (and count as OOV). ``lexicon``: what GroC layers (input and output) ground the
    evaluation vocabulary in (None: each layer's own lexicon merged with WordNet's entries for
    the new words). The stream layout, and so the result, is that of ``evaluate_stream``."""
    combiners = combiners or Combiners()
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
    embedding = None
    if new_words and isinstance(
        model.embedding, OpenVocabularyEmbedding
    ):  # the input side reads them too
        grounding = _grounding(model.embedding, eval_words[known:], lexicon)
        embedding = model.embedding.for_words(eval_words, grounding)
        input_ids = target_ids  # ids of V_eval
    else:
        input_ids = target_ids.masked_fill(target_ids >= known, unk)
    weight, bias = model.output()
    compositional = open_vocabulary and isinstance(model.output, OpenVocabularyOutput)
    if compositional and new_words and isinstance(model.output, OpenVocabularyOutput):
        grounding = _grounding(model.output, eval_words[known:], lexicon)
        weight, bias = model.output.embed_words(eval_words, grounding)
    context = ScoringContext(
        vocab_size=len(eval_words),
        known=known,
        scored_size=weight.size(0),  # V_train, or V_eval for a compositional layer
        compositional=compositional,
        open_vocabulary=open_vocabulary,
        batch_size=batch_size,
        device=device,
    )
    built = build_combiners(combiners, model, context, unknown=unk)
    results = evaluate_ids(
        model,
        target_ids,
        batch_size=batch_size,
        segment=segment,
        combiners=built,
        context=context,
        input_ids=input_ids,
        output=(weight, bias),
        embedding=embedding,
        per_token=True,
        device=device,
    )
    is_new = torch.tensor([w not in vocab for w in tokens])
    scores = []
    for result in results:
        if result.log_probs is None:  # never: per_token=True keeps them
            raise RuntimeError("evaluate_ids kept no per-token log-probabilities")
        scores.append(TokenScores(result.log_probs, is_new, list(tokens)))
    return scores


def _grounding(
    layer: OpenVocabularyOutput | OpenVocabularyEmbedding,
    new_words: list[str],
    lexicon: Lexicon | None,
) -> Lexicon | None:
    """The lexicon a GroC layer grounds ``V_eval`` in: ``lexicon`` when given, else the layer's
    own (which only knows the training words) merged with WordNet's entries for the new
    words; None for a layer without a lexicon (char-CNN, or relations and definitions off)."""
    own = layer.lexicon
    if lexicon is not None or own is None:
        return lexicon
    from targetlm.lexicon import load_lexicon

    return own.merged(load_lexicon(new_words, own.max_relations, own.max_definition))
