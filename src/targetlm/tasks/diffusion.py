r"""``diffusion``: a non-autoregressive conditional generator in the output embedding space.

Sentence pairs are batched as for translation (:func:`~targetlm.tasks.translation.pair_batches`);
the denoiser reads no target prefix, only the target ids (``Batch.targets``, ``<eos>``
included, IGNORE at padding) and the source. One training prediction::

    x₀ = s·norm(E_out)[y]                 the logit layer's rows (tied by default), scale s,
                                          optional LayerNorm of the rows (Difformer's embed-norm)
    t ~ U{1/T..1} (sqrt) | U[σ_min, 1] (dinoiser, clipped)
    x_t = a(t)·x₀ + σ(t)·ε
    x̂₀_prev = f(x_t, t, 0) without gradient, with probability p (self-conditioning), else 0
    x̂₀ = f(x_t, t, x̂₀_prev);  heads_n(x̂₀) raw (the LanguageModel's heads read the model's output)

:class:`DiffusionLoss` turns it into ``MSE + anchor CE + length CE`` (with heads the MSE terms
are ½·L₀ + α/(2N−2)·Σ L_n, Heo et al. 2025 eqs. 11–12, head n's x̂₀[s+n] = MLPⁿ(x̂₀[s]) +
Δʳ_n x₀[s] with the detached conjugate of the clean embeddings, any registered head kind).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from targetlm import functional
from targetlm.data.batching import IGNORE
from targetlm.modules.diffusion import (
    DenoiserState,
    DiffusionDenoiser,
    build_schedule,
    clip_noise_scale,
)
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.objectives.base import LossOutput
from targetlm.registry import ConfigError, Count, NonNegative, Positive, Probability, Seed, Size
from targetlm.tasks.base import TASKS, Batch, Task

SAMPLERS = ("renoise", "posterior")


@dataclass(frozen=True)
class DiffusionState:
    """What the loss needs besides x̂₀ (the ``state`` of a diffusion :class:`Prediction`).

    clean: x₀ (B, T, d); mask (B, T) True at real target positions; time (B,);
    length_logits (B, 2m + 1) and length_classes (B,) (target − source length + m).
    """

    clean: torch.Tensor
    mask: torch.Tensor
    time: torch.Tensor
    length_logits: torch.Tensor
    length_classes: torch.Tensor


def denoiser_of(model: LanguageModel) -> DiffusionDenoiser:
    if not isinstance(model.encoder, DiffusionDenoiser):
        raise ConfigError(
            "task.kind = 'diffusion' needs a denoiser: model.encoder.kind = 'diffusion_denoiser', "
            f"got a {type(model.encoder).__name__}"
        )
    return model.encoder


def denoise(
    model: LanguageModel, noised: torch.Tensor, state: DenoiserState, *, run_heads: bool = True
) -> Prediction:
    """One denoiser call: x_t (B, T, d) at ``state.time`` -> Prediction(x̂₀ (B, T, d), the heads'
    raw outputs from x̂₀ (N−1, B, T, d) or None, state). The LM's ``forward`` without the token
    lookup: the model's projection gives x̂₀ and its heads read it."""
    hidden, state = model.encoder(noised, state)
    predicted = model.projection(hidden)
    heads = model.heads(predicted) if run_heads and model.num_heads else None
    return Prediction(predicted, heads, state)


