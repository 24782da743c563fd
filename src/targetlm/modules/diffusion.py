r"""Embedding-space text diffusion: the forward processes and the denoiser (an encoder kind).

Clean target embeddings are the logit layer's own rows, ``x₀ = s·E_out[y]`` (the task makes
them, :mod:`targetlm.tasks.diffusion`); the forward process noises them::

    x_t = a(t)·x₀ + σ(t)·ε,   ε ~ N(0, I),   t ∈ (0, 1]

    sqrt      (Difformer, Gao et al. 2022; Diffusion-LM's schedule):  ᾱ(t) = 1 − √(t + 10⁻⁴),
              a(t) = √ᾱ(t), σ(t) = F·√(1 − ᾱ(t)), F the noise factor (Difformer: 4)
    dinoiser  (DINOISER, Ye et al. 2023, "interchangeable"):          a(t) = √(1 − t²), σ(t) = t,
              training times clipped to t ≥ σ_min (noise-scale clipping, :func:`clip_noise_scale`)

The denoiser is a registered encoder (``model.encoder.kind = "diffusion_denoiser"``), so the
diffusion model is the same :class:`~targetlm.modules.model.LanguageModel` as every other run:
its input embedding embeds the source, :meth:`DiffusionDenoiser.start` encodes it (the
Transformer encoder layers of :mod:`targetlm.modules.seq2seq`), and ``forward(x_t, state)``
reads the noised target embeddings (B, T, d_emb) and returns h (B, T, model_size); the model's
projection maps h to x̂₀ in the embedding space, where the output layer, the heads and the
objectives read it::

    source ─► embedding ─► start(): encoder layers ─► DenoiserState(memory, masks, t, x̂₀_prev)
    x_t ⊕ x̂₀_prev ─► Linear(2·d_emb → d) + positions + time embedding ─► non-causal layers with
        cross-attention (target padding masked) ─► h ─► projection ─► x̂₀ ─► [heads] ─► E_out
    pooled memory ─► length classifier over target − source length differences
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.modules.encoders import ENCODERS, add_positions
from targetlm.modules.seq2seq import (
    DecoderLayer,
    LayerOptions,
    SourceConditioned,
    check_stack_options,
)
from targetlm.registry import ConfigError, Count, Fraction, Size

# --- forward processes ------------------------------------------------------------------------


class NoiseSchedule:
    """``x_t = a(t)·x₀ + σ(t)·ε``: ``scale(t)`` is a(t), ``std(t)`` is σ(t); t a tensor in (0, 1]."""

    name: str

    def scale(self, t: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def std(self, t: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def noise(
        self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x₀ (B, T, d), t (B,) -> x_t (B, T, d) (``noise``: ε, default drawn from torch's RNG)."""
        if noise is None:
            noise = torch.randn_like(x0)
        return self.scale(t)[:, None, None] * x0 + self.std(t)[:, None, None] * noise

    def posterior_mean(
        self, x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, s: torch.Tensor
    ) -> torch.Tensor:
        """The mean of q(x_s | x_t, x₀) for s < t (t, s: (B,)), the Gaussian posterior of any
        ``a, σ`` process (Kingma et al. 2021, eq. 32): with a_{t|s} = a_t/a_s and
        σ²_{t|s} = σ_t² − a_{t|s}²·σ_s², ``(a_{t|s}·σ_s²·x_t + a_s·σ²_{t|s}·x₀) / σ_t²``."""
        a_t, a_s = self.scale(t), self.scale(s)
        var_t, var_s = self.std(t) ** 2, self.std(s) ** 2
        a_ts = a_t / a_s
        var_ts = var_t - a_ts**2 * var_s
        coef_x, coef_0 = a_ts * var_s / var_t, a_s * var_ts / var_t
        return coef_x[:, None, None] * x_t + coef_0[:, None, None] * x0


