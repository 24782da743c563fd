"""The head ensemble of Heo, Rim & Choi (2025): N-gram heads help predict the next word.

Head n at column t−n predicted the word at column t (``targetlm.modules.heads`` has the
index picture). Its estimate of x_t is

    ê_n(t) = MLP^n(h_{t−n})                       simple heads
    ê_n(t) = MLP^n(h_{t−n}) + Δ^r_n x_{t−n}       WDR heads: from y_{t−n}..y_{t−1}, words already read

and ``x̂_ens = (1−λ)·x̂_t + λ·mean_n ê_n(t)`` (:func:`targetlm.functional.ensemble`).

Start-of-stream rule (the only one, used everywhere): ê_n(t) exists when column t−n does,
i.e. t ≥ n counted from the start of the row; the mean runs over the existing ones, and
a position with none (t = 0) uses x̂_t. A row is one stream whose encoder state is carried
across segments, so :class:`HeadEstimates` carries the last N−1 columns of h and of the
targets too: splitting a row into segments changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from targetlm import functional
from targetlm.data.batching import IGNORE, StreamBatches
from targetlm.inference.evaluate import perplexity
from targetlm.modules.heads import NgramHeads
from targetlm.modules.model import LanguageModel


class HeadEstimates:
    """Streaming head estimates ê_n(t) of the next word's vector, carried across segments.

    Args:
        heads: the model's heads.
        weight: ``E_out`` (V, d), for the WDR conjugate.

    ``__call__(predicted (B, T, d), targets (B, T))`` -> ``(estimates (N−1, B, T, d),
    available (N−1, T) bool)``. ``targets`` of a column are only read for later columns.
    """

    def __init__(self, heads: NgramHeads, weight: torch.Tensor) -> None:
        self.heads = heads
        self.weight = weight.detach()
        self.keep = heads.num_predictions - 1
        self.hidden: torch.Tensor | None = None  # (B, ≤ N−1, d): the last columns of h
        self.targets: torch.Tensor | None = None  # (B, ≤ N−1): their targets

    def reset(self) -> None:
        self.hidden = self.targets = None

    def __call__(
        self, predicted: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        T = predicted.size(1)
        hidden, ids = predicted, targets
        if self.hidden is not None:
            hidden = torch.cat([self.hidden, predicted], 1)  # (B, P + T, d)
            ids = torch.cat([self.targets, targets], 1)  # (B, P + T)
        P = hidden.size(1) - T  # carried columns: min(N−1, columns already read)
        real = ids != IGNORE
        embeddings = self.weight[ids.masked_fill(~real, 0)]  # x_s = E_out[y_s]
        # one more (zero) column: ê_n(t) comes from column t−n, whose conjugate reads
        # x_{t−n}..x_{t−1} only, but wdr_conjugate defines a column only where x_{t−n+n} exists
        embeddings = F.pad(embeddings, (0, 0, 0, 1))
        outputs = self.heads.reconstruct(self.heads(hidden), embeddings)
        estimates = torch.stack(
            # column c of the extended sequence gets head n's output at c − n (zeros before 0)
            [F.pad(out, (0, 0, n, 0))[:, P : P + T] for n, out in enumerate(outputs, 1)]
        )  # (N−1, B, T, d)
        columns = torch.arange(P, P + T, device=predicted.device)
        steps = torch.arange(1, self.keep + 1, device=predicted.device)
        available = columns[None, :] >= steps[:, None]  # (N−1, T): column t−n exists
        if self.keep > 0:
            self.hidden = hidden[:, -self.keep :].detach()
            self.targets = ids[:, -self.keep :]
        return estimates, available


@torch.no_grad()
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
    if model.heads is None or model.heads.num_predictions < 2:
        raise ValueError("the head ensemble needs a model with N-gram heads (model.heads.n >= 2)")
    for lam in lambdas:
        if not 0 <= lam <= 1:
            raise ValueError(f"ensemble λ must be in [0, 1], got {lam}")
    was_training = model.training
    model.eval()
    batches = StreamBatches(ids, batch_size, segment, pad=True)
    weight, bias = model.output()
    estimator = HeadEstimates(model.heads, weight)
    state = None
    main_total, totals, count = 0.0, [0.0] * len(lambdas), 0
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        predicted, state = model(inputs, state)
        estimates, available = estimator(predicted, targets)
        flat = targets.reshape(-1)
        main = functional.logits(predicted, weight, bias).flatten(0, -2)  # (B*T, V)
        _, nll_sum, n = functional.cross_entropy(main, flat)
        main_total, count = main_total + float(nll_sum), count + n
        for i, lam in enumerate(lambdas):
            if lam == 0:  # exactly the main head
                totals[i] += float(nll_sum)
                continue
            mixed = functional.ensemble(predicted, estimates, lam, available)
            logits = functional.logits(mixed, weight, bias).flatten(0, -2)
            totals[i] += float(functional.cross_entropy(logits, flat)[1])
    model.train(was_training)
    if count == 0:
        raise ValueError("nothing to score")
    nll = main_total / count
    return {
        "ppl": perplexity(nll),
        "nll": nll,
        "tokens": count,
        "ensemble": [
            {"lambda": lam, "ppl": perplexity(t / count), "nll": t / count}
            for lam, t in zip(lambdas, totals)
        ],
    }


def ensemble_predictions(
    model: LanguageModel, inputs: torch.Tensor, targets: torch.Tensor, lam: float
) -> torch.Tensor:
    """x̂_ens (B, T, d) of one segment read from the start of its rows (tests, analyses)."""
    weight, _ = model.output()
    predicted, _ = model(inputs)
    estimates, available = HeadEstimates(model.heads, weight)(predicted, targets)
    return functional.ensemble(predicted, estimates, lam, available)
