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

:class:`~targetlm.objectives.diffusion.DiffusionLoss` turns it into ``MSE + anchor CE + length CE`` (with heads the MSE terms
are ½·L₀ + α/(2N−2)·Σ L_n, Heo et al. 2025 eqs. 11–12, head n's x̂₀[s+n] = MLPⁿ(x̂₀[s]) +
Δʳ_n x₀[s] with the detached conjugate of the clean embeddings, any registered head kind).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

from targetlm.data.batching import IGNORE
from targetlm.modules.diffusion import SAMPLERS, build_schedule, clip_noise_scale, denoiser_of
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.objectives.diffusion import DiffusionInputs, DiffusionLoss, diffusion_loss
from targetlm.registry import ConfigError, Count, NonNegative, Positive, Probability, Seed, Size
from targetlm.tasks.base import TASKS, Batch
from targetlm.tasks.translation import SentencePairTask

if TYPE_CHECKING:
    from targetlm.objectives.ngram import NgramLoss


@TASKS.register("diffusion")
class DiffusionTask(SentencePairTask):
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
    denoising = True
    causal = False
    decodes_at_lengths = True

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
        self.decode: dict[str, Any] = {
            "steps": decode_steps,
            "length_beam": length_beam,
            "samples": samples,
            "sampler": sampler,
            "seed": decode_seed,
        }
        # the loss :meth:`training_objective` made, which evaluation reads (a finished run's
        # task builds its own)
        self.loss: DiffusionLoss | None = None

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
        coin_generator: torch.Generator | None = None,
    ) -> Prediction:
        """Noise the batch's clean targets at a random t and denoise them once (self-conditioned
        with probability ``self_condition_prob``): Prediction(x̂₀, heads, None,
        :class:`~targetlm.objectives.diffusion.DiffusionInputs`).
        ``generator``: the randomness (t, ε, and on the CPU the self-conditioning coin); None:
        torch's RNG. ``coin_generator``: a CPU generator for the coin when ``generator`` is a
        GPU's (seeded evaluation on a GPU). A process's share of a batch (``batch.part``)
        draws t and ε for the whole batch and keeps its rows, so with the same random
        stream every process noises each row as one process would."""
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
        # t and ε of the whole batch's rows, these rows' kept: a row's draws do not depend on
        # how many processes share the batch
        rows, device = batch.whole_rows, targets.device
        time = batch.of_whole(self.sample_times(model, rows, device, generator))
        noise = batch.of_whole(
            torch.randn(
                (rows, *clean.shape[1:]), device=device, generator=generator, dtype=clean.dtype
            )
        )
        noised = self.schedule.noise(clean, time, noise)
        memory = denoiser.start(model.embed_source(batch.source), batch.source_mask)
        previous = None
        # the self-conditioning coin decides on the host which passes run: drawn on the CPU
        # (from ``coin_generator``, else ``generator`` when it is the CPU's, else torch's CPU
        # RNG), so a step on a GPU does not wait for the device to read it
        if coin_generator is None and (generator is None or generator.device.type == "cpu"):
            coin_generator = generator
        coin = torch.rand((), generator=coin_generator)
        if denoiser.self_condition and float(coin) < self.self_condition_prob:
            with torch.no_grad():
                first = model.forward_embedded(noised, memory.at(time, mask), run_heads=False)
            previous = first.main.detach()
        prediction = model.forward_embedded(
            noised, memory.at(time, mask, previous), run_heads=run_heads
        )
        m = denoiser.max_length_difference
        difference = mask.sum(1) - batch.source_mask.sum(1)
        extras = DiffusionInputs(
            clean, mask, time, denoiser.length_logits(memory), difference.clamp(-m, m) + m
        )
        return Prediction(prediction.main, prediction.heads, None, extras)

    # --- the loss, evaluation and decoding ----------------------------------------------------
    def check_model(self, kind: str, encoder_kind: str, model: LanguageModel) -> None:
        """A denoiser whose length classes cover the default length beam."""
        super().check_model(kind, encoder_kind, model)
        beam, classes = self.decode["length_beam"], denoiser_of(model).num_length_classes
        if beam > classes:
            raise ConfigError(
                f"task.length_beam = {beam} exceeds the denoiser's {classes} length classes "
                "(2·model.encoder.max_length_difference + 1)"
            )

    def loss_weights(self) -> dict[str, float]:
        """The task's options that weigh :class:`~targetlm.objectives.diffusion.DiffusionLoss`."""
        return {
            "embedding_scale": self.embedding_scale,
            "diffusion_weight": self.diffusion_weight,
            "anchor_weight": self.anchor_weight,
            "length_weight": self.length_loss_weight,
        }

    def training_objective(self, objective: NgramLoss, model: LanguageModel) -> DiffusionLoss:
        """:class:`~targetlm.objectives.diffusion.DiffusionLoss` around the run's objective."""
        denoiser_of(model)  # a clear error for any other encoder
        self.loss = diffusion_loss(objective, model.heads, **self.loss_weights())
        return self.loss

    def evaluate(self, model: LanguageModel, split: str) -> dict[str, Any]:
        """The losses at seeded times and noise; ``ppl``: the anchor perplexity (how well x̂₀
        rounds to the target through the logit layer), which picks the best model."""
        from targetlm.inference.diffusion import evaluate_diffusion
        from targetlm.objectives import build_objective

        loss = self.loss
        if loss is None:  # a finished run's: its objective, built as its training built it
            denoiser_of(model)
            objective = build_objective(self.config.objective, model)
            loss = diffusion_loss(objective, model.heads, **self.loss_weights())
        return evaluate_diffusion(model, self.data.batches[split], self.predict, loss, self.device)

    def split_results(self, model: LanguageModel, split: str) -> dict[str, Any]:
        """The validation losses with BLEU and chrF of diffusion decoding (the ``[task]``
        decode settings)."""
        result = self.evaluate(model, split)
        options = self.run_decoding(0.0)
        scores, speed = self.decode_split(model, split, options, options.summary()["decoding"])
        return {**result, **scores, **options.summary(), "sentences_per_s": speed}

    def decoding_options(
        self, ensemble_lambda: float, beam: dict[str, Any], diffusion: dict[str, Any]
    ) -> Any:
        from targetlm.inference.diffusion import decode_options

        given = [f"--{key.replace('_', '-')}" for key, value in beam.items() if value is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)}: beam search's options; a diffusion run decodes with "
                "--steps, --length-beam and --samples"
            )
        overrides = {key: value for key, value in diffusion.items() if key != "oracle_length"}
        return decode_options(self, ensemble_lambda, **overrides)

    def decoder(self) -> Callable[..., list[list[int]]]:
        from targetlm.inference.diffusion import translate_ids

        def decode(
            model: LanguageModel, sources: Any, *args: Any, **settings: Any
        ) -> list[list[int]]:
            return translate_ids(model, self, sources, *args, **settings)

        return decode

    def decoding_summary(self, options: Any) -> dict[str, Any]:
        return {"beam": options.beam, **options.summary()}

    def evaluate_run(
        self, model: LanguageModel, split: str, ensemble_lambda: float
    ) -> dict[str, Any]:
        """The validation losses of ``split`` (decoding and BLEU are ``targetlm translate``'s)."""
        if ensemble_lambda:
            raise ConfigError(
                "a diffusion run is evaluated on its splits (its losses): use `targetlm "
                "translate RUN --input SRC [--ensemble-lambda L]` to decode a file"
            )
        return {"split": getattr(self.config.data, split), **self.evaluate(model, split)}

    def describe(self, split: str, result: dict[str, Any]) -> str:
        r = result
        heads = "".join(f", L_{n} {v:.4f}" for n, v in enumerate(r["head_mse"], 1))
        return (
            f"{split} ({r['split']}): loss {r['loss']:.4f} (MSE L_0 {r['mse']:.4f}{heads}; "
            f"anchor NLL {r['nll']:.3f}, ppl {r['ppl']:.2f} over {r['tokens']:,} target tokens; "
            f"length loss {r['length_loss']:.3f}, accuracy {r['length_accuracy']:.1%})"
        )
