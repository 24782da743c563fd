r"""Decoding a diffusion run: K denoising steps, a length beam × noise samples, MBR, argmax.

For each source the length classifier proposes the B most probable target lengths (source
length + difference); each length gets S noise draws, so B·S candidates per sentence are
denoised together, batched::

    x ← σ(1)·ε   (t = 1);  times t_0 = 1 > t_1 > … > t_{K−1} = t_end   (linear)
    for each t_i:  x̂₀ = f(x, t_i, x̂₀_prev)            (self-conditioned on the last estimate)
                  x̂₀ ← (1−λ)·x̂₀ + λ/(N−1)·Σ_n ê_n     (head ensemble, λ > 0 only)
                  x ← a(t_{i+1})·x̂₀ + σ(t_{i+1})·ε'    (renoise, DINOISER)
                    | mean of q(x_{t_{i+1}} | x, x̂₀)  (posterior, Difformer)
    tokens = argmax (x̂₀/s)·E_outᵀ + b, cut at the first <eos>

and the candidate with the highest mean sentence BLEU against the other candidates of its
sentence is kept (minimum Bayes risk; one candidate: itself). Noise comes from one generator
seeded with ``seed``: the same seed gives the same output.

Head ensemble (Heo et al. 2025 §3.3, eq. 13 on x̂₀): head n's estimate of position t is
``MLPⁿ(x̂₀[t−n]) + Δʳ_n`` of the *current step's* estimate x̂₀[t−n..t−1] (the main head's, before
ensembling; the clean x₀ is unknown while decoding); positions t < n have no head n and
average the heads that exist (:func:`targetlm.functional.ensemble`); λ = 0 is plain decoding
exactly (the heads are not even run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from targetlm import functional
from targetlm.data.batching import Batch
from targetlm.inference.translate import decode_in_batches, until_eos
from targetlm.modules.diffusion import SAMPLERS, NoiseSchedule, denoiser_of
from targetlm.modules.model import LanguageModel, Prediction, evaluating
from targetlm.objectives.diffusion import DiffusionLoss
from targetlm.registry import ConfigError


class DiffusionTask(Protocol):
    """What diffusion decoding asks of its task (:class:`targetlm.tasks.diffusion.DiffusionTask`
    is one): its decoding options, noise schedule, end time and logit layer. A protocol, so
    that inference sits below the tasks that call it."""

    decode: dict[str, Any]
    decode_schedule: NoiseSchedule

    def end_time(self, model: LanguageModel) -> float: ...

    def logits(self, model: LanguageModel, estimate: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class DiffusionDecodeOptions:
    """steps: K denoiser calls. length_beam: B lengths per sentence. samples: S noise draws
    per length. sampler: ``renoise`` | ``posterior``. ensemble_lambda: λ (0: off; needs
    heads). seed: the noise generator's seed."""

    steps: int = 20
    length_beam: int = 3
    samples: int = 1
    sampler: str = "posterior"
    ensemble_lambda: float = 0.0
    seed: int = 1

    @property
    def beam(self) -> int:
        return self.length_beam

    length_penalty = None  # no length penalty: lengths come from the length classifier

    def check(self, model: LanguageModel) -> None:
        denoiser = denoiser_of(model)
        if self.steps < 1:
            raise ConfigError(f"the number of denoising steps must be >= 1, got {self.steps}")
        if self.samples < 1:
            raise ConfigError(f"samples must be >= 1, got {self.samples}")
        if not 1 <= self.length_beam <= denoiser.num_length_classes:
            raise ConfigError(
                f"the length beam must be in [1, {denoiser.num_length_classes}] (the model's "
                f"length classes), got {self.length_beam}"
            )
        if self.sampler not in SAMPLERS:
            raise ConfigError(
                f"unknown sampler {self.sampler!r}; choose one of {', '.join(SAMPLERS)}"
            )
        if not 0 <= self.ensemble_lambda <= 1:
            raise ConfigError(f"the ensemble λ must be in [0, 1], got {self.ensemble_lambda}")
        if self.ensemble_lambda > 0 and model.num_heads < 1:
            raise ConfigError(
                "the head ensemble needs a model with N-gram heads (model.heads.n >= 2)"
            )

    def summary(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "beam": self.length_beam,
            "decoding": f"{self.steps} steps, length beam {self.length_beam} x {self.samples} "
            f"samples, {self.sampler}",
        }


