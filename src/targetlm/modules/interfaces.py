"""Declared capabilities of components, checked with ``isinstance`` (never ``hasattr``).

A component has a capability by having the members below (structural typing, so a new
component needs no base class to gain one); callers ask ``isinstance(module, Capability)``.
Encoders declare ``max_context`` on their base class, :class:`targetlm.modules.encoders.Encoder`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from targetlm.lexicon.lexicon import Lexicon

__all__ = [
    "ConditionalEncoder",
    "EmbeddingTable",
    "HasTrainingCache",
    "OpenVocabularyEmbedding",
    "OpenVocabularyOutput",
    "RaggedEncoder",
    "RewindableEncoder",
    "RowConcatenableEncoder",
    "RowSelectableEncoder",
]


@runtime_checkable
class EmbeddingTable(Protocol):
    """An input embedding with a whole-vocabulary table, which a tied output layer reuses."""

    size: int  # d

    def table(self) -> torch.Tensor:
        """The embeddings of the whole vocabulary (V, size)."""
        ...


@runtime_checkable
class OpenVocabularyOutput(Protocol):
    """An output layer that embeds any strings (compositional: char-CNN, GroC)."""

    lexicon: Lexicon | None  # what its own words are grounded in (None: characters only)

    def embed_words(
        self, words: Sequence[str], lexicon: Lexicon | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """E_out (n, d) and b (n,) or None of ``words``, grounded in ``lexicon``."""
        ...


@runtime_checkable
class OpenVocabularyEmbedding(Protocol):
    """An input embedding that reads any strings: the same module over another vocabulary."""

    lexicon: Lexicon | None  # what its own words are grounded in (None: characters only)

    def for_words(self, words: Sequence[str], lexicon: Lexicon | None = None) -> torch.nn.Module:
        """This embedding (same parameters) over the vocabulary ``words``."""
        ...


@runtime_checkable
class HasTrainingCache(Protocol):
    """A module with training-time state outside its state_dict, saved for exact resume."""

    def training_cache(self) -> torch.Tensor | None:
        """The state to save (detached), or None."""
        ...

    def load_training_cache(self, cache: torch.Tensor | None) -> None:
        """Restore what :meth:`training_cache` returned."""
        ...


@runtime_checkable
class ConditionalEncoder(Protocol):
    """An encoder that reads a source besides the target stream (``Encoder.conditional``: an
    encoder-decoder, a diffusion denoiser): the target is read from the state of its source."""

    def start(self, source: torch.Tensor, mask: torch.Tensor) -> Any:
        """The state a target starts from: the embedded source (B, S, d) with its mask (B, S)
        (True = a real token) encoded."""
        ...


@runtime_checkable
class RewindableEncoder(Protocol):
    """An encoder whose state can forget the last tokens it read (speculative decoding drops
    rejected drafted tokens); without it, a caller re-reads from a state it saved."""

    def rewind(self, state: Any, n: int) -> Any | None:
        """``state`` as if its last ``n`` tokens had not been read; None where this state
        cannot say (the caller then re-reads from a saved state)."""
        ...


@runtime_checkable
class RowSelectableEncoder(Protocol):
    """An encoder whose state's batch rows can be kept or dropped (finished rows leave a
    generating batch)."""

    def select_rows(self, state: Any, rows: torch.Tensor) -> Any:
        """The state of batch rows ``rows`` (B',) only, in that order."""
        ...


@runtime_checkable
class RowConcatenableEncoder(Protocol):
    """An encoder whose states' rows can be put together into one batch (speculative decoding
    re-reads groups of rows that keep different numbers of tokens)."""

    def concat_rows(self, states: Sequence[Any]) -> Any:
        """One state whose rows are those of ``states`` one after the other."""
        ...


@runtime_checkable
class RaggedEncoder(Protocol):
    """An encoder whose batch rows may hold different numbers of tokens: each row can forget
    its own number of last tokens, and the next read continues every row where it stands."""

    def rewind_rows(self, state: Any, counts: torch.Tensor) -> Any | None:
        """``state`` as if row b had not read its last ``counts[b]`` tokens ((B,) long); None
        where this state cannot say (the caller re-reads from a saved state)."""
        ...
