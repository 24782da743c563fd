"""Compositional output layers: any string -> (E_out row, bias); no parameter depends on a vocabulary.

* ``groc`` (:class:`GrocOutput`, Pappas, Mulcaire, Smith 2020): the grounded encoder through a
  residual output network; by default one encoder on both sides, ``E_out = g(E_in)`` (§3.2),
  when the input embedding is ``groc`` (``share_encoder = "auto"``).
* ``char_cnn`` (:class:`CharCnnOutput`, Józefowicz et al. 2016): the CNN softmax.

Speed: in evaluation (``eval()`` and no grad) ``E_out`` is computed once and reused until a
parameter changes; in training ``update_prob`` p < 1 recomputes it (with gradients) with
probability p and otherwise reuses the last one, detached (GroC's sparse output updates).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from targetlm.lexicon.lexicon import Lexicon
from targetlm.modules.char_cnn import CharCnn, StringIndex, Widths, index_strings
from targetlm.modules.groc_embedding import shared_encoder
from targetlm.modules.grounded import GroundedEncoder, prepare_lexicon
from targetlm.modules.outputs import (
    OUTPUT_LAYERS,
    OutputLayer,
    ResidualNetwork,
    variational_dropout,
)
from targetlm.registry import Count, Fraction, Probability, Seed, Size


class CompositionalOutput(OutputLayer):
    """``E_out = ResidualNetwork(GroundedEncoder(V))``, compositional bias
    ``b_v = tanh(w · e_v + a)`` (Pappas et al. 2020, eq. 5), evaluation cache, sparse updates.

    ``embedding_dropout``: variational dropout on E_out itself in training (one mask over d
    shared by every word); GroC uses it at depth 0, where the network has no layers to drop
    between.
    """

    index_word: torch.Tensor  # (V,) buffer: each word's string id (one of the index_* buffers)

    def __init__(
        self,
        words: Sequence[str],
        lexicon: Lexicon | None,
        encoder: GroundedEncoder,
        network: ResidualNetwork,
        size: int,
        bias: bool,
        update_prob: float,
        max_word_length: int,
        embedding_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0 <= update_prob <= 1:
            raise ValueError(f"update_prob must be in [0, 1], got {update_prob}")
        if not 0 <= embedding_dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {embedding_dropout}")
        self.embedding_dim = size
        self.encoder = encoder
        self.network = network
        self.bias_layer = nn.Linear(size, 1) if bias else None
        self.embedding_dropout = embedding_dropout
        self.update_prob = update_prob
        # a step that reuses the last E_out leaves the network that composes it untouched
        self.may_leave_parameters_unused = update_prob < 1
        self.lexicon = lexicon
        self.max_word_length = max_word_length
        self.words = list(words)
        for name, tensor in zip(StringIndex._fields, self._index_of(self.words, lexicon)):
            self.register_buffer(f"index_{name}", tensor, persistent=False)  # data, not weights
        self._eval_cache: tuple | None = None
        self._eval_key: tuple | None = None
        self._stale: torch.Tensor | None = None  # the last E_out computed in training, detached

    def _index_of(self, words: Sequence[str], lexicon: Lexicon | None) -> StringIndex:
        return index_strings(
            words,
            lexicon,
            self.encoder.relations,
            self.encoder.definitions,
            self.max_word_length,
            self.encoder.cnn.max_width,
        )

    @property
    def index(self) -> StringIndex:
        return StringIndex(*(getattr(self, f"index_{name}") for name in StringIndex._fields))

    def compose(self, index: StringIndex, words: Sequence[str] | None = None) -> torch.Tensor:
        """E_out (V, d) of an indexed word list (``words`` None: the built vocabulary)."""
        return self.network(self.encoder(index))

    def compositional_bias(self, weight: torch.Tensor) -> torch.Tensor | None:
        """``b_v = tanh(w · e_v + a)`` (V,) of E_out ``weight`` (V, d): no per-word parameter."""
        if self.bias_layer is None:
            return None
        return torch.tanh(self.bias_layer(weight)).squeeze(-1)

    def embed_words(
        self, words: Sequence[str], lexicon: Lexicon | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """E_out (n, d) and b (n,) of any strings, grounded in ``lexicon`` (default: the
        layer's own, which only knows the words it was built for; pass a lexicon of the
        new words, e.g. ``targetlm.lexicon.load_lexicon(words)``, for unseen ones)."""
        lexicon = self.lexicon if lexicon is None else lexicon
        index = self._index_of(words, lexicon).to(self.index_word.device)
        weight = self.compose(index, list(words))
        return weight, self.compositional_bias(weight)

    def training_cache(self) -> torch.Tensor | None:
        """The E_out that sparse updates reuse (detached), for a resumable checkpoint; kept out
        of the state_dict, which must not depend on the vocabulary."""
        return self._stale

    def load_training_cache(self, cache: torch.Tensor | None) -> None:
        self._stale = cache

    def train(self, mode: bool = True) -> CompositionalOutput:
        self._eval_cache, self._eval_key, self._stale = None, None, None
        return super().train(mode)

    def _parameters_key(self) -> tuple:
        # in-place updates (optimiser steps, load_state_dict) bump a tensor's version
        return tuple((p.data_ptr(), p._version) for p in self.parameters())

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.training:
            if torch.is_grad_enabled():  # someone wants gradients: no cache
                weight = self.compose(self.index)
                return weight, self.compositional_bias(weight)
            key = self._parameters_key()
            if self._eval_cache is None or key != self._eval_key:
                weight = self.compose(self.index)
                self._eval_cache, self._eval_key = (weight, self.compositional_bias(weight)), key
            return self._eval_cache
        # sparse output updates: recompute with probability p, else reuse the last E_out
        # (detached; the bias's w, a still learn from it)
        if self._stale is None or self.update_prob >= 1 or torch.rand(()) < self.update_prob:
            weight = self.compose(self.index)
            if self.embedding_dropout > 0:
                weight = variational_dropout(weight, self.embedding_dropout)
            self._stale = weight.detach() if self.update_prob < 1 else None
        else:
            weight = self._stale
        return weight, self.compositional_bias(weight)


@OUTPUT_LAYERS.register("groc")
class GrocOutput(CompositionalOutput):
    """GroC output layer (Pappas, Mulcaire, Smith 2020): grounded compositional embeddings
    (:class:`GroundedEncoder`) through a deep residual output network of depth k (eq. 4) with
    variational dropout, and a compositional bias (eq. 5); d = the encoder's output size.

    The paper's model has one encoder: ``E_out = g(E_in)``, the GroC *input* embedding
    through the output network (§3.2), so it has fewer parameters than a tied model with a
    lookup input. ``share_encoder = "auto"`` builds it whenever the input embedding can give
    it (a ``groc`` input embedding of size d with the same relations/definitions).

    Args:
        words / lexicon: the vocabulary's strings and its lexicon (supplied by the builder).
        relations / definitions: use WordNet relatives / gloss words (ablations).
        depth / activation: the residual output network (depth 0: ``E_out = E^(0)``).
        dropout: r of Table 8, variational (one mask over d for every word): between the
            network's layers (§3.2) or, at depth 0, on the output embeddings themselves (§4.1:
            "we apply variational dropout to all output embeddings").
        bias: the compositional bias ``tanh(w·e_v + a)`` of eq. 5, where "σ is the activation
            function" (not necessarily the sigmoid): tanh, as in the authors' code.
        update_prob: p of the sparse output updates (1: recompute E_out every step; 0: only
            the first step of each ``train()`` phase, then reuse it). The reused E_out goes
            into the trainer's resumable checkpoint, so resume is exact for any p.
        char_size / widths / channels_per_width / highway_layers: the char-CNN.
        max_word_length: characters kept per string, with the two markers.
        max_relations / max_definition: relatives / gloss words per word (paper: 3 / 10).
        lexicon_drop / lexicon_seed: remove the entries of this fraction of words (Table 4).
        share_encoder: reuse the GroC input embedding's encoder (char-CNN, highway,
            projection) instead of a second one (the char-CNN options here are then unused).
            ``"auto"``: share when the input embedding is ``groc`` of size d with the same
            relations/definitions settings, else own an encoder; ``true``: share, and a
            configuration that cannot is an error; ``false``: always own an encoder.
    """

    def __init__(
        self,
        words: Sequence[str],
        hidden_size: int,
        lexicon: Lexicon | None = None,
        embedding: nn.Module | None = None,
        relations: bool = True,
        definitions: bool = True,
        depth: Count = 2,
        activation: Literal["relu", "selu", "tanh"] = "relu",
        dropout: Fraction = 0.0,
        bias: bool = True,
        update_prob: Probability = 1.0,
        char_size: Size = 16,
        widths: Widths = (1, 2, 3, 4, 5, 6),
        channels_per_width: Size = 32,
        highway_layers: Count = 1,
        max_word_length: Size = 20,
        max_relations: Count = 3,
        max_definition: Count = 10,
        lexicon_drop: Probability = 0.0,
        lexicon_seed: Seed = 0,
        share_encoder: bool | Literal["auto"] = "auto",
    ) -> None:
        lexicon = prepare_lexicon(
            lexicon,
            relations or definitions,
            max_relations,
            max_definition,
            lexicon_drop,
            lexicon_seed,
        )
        encoder = None
        if share_encoder is not False:
            encoder = shared_encoder(
                embedding, hidden_size, relations, definitions, required=share_encoder is True
            )
        if encoder is None:
            cnn = CharCnn(char_size, widths, channels_per_width, highway_layers)
            encoder = GroundedEncoder(hidden_size, relations, definitions, cnn)
        super().__init__(
            words,
            lexicon,
            encoder,
            ResidualNetwork(hidden_size, depth, activation, dropout),
            hidden_size,
            bias,
            update_prob,
            max_word_length,
            embedding_dropout=dropout if depth == 0 else 0.0,
        )


@OUTPUT_LAYERS.register("char_cnn")
class CharCnnOutput(CompositionalOutput):
    """CNN softmax (Józefowicz et al. 2016): ``E_out = W · highway(CNN(chars))``, with
    the optional per-word correction ``+ M · c_v`` (c_v of size ``correction``; it is the one
    vocabulary-dependent part, off by default; unseen words get none). d = the encoder's
    output size; the bias is compositional (``tanh(w·e_v + a)``), as in GroC.

    Args: as :class:`GrocOutput`'s bias and char-CNN options, plus ``correction``.
    """

    def __init__(
        self,
        words: Sequence[str],
        hidden_size: int,
        bias: bool = True,
        update_prob: Probability = 1.0,
        char_size: Size = 16,
        widths: Widths = (1, 2, 3, 4, 5, 6),
        channels_per_width: Size = 32,
        highway_layers: Count = 1,
        max_word_length: Size = 20,
        correction: Count = 0,
    ) -> None:
        cnn = CharCnn(char_size, widths, channels_per_width, highway_layers)
        super().__init__(
            words,
            None,
            GroundedEncoder(hidden_size, False, False, cnn),
            ResidualNetwork(hidden_size, 0),
            hidden_size,
            bias,
            update_prob,
            max_word_length,
        )
        if correction < 0:
            raise ValueError(f"correction must be >= 0, got {correction}")
        self.correction = nn.Embedding(len(self.words), correction) if correction else None
        self.correction_map = nn.Linear(correction, hidden_size, bias=False) if correction else None
        if self.correction_map is not None:
            nn.init.zeros_(self.correction_map.weight)  # starts as the plain CNN softmax
        self.stoi = {w: i for i, w in enumerate(self.words)}

    def compose(self, index: StringIndex, words: Sequence[str] | None = None) -> torch.Tensor:
        weight = self.encoder(index)  # (V, d)
        if self.correction is None or self.correction_map is None:
            return weight
        if words is None:
            return weight + self.correction_map(self.correction.weight)
        rows = torch.tensor([self.stoi.get(w, -1) for w in words], device=weight.device)
        known = (rows >= 0).to(weight.dtype)[:, None]  # unseen words: no correction
        return weight + known * self.correction_map(self.correction(rows.clamp(min=0)))