def decode_options(task: DiffusionTask, ensemble_lambda: float = 0.0, **overrides: Any):
    """The run's decoding defaults (``[task]`` decode_*) with ``overrides`` (None: the default)."""
    values = dict(task.decode) | {k: v for k, v in overrides.items() if v is not None}
    return DiffusionDecodeOptions(**values, ensemble_lambda=ensemble_lambda)


def head_ensemble(
    model: LanguageModel, main: torch.Tensor, raw: torch.Tensor | None, lam: float
) -> torch.Tensor:
    """x̂₀ (R, T, d) and the heads' raw outputs (N−1, R, T, d) -> the ensembled x̂₀ (eq. 13)."""
    if lam == 0 or raw is None:
        return main
    assert model.heads is not None  # raw outputs (not None) come only from the model's heads
    T = main.size(1)
    rebuilt = model.heads.reconstruct(raw, main)  # column s: the estimate of position s + n
    estimates = torch.stack(
        [F.pad(rebuilt[n - 1][:, : T - n], (0, 0, n, 0)) for n in range(1, raw.size(0) + 1)]
    )  # (N−1, R, T, d): head n's estimate of position t, read at t − n
    steps = torch.arange(1, raw.size(0) + 1, device=main.device)
    available = torch.arange(T, device=main.device)[None] >= steps[:, None]  # (N−1, T)
    return functional.ensemble(main, estimates, lam, available)


@torch.no_grad()
def generate(
    model: LanguageModel,
    task: DiffusionTask,
    source: torch.Tensor,
    mask: torch.Tensor,
    options: DiffusionDecodeOptions,
    eos: int,
    generator: torch.Generator,
    lengths: torch.Tensor | None = None,
) -> list[list[int]]:
    """The chosen output of every source row (ids without ``<eos>``); see the module.
    ``lengths`` (B,): given target lengths (``<eos>`` included; the oracle), instead of the
    length classifier's beam (then each row has only its S samples)."""
    denoiser = denoiser_of(model)
    memory = denoiser.start(model.embed_source(source), mask)
    B, device = source.size(0), source.device
    Lb, S, K = options.length_beam, options.samples, options.steps
    if lengths is None:
        differences = (
            denoiser.length_logits(memory).topk(Lb, -1).indices - denoiser.max_length_difference
        )
        lengths = (mask.sum(1)[:, None] + differences).clamp(1, denoiser.max_context)  # (B, Lb)
    else:
        Lb, lengths = 1, lengths.to(device)[:, None].clamp(1, denoiser.max_context)
    lengths = lengths.repeat_interleave(S, 1).reshape(-1)  # (R,), R = B·Lb·S
    rows = torch.arange(B, device=device).repeat_interleave(Lb * S)
    state = denoiser.cache_memory(memory).select(rows)  # projected once, not at every step
    R, T = rows.numel(), int(lengths.max())
    target_mask = torch.arange(T, device=device)[None] < lengths[:, None]  # (R, T)
    d = denoiser.target_size
    schedule = task.decode_schedule
    times = torch.linspace(1.0, task.end_time(model), K, device=device) if K > 1 else None
    times = torch.ones(1, device=device) if times is None else times
    ones = torch.ones(R, device=device)
    x = schedule.std(ones)[:, None, None] * torch.randn(R, T, d, device=device, generator=generator)
    previous = None
    lam = options.ensemble_lambda
    keep = target_mask[..., None].to(x.dtype)
    for i in range(K):
        t = times[i] * ones
        prediction = model.forward_embedded(
            x, state.at(t, target_mask, previous), run_heads=lam > 0
        )
        estimate = head_ensemble(model, prediction.main, prediction.heads, lam) * keep
        previous = estimate if denoiser.self_condition else None
        if i + 1 < K:
            s = times[i + 1] * ones
            if options.sampler == "renoise":
                noise = torch.randn(x.shape, device=device, generator=generator, dtype=x.dtype)
                x = schedule.noise(estimate, s, noise)
            else:
                x = schedule.posterior_mean(x, estimate, t, s)
    tokens = task.logits(model, estimate).argmax(-1).tolist()  # (R, T)
    candidates = [until_eos(row[:length], eos) for row, length in zip(tokens, lengths.tolist())]
    per_sentence = Lb * S
    return [
        minimum_bayes_risk(candidates[b * per_sentence : (b + 1) * per_sentence]) for b in range(B)
    ]