class SqrtSchedule(NoiseSchedule):
    """Difformer's ``sqrt`` schedule (Li et al. 2022's ᾱ(t) = 1 − √(t + 10⁻⁴)) with its noise
    factor F on the noise: a(t) = √ᾱ(t), σ(t) = F·√(1 − ᾱ(t))."""

    name = "sqrt"
    offset = 1e-4

    def __init__(self, noise_factor: float = 1.0) -> None:
        self.noise_factor = noise_factor

    def alpha_bar(self, t: torch.Tensor) -> torch.Tensor:
        return 1 - torch.sqrt(t + self.offset)

    def scale(self, t: torch.Tensor) -> torch.Tensor:
        return self.alpha_bar(t).clamp(min=0).sqrt()

    def std(self, t: torch.Tensor) -> torch.Tensor:
        return self.noise_factor * (1 - self.alpha_bar(t)).sqrt()


class DinoiserSchedule(NoiseSchedule):
    """DINOISER's schedule (its ``interchangable`` scheduler): a(t) = √(1 − t²), σ(t) = t."""

    name = "dinoiser"

    def scale(self, t: torch.Tensor) -> torch.Tensor:
        return (1 - t**2).clamp(min=0).sqrt()

    def std(self, t: torch.Tensor) -> torch.Tensor:
        return t


SCHEDULES = ("sqrt", "dinoiser")


