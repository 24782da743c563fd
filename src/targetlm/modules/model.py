"""The language model: InputEmbedding -> Encoder -> (projection) -> x̂, and the OutputLayer.

``forward`` returns the predicted target vectors x̂ (B, T, d); ``output()`` returns
``E_out`` and ``b``. Losses and combiners take both, so the model never owns a
softmax and any output layer works with any objective or combiner.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.config import ModelConfig
from targetlm.modules.embeddings import INPUT_EMBEDDINGS
from targetlm.modules.encoders import ENCODERS
from targetlm.modules.outputs import OUTPUT_LAYERS, OutputLayer


class LanguageModel(nn.Module):
    """Args: already-built embedding, encoder and output layer (see :func:`build_model`)."""

    def __init__(self, embedding: nn.Module, encoder: nn.Module, output: OutputLayer) -> None:
        super().__init__()
        self.embedding = embedding
        self.encoder = encoder
        self.output = output
        hidden, d = encoder.output_size, output.embedding_dim
        # maps the encoder's output to the output embedding space when the sizes differ
        self.projection = nn.Linear(hidden, d, bias=False) if hidden != d else nn.Identity()

    def encode(self, tokens: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        """tokens (B, T) -> encoder output h (B, T, H) and the state that continues the stream."""
        return self.encoder(self.embedding(tokens), state)

    def forward(self, tokens: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        """tokens (B, T) -> predicted target vectors x̂ (B, T, d) and the new state."""
        hidden, state = self.encode(tokens, state)
        return self.projection(hidden), state

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """x̂ (..., d) -> x̂ · E_outᵀ + b (..., V)."""
        weight, bias = self.output()
        return F.linear(predicted, weight, bias)

    def log_probs(self, tokens: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        predicted, state = self(tokens, state)
        return torch.log_softmax(self.logits(predicted).float(), -1), state

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part of the pipeline (a shared tensor counted once, in its owner)."""
        parts = {
            "input_embedding": self.embedding,
            "encoder": self.encoder,
            "output": nn.ModuleList([self.output, self.projection]),
        }
        seen: set[int] = set()
        counts = {}
        for name, module in parts.items():
            total = 0
            for parameter in module.parameters():
                if id(parameter) not in seen:
                    seen.add(id(parameter))
                    total += parameter.numel()
            counts[name] = total
        counts["heads"] = 0
        return counts


def build_model(config: ModelConfig, vocab_size: int) -> LanguageModel:
    """Wire the configured components: each builder receives what it needs, already built."""
    embedding = INPUT_EMBEDDINGS.build(
        config.embedding.kind, config.embedding.options, "model.embedding", vocab_size=vocab_size
    )
    encoder = ENCODERS.build(
        config.encoder.kind, config.encoder.options, "model.encoder", input_size=embedding.size
    )
    output = OUTPUT_LAYERS.build(
        config.output.kind,
        config.output.options,
        "model.output",
        vocab_size=vocab_size,
        hidden_size=encoder.output_size,
        embedding=embedding,
    )
    return LanguageModel(embedding, encoder, output)


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