def minimum_bayes_risk(candidates: Sequence[list[int]]) -> list[int]:
    """The candidate with the highest mean sentence BLEU (SacreBLEU, on token ids, exponential
    smoothing) against the others; the first (most probable length) on ties."""
    if len(candidates) == 1:
        return list(candidates[0])
    from targetlm.inference.translate import _sacrebleu

    bleu = _sacrebleu().metrics.BLEU(tokenize="none", effective_order=True)
    texts = [" ".join(map(str, c)) for c in candidates]
    best, best_score = 0, float("-inf")
    for i, hypothesis in enumerate(texts):
        score = sum(
            bleu.sentence_score(hypothesis, [reference]).score
            for j, reference in enumerate(texts)
            if j != i
        )
        if score > best_score:
            best, best_score = i, score
    return list(candidates[best])


def translate_ids(
    model: LanguageModel,
    task: DiffusionTask,
    sources: Sequence[torch.Tensor],
    options: DiffusionDecodeOptions,
    eos: int,
    *,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    target_lengths: Sequence[int] | None = None,
) -> list[list[int]]:
    """Output ids of every source, batched by length, in order; the noise generator is seeded
    once, so a call is reproducible. ``target_lengths``: each output's length with its
    ``<eos>`` (the oracle: the reference's), instead of the length classifier's proposals."""
    options.check(model)
    if target_lengths is not None and len(target_lengths) != len(sources):
        raise ValueError(f"{len(target_lengths)} target lengths for {len(sources)} sources")
    generator = torch.Generator(device=device).manual_seed(options.seed)

    def decode_batch(source: torch.Tensor, mask: torch.Tensor, index: list[int]):
        lengths = None
        if target_lengths is not None:
            lengths = torch.tensor([target_lengths[i] for i in index])
        return generate(model, task, source, mask, options, eos, generator, lengths)

    return decode_in_batches(
        model,
        sources,
        decode_batch,
        batch_size,
        device,
    )


@torch.no_grad()
def evaluate_diffusion(
    model: LanguageModel,
    batches: Sequence[Batch],
    predict: Callable[..., Prediction],
    loss: DiffusionLoss,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    """The validation losses at seeded times and noise (each batch noised and denoised by
    ``predict``, the task's, with its ``generator`` and ``coin_generator``): ``loss`` (the
    training total), ``mse`` (L₀), ``head_mse`` (L_n), ``nll``/``ppl`` (the anchor
    cross-entropy per target token), ``length_loss`` and ``length_accuracy`` (per sentence),
    ``tokens``, ``sentences``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    coins = torch.Generator().manual_seed(seed) if generator.device.type != "cpu" else None
    with evaluating(model):
        weight, bias = model.output()
        sums: dict[str, float] = {
            "loss": 0.0,
            "mse": 0.0,
            "nll": 0.0,
            "length": 0.0,
            "correct": 0.0,
        }
        head_sums: list[float] = []
        tokens = sentences = 0
        for batch in batches:
            batch = batch.to(device)
            prediction = predict(model, batch, generator=generator, coin_generator=coins)
            terms = loss.terms(prediction, batch.targets, weight, bias)
            count, rows = terms["anchor"].count, batch.targets.size(0)
            sums["loss"] += float(terms["loss"]) * count
            sums["mse"] += float(terms["mse"]) * count
            sums["nll"] += float(terms["anchor"].nll_sum)
            sums["length"] += float(terms["length"]) * rows
            sums["correct"] += float(terms["length_accuracy"]) * rows
            values = [float(v) * count for v in terms["head_mse"]]
            head_sums = [a + b for a, b in zip(head_sums, values)] if head_sums else values
            tokens, sentences = tokens + count, sentences + rows
    n = max(tokens, 1)
    nll = sums["nll"] / n
    return {
        "loss": sums["loss"] / n,
        "mse": sums["mse"] / n,
        "head_mse": [v / n for v in head_sums],
        "nll": nll,
        "ppl": float(torch.exp(torch.tensor(nll))),
        "length_loss": sums["length"] / max(sentences, 1),
        "length_accuracy": sums["correct"] / max(sentences, 1),
        "tokens": tokens,
        "sentences": sentences,
    }
