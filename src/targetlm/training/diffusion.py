"""Training a diffusion run: the translation trainer with the diffusion task and loss.

Everything but the loss, validation and final figures is
:class:`~targetlm.training.translation.TranslationTrainer`'s (parallel splits, joint BPE,
pair batches under a token budget, the schedule, exact resume, early stopping). The step is
the base trainer's: the task's ``predict`` (noise at a random t, one self-conditioned
denoising), then :class:`~targetlm.tasks.diffusion.DiffusionLoss` around the run's
``[objective]`` (its α, its heads). Validation is the loss at seeded times and noise; the best
model is the one with the lowest anchor perplexity (``ppl``: how well x̂₀ rounds to the
target through the logit layer). The final results add BLEU and chrF of diffusion decoding
with the ``[task]`` decode settings on valid and test.
"""

from __future__ import annotations

from typing import Any

from targetlm.inference.diffusion import (
    decode_options,
    evaluate_diffusion,
    translate_texts,
)
from targetlm.inference.translate import score_translations
from targetlm.tasks.base import Batch
from targetlm.tasks.diffusion import denoiser_of, diffusion_loss
from targetlm.training.translation import TranslationTrainer


class DiffusionTrainer(TranslationTrainer):
    """``task.kind = "diffusion"``: trains a denoiser (``model.encoder.kind =
    "diffusion_denoiser"``) on ``data.source_lang`` → ``data.target_lang`` pairs."""

    def _setup(self) -> None:
        super()._setup()
        denoiser_of(self.model)  # a clear error for any other encoder
        self.objective = diffusion_loss(self.objective, self.task).to(self.device)

    def train_step(self, batch: Batch | list[Batch], lr: float) -> tuple[float, int]:
        result = super().train_step(batch, lr)
        self.state = None  # the prediction's state is the loss's inputs, not a stream state
        return result

    def _evaluate(self, split: str) -> dict[str, Any]:
        return evaluate_diffusion(
            self.model, self.eval_batches[split], self.task, self.objective, self.device
        )

    def _split_results(self, split: str) -> dict[str, Any]:
        c = self.config
        result = self._evaluate(split)
        part = self.corpus.splits[getattr(c.data, split)]
        options = decode_options(self.task)
        hypotheses, seconds = translate_texts(
            self.model,
            self.vocab,
            part.source,
            options,
            task=self.task,
            batch_size=c.eval.batch_size,
            device=self.device,
        )
        scores = score_translations(hypotheses, part.target_lines)
        self.log(
            f"{split}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f} "
            f"({options.summary()['decoding']}, {len(hypotheses) / seconds:.1f} sentences/s) "
            f"{scores['bleu_signature']}"
        )
        return {
            **result,
            **scores,
            **options.summary(),
            "sentences_per_s": len(hypotheses) / seconds,
        }
