"""The language model: InputEmbedding -> Encoder -> (projection) -> x̂ [-> heads], and the OutputLayer.

``forward`` returns a :class:`Prediction`: the predicted target vectors x̂ (B, T, d), the N-gram
heads' raw outputs from the same h_t, and the encoder state; ``output()`` returns ``E_out`` and
``b``. Losses and combiners take both, so the model never owns a softmax and any output layer
works with any objective or combiner.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.lexicon.lexicon import Lexicon
from targetlm.modules.embeddings import INPUT_EMBEDDINGS
from targetlm.modules.encoders import ENCODERS, Encoder
from targetlm.modules.heads import NgramHeads, build_heads
from targetlm.modules.outputs import OUTPUT_LAYERS, OutputLayer
from targetlm.registry import ConfigError

if TYPE_CHECKING:
    from targetlm.config import ComponentConfig, ModelConfig


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``with evaluating(model):`` runs in eval mode (no dropout) and gives the model back in
    the mode it was in, on an error too (a training run continues with dropout)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for a segment.

    main: x̂_t (B, T, d), the main head's predicted target vectors (column t predicts the
        segment's target t).
    heads: (N−1, B, T, d), head n's raw output MLP^n(h_t) at column t (n = 1..N−1; the
        prediction of target t+n before any WDR conjugate is added); None without heads or
        when not asked for.
    state: the encoder state that continues the stream (None: nothing to carry).
    extras: what a task's loss reads besides ``main`` and ``heads`` (the diffusion task's
        clean embeddings, times and length logits); None for the tasks whose loss reads the
        targets alone.

    Unpacks and indexes as the tuple ``(main, heads, state)`` (``extras`` is read by name).
    """

    main: torch.Tensor
    heads: torch.Tensor | None
    state: Any
    extras: Any = None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.main, self.heads, self.state))

    def __getitem__(self, index: int | slice) -> Any:
        return (self.main, self.heads, self.state)[index]

    def __len__(self) -> int:
        return 3

    def rows(self, index: slice) -> Prediction:
        """The prediction of some batch rows (the state is left out: it is the stream's)."""
        heads = None if self.heads is None else self.heads[:, index]
        return Prediction(self.main[index], heads, None)