@TASKS.register("diffusion")
class DiffusionTask(Task):
    """Embedding-space diffusion (Difformer / DINOISER) on sentence pairs.

    Args:
        schedule: ``sqrt`` (Difformer) or ``dinoiser`` (:mod:`targetlm.modules.diffusion`).
        noise_factor: F of the sqrt schedule (Difformer: 4).
        diffusion_steps: T, training times t = k/T, k ~ U{1..T} (sqrt; 0: continuous t ~ U(0, 1]).
        embedding_scale: s in x₀ = s·norm(E_out)[y].
        embedding_norm: LayerNorm (no affine) of the logit layer's rows before scaling
            (Difformer's embed-norm): every x₀ has per-dimension variance s², the noise's scale.
            The anchor logits and the argmax read the logit layer itself, (x̂₀/s)·E_outᵀ + b.
        self_condition_prob: probability of a self-conditioned training pass (0.5).
        length_loss_weight: weight of the length cross-entropy (Difformer: 0.1).
        anchor_weight: weight of the anchor (rounding) cross-entropy.
        diffusion_weight: weight of the diffusion term (L₀, or with heads the N-gram total
            ½·L₀ + α/(2N−2)·Σ L_n); 0.5 on a model without heads gives it the weight L₀ has
            against the anchor and length losses in a WDR model (the control that separates
            the heads from that reweighting).
        clip_every: dinoiser: recompute σ_min from the table every this many training
            batches (and on the first); 0: never (t ~ U(0, 1]).
        decode_steps, length_beam, samples, sampler, decode_seed: the defaults of decoding
            (:mod:`targetlm.inference.diffusion`; ``sampler``: ``renoise`` (DINOISER: x̂₀
            noised afresh to the next t) or ``posterior`` (Difformer: the mean of q(x_s|x_t, x̂₀))).
        decode_noise_factor: the sqrt schedule's noise factor while decoding (Difformer: 1);
            0: the training one.
    """

    conditional = True
    causal = False

    def __init__(
        self,
        schedule: Literal["sqrt", "dinoiser"] = "sqrt",
        noise_factor: Positive = 1.0,
        diffusion_steps: Count = 2000,
        embedding_scale: Positive = 1.0,
        embedding_norm: bool = False,
        self_condition_prob: Probability = 0.5,
        length_loss_weight: NonNegative = 0.1,
        anchor_weight: NonNegative = 1.0,
        diffusion_weight: Positive = 1.0,
        clip_every: Count = 100,
        decode_steps: Size = 20,
        length_beam: Size = 3,
        samples: Size = 1,
        sampler: Literal["renoise", "posterior"] = "posterior",
        decode_seed: Seed = 1,
        decode_noise_factor: NonNegative = 0.0,
    ) -> None:
        self.schedule = build_schedule(schedule, noise_factor)
        if decode_noise_factor < 0:
            raise ValueError(f"decode_noise_factor must be >= 0, got {decode_noise_factor}")
        # Difformer decodes with another noise factor than it trains with (1 against 4)
        self.decode_schedule = (
            build_schedule(schedule, decode_noise_factor) if decode_noise_factor else self.schedule
        )
        if noise_factor <= 0 or embedding_scale <= 0:
            raise ValueError("noise_factor and embedding_scale must be > 0")
        if diffusion_steps < 0 or clip_every < 0:
            raise ValueError("diffusion_steps and clip_every must be >= 0")
        if not 0 <= self_condition_prob <= 1:
            raise ValueError(f"self_condition_prob must be in [0, 1], got {self_condition_prob}")
        if not min(length_loss_weight, anchor_weight) >= 0:
            raise ValueError("length_loss_weight and anchor_weight must be >= 0")
        if not diffusion_weight > 0:
            raise ValueError(f"diffusion_weight must be > 0, got {diffusion_weight}")
        if min(decode_steps, length_beam, samples) < 1:
            raise ValueError("decode_steps, length_beam and samples must be >= 1")
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}")
        self.diffusion_steps = diffusion_steps
        self.embedding_scale, self.embedding_norm = embedding_scale, embedding_norm
        self.self_condition_prob = self_condition_prob
        self.length_loss_weight, self.anchor_weight = length_loss_weight, anchor_weight
        self.diffusion_weight = diffusion_weight
        self.clip_every = clip_every
        self.decode = {
            "steps": decode_steps,
            "length_beam": length_beam,
            "samples": samples,
            "sampler": sampler,
            "seed": decode_seed,
        }

    @property
    def clipped(self) -> bool:
        return self.schedule.name == "dinoiser" and self.clip_every > 0

    # --- the clean embeddings and their logit layer ----------------------------------------
    def clean_table(self, weight: torch.Tensor) -> torch.Tensor:
        """x₀ of every word: s·norm(E_out) (V, d), norm = LayerNorm without affine or identity."""
        table = F.layer_norm(weight, weight.shape[-1:]) if self.embedding_norm else weight
        return self.embedding_scale * table

    def logits(self, model: LanguageModel, estimate: torch.Tensor) -> torch.Tensor:
        """x̂₀ (..., d) -> logits through the run's own logit layer, x̂₀ read in x₀'s scale:
        (x̂₀ / s)·E_outᵀ + b (the anchor loss and decoding's argmax)."""
        return model.logits(estimate / self.embedding_scale)

    def update_clip(self, model: LanguageModel) -> None:
        """DINOISER's σ_min from the current table (kept in the denoiser's buffer)."""
        weight, _ = model.output()
        value = clip_noise_scale(self.clean_table(weight.detach()))
        denoiser_of(model).sigma_min.fill_(value)

    def end_time(self, model: LanguageModel) -> float:
        """The smallest t decoding visits: σ_min (dinoiser, clipped) or 1/T (sqrt)."""
        if self.clipped:
            return max(float(denoiser_of(model).sigma_min), 1e-3)
        return 1.0 / self.diffusion_steps if self.diffusion_steps else 1e-3

    def sample_times(
        self, model: LanguageModel, rows: int, device, generator: torch.Generator | None
    ) -> torch.Tensor:
        """Training times t (rows,): k/T for the sqrt schedule, U[σ_min, 1] for dinoiser."""
        u = torch.rand(rows, device=device, generator=generator)
        if self.schedule.name == "sqrt" and self.diffusion_steps:
            return (torch.floor(u * self.diffusion_steps) + 1) / self.diffusion_steps
        low = float(denoiser_of(model).sigma_min) if self.clipped else 0.0
        return low + (1 - low) * (1 - u)  # in (low, 1]

    # --- the task ---------------------------------------------------------------------------
    def predict(
        self,
        model: LanguageModel,
        batch: Batch,
        state: Any = None,
        *,
        run_heads: bool = True,
        generator: torch.Generator | None = None,
    ) -> Prediction:
        """Noise the batch's clean targets at a random t and denoise them once (self-conditioned
        with probability ``self_condition_prob``): Prediction(x̂₀, heads, :class:`DiffusionState`).
        ``generator``: the randomness (t, ε, the self-conditioning coin); None: torch's RNG."""
        denoiser = denoiser_of(model)
        if batch.source is None or batch.source_mask is None:
            raise ValueError("a diffusion batch needs its source and source_mask")
        targets = batch.targets
        mask = targets != IGNORE
        if model.training and self.clipped:
            if int(denoiser.training_batches) % self.clip_every == 0:
                self.update_clip(model)
            denoiser.training_batches += 1
        weight, _ = model.output()
        clean = self.clean_table(weight)[targets.masked_fill(~mask, 0)]  # (B, T, d)
        clean = clean * mask[..., None].to(clean.dtype)
        B, device = targets.size(0), targets.device
        time = self.sample_times(model, B, device, generator)
        noise = torch.randn(clean.shape, device=device, generator=generator, dtype=clean.dtype)
        noised = self.schedule.noise(clean, time, noise)
        memory = denoiser.start(model.embedding(batch.source), batch.source_mask)
        previous = None
        coin = torch.rand((), device=device, generator=generator)
        if denoiser.self_condition and float(coin) < self.self_condition_prob:
            with torch.no_grad():
                first = denoise(model, noised, memory.at(time, mask), run_heads=False)
            previous = first.main.detach()
        prediction = denoise(model, noised, memory.at(time, mask, previous), run_heads=run_heads)
        m = denoiser.max_length_difference
        difference = mask.sum(1) - batch.source_mask.sum(1)
        extras = DiffusionState(
            clean, mask, time, denoiser.length_logits(memory), difference.clamp(-m, m) + m
        )
        return Prediction(prediction.main, prediction.heads, extras)


