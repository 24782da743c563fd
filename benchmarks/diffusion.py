"""Text diffusion: targetlm's denoiser against a plain PyTorch one, heads, decoding.

The shape is ``configs/diff-tiny-multi30k-base.toml``'s (``--shape small``: translation.py's
``nmt-small`` sizes): d 128, ff 256, 2 encoder + 2 denoiser layers, 4 heads, V 6000, learned
positions, post-LN, GELU, one embedding shared by the source and the tied logit layer (no
bias), DINOISER's schedule (a(t) = √(1 − t²), σ(t) = t, t ~ U[σ_min, 1] with σ_min recomputed
from the table every 100 batches), embed-norm (x₀ = LayerNorm without affine of the logit
layer's rows, scale 1), self-conditioning with probability 0.5, label smoothing 0.1, length
loss 0.1, dropout 0.1 on the residual branches and the inputs (none on the attention weights
nor inside the feed-forward). Data: random Multi30k-like pairs (10–25 tokens each side, the
target within ±3 of the source) batched by ``targetlm.tasks.pair_batches`` under a 2,048-token
budget, ids uniform.

* **training** (target tokens/s): targetlm ``DiffusionTask(...).predict`` +
  ``diffusion_loss(build_objective(...))`` + backward + gradient clipping (1.0, as the preset)
  + Adam (1e-3, β (0.9, 0.98)); against ``Reference``, written here from stock pieces:
  ``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer`` over √d·E[source] + learned
  positions; ``nn.TransformerDecoder`` of ``nn.TransformerDecoderLayer`` with no causal mask
  (target padding masked as keys) over ``Linear([x_t; x̂₀_prev])`` + learned positions + an MLP
  of sinusoidal features of 1000·t; x₀ = ``F.layer_norm(E[y])`` (only the batch's rows), the
  same schedule and σ_min clipping (its own nearest-neighbour code, same cadence), a no-grad
  first pass with probability 0.5, loss = masked MSE + ``F.cross_entropy(x̂₀·Eᵀ,
  label_smoothing=0.1)`` + 0.1 · length CE (a Linear on the masked mean of the memory, classes
  target − source length in [−16, 16]); the same clipping and Adam.
  Both sides draw t, ε and the self-conditioning coin from a ``torch.Generator`` seeded alike,
  in the same order (``predict(generator=...)``: t (B,), then ε, then the coin), so they see
  the same noise in every step.
* **check** (before anything is timed): the reference gets targetlm's weights; with dropout 0
  and self-conditioning probability 0 and then 1 (both branches), on the same batch and seeds,
  the total loss, its MSE / anchor / length terms and the gradients (the shared embedding's,
  and the global gradient norm) must agree within float32 round-off (tolerances below).
* **heads' cost**: targetlm training step time with WDR heads N = 2 and N = 3 (α 0.1) relative
  to no heads, next to the ratio the extra matmul FLOPs predict. With heads the diffusion loss
  adds no logit pass (its head terms are MSEs of ``reconstruct``-ed estimates in the embedding
  space), so the heads' extra FLOPs are only their MLPs (2 d×d matmuls each, forward and
  backward: 3 × (N − 1) · 2 · 2 · d² per target position); the base counts every matmul of a
  step (encoder, denoiser, the no-grad self-conditioning pass with weight 0.5, the logits;
  attention over the padded lengths; backward = 2 × forward).
* **decoding** (sentences/s, targetlm only; ``--batch`` sentences per batch, default 100, the
  presets' ``eval.batch_size``): diffusion ``translate_ids`` (renoise sampler, 1 sample per
  length) with K = 10 and 20 steps and length beam 1 and 3, and K = 10, beam 3 with the head
  ensemble (WDR N = 2, λ 0.1, the trained base weights plus random heads); against the
  autoregressive ``targetlm.inference.translate.translate_ids``, beam 5, of an ``nmt-tiny``
  model (translation.py's ``model_config``). Random weights decode to arbitrary lengths, so the
  lengths are fixed: the ``<eos>`` row of each model's embedding is zeroed (its logit is 0,
  never the argmax nor among the best beam candidates of a random model); the diffusion length
  classifier's weight is zeroed and its bias ranks the differences 0, +1, −1 first, so a
  sentence's candidates have |source| + {0, +1, −1} positions; the autoregressive decoder's
  maximum is |source| + 1 (``max_len_a`` 1, ``max_len_b`` 1, ``<eos>`` forced there). Every
  output then has |source| tokens (±1 for a length beam of 3), which the script asserts.

Timing: one untimed warm-up per side and case, then rounds in which the sides alternate
(ABBA…, or ABC CBA…); each side's rate is the median over the rounds, ``spread`` =
(max − min) / median. The table is followed by a line ``JSON {...}`` (also ``--json-out``).

Usage::

    python benchmarks/diffusion.py [--shape tiny|small] [--steps 6] [--rounds 5]
        [--sentences 200] [--batch 100] [--threads 1] [--quick] [--json-out diff.json]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from common import LOAD_BEFORE, emit, interleaved, load_average, median, rate, spread
from torch import nn
from translation import (
    EOS,
    IGNORE,
    SEED,
    SHAPES,
    Shape,
    copy_weights,
    log,
    preset_shape,
    random_pairs,
)
from translation import model_config as translation_config

from targetlm.config import ComponentConfig, ModelConfig
from targetlm.inference import translate as autoregressive
from targetlm.inference.diffusion import DiffusionDecodeOptions
from targetlm.inference.diffusion import translate_ids as diffusion_translate
from targetlm.modules import build_model
from targetlm.objectives import build_objective
from targetlm.tasks import Batch, pair_batches
from targetlm.tasks.diffusion import DiffusionTask, diffusion_loss

MAX_DIFFERENCE = 16  # max_length_difference of the presets: 33 length classes
CLIP_EVERY = 100  # σ_min recomputed every this many training batches (task.clip_every)
LABEL_SMOOTHING, LENGTH_WEIGHT, SELF_CONDITION = 0.1, 0.1, 0.5
ADAM = dict(lr=1e-3, betas=(0.9, 0.98))
# the equality check: |Δ| <= tolerance · max(1, |value|) (float32 round-off of a different
# order of operations: nn.MultiheadAttention's path against targetlm's SDPA calls)
LOSS_TOLERANCE, GRAD_TOLERANCE = 1e-5, 1e-4


def model_config(shape: Shape, dropout: float, heads: int = 1) -> ModelConfig:
    """The diff-tiny-multi30k preset's model (``heads`` = N: WDR heads when N > 1)."""
    return ModelConfig(
        embedding=ComponentConfig("lookup", {"size": shape.d, "init_std": shape.d**-0.5}),
        encoder=ComponentConfig(
            "diffusion_denoiser",
            {
                "encoder_layers": shape.encoder_layers,
                "decoder_layers": shape.decoder_layers,
                "num_heads": shape.heads,
                "ff_size": shape.ff,
                "dropout": dropout,
                "max_context": shape.max_context,
                "positions": "learned",
                "norm": "post",
                "activation": "gelu",
                "self_condition": True,
                "max_length_difference": MAX_DIFFERENCE,
            },
        ),
        output=ComponentConfig("tied", {"bias": False}),
        heads=ComponentConfig("wdr", {"n": heads}) if heads > 1 else ComponentConfig("none", {}),
    )


