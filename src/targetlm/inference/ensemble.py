"""The head ensemble of Heo, Rim & Choi (2025): N-gram heads help predict the next word.

Head n at column t−n predicted the word at column t (``targetlm.modules.heads`` has the
index picture). Its estimate of x_t is

    ê_n(t) = MLP^n(h_{t−n})                       simple heads
    ê_n(t) = MLP^n(h_{t−n}) + Δ^r_n x_{t−n}       WDR heads: from y_{t−n}..y_{t−1}, words already read

and ``x̂_ens = (1−λ)·x̂_t + λ·mean_n ê_n(t)`` (:func:`targetlm.functional.ensemble`).

Start-of-stream rule (the only one, used everywhere): ê_n(t) exists when column t−n does,
i.e. t ≥ n counted from the start of the row; the mean runs over the existing ones, and
a position with none (t = 0) uses x̂_t. A row is one stream whose encoder state is carried
across segments, so :class:`HeadEstimates` carries the last N−1 columns of the heads' outputs
and of the targets too: splitting a row into segments changes nothing.

The ensemble is the vector combiner :class:`~targetlm.inference.combiners.HeadEnsemble` of the
one evaluation loop; :func:`evaluate_ensemble` is that loop with it alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from targetlm import functional
from targetlm.inference.combiners import (
    BuiltCombiners,
    CombinerError,
    HeadEnsemble,
    HeadEstimates,
)
from targetlm.inference.evaluate import evaluate_ids, perplexity
from targetlm.modules.model import LanguageModel

__all__ = ["HeadEstimates", "ensemble_predictions", "evaluate_ensemble"]


def evaluate_ensemble(
    model: LanguageModel,
    ids: torch.Tensor,
    batch_size: int,
    segment: int,
    lambdas: Sequence[float],
    device: str = "cpu",
) -> dict:
    """Next-word perplexity of the head ensemble for every λ in ``lambdas``, in one pass.

    The stream is read as in :func:`targetlm.inference.evaluate.evaluate_stream` (rows,
    segments, carried state); the encoder and the heads run once per segment and only
    the logit layer runs per λ. Returns ``{"ppl", "nll", "tokens"}`` of the main head and
    ``"ensemble": [{"lambda", "ppl", "nll"}, ...]``.
    """
    if model.num_heads < 1:
        raise CombinerError(
            "the head ensemble needs a model with N-gram heads (model.heads.n >= 2)"
        )
    combiners = BuiltCombiners(vector=HeadEnsemble(lambdas))
    main, *streams = evaluate_ids(
        model, ids, batch_size=batch_size, segment=segment, combiners=combiners, device=device
    )
    return {
        "ppl": perplexity(main.nll),
        "nll": main.nll,
        "tokens": main.count,
        "ensemble": [
            {"lambda": lam, "ppl": perplexity(s.nll), "nll": s.nll}
            for lam, s in zip(lambdas, streams)
        ],
    }


def ensemble_predictions(
    model: LanguageModel, inputs: torch.Tensor, targets: torch.Tensor, lam: float
) -> torch.Tensor:
    """x̂_ens (B, T, d) of one segment read from the start of its rows (tests, analyses)."""
    if model.heads is None:
        raise ValueError("the head ensemble needs a model with N-gram heads (model.heads)")
    weight, _ = model.output()
    prediction = model(inputs)
    estimates, available = HeadEstimates(model.heads, weight)(prediction, targets)
    return functional.ensemble(prediction.main, estimates, lam, available)