def masked_mse(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the positions ``mask`` (B, T) and the d dimensions (0 for none)."""
    weights = mask.to(predicted.dtype)[..., None]
    count = weights.sum() * predicted.size(-1)
    return ((predicted - target) ** 2 * weights).sum() / count.clamp(min=1)


class DiffusionLoss(nn.Module):
    """``w·MSE + anchor·CE(x̂₀) + length_weight·CE(length)`` of a diffusion :class:`Prediction`.

    MSE: L₀ = ‖x̂₀ − x₀‖² (mean over real positions and dimensions); with N-gram heads
    ``½·L₀ + α/(2N−2)·Σ_n L_n`` (:func:`targetlm.functional.ngram_loss`), L_n the MSE between
    head n's reconstruction at s, ``heads.reconstruct`` (WDR: MLPⁿ(x̂₀[s]) + Δʳ_n x₀[s], the
    detached conjugate of x₀[s..s+n−1]), and x₀[s+n], over the s where s + n is a real position.
    The anchor CE is the run's objective (cross entropy, label smoothing...) on the logit
    layer's logits of x̂₀ read in x₀'s scale, (x̂₀ / s)·E_outᵀ + b; its NLL is the perplexity
    the trainer logs.

    Args:
        objective: the built per-position objective (``[objective]``); heads: the model's
            heads (not owned); alpha: α (``objective.ngram_alpha``); task: the diffusion task.
    """

    lookahead = 0  # pair batches carry the whole target

    def __init__(
        self,
        objective: nn.Module,
        heads: nn.Module | None,
        alpha: float,
        task,
        main_weight: float = 0.5,
    ) -> None:
        super().__init__()
        self.objective, self.heads, self.alpha, self.task = objective, [heads], alpha, task
        self.main_weight = main_weight

    def terms(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> dict[str, Any]:
        """Every term: ``mse`` (L₀), ``head_mse`` ([L_1..L_{N−1}]), ``anchor`` (LossOutput),
        ``length`` (mean CE), ``length_accuracy``, ``loss`` (the total)."""
        extras: DiffusionState = prediction.state
        clean, mask = extras.clean, extras.mask
        mse = masked_mse(prediction.main, clean, mask)
        head_mse = []
        heads = self.heads[0]
        if heads is not None and prediction.heads is not None:
            T = clean.size(1)
            rebuilt = heads.reconstruct(prediction.heads, clean.detach())  # (N−1, B, T, d)
            for n, estimate in enumerate(rebuilt, 1):
                shifted = F.pad(clean[:, n:], (0, 0, 0, n))  # x₀[s + n] at column s
                scored = F.pad(mask[:, n:], (0, n), value=False)[:, :T]
                head_mse.append(masked_mse(estimate, shifted, scored))
        diffusion = (
            functional.ngram_loss([mse, *head_mse], self.alpha, self.main_weight)
            if head_mse
            else mse
        )
        scale = self.task.embedding_scale
        anchor = self.objective(prediction.main / scale, targets, weight, bias)
        length = F.cross_entropy(extras.length_logits.float(), extras.length_classes)
        correct = (extras.length_logits.argmax(-1) == extras.length_classes).float().mean()
        loss = (
            self.task.diffusion_weight * diffusion
            + self.task.anchor_weight * anchor.loss
            + self.task.length_loss_weight * length
        )
        return {
            "loss": loss,
            "diffusion": diffusion,
            "mse": mse,
            "head_mse": head_mse,
            "anchor": anchor,
            "length": length,
            "length_accuracy": correct,
        }

    def forward(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> LossOutput:
        terms = self.terms(prediction, targets, weight, bias)
        anchor = terms["anchor"]
        return LossOutput(terms["loss"], anchor.nll_sum, anchor.count)


def diffusion_loss(ngram: nn.Module, task: DiffusionTask) -> DiffusionLoss:
    """The diffusion loss around the run's built objective (an ``NgramLoss``: its wrapped
    objective, heads, α and L₀'s weight)."""
    if ngram.heads_objective is not ngram.objective:
        raise ConfigError(
            "objective.ngram_heads_label_smoothing: the diffusion heads' losses are MSEs, "
            "with no targets to smooth"
        )
    return DiffusionLoss(ngram.objective, ngram.heads[0], ngram.alpha, task, ngram.main_weight)