def build_schedule(name: str, noise_factor: float = 1.0) -> NoiseSchedule:
    """``sqrt`` (with ``noise_factor``) or ``dinoiser``; anything else is an error."""
    if name == "sqrt":
        return SqrtSchedule(noise_factor)
    if name == "dinoiser":
        if noise_factor != 1.0:
            raise ValueError("noise_factor belongs to the sqrt schedule (dinoiser's σ(t) = t)")
        return DinoiserSchedule()
    raise ValueError(f"unknown noise schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


@torch.no_grad()
def mean_nearest_neighbour_sq_distance(table: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """``mean_i min_{j≠i} ‖x_i − x_j‖²`` of the rows of ``table`` (V, d), in blocks of ``chunk``
    rows (a (chunk × V) distance tile, never the V × V matrix)."""
    x = table.detach().float()
    norms = (x**2).sum(-1)  # (V,)
    minima = []
    for start in range(0, x.size(0), chunk):
        block = x[start : start + chunk]  # (C, d)
        dist = norms[start : start + chunk, None] + norms[None, :] - 2 * block @ x.T  # (C, V)
        rows = torch.arange(block.size(0), device=x.device)
        dist[rows, start + rows] = float("inf")  # not its own neighbour
        minima.append(dist.min(-1).values.clamp(min=0))
    return torch.cat(minima).mean()


@torch.no_grad()
def clip_noise_scale(table: torch.Tensor, chunk: int = 1024) -> float:
    """DINOISER's noise-scale clipping threshold σ_min for the embedding rows ``table`` (V, d):
    with v = mean nearest-neighbour squared distance / d (per dimension), σ_min = √(v / (1 + v))
    (its ``ClippedSampler``: the noise whose variance per dimension matches the gap between
    neighbouring embeddings, so training never sees noise too small to confuse two words)."""
    v = float(mean_nearest_neighbour_sq_distance(table, chunk)) / table.size(1)
    return math.sqrt(v / (1 + v))


# --- the denoiser ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DenoiserState:
    """What one denoising call reads besides x_t.

    memory (B, S, d): the encoded source; memory_mask (B, S) bool, True at real tokens.
    time (B,): t of each row (None: only the source is encoded yet).
    target_mask (B, T) bool: True at real target positions (None: all real).
    previous (B, T, d_emb): the previous estimate x̂₀ (self-conditioning; None: zeros).
    memory_keys_values: each denoiser layer's cross-attention keys and values of the memory,
    computed once for many denoising calls (:meth:`DiffusionDenoiser.cache_memory`; None: each
    call projects the memory).
    """

    memory: torch.Tensor
    memory_mask: torch.Tensor
    time: torch.Tensor | None = None
    target_mask: torch.Tensor | None = None
    previous: torch.Tensor | None = None
    memory_keys_values: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None

    def at(
        self,
        time: torch.Tensor,
        target_mask: torch.Tensor | None = None,
        previous: torch.Tensor | None = None,
    ) -> DenoiserState:
        return replace(self, time=time, target_mask=target_mask, previous=previous)

    def select(self, index: torch.Tensor) -> DenoiserState:
        """The source rows ``index`` (candidates of one sentence read its source)."""
        cached = self.memory_keys_values
        if cached is not None:
            cached = tuple((k.index_select(0, index), v.index_select(0, index)) for k, v in cached)
        return DenoiserState(
            self.memory.index_select(0, index),
            self.memory_mask.index_select(0, index),
            memory_keys_values=cached,
        )


class DenoiserLayer(DecoderLayer):
    """A decoder layer read non-causally: self-attention (target padding masked),
    cross-attention to the source, FF."""

    def forward(self, x, target_mask, memory, memory_mask, memory_keys_values=None):
        attention = self.self_attention
        x = self.residual(
            0, x, lambda y: attention.self_attend(y, causal=False, key_mask=target_mask)[0]
        )
        kv = memory_keys_values or self.cross_attention.keys_values(memory)
        x = self.residual(1, x, lambda y: self.cross_attention(y, kv, key_mask=memory_mask))
        return self.residual(2, x, self.ff)


def time_features(t: torch.Tensor, size: int, scale: float = 1000.0) -> torch.Tensor:
    """Sinusoidal features of t·scale (B,) -> (B, size) (DDPM's timestep embedding)."""
    half = size // 2
    frequencies = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
    angles = t.float()[:, None] * scale * frequencies[None]
    features = torch.cat([angles.sin(), angles.cos()], -1)
    return F.pad(features, (0, size - 2 * half))


@ENCODERS.register("diffusion_denoiser")
class DiffusionDenoiser(SourceConditioned):
    """The denoiser f(x_t, t, x̂₀_prev; source) of Difformer / DINOISER (``task.kind = "diffusion"``).

    A Transformer encoder over the source (:meth:`start`), and a non-causal Transformer stack
    over the noised target embeddings with cross-attention to it (``forward``): inputs are
    ``Linear([x_t; x̂₀_prev])`` (self-conditioning; zeros for no previous estimate) plus
    positions and a time embedding (sinusoidal features of t → MLP, added at every position);
    a length classifier reads the masked mean of the source encoding and scores target −
    source length differences in [−max_length_difference, max_length_difference] (both
    lengths count ``<eos>``). A buffer keeps DINOISER's clipping threshold σ_min (the task
    updates it from the embedding table while training; it travels with the checkpoint).

    Args:
        input_size: the source embedding size (supplied by the builder).
        target_size: d_emb, the width of the clean target embeddings x₀ (the output layer's
            ``embedding_dim``); default input_size (a tied output layer).
        model_size: the residual width (default input_size).
        encoder_layers / decoder_layers / num_heads / ff_size: the stacks' shape.
        dropout, attention_dropout, max_context, positions, norm, activation, scale_embedding:
            as :class:`~targetlm.modules.seq2seq.TransformerSeq2Seq`.
        self_condition: read the previous estimate x̂₀ (Chen et al. 2022's self-conditioning).
        max_length_difference: the length classes are −m..m (2m + 1 of them).
    """

    causal = False  # every target position reads every other (noised) one
    denoiser = True  # a diffusion denoiser: read by task.kind = "diffusion" only
    # (max_context, d) each: parameters (learned) or buffers (sinusoidal)
    source_positions: torch.Tensor
    target_positions: torch.Tensor
    sigma_min: torch.Tensor  # () buffer: DINOISER's clipping threshold
    training_batches: torch.Tensor  # () long buffer: batches trained (the clip's schedule)

    def __init__(
        self,
        input_size: int,
        target_size: Size | None = None,
        model_size: Size | None = None,
        encoder_layers: Size = 6,
        decoder_layers: Size = 6,
        num_heads: Size = 8,
        ff_size: Size = 2048,
        dropout: Fraction = 0.1,
        attention_dropout: Fraction = 0.0,
        max_context: Size = 256,
        positions: Literal["learned", "sinusoidal"] = "learned",
        norm: Literal["pre", "post"] = "post",
        activation: Literal["gelu", "relu"] = "gelu",
        scale_embedding: bool = True,
        self_condition: bool = True,
        max_length_difference: Count = 32,
    ) -> None:
        d = model_size or input_size
        check_stack_options(norm, activation, positions, encoder_layers, decoder_layers)
        if max_length_difference < 0:
            raise ValueError(f"max_length_difference must be >= 0, got {max_length_difference}")
        super().__init__(input_size, d, max_context, scale_embedding)
        self.target_size = target_size or input_size
        self.self_condition = self_condition
        self.max_length_difference = max_length_difference
        reads = self.target_size * (2 if self_condition else 1)
        self.target_map = nn.Linear(reads, d)  # [x_t; x̂₀_prev] -> the model width
        for name in ("source_positions", "target_positions"):
            add_positions(self, name, positions, max_context, d)
        self.time_mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(dropout)
        layer = LayerOptions(num_heads, ff_size, dropout, attention_dropout, norm, activation)
        self._build_stacks(d, layer, encoder_layers, decoder_layers, DenoiserLayer)
        self.length_classifier = nn.Linear(d, 2 * max_length_difference + 1)
        self.register_buffer("sigma_min", torch.zeros(()))  # DINOISER's clip, kept with the model
        self.register_buffer("training_batches", torch.zeros((), dtype=torch.long))

    @property
    def num_length_classes(self) -> int:
        return 2 * self.max_length_difference + 1

    def start(self, source: torch.Tensor, mask: torch.Tensor, **_: object) -> DenoiserState:
        """Encode the embedded source (B, S, input_size), mask (B, S) True at real tokens."""
        return DenoiserState(self._encode_source(source, mask, self.source_positions), mask)

    def cache_memory(self, state: DenoiserState) -> DenoiserState:
        """``state`` with every denoiser layer's cross-attention keys and values of the memory,
        for decoding (K calls read one source; :meth:`DenoiserState.select` keeps them)."""
        return replace(state, memory_keys_values=self._memory_keys_values(state.memory))

    def length_logits(self, state: DenoiserState) -> torch.Tensor:
        """Scores of the length differences −m..m (B, 2m + 1) from the masked mean of the memory."""
        weights = state.memory_mask.to(state.memory.dtype)[..., None]  # (B, S, 1)
        pooled = (state.memory * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.length_classifier(pooled)

    def forward(
        self, x: torch.Tensor, state: DenoiserState | None = None
    ) -> tuple[torch.Tensor, DenoiserState]:
        """Noised target embeddings x (B, T, target_size) at ``state.time`` -> h (B, T, d)."""
        if not isinstance(state, DenoiserState) or state.time is None:
            raise ValueError(
                "the diffusion_denoiser encoder reads noised target embeddings at a time t with "
                "a source: its state comes from start() and the diffusion task (task.kind = "
                "'diffusion')"
            )
        B, T, size = x.shape
        if size != self.target_size:
            raise ValueError(
                f"the denoiser reads embeddings of width {self.target_size} "
                f"(model.encoder.target_size), got {size}: set target_size to the output "
                "layer's embedding size"
            )
        self._check_length(T, "a target")
        if self.self_condition:
            previous = state.previous if state.previous is not None else torch.zeros_like(x)
            x = torch.cat([x, previous], -1)
        d = self.output_size
        time = self.time_mlp(time_features(state.time, d).to(x.dtype))[:, None]  # (B, 1, d)
        h = self.drop(self.target_map(x) + self.target_positions[:T] + time)
        cached = state.memory_keys_values or (None,) * len(self.decoder_layers)
        for layer, keys_values in zip(self.decoder_layers, cached):
            h = layer(h, state.target_mask, state.memory, state.memory_mask, keys_values)
        return self.decoder_norm(h), state


SAMPLERS = ("renoise", "posterior")  # diffusion decoding's update of x_t


def denoiser_of(model: nn.Module) -> DiffusionDenoiser:
    """``model``'s encoder, a diffusion denoiser (a one-line error for any other)."""
    if not isinstance(model.encoder, DiffusionDenoiser):
        raise ConfigError(
            "task.kind = 'diffusion' needs a denoiser: model.encoder.kind = 'diffusion_denoiser', "
            f"got a {type(model.encoder).__name__}"
        )
    return model.encoder
