"""GroC's compositional input embedding (Pappas et al. 2020, §3.1), registered as ``groc``,
and :func:`shared_encoder`: the one place that decides whether an output layer reuses its
encoder (the paper's single encoder, ``E_out = g(E_in)``, §3.2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.lexicon.lexicon import Lexicon
from targetlm.modules.char_cnn import CharCnn, StringIndex, Widths, index_strings
from targetlm.modules.embeddings import INPUT_EMBEDDINGS
from targetlm.modules.grounded import GroundedEncoder, prepare_lexicon
from targetlm.registry import Count, Probability, Seed, Size


@INPUT_EMBEDDINGS.register("groc")
class GrocEmbedding(nn.Module):
    """GroC's compositional input embedding (Pappas et al. 2020, §3.1): the
    :class:`GroundedEncoder` on the input side; with relations and definitions off it is a
    char-CNN input embedding (Kim et al. 2016). Each step encodes only the batch's distinct
    words. It embeds any string: :meth:`for_words` gives it another vocabulary, e.g. with the
    new words of an evaluation text ("any word's input embedding can be calculated
    compositionally", §3.1).

    Args: ``words`` / ``lexicon`` (supplied by the builder), ``size``, and the encoder and
    lexicon options of :class:`GrocOutput`.
    """

    encoder: GroundedEncoder
    index_word: torch.Tensor  # (V,) buffer: each word's string id (one of the index_* buffers)

    def __init__(
        self,
        words: Sequence[str],
        lexicon: Lexicon | None = None,
        size: Size = 200,
        relations: bool = True,
        definitions: bool = True,
        char_size: Size = 16,
        widths: Widths = (1, 2, 3, 4, 5, 6),
        channels_per_width: Size = 32,
        highway_layers: Count = 1,
        max_word_length: Size = 20,
        max_relations: Count = 3,
        max_definition: Count = 10,
        lexicon_drop: Probability = 0.0,
        lexicon_seed: Seed = 0,
    ) -> None:
        super().__init__()
        lexicon = prepare_lexicon(
            lexicon,
            relations or definitions,
            max_relations,
            max_definition,
            lexicon_drop,
            lexicon_seed,
        )
        cnn = CharCnn(char_size, widths, channels_per_width, highway_layers)
        encoder = GroundedEncoder(size, relations, definitions, cnn)
        self._attach(encoder, size, words, lexicon, max_word_length)

    def _attach(
        self,
        encoder: GroundedEncoder,
        size: int,
        words: Sequence[str],
        lexicon: Lexicon | None,
        max_word_length: int,
    ) -> None:
        self.size = size
        self.encoder = encoder
        self.lexicon = lexicon
        self.max_word_length = max_word_length
        index = index_strings(
            words,
            lexicon,
            encoder.relations,
            encoder.definitions,
            max_word_length,
            encoder.cnn.max_width,
        )
        for name, tensor in zip(StringIndex._fields, index):
            self.register_buffer(f"index_{name}", tensor, persistent=False)

    def for_words(self, words: Sequence[str], lexicon: Lexicon | None = None) -> GrocEmbedding:
        """This embedding over the vocabulary ``words`` (ids index it): the same encoder
        module, so the same parameters. ``lexicon`` grounds the words (default: the embedding's
        own, which only knows the words it was built for)."""
        other = type(self).__new__(type(self))
        nn.Module.__init__(other)
        lexicon = self.lexicon if lexicon is None else lexicon
        other._attach(self.encoder, self.size, words, lexicon, self.max_word_length)
        return other.to(self.index_word.device).train(self.training)

    @property
    def index(self) -> StringIndex:
        return StringIndex(*(getattr(self, f"index_{name}") for name in StringIndex._fields))

    def table(self) -> torch.Tensor:
        """Embeddings of the whole vocabulary (V, size)."""
        return self.encoder(self.index)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) of this embedding's vocabulary -> (B, T, size)."""
        rows, inverse = tokens.unique(return_inverse=True)  # the batch's distinct words
        return F.embedding(inverse, self.encoder(self.index, rows))  # (B, T, size)


def shared_encoder(
    embedding: nn.Module | None,
    size: int,
    relations: bool,
    definitions: bool,
    required: bool,
) -> GroundedEncoder | None:
    """The GroC input embedding's encoder if it fits the output layer, else None (``required``:
    a ValueError that says why)."""
    problem = None
    if not isinstance(embedding, GrocEmbedding):
        problem = f"a groc input embedding, not a {type(embedding).__name__}"
    elif embedding.size != size:
        problem = f"the input embedding size ({embedding.size}) to equal the output size ({size})"
    elif (embedding.encoder.relations, embedding.encoder.definitions) != (relations, definitions):
        problem = "the same relations/definitions settings on both sides"
    if problem is None and isinstance(embedding, GrocEmbedding):
        return embedding.encoder
    if required:
        raise ValueError(f"share_encoder needs {problem}")
    return None