def make_task(self_condition_prob: float = SELF_CONDITION) -> DiffusionTask:
    """The preset's ``[task]``."""
    return DiffusionTask(
        schedule="dinoiser",
        embedding_norm=True,
        embedding_scale=1.0,
        self_condition_prob=self_condition_prob,
        length_loss_weight=LENGTH_WEIGHT,
        clip_every=CLIP_EVERY,
        decode_steps=10,
        length_beam=3,
        samples=1,
        sampler="renoise",
    )


def make_loss(model: nn.Module, task: DiffusionTask) -> nn.Module:
    options: dict[str, Any] = {"label_smoothing": LABEL_SMOOTHING}
    if model.heads is not None:
        options["ngram_alpha"] = 0.1
    objective = build_objective(ComponentConfig("cross_entropy", options), model)
    return diffusion_loss(objective, model.heads, **task.loss_weights())


# --- the reference ----------------------------------------------------------------------------


def time_features(t: torch.Tensor, size: int) -> torch.Tensor:
    """DDPM's timestep embedding of 1000·t: [sin(1000·t·ω_i); cos(1000·t·ω_i)], ω_i = 10⁴^(−i/half)."""
    half = size // 2
    omega = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    angles = 1000.0 * t[:, None] * omega
    return torch.cat([angles.sin(), angles.cos()], -1)