class LanguageModel(nn.Module):
    """Args: already-built embedding, encoder, output layer and optional N-gram heads
    (see :func:`build_model`). ``forward`` runs the main head and the N-gram heads once;
    the N-gram loss and the head ensemble read their outputs from the :class:`Prediction`."""

    def __init__(
        self,
        embedding: nn.Module,
        encoder: Encoder,
        output: OutputLayer,
        heads: NgramHeads | None = None,
        source_embedding: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.encoder = encoder
        self.output = output
        self.heads = heads
        # a source sentence's own embedding (None: the source reads ``embedding``)
        self.source_embedding = source_embedding
        hidden, d = encoder.output_size, output.embedding_dim
        # maps the encoder's output to the output embedding space when the sizes differ
        self.projection = nn.Linear(hidden, d, bias=False) if hidden != d else nn.Identity()

    def encode(self, tokens: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        """tokens (B, T) -> encoder output h (B, T, H) and the state that continues the stream."""
        return self.encoder(self.embedding(tokens), state)

    def embed_source(self, source: torch.Tensor) -> torch.Tensor:
        """Source ids (B, S) -> their vectors (B, S, d_in) for a conditional encoder: the
        source's own embedding, or the shared input embedding when it has none."""
        embedding = self.embedding if self.source_embedding is None else self.source_embedding
        return embedding(source)

    @property
    def num_heads(self) -> int:
        """N−1, the number of future-word heads (0 without heads)."""
        return 0 if self.heads is None else self.heads.num_predictions - 1

    def forward(
        self, tokens: torch.Tensor, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        """tokens (B, T) -> :class:`Prediction` (x̂ (B, T, d), heads (N−1, B, T, d) or None, state).

        ``run_heads=False`` skips the heads (plain next-word evaluation, generation).
        """
        return self.forward_embedded(self.embedding(tokens), state, run_heads=run_heads)

    def forward_embedded(
        self, inputs: torch.Tensor, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        """:meth:`forward` from input vectors (B, T, d_in) instead of token ids: the encoder,
        the projection to x̂ and the heads (a diffusion denoiser reads noised embeddings)."""
        hidden, state = self.encoder(inputs, state)
        predicted = self.projection(hidden)
        heads = None
        if run_heads and self.heads is not None and self.num_heads:
            heads = self.heads(predicted)
        return Prediction(predicted, heads, state)

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """x̂ (..., d) -> x̂ · E_outᵀ + b (..., V)."""
        weight, bias = self.output()
        return F.linear(predicted, weight, bias)

    def log_probs(self, tokens: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        """tokens (B, T) -> the main head's next-word log-probabilities (B, T, V) and the state."""
        prediction = self(tokens, state, run_heads=False)
        return torch.log_softmax(self.logits(prediction.main).float(), -1), prediction.state

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part of the pipeline (a shared tensor counted once, in its owner)."""
        parts = {
            "input_embedding": self.embedding,
            "encoder": self.encoder,
            "output": nn.ModuleList([self.output, self.projection]),
            "heads": nn.ModuleList([] if self.heads is None else [self.heads]),
        }
        if self.source_embedding is not None:
            parts["source_embedding"] = self.source_embedding
        seen: set[int] = set()
        counts = {}
        for name, module in parts.items():
            total = 0
            for parameter in module.parameters():
                if id(parameter) not in seen:
                    seen.add(id(parameter))
                    total += parameter.numel()
            counts[name] = total
        return counts


def build_model(
    config: ModelConfig, vocab: int | Sequence[str], lexicon: Lexicon | None = None
) -> LanguageModel:
    """Wire the configured components: each builder receives what it needs, already built.

    ``vocab``: the vocabulary's words in id order (a ``Vocabulary``'s ``itos``), or only its
    size (placeholder strings: enough for lookup tables). ``lexicon``: what GroC grounds words
    in; None loads WordNet's for these words (cached) when a component needs one.
    """
    words = [f"<w{i}>" for i in range(vocab)] if isinstance(vocab, int) else list(vocab)
    vocab_size = len(words)
    if config.backbone.kind != "none":  # a pretrained model supplies the three parts
        from targetlm.modules.hf import BACKBONES

        backbone = BACKBONES.build(
            config.backbone.kind, config.backbone.options, "model.backbone", vocab_size=vocab_size
        )
        if config.source_embedding.kind != "none":
            raise ConfigError(
                f"model.source_embedding.kind = {config.source_embedding.kind!r}: a pretrained "
                "backbone reads no source sentence (use 'none')"
            )
        heads = build_heads(config.heads, embedding_dim=backbone.output.embedding_dim)
        return LanguageModel(backbone.embedding, backbone.encoder, backbone.output, heads)
    limits = _lexicon_limits(config)
    if lexicon is None and limits is not None:
        from targetlm.lexicon import load_lexicon

        lexicon = load_lexicon(words, *limits)

    def input_embedding(component: ComponentConfig, where: str) -> nn.Module:
        return INPUT_EMBEDDINGS.build(
            component.kind,
            component.options,
            where,
            vocab_size=vocab_size,
            words=words,
            lexicon=lexicon,
        )

    embedding = input_embedding(config.embedding, "model.embedding")
    encoder = ENCODERS.build(
        config.encoder.kind, config.encoder.options, "model.encoder", input_size=embedding.size
    )
    output = OUTPUT_LAYERS.build(
        config.output.kind,
        config.output.options,
        "model.output",
        vocab_size=vocab_size,
        words=words,
        hidden_size=encoder.output_size,
        embedding=embedding,
        lexicon=lexicon,
    )
    heads = build_heads(config.heads, embedding_dim=output.embedding_dim)
    source_embedding = None
    if config.source_embedding.kind != "none":
        source_embedding = input_embedding(config.source_embedding, "model.source_embedding")
        if source_embedding.size != embedding.size:
            raise ConfigError(
                f"model.source_embedding.size = {source_embedding.size}: the encoder reads "
                f"vectors of model.embedding.size = {embedding.size}"
            )
    # built last, so a model without it draws the same initial weights as before it existed
    return LanguageModel(embedding, encoder, output, heads, source_embedding)


def _lexicon_limits(config: ModelConfig) -> tuple[int, int] | None:
    """(relatives, gloss words) per word the components' lexicon must hold; None: no lexicon."""
    limits = []
    for registry, component in (
        (INPUT_EMBEDDINGS, config.embedding),
        (OUTPUT_LAYERS, config.output),
        (INPUT_EMBEDDINGS, config.source_embedding),
    ):
        if component.kind == "none":  # no source embedding of its own
            continue
        parameters = inspect.signature(registry.get(component.kind)).parameters
        options = {k: p.default for k, p in parameters.items()} | component.options
        if "lexicon" in parameters and (options["relations"] or options["definitions"]):
            limits.append((options["max_relations"], options["max_definition"]))
    return (max(r for r, _ in limits), max(d for _, d in limits)) if limits else None


def detach_state(state: Any) -> Any:
    """Detach every tensor of an encoder state (any nesting of lists/tuples)."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.detach()
    return type(state)(detach_state(s) for s in state)


def state_to_list(state: Any) -> Any:
    """A state as nested lists of tensors (what ``torch.load(weights_only=True)`` accepts)."""
    if state is None or isinstance(state, torch.Tensor):
        return state
    return [state_to_list(s) for s in state]
