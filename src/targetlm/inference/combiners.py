r"""Inference-time combiners: what is mixed into the model's prediction, in one documented order.

Every evaluation (``targetlm eval``, scoring, the trainer's validation) runs one loop
(:func:`targetlm.inference.evaluate.evaluate_ids`) with any subset of these combiners:

    x̂_t ──► vector combiner ──► x̂ per stream ──► logit layer ──► p(y_t) ──► probability combiners
            (head ensemble:        (the main x̂ and     x̂·E_outᵀ+b      1. uniform mixture
             one stream per λ)      one per λ)                          2. new-word weight
                                                                        3. unigram cache
                                                                        4. neural cache

* **Vector** combiners act on x̂ before the logit layer. The head ensemble (Heo et al. 2025)
  turns the main x̂ and the heads' outputs into one *stream* per λ; every λ is evaluated in the
  same pass (the encoder and the heads run once per segment, the logit layer once per stream).
* **Probability** combiners act on the probability of each target word after it, in the order
  above (their ``order``), and apply to every stream alike:

  1. ``uniform``: ``(1 − μ)·p + μ/|V_eval|`` for a closed output layer in open vocabulary
     (new words get a finite loss; Pappas et al. 2020);
  2. ``new_word_weight``: ``p(w)·ω / (1 − (1 − ω)·P_new)`` for new words, ``p(w) / (1 − (1 −
     ω)·P_new)`` for the others (P_new = the stream's mass on new words): still a distribution;
  3. ``unigram_cache`` and 4. ``neural_cache`` (``targetlm.inference.caches``):
     ``(1 − λ)·p + λ·p_cache`` where the cache has entries. Both read the text and the main
     head's x̂ only, so one cache serves every stream.

Each combiner class is registered in :data:`COMBINERS` with its ``stage`` and ``order``, and
says which of the user-facing :class:`Combiners` fields turn it on (its ``requested``);
:func:`build_combiners` asks every registered combiner, builds the ones requested and checks
that each can apply (λ without heads is one :class:`CombinerError`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import torch
import torch.nn.functional as F

from targetlm import functional
from targetlm.chunked import logit_statistics
from targetlm.data.batching import IGNORE
from targetlm.inference.caches import NeuralCache, UnigramCache, interpolate
from targetlm.modules.heads import NgramHeads
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.registry import ConfigError, Fraction, Positive, Probability, Range, Registry, Size


class CombinerError(ConfigError):
    """A combiner that cannot apply to this model or text (e.g. λ without N-gram heads)."""


@dataclass(frozen=True)
class Combiners:
    """What is mixed into the model's prediction at evaluation time (all off by default).

    Args:
        ensemble_lambdas: λ values of the head ensemble (Heo et al. 2025), each in [0, 1]; each
            is its own stream, evaluated in the same pass as the main head (needs N-gram heads).
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
    ensemble_lambdas: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("uniform_weight", "unigram_cache", "neural_cache"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if not 0 < self.new_word_weight <= 1:
            raise ValueError(f"new_word_weight must be in (0, 1], got {self.new_word_weight}")
        if self.neural_window < 1:
            raise ValueError(f"neural_window must be >= 1, got {self.neural_window}")
        for lam in self.ensemble_lambdas:
            if not 0 <= lam <= 1:
                raise ValueError(f"ensemble_lambdas: every λ must be in [0, 1], got {lam}")
        object.__setattr__(self, "ensemble_lambdas", tuple(self.ensemble_lambdas))


@dataclass(frozen=True)
class ScoringContext:
    """What the combiners know about one evaluation: the vocabularies and the batching.

    vocab_size: |V_eval|, the evaluation vocabulary (ids ≥ ``known`` are new words).
    known: |V_train|, the words the model was trained with.
    scored_size: rows of ``E_out`` (V_train, or V_eval for a compositional layer in open
        vocabulary): targets ≥ it get no mass from the logit layer.
    compositional: the output layer embeds V_eval itself (open vocabulary only).
    open_vocabulary: the text's new words are words of their own (else ``<unk>``).
    batch_size: rows B of the stream.
    """

    vocab_size: int
    known: int
    scored_size: int
    compositional: bool = False
    open_vocabulary: bool = False
    batch_size: int = 1
    device: torch.device | str = "cpu"

    @property
    def new_words(self) -> int:
        return self.vocab_size - self.known


@dataclass
class Segment:
    """One segment of the evaluation stream, as every combiner sees it.

    prediction: the model's :class:`Prediction` (x̂ (B, T, d), heads (N−1, B, T, d) or None).
    targets: (B, T) target ids in V_eval, ``IGNORE`` for padding.
    """

    prediction: Prediction
    targets: torch.Tensor


@dataclass
class StreamLogits:
    """One stream's logit layer for a segment: x̂ ``vectors`` (B, T, d) over ``weight`` E_out
    (V_scored, d) and ``bias``; log Z (B, T); the logits (B, T, V_scored) when the evaluation
    built them (None when it ran chunked: :meth:`log_mass` then reads them in tiles)."""

    vectors: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    log_norm: torch.Tensor
    logits: torch.Tensor | None = None

    def log_mass(self, start: int) -> torch.Tensor:
        """``logsumexp`` of the logits of words ``start..V_scored − 1`` at each position (B, T)."""
        if self.logits is not None:
            return torch.logsumexp(self.logits[..., start:], -1)
        bias = None if self.bias is None else self.bias[start:]
        return logit_statistics(self.vectors, self.weight[start:], bias)[0]


class VectorCombiner(ABC):
    """Acts on x̂ before the logit layer: a segment's prediction -> x̂ per stream (B, T, d).

    The first stream is always the main head's x̂ (names ``None``); ``names`` label the others.
    """

    stage: ClassVar[Literal["vector"]] = "vector"
    order: ClassVar[int] = 0

    @classmethod
    @abstractmethod
    def requested(cls, combiners: Combiners, uniform: float) -> dict[str, Any] | None:
        """This combiner's options as ``combiners`` asks for them, None when it is off.

        uniform: the uniform mixture's μ in effect for the text (:func:`uniform_weight_in_effect`).
        """

    @property
    @abstractmethod
    def names(self) -> list[float]:
        """One label per extra stream (the head ensemble: its λ values)."""

    def check(self, model: LanguageModel, context: ScoringContext) -> None:
        """Raise :class:`CombinerError` when this combiner cannot apply (default: it always can)."""
        return None

    @abstractmethod
    def start(self, model: LanguageModel, weight: torch.Tensor) -> None:
        """Forget everything: a new pass over a text begins."""

    @abstractmethod
    def streams(self, segment: Segment) -> list[torch.Tensor]:
        """[x̂ of each extra stream (B, T, d)]; read after :meth:`start`, segment by segment."""


class ProbabilityCombiner(ABC):
    """Acts on the probability p(y_t) (B, T) of each target word after the logit layer."""

    stage: ClassVar[Literal["probability"]] = "probability"
    order: ClassVar[int]

    @classmethod
    @abstractmethod
    def requested(cls, combiners: Combiners, uniform: float) -> dict[str, Any] | None:
        """This combiner's options as ``combiners`` asks for them, None when it is off.

        uniform: the uniform mixture's μ in effect for the text (:func:`uniform_weight_in_effect`).
        """

    def check(self, model: LanguageModel, context: ScoringContext) -> None:
        """Raise :class:`CombinerError` when this combiner cannot apply (default: it always can)."""
        return None

    def start(self, context: ScoringContext) -> None:
        """Forget everything: a new pass over a text begins (default: nothing to forget)."""
        return None

    def observe(self, segment: Segment) -> None:
        """Read a segment once, before :meth:`combine` runs for each of its streams."""
        return None

    @abstractmethod
    def combine(self, probs: torch.Tensor, stream: StreamLogits, segment: Segment) -> torch.Tensor:
        """p(y_t) (B, T) of one stream -> the combined p(y_t) (B, T)."""


# builders supply the <unk> id and the uniform mixture's μ; users set the rest
COMBINERS: Registry[VectorCombiner | ProbabilityCombiner] = Registry(
    "combiner", context=("unknown", "uniform_weight")
)


class HeadEstimates:
    """Streaming head estimates ê_n(t) of the next word's vector, carried across segments.

    Head n at column t−n predicted the word at column t (``targetlm.modules.heads`` has the
    index picture); its estimate of x_t is ``MLP^n(h_{t−n})`` (simple heads) or
    ``MLP^n(h_{t−n}) + Δ^r_n x_{t−n}`` (WDR heads: from y_{t−n}..y_{t−1}, words already read).
    Start of a row: ê_n(t) exists when column t−n does; the last N−1 columns of the heads' raw
    outputs and of the targets are carried, so splitting a row into segments changes nothing.

    Args:
        heads: the model's heads (their ``reconstruct``: the WDR conjugate).
        weight: ``E_out`` (V, d), for the WDR conjugate.

    ``__call__(prediction, targets (B, T))`` -> ``(estimates (N−1, B, T, d),
    available (N−1, T) bool)``, from the heads' raw outputs the model returned in its
    :class:`Prediction`. ``targets`` of a column are only read for later columns; ids beyond
    ``E_out`` (new words of a closed layer) read the ``unknown`` row.
    """

    def __init__(self, heads: NgramHeads, weight: torch.Tensor, unknown: int = 0) -> None:
        self.heads = heads
        self.weight = weight.detach()
        self.unknown = unknown
        self.keep = heads.num_predictions - 1
        self.outputs: torch.Tensor | None = None  # (N−1, B, ≤ N−1, d): the last raw outputs
        self.targets: torch.Tensor | None = None  # (B, ≤ N−1): their targets

    def reset(self) -> None:
        self.outputs = self.targets = None

    def __call__(
        self, prediction: Prediction, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if prediction.heads is None:
            raise ValueError("the head ensemble needs the heads' outputs: call the model with them")
        predicted, raw = prediction.main, prediction.heads
        T = predicted.size(1)
        ids = targets
        if self.outputs is not None and self.targets is not None:  # set together
            raw = torch.cat([self.outputs, raw], 2)  # (N−1, B, P + T, d)
            ids = torch.cat([self.targets, targets], 1)  # (B, P + T)
        P = raw.size(2) - T  # carried columns: min(N−1, columns already read)
        real = ids != IGNORE
        rows = ids.masked_fill(~real, 0)
        rows = rows.masked_fill(rows >= self.weight.size(0), self.unknown)
        embeddings = self.weight[rows]  # x_s = E_out[y_s]
        # one more (zero) column: ê_n(t) comes from column t−n, whose conjugate reads
        # x_{t−n}..x_{t−1} only, but wdr_conjugate defines a column only where x_{t−n+n} exists
        embeddings = F.pad(embeddings, (0, 0, 0, 1))
        outputs = self.heads.reconstruct(raw, embeddings)  # (N−1, B, P + T, d)
        estimates = torch.stack(
            # column c of the extended sequence gets head n's output at c − n (zeros before 0)
            [F.pad(out, (0, 0, n, 0))[:, P : P + T] for n, out in enumerate(outputs, 1)]
        )  # (N−1, B, T, d)
        columns = torch.arange(P, P + T, device=predicted.device)
        steps = torch.arange(1, self.keep + 1, device=predicted.device)
        available = columns[None, :] >= steps[:, None]  # (N−1, T): column t−n exists
        if self.keep > 0:
            self.outputs = raw[:, :, -self.keep :].detach()
            self.targets = ids[:, -self.keep :]
        return estimates, available


@COMBINERS.register("head_ensemble")
class HeadEnsemble(VectorCombiner):
    """``x̂_ens = (1−λ)·x̂_t + λ·mean_n ê_n(t)`` (:func:`targetlm.functional.ensemble`), one
    stream per λ (Heo et al. 2025, eq. 13). λ = 0 is the main head's x̂ itself.

    Args:
        lambdas: the λ values, each in [0, 1].
        unknown: the ``<unk>`` id, for the WDR conjugate of a new word in a closed vocabulary.
    """

    def __init__(self, lambdas: Sequence[Probability], unknown: int = 0) -> None:
        for lam in lambdas:
            if not 0 <= lam <= 1:
                raise ValueError(f"ensemble λ must be in [0, 1], got {lam}")
        self.lambdas = list(lambdas)
        self.unknown = unknown
        self.estimator: HeadEstimates | None = None

    @classmethod
    def requested(cls, combiners: Combiners, uniform: float) -> dict[str, Any] | None:
        lambdas = combiners.ensemble_lambdas
        return {"lambdas": list(lambdas)} if lambdas else None

    @property
    def names(self) -> list[float]:
        return self.lambdas

    def check(self, model: LanguageModel, context: ScoringContext) -> None:
        if model.num_heads < 1:
            raise CombinerError(
                "the head ensemble (λ) needs a model with N-gram heads (model.heads.n >= 2)"
            )

    def start(self, model: LanguageModel, weight: torch.Tensor) -> None:
        assert model.heads is not None  # checked
        self.estimator = HeadEstimates(model.heads, weight, self.unknown)

    def streams(self, segment: Segment) -> list[torch.Tensor]:
        assert self.estimator is not None, "start() first"
        estimates, available = self.estimator(segment.prediction, segment.targets)
        main = segment.prediction.main
        return [functional.ensemble(main, estimates, lam, available) for lam in self.lambdas]


@COMBINERS.register("uniform")
class UniformMixture(ProbabilityCombiner):
    """``(1 − μ)·p + μ/|V_eval|``: a closed output layer gives new words a finite loss.

    Args:
        weight: μ in [0, 1).
    """

    order = 1

    def __init__(self, weight: Fraction) -> None:
        if not 0 <= weight < 1:
            raise ValueError(f"uniform_weight must be in [0, 1), got {weight}")
        self.weight = weight
        self.vocab_size = 1

    @classmethod
    def requested(cls, combiners: Combiners, uniform: float) -> dict[str, Any] | None:
        return {"weight": uniform} if uniform else None

    def check(self, model: LanguageModel, context: ScoringContext) -> None:
        if context.compositional:
            raise CombinerError(
                "uniform mixture: the output layer is compositional: it scores new words itself "
                "and is never mixed with the uniform distribution"
            )

    def start(self, context: ScoringContext) -> None:
        self.vocab_size = context.vocab_size

    def combine(self, probs: torch.Tensor, stream: StreamLogits, segment: Segment) -> torch.Tensor:
        return (1 - self.weight) * probs + self.weight / self.vocab_size


@COMBINERS.register("new_word_weight")
class NewWordWeight(ProbabilityCombiner):
    """``p(w)·ω / (1 − (1 − ω)·P_new)`` for new words, ``p(w) / (1 − (1 − ω)·P_new)`` for the
    others: a distribution that tempers how much a model bets on words it never saw.

    P_new is the stream's mass on new words: from its logits for a compositional layer, the
    uniform mixture's ``μ·(new words)/|V_eval|`` for a closed one.

    Args:
        weight: ω in (0, 1].
        uniform_weight: μ of the uniform mixture that runs before (closed layers).
    """

    order = 2

    def __init__(
        self, weight: Annotated[float, Range(0, 1, low_open=True)], uniform_weight: float = 0.0
    ) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"new_word_weight must be in (0, 1], got {weight}")
        self.weight = weight
        self.uniform_weight = uniform_weight
        self.context: ScoringContext | None = None

    @classmethod
    def requested(cls, combiners: Combiners, uniform: float) -> dict[str, Any] | None:
        weight = combiners.new_word_weight
        return {"weight": weight} if weight < 1 else None

    def start(self, context: ScoringContext) -> None:
        self.context = context  # a closed vocabulary has no new words: then it changes nothing

    def combine(self, probs: torch.Tensor, stream: StreamLogits, segment: Segment) -> torch.Tensor:
        context = self.context
        assert context is not None, "start() first"
        if not context.new_words:
            return probs
        known, omega = context.known, self.weight
        if context.compositional:
            new_mass = (stream.log_mass(known) - stream.log_norm).exp()
        else:
            mass = self.uniform_weight * context.new_words / context.vocab_size
            new_mass = torch.full_like(probs, mass)
        is_new = segment.targets >= known
        return probs * torch.where(is_new, omega, 1.0) / (1 - (1 - omega) * new_mass)


class _Cache(ProbabilityCombiner):
    """``(1 − λ)·p + λ·p_cache`` where the cache has entries; the cache reads each segment once."""

    def __init__(self, weight: Fraction) -> None:
        if not 0 <= weight < 1:
            raise ValueError(f"a cache weight must be in [0, 1), got {weight}")
        self.weight = weight
        self.current: tuple[torch.Tensor, torch.Tensor] | None = None

    def combine(self, probs: torch.Tensor, stream: StreamLogits, segment: Segment) -> torch.Tensor:
        assert self.current is not None, "observe() first"
        cache_probs, available = self.current
        return interpolate(probs, cache_probs, available, self.weight)


@COMBINERS.register("unigram_cache")
class UnigramCacheCombiner(_Cache):
    """The unigram cache (:class:`~targetlm.inference.caches.UnigramCache`). Args: weight λ."""

    order = 3

    @classmethod
    def requested(cls, combiners: Combiners, uniform: float) -> dict[str, Any] | None:
        weight = combiners.unigram_cache
        return {"weight": weight} if weight else None

    def start(self, context: ScoringContext) -> None:
        self.cache = UnigramCache(context.batch_size, context.vocab_size, context.device)

    def observe(self, segment: Segment) -> None:
        self.current = self.cache(segment.targets)


@COMBINERS.register("neural_cache")
class NeuralCacheCombiner(_Cache):
    """The neural cache of Grave et al. (:class:`~targetlm.inference.caches.NeuralCache`) over
    the main head's x̂. Args: weight λ, theta θ, window (positions per row)."""

    order = 4

    def __init__(self, weight: Fraction, theta: Positive = 0.5, window: Size = 10_000) -> None:
        super().__init__(weight)
        if window < 1:
            raise ValueError(f"the neural cache window must be >= 1, got {window}")
        self.theta, self.window = theta, window

    @classmethod
    def requested(cls, combiners: Combiners, uniform: float) -> dict[str, Any] | None:
        if not combiners.neural_cache:
            return None
        theta, window = combiners.neural_theta, combiners.neural_window
        return {"weight": combiners.neural_cache, "theta": theta, "window": window}

    def start(self, context: ScoringContext) -> None:
        self.cache = NeuralCache(self.window, self.theta)

    def observe(self, segment: Segment) -> None:
        self.current = self.cache(segment.prediction.main, segment.targets)


@dataclass
class BuiltCombiners:
    """The combiners of one evaluation: at most one vector combiner, probability ones in order."""

    vector: VectorCombiner | None = None
    probability: list[ProbabilityCombiner] = field(default_factory=list)

    def check(self, model: LanguageModel, context: ScoringContext) -> None:
        for combiner in [self.vector, *self.probability]:
            if combiner is not None:
                combiner.check(model, context)


def uniform_weight_in_effect(combiners: Combiners, context: ScoringContext) -> float:
    """μ used for this text: the given one, else 0.01 when the text has new words (0 for a
    compositional layer, which scores them itself)."""
    if context.compositional:
        return 0.0
    if combiners.uniform_weight is None:
        return 0.01 if context.open_vocabulary and context.new_words else 0.0
    return combiners.uniform_weight


def build_combiners(
    combiners: Combiners, model: LanguageModel, context: ScoringContext, unknown: int = 0
) -> BuiltCombiners:
    """The registered combiners ``combiners`` asks for, checked against ``model`` and the text.

    ``unknown``: the ``<unk>`` id (the WDR conjugate of a closed layer's new words)."""
    built = BuiltCombiners()
    uniform = uniform_weight_in_effect(combiners, context)
    for name in COMBINERS.names():
        kind = COMBINERS.get(name)
        assert isinstance(kind, type) and issubclass(kind, (VectorCombiner, ProbabilityCombiner))
        options = kind.requested(combiners, uniform)
        if options is None:
            continue
        combiner = COMBINERS.build(name, options, unknown=unknown, uniform_weight=uniform)
        if isinstance(combiner, VectorCombiner):
            assert built.vector is None, "one vector combiner per evaluation"
            built.vector = combiner
        else:
            built.probability.append(combiner)
    built.probability.sort(key=lambda c: c.order)
    built.check(model, context)
    return built