@torch.no_grad()
def noise_floor(table: torch.Tensor, chunk: int = 1024) -> float:
    """DINOISER's σ_min of the rows of ``table``: v = mean nearest-neighbour squared distance
    per dimension, σ_min = √(v / (1 + v))."""
    norms = (table**2).sum(-1)
    minima = []
    for start in range(0, table.size(0), chunk):
        block = table[start : start + chunk]
        distance = norms[start : start + chunk, None] + norms - 2 * block @ table.T
        distance.diagonal(start).fill_(float("inf"))  # entries (i, start + i): itself
        minima.append(distance.min(-1).values.clamp(min=0))
    v = torch.cat(minima).mean().item() / table.size(1)
    return math.sqrt(v / (1 + v))


class Reference(nn.Module):
    """Shared embedding -> ``nn.TransformerEncoder`` (source) and a non-causal
    ``nn.TransformerDecoder`` (denoiser); post-LN, GELU."""

    def __init__(self, shape: Shape, dropout: float) -> None:
        super().__init__()
        d = shape.d
        self.d, self.scale = d, math.sqrt(d)
        self.embedding = nn.Embedding(shape.vocab, d)
        layer = dict(
            d_model=d,
            nhead=shape.heads,
            dim_feedforward=shape.ff,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=False,
        )
        # named as nn.Transformer's stacks, so translation.copy_weights fills them
        self.transformer = nn.Module()
        self.transformer.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer), shape.encoder_layers, enable_nested_tensor=False
        )
        self.transformer.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**layer), shape.decoder_layers
        )
        for module in self.modules():
            if isinstance(module, nn.MultiheadAttention):  # none on the attention weights
                module.dropout = 0.0
            if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
                module.dropout = nn.Identity()  # none inside the feed-forward
        self.source_positions = nn.Parameter(torch.randn(shape.max_context, d) * 0.02)
        self.target_positions = nn.Parameter(torch.randn(shape.max_context, d) * 0.02)
        self.target_map = nn.Linear(2 * d, d)
        self.time_mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.length_classifier = nn.Linear(d, 2 * MAX_DIFFERENCE + 1)
        self.drop = nn.Dropout(dropout)
        self.sigma_min, self.batches = 0.0, 0

    def encode(self, source: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        S = source.size(1)
        h = self.drop(self.embedding(source) * self.scale + self.source_positions[:S])
        return self.transformer.encoder(h, src_key_padding_mask=~mask)

    def denoise(self, x_t, previous, t, target_mask, memory, memory_mask) -> torch.Tensor:
        T = x_t.size(1)
        time = self.time_mlp(time_features(t, self.d))[:, None]
        h = self.target_map(torch.cat([x_t, previous], -1)) + self.target_positions[:T] + time
        return self.transformer.decoder(
            self.drop(h),
            memory,
            tgt_key_padding_mask=~target_mask,
            memory_key_padding_mask=~memory_mask,
        )

    def loss(
        self, batch: Batch, generator: torch.Generator, self_condition_prob: float
    ) -> dict[str, torch.Tensor]:
        targets, source_mask = batch.targets, batch.source_mask
        mask = targets != IGNORE
        E = self.embedding.weight
        if self.training:
            if self.batches % CLIP_EVERY == 0:
                self.sigma_min = noise_floor(F.layer_norm(E.detach(), (self.d,)))
            self.batches += 1
        clean = F.layer_norm(E[targets.masked_fill(~mask, 0)], (self.d,)) * mask[..., None]
        B = targets.size(0)
        t = self.sigma_min + (1 - self.sigma_min) * (1 - torch.rand(B, generator=generator))
        noise = torch.randn(clean.shape, generator=generator)
        x_t = (1 - t**2).clamp(min=0).sqrt()[:, None, None] * clean + t[:, None, None] * noise
        memory = self.encode(batch.source, source_mask)
        previous = torch.zeros_like(x_t)
        if float(torch.rand((), generator=generator)) < self_condition_prob:
            with torch.no_grad():
                previous = self.denoise(x_t, previous, t, mask, memory, source_mask)
        x0 = self.denoise(x_t, previous, t, mask, memory, source_mask)
        weights = mask[..., None].to(x0.dtype)
        mse = ((x0 - clean) ** 2 * weights).sum() / (weights.sum() * self.d)
        anchor = F.cross_entropy(
            F.linear(x0, E).flatten(0, 1),
            targets.reshape(-1),
            ignore_index=IGNORE,
            label_smoothing=LABEL_SMOOTHING,
        )
        pool = source_mask[..., None].to(memory.dtype)
        pooled = (memory * pool).sum(1) / pool.sum(1)
        difference = mask.sum(1) - source_mask.sum(1)
        classes = difference.clamp(-MAX_DIFFERENCE, MAX_DIFFERENCE) + MAX_DIFFERENCE
        length = F.cross_entropy(self.length_classifier(pooled), classes)
        total = mse + anchor + LENGTH_WEIGHT * length
        return {"loss": total, "mse": mse, "anchor": anchor, "length": length}


@torch.no_grad()
def copy_diffusion_weights(model: nn.Module, reference: Reference) -> None:
    """targetlm's parameters into the reference: the stacks through translation.copy_weights
    (the denoiser's layers are named as the seq2seq ones), then the diffusion extras."""
    copy_weights(model, reference)
    denoiser = model.encoder
    for name in ("source_positions", "target_positions"):
        getattr(reference, name).copy_(getattr(denoiser, name))
    for name in ("target_map", "time_mlp", "length_classifier"):
        getattr(reference, name).load_state_dict(getattr(denoiser, name).state_dict())
    reference.sigma_min = float(denoiser.sigma_min)
    reference.batches = int(denoiser.training_batches)


def set_dropout(module: nn.Module, p: float) -> None:
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = p


# --- check ------------------------------------------------------------------------------------


def close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(1.0, abs(a), abs(b))


def check_same(model, reference: Reference, batch: Batch, dropout: float) -> dict[str, Any]:
    """Loss terms and gradients of both sides with copied weights, dropout 0, the same
    generator seed, self-conditioning probability 0 and 1; raises if they differ."""
    set_dropout(model, 0.0), set_dropout(reference, 0.0)
    model.train(), reference.train()
    copy_diffusion_weights(model, reference)
    report: dict[str, Any] = {}
    for p in (0.0, 1.0):
        task = make_task(p)
        loss_fn = make_loss(model, task)
        model.zero_grad(set_to_none=True), reference.zero_grad(set_to_none=True)
        prediction = task.predict(model, batch, generator=torch.Generator().manual_seed(SEED))
        weight, bias = model.output()
        terms = loss_fn.terms(prediction, batch.targets, weight, bias)
        terms["loss"].backward()
        ours = {
            "loss": terms["loss"],
            "mse": terms["mse"],
            "anchor": terms["anchor"].loss,
            "length": terms["length"],
        }
        theirs = reference.loss(batch, torch.Generator().manual_seed(SEED), p)
        theirs["loss"].backward()
        ours_f = {k: v.detach().item() for k, v in ours.items()}
        theirs_f = {k: v.detach().item() for k, v in theirs.items()}
        diffs = {k: abs(ours_f[k] - theirs_f[k]) for k in ours_f}
        sigma_min = float(model.encoder.sigma_min)
        assert close(reference.sigma_min, sigma_min, LOSS_TOLERANCE), "σ_min differs"
        g_ours, g_ref = model.embedding.weight.grad, reference.embedding.weight.grad
        grad_diff = ((g_ours - g_ref).abs().max() / g_ours.abs().max()).item()
        norm_ours = torch.linalg.vector_norm(
            torch.stack([q.grad.norm() for q in model.parameters() if q.grad is not None])
        ).item()
        norm_ref = torch.linalg.vector_norm(
            torch.stack([q.grad.norm() for q in reference.parameters() if q.grad is not None])
        ).item()
        report[f"self_condition_prob={p:g}"] = {
            "targetlm": ours_f,
            "reference": theirs_f,
            "max_abs_diff": max(diffs.values()),
            "embedding_grad_rel_diff": grad_diff,
            "grad_norms": [norm_ours, norm_ref],
        }
        bad = [k for k in ours_f if not close(ours_f[k], theirs_f[k], LOSS_TOLERANCE)]
        assert not bad, f"p={p}: the reference's {bad} differ: {ours_f} vs {theirs_f}"
        assert grad_diff <= GRAD_TOLERANCE, f"p={p}: embedding gradients differ by {grad_diff}"
        assert close(norm_ours, norm_ref, GRAD_TOLERANCE), f"gradient norms {norm_ours} {norm_ref}"
    report["sigma_min"] = reference.sigma_min
    model.zero_grad(set_to_none=True), reference.zero_grad(set_to_none=True)
    set_dropout(model, dropout), set_dropout(reference, dropout)
    return report


# --- FLOPs ------------------------------------------------------------------------------------


def step_flops(shape: Shape, batch: Batch, heads: int) -> float:
    """Matmul FLOPs (2 per multiply-add) of one training step; backward = 2 × forward; the
    no-grad self-conditioning pass counted with its probability."""
    d, ff, V = shape.d, shape.ff, shape.vocab
    B, T = batch.targets.shape
    S = batch.source.size(1)
    encoder = B * S * shape.encoder_layers * (2 * 4 * d * d + 2 * 2 * S * d + 2 * 2 * d * ff)
    per_position = 2 * 2 * d * d + shape.decoder_layers * (
        2 * 4 * d * d + 2 * 2 * T * d + 2 * 2 * d * d + 2 * 2 * S * d + 2 * 2 * d * ff
    )
    denoiser = B * T * per_position + B * S * shape.decoder_layers * 2 * 2 * d * d
    denoiser += B * 2 * 2 * 4 * d * d  # the time MLP
    logits = B * T * 2 * d * V
    head_mlps = (heads - 1) * B * T * 2 * 2 * d * d
    return 3 * (encoder + denoiser + logits + head_mlps) + SELF_CONDITION * denoiser


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--steps", type=int, default=6, help="training steps per round and side")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per case")
    p.add_argument("--sentences", type=int, default=200, help="sentences decoded per round")
    p.add_argument("--batch", type=int, default=100, help="sentences per decoding batch")
    p.add_argument("--max-tokens", type=int, default=2048, help="training batch token budget")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 step x 2 rounds, 16 sentences in batches of 16 (< 60 s)",
    )
    p.add_argument("--json-out", type=Path, help="also write the JSON object to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.sentences, args.batch = 1, 2, 16, 16
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
    torch.set_num_threads(args.threads)
    load = LOAD_BEFORE
    shape = preset_shape(args.shape)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}, "
        f"{platform.processor() or '?'}, {os.cpu_count()} cores, "
        f"load average before the run {load:.2f}"
    )
    if load >= 0.5:
        print("warning: the machine is busy; the timings are noise")
    print(
        f"shape {args.shape}: d {shape.d}, ff {shape.ff}, {shape.encoder_layers}+"
        f"{shape.decoder_layers} layers, {shape.heads} heads, V {shape.vocab}; dropout "
        f"{args.dropout}; {args.steps} steps x {args.rounds} rounds; decoding "
        f"{args.sentences} sentences in batches of {args.batch} per round"
    )

    torch.manual_seed(SEED)
    model = build_model(model_config(shape, args.dropout), shape.vocab)
    reference = Reference(shape, args.dropout)
    source, target = random_pairs(max(400, args.steps * 100), shape.vocab, SEED)
    batches = pair_batches(source, target, EOS, max_tokens=args.max_tokens)
    batches = sorted(batches, key=lambda b: -b.targets.numel())[: max(args.steps, 4)]
    tokens = [int((b.targets != IGNORE).sum()) for b in batches]

    check = check_same(model, reference, batches[0], args.dropout)
    for case in ("self_condition_prob=0", "self_condition_prob=1"):
        c = check[case]
        print(
            f"check ({case}): loss {c['targetlm']['loss']:.6f} vs {c['reference']['loss']:.6f}, "
            f"max |Δ| over loss/MSE/anchor/length {c['max_abs_diff']:.2e}, embedding gradient "
            f"max rel. Δ {c['embedding_grad_rel_diff']:.2e}, gradient norms "
            f"{c['grad_norms'][0]:.6f} / {c['grad_norms'][1]:.6f}"
        )

    # --- training: targetlm against the reference ---
    task = make_task()

    def make_step(m: nn.Module, ours: bool) -> Callable[[Batch], None]:
        optimizer = torch.optim.Adam(m.parameters(), **ADAM)
        generator = torch.Generator().manual_seed(SEED)
        loss_fn = make_loss(m, task) if ours else None

        def step(b: Batch) -> None:
            if ours:
                prediction = task.predict(m, b, generator=generator)
                weight, bias = m.output()
                loss = loss_fn(prediction, b.targets, weight, bias).loss
            else:
                loss = m.loss(b, generator, SELF_CONDITION)["loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            optimizer.step()

        return step

    def train(step: Callable[[Batch], None]) -> Callable[[], int]:
        def run() -> int:
            for i in range(args.steps):
                step(batches[i % len(batches)])
            return sum(tokens[i % len(batches)] for i in range(args.steps))

        return run

    model.train(), reference.train()
    ours_step, ref_step = make_step(model, True), make_step(reference, False)
    for step in (ours_step, ref_step):  # warm-up
        step(batches[0]), step(batches[1])
    log("training: targetlm vs reference")
    r = interleaved(
        {"targetlm": rate(train(ours_step)), "reference": rate(train(ref_step))}, args.rounds
    )
    samples = {f"training {side}": v for side, v in r.items()}
    training = {
        "targetlm_tokens_per_s": median(r["targetlm"]),
        "reference_tokens_per_s": median(r["reference"]),
        "spread": {k: spread(v) for k, v in r.items()},
    }
    training["ratio"] = training["targetlm_tokens_per_s"] / training["reference_tokens_per_s"]

    # --- heads' cost ---
    log("training: WDR heads N = 2, 3 against none")
    head_steps: dict[str, Callable[[], float]] = {}
    for n in (1, 2, 3):
        torch.manual_seed(SEED)
        m = build_model(model_config(shape, args.dropout, n), shape.vocab).train()
        step = make_step(m, True)
        step(batches[0]), step(batches[1])
        head_steps[f"N={n}"] = rate(train(step))
    r = interleaved(head_steps, args.rounds)
    samples |= {f"heads {side}": v for side, v in r.items()}
    used = [batches[i % len(batches)] for i in range(args.steps)]
    flops = {n: sum(step_flops(shape, b, n) for b in used) for n in (1, 2, 3)}
    base = median(r["N=1"])
    heads = {
        f"N={n}": {
            "step_time_ratio": base / median(r[f"N={n}"]),
            "flop_ratio": flops[n] / flops[1],
            "tokens_per_s": median(r[f"N={n}"]),
            "spread": spread(r[f"N={n}"]),
        }
        for n in (1, 2, 3)
    }

    # --- decoding ---
    log("decoding")
    sentences, _ = random_pairs(args.sentences, shape.vocab, SEED + 1)
    model.eval()
    with torch.no_grad():  # fixed lengths: see the module's docstring
        model.embedding.weight[EOS] = 0.0
        classifier = model.encoder.length_classifier
        classifier.weight.zero_()
        classifier.bias.zero_()
        classifier.bias[MAX_DIFFERENCE + torch.tensor([0, 1, -1])] = torch.tensor([3.0, 2.0, 1.0])
    torch.manual_seed(SEED)
    with_heads = build_model(model_config(shape, args.dropout, 2), shape.vocab)
    missing = with_heads.load_state_dict(model.state_dict(), strict=False)
    assert not missing.unexpected_keys and all(k.startswith("heads.") for k in missing.missing_keys)
    with_heads.eval()
    torch.manual_seed(SEED)
    ar_model = build_model(translation_config(shape, args.dropout), shape.vocab).eval()
    with torch.no_grad():
        ar_model.embedding.weight[EOS] = 0.0
    n_sentences = len(sentences)

    def diffusion_case(steps: int, beam: int, lam: float = 0.0) -> Callable[[], int]:
        m = with_heads if lam else model
        options = DiffusionDecodeOptions(
            steps=steps, length_beam=beam, samples=1, sampler="renoise", ensemble_lambda=lam
        )

        def run() -> int:
            outputs = diffusion_translate(m, task, sentences, options, EOS, batch_size=args.batch)
            for o, s in zip(outputs, sentences):
                assert abs(len(o) - len(s)) <= (beam > 1), "an output has another length"
            return n_sentences

        return run

    beam5 = autoregressive.DecodeOptions(beam=5, max_len_a=1.0, max_len_b=1)

    def ar_case() -> int:
        with torch.no_grad():
            outputs = autoregressive.translate_ids(
                ar_model, sentences, beam5, EOS, batch_size=args.batch
            )
        assert all(len(o) == len(s) for o, s in zip(outputs, sentences)), "an AR output ended early"
        return n_sentences

    cases = {
        "diffusion K=10, length beam 1": diffusion_case(10, 1),
        "diffusion K=20, length beam 1": diffusion_case(20, 1),
        "diffusion K=10, length beam 3": diffusion_case(10, 3),
        "diffusion K=20, length beam 3": diffusion_case(20, 3),
        "diffusion K=10, length beam 3, ensemble (WDR N=2, λ 0.1)": diffusion_case(10, 3, 0.1),
        "autoregressive nmt-tiny, beam 5": ar_case,
    }
    sides = {name: rate(case) for name, case in cases.items()}
    for side in sides.values():
        side()  # warm-up
    r = interleaved(sides, args.rounds)
    samples |= {f"decoding {side}": v for side, v in r.items()}
    ar = median(r["autoregressive nmt-tiny, beam 5"])
    decoding = {
        name: {
            "sentences_per_s": median(v),
            "relative_to_autoregressive_beam5": median(v) / ar,
            "spread": spread(v),
        }
        for name, v in r.items()
    }

    # --- report ---
    print()
    print("| case | targetlm | reference | ratio | spreads |")
    print("|---|---:|---:|---:|---|")
    print(
        f"| training tokens/s | {training['targetlm_tokens_per_s']:,.0f} | "
        f"{training['reference_tokens_per_s']:,.0f} | {training['ratio']:.2f} | "
        f"{training['spread']['targetlm']:.0%} / {training['spread']['reference']:.0%} |"
    )
    print()
    print("| heads | tokens/s | step time / no heads | FLOP ratio | spread |")
    print("|---|---:|---:|---:|---:|")
    for name, h in heads.items():
        print(
            f"| {name} | {h['tokens_per_s']:,.0f} | {h['step_time_ratio']:.3f} | "
            f"{h['flop_ratio']:.3f} | {h['spread']:.0%} |"
        )
    print()
    print("| decoding | sentences/s | / autoregressive beam 5 | spread |")
    print("|---|---:|---:|---:|")
    for name, c in decoding.items():
        print(
            f"| {name} | {c['sentences_per_s']:,.1f} | "
            f"{c['relative_to_autoregressive_beam5']:.2f} | {c['spread']:.0%} |"
        )
    print(f"load average after the run {load_average():.2f}")
    result = {
        "shape": args.shape,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "load_before": load,
        "steps": args.steps,
        "rounds": args.rounds,
        "check": check,
        "training": training,
        "goal_training_ratio_met": training["ratio"] >= 1.0,
        "heads": heads,
        "decoding": decoding,
    }
    emit(result, args.json_out, samples=samples, indent=None, ensure_ascii=False)


if __name__ == "__main__":
    main()
