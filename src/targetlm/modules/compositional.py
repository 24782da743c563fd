"""Compositional word embeddings: any string -> a vector; no parameter depends on a vocabulary.

* :class:`CharCnn`: the surface encoder of Józefowicz et al. (2016) / Kim et al. (2016):
  characters -> convolutions of several widths -> max over time -> highway layers.
* :class:`GroundedEncoder`: GroC (Pappas, Mulcaire, Smith 2020): the surface encoding
  of a word, the mean surface encoding of its (≤3) WordNet relatives and of its (≤10)
  gloss words (zero when missing), concatenated and projected to d.
* output layers ``char_cnn`` and ``groc`` and the input embedding ``groc``. The paper's GroC
  is one encoder on both sides: ``E_out = g(E_in)`` (§3.2), which the ``groc`` output layer
  builds by default when the input embedding is ``groc`` (``share_encoder = "auto"``).

Speed: a word list is indexed once (:func:`index_strings`) into the unique strings that its
words, relatives and gloss words use, so one batched char-CNN pass per step encodes each
string once; relatives and glosses are then averaged with ``embedding_bag``. In evaluation
(``eval()`` and no grad) ``E_out`` is computed once and reused until a parameter changes;
in training ``update_prob`` p < 1 recomputes it (with gradients) with probability p and
otherwise reuses the last one, detached (GroC's sparse output updates).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.lexicon.characters import NUM_CHARACTERS, PAD, encode_characters
from targetlm.lexicon.lexicon import Lexicon
from targetlm.modules.embeddings import INPUT_EMBEDDINGS
from targetlm.modules.outputs import (
    OUTPUT_LAYERS,
    OutputLayer,
    ResidualNetwork,
    variational_dropout,
)

Widths = tuple[int, ...]


class StringIndex(NamedTuple):
    """A word list as unique strings (sorted by length) and bags of string ids; U strings, V words."""

    chars: torch.Tensor  # (U, L) character ids
    lengths: torch.Tensor  # (U,) with the begin/end markers
    word: torch.Tensor  # (V,) each word's own string
    relation_strings: torch.Tensor  # (R,) the relatives of all words, concatenated
    relation_offsets: torch.Tensor  # (V + 1,) word v's: relation_strings[o[v] : o[v + 1]]
    definition_strings: torch.Tensor  # (D,) the gloss words of all words, concatenated
    definition_offsets: torch.Tensor  # (V + 1,)

    def to(self, device: torch.device) -> StringIndex:
        return StringIndex(*(t.to(device) for t in self))


def index_strings(
    words: Sequence[str],
    lexicon: Lexicon | None,
    relations: bool = True,
    definitions: bool = True,
    max_length: int = 20,
    min_length: int = 1,
) -> StringIndex:
    """Index ``words`` (and, when asked, their lexicon relatives and gloss words) once."""
    ids: dict[str, int] = {}
    word = [ids.setdefault(w, len(ids)) for w in words]
    bags = []
    for wanted, entries in (
        (relations and lexicon is not None, lambda w: lexicon.relations(w)),
        (definitions and lexicon is not None, lambda w: lexicon.definition(w)),
    ):
        flat, offsets = [], [0]
        for w in words:
            if wanted:
                flat.extend(ids.setdefault(s, len(ids)) for s in entries(w))
            offsets.append(len(flat))
        bags.append((flat, offsets))
    strings = list(ids)
    chars, lengths = encode_characters(strings, max_length, min_length)
    # renumber the strings by length: the char-CNN convolves equal lengths together
    order = torch.sort(lengths, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    as_tensor = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return StringIndex(
        chars[order],
        lengths[order],
        rank[as_tensor(word)],
        rank[as_tensor(bags[0][0])],
        as_tensor(bags[0][1]),
        rank[as_tensor(bags[1][0])],
        as_tensor(bags[1][1]),
    )


def select_bags(
    flat: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The bags of ``rows`` (n,) out of ``flat``/``offsets``: (flat', offsets' (n + 1,))."""
    starts = offsets[rows]
    counts = offsets[rows + 1] - starts
    new_offsets = F.pad(counts.cumsum(0), (1, 0))
    # position j of the result comes from flat[starts[bag(j)] + j - new_offsets[bag(j)]]
    shift = torch.repeat_interleave(starts - new_offsets[:-1], counts)
    return flat[shift + torch.arange(shift.numel(), device=flat.device)], new_offsets


class Highway(nn.Module):
    """Highway layers (Srivastava et al. 2015): ``y = t ⊙ relu(W_h x) + (1 − t) ⊙ x``,
    ``t = σ(W_t x + b_t)``, with b_t = −2 so a new layer mostly carries its input."""

    def __init__(self, size: int, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(size, 2 * size) for _ in range(num_layers))
        for layer in self.layers:
            nn.init.constant_(layer.bias[size:], -2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden, gate = layer(x).chunk(2, -1)  # (N, S) each
            gate = torch.sigmoid(gate)
            x = gate * torch.relu(hidden) + (1 - gate) * x
        return x


class CharCnn(nn.Module):
    """Character CNN (Kim et al. 2016; Józefowicz et al. 2016): chars (N, L) -> (N, S).

    Character embeddings, one convolution per width, max over the positions of the word,
    tanh, then highway layers. S = channels_per_width · len(widths).
    """

    def __init__(
        self,
        char_size: int = 16,
        widths: Widths = (1, 2, 3, 4, 5, 6),
        channels_per_width: int = 32,
        highway_layers: int = 1,
    ) -> None:
        super().__init__()
        if not widths or min(widths) < 1:
            raise ValueError(f"widths must be positive, got {list(widths)}")
        self.characters = nn.Embedding(NUM_CHARACTERS, char_size, padding_idx=PAD)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(char_size, channels_per_width, w) for w in widths
        )
        self.max_width = max(widths)
        self.output_size = channels_per_width * len(widths)
        # each output channel's filter width (S,)
        self.register_buffer(
            "widths",
            torch.tensor(widths).repeat_interleave(channels_per_width),
            persistent=False,
        )
        self.highway = Highway(self.output_size, highway_layers)
        # how the windows are computed: None picks by device (one padded pass on GPUs, where
        # kernel launches cost more than FLOPs; groups of equal length elsewhere, where the
        # FLOPs of padding cost more). Both give the same encodings.
        self.single_pass: bool | None = None

    def _filters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All widths as one matrix over windows of the widest filter (narrower filters
        zero-padded on the right): weight (S, char_size * K), bias (S,)."""
        K = self.max_width
        weight = torch.cat(
            [F.pad(conv.weight, (0, K - conv.kernel_size[0])) for conv in self.convolutions]
        ).flatten(1)
        return weight, torch.cat([conv.bias for conv in self.convolutions])

    def forward(self, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """chars (N, L) padded to at least the widest filter, lengths (N,) -> (N, S).

        A filter of width w sees the max(length, K) - w + 1 windows that start inside the word
        (K the widest filter; shorter words are padded to K), so a word's encoding never
        depends on what it is batched with.
        """
        if lengths.numel() == 0:
            return self.highway(chars.new_zeros(0, self.output_size, dtype=torch.float))
        single_pass = chars.is_cuda if self.single_pass is None else self.single_pass
        pooled = self._single_pass(chars, lengths) if single_pass else self._grouped(chars, lengths)
        return self.highway(torch.tanh(pooled))  # (N, S)

    def _single_pass(self, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Every word padded to the longest: one GEMM over all windows, invalid ones masked."""
        K = self.max_width
        weight, bias = self._filters()
        x = self.characters(chars)  # (N, L, char_size)
        windows = F.pad(x, (0, 0, 0, K - 1)).unfold(1, K, 1)  # (N, L, char_size, K)
        y = windows.flatten(2) @ weight.t()  # (N, L, S): window t, channel s
        start = torch.arange(x.size(1), device=x.device)[:, None]  # (L, 1)
        last = lengths.clamp(min=K)[:, None, None] - self.widths  # (N, 1, S): last valid start
        y = y.masked_fill(start > last, float("-inf"))
        return y.max(1).values + bias  # (N, S)

    def _grouped(self, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Words convolved in groups of equal length, each cut to that length (or K): no
        padding FLOPs. Rows sorted by length (as :func:`index_strings` makes them) need no
        reordering."""
        ordered = bool((lengths[1:] >= lengths[:-1]).all())
        order = None if ordered else torch.sort(lengths, stable=True).indices
        if order is not None:
            chars, lengths = chars[order], lengths[order]
        values, counts = torch.unique_consecutive(lengths, return_counts=True)
        K = self.max_width
        weight, bias = self._filters()  # one GEMM per group instead of one conv per width
        x = self.characters(chars)  # (N, L, char_size)
        pooled = []
        for group, length in zip(x.split(counts.tolist()), values.tolist()):
            length = max(length, K)
            windows = F.pad(group[:, :length], (0, 0, 0, K - 1)).unfold(1, K, 1)
            # a filter of width w has length - w + 1 windows inside the word; the others get
            # a bias of -inf, so the max never picks them
            outside = torch.arange(length, device=x.device)[:, None] > length - self.widths
            shift = bias.masked_fill(outside, float("-inf"))  # (length, S)
            y = windows.flatten(2) @ weight.t() + shift  # (n, length, S): window t, channel s
            pooled.append(y.max(1).values)  # (n, S)
        encoded = torch.cat(pooled)  # (N, S)
        if order is not None:
            encoded = encoded[torch.argsort(order)]
        return encoded


class GroundedEncoder(nn.Module):
    """GroC's word encoder (Pappas et al. 2020, §3.1): for word w,
    ``e_w = W · [s(w); mean_{r ∈ R(w)} s(r); mean_{g ∈ D(w)} s(g)]`` with s the char-CNN,
    R(w) its WordNet relatives and D(w) its gloss words; an empty mean is zero. Turning
    ``relations`` / ``definitions`` off drops that part (the paper's ablations).

    W has no bias: with a char-CNN of output size S = d it is the paper's "3d² parameters for
    projection" (§3.4); a bias would add the same vector to every word's embedding, which the
    prefix encoder's input bias, the softmax and the compositional bias's ``a`` absorb anyway.
    """

    def __init__(
        self,
        size: int,
        relations: bool = True,
        definitions: bool = True,
        char_size: int = 16,
        widths: Widths = (1, 2, 3, 4, 5, 6),
        channels_per_width: int = 32,
        highway_layers: int = 1,
    ) -> None:
        super().__init__()
        self.relations = relations
        self.definitions = definitions
        self.cnn = CharCnn(char_size, widths, channels_per_width, highway_layers)
        parts = 1 + relations + definitions
        self.projection = nn.Linear(parts * self.cnn.output_size, size, bias=False)

    def forward(self, index: StringIndex, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The encodings of all indexed words (V, size), or of ``rows`` (n,) of them (n, size)."""
        relation = (index.relation_strings, index.relation_offsets)
        definition = (index.definition_strings, index.definition_offsets)
        if rows is None:
            word = index.word
            surface = self.cnn(index.chars, index.lengths)  # (U, S): every string once
        else:
            word = index.word[rows]
            relation = select_bags(*relation, rows)
            definition = select_bags(*definition, rows)
            needed = torch.cat([word, relation[0], definition[0]])
            strings, inverse = needed.unique(return_inverse=True)  # sorted: still by length
            word, relatives, glosses = inverse.split(
                [len(word), len(relation[0]), len(definition[0])]
            )
            relation, definition = (relatives, relation[1]), (glosses, definition[1])
            surface = self.cnn(index.chars[strings], index.lengths[strings])  # (U', S)
        parts = [surface[word]]
        for wanted, (flat, offsets) in ((self.relations, relation), (self.definitions, definition)):
            if wanted:  # mean of each word's bag; an empty bag gives zeros
                parts.append(
                    F.embedding_bag(flat, surface, offsets, mode="mean", include_last_offset=True)
                )
        return self.projection(torch.cat(parts, 1))  # (V, size)


BIAS_ACTIVATIONS = {"tanh": torch.tanh, "sigmoid": torch.sigmoid}


class CompositionalOutput(OutputLayer):
    """``E_out = ResidualNetwork(GroundedEncoder(V))``, compositional bias
    ``b_v = act(w · e_v + a)`` (Pappas et al. 2020, eq. 5), evaluation cache, sparse updates.

    ``embedding_dropout``: variational dropout on E_out itself in training (one mask over d
    shared by every word); GroC uses it at depth 0, where the network has no layers to drop
    between.
    """

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
        bias_activation: Literal["tanh", "sigmoid"] = "tanh",
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
        self.bias_activation = BIAS_ACTIVATIONS[bias_activation]
        self.embedding_dropout = embedding_dropout
        self.update_prob = update_prob
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
        """``b_v = act(w · e_v + a)`` (V,) of E_out ``weight`` (V, d): no per-word parameter."""
        if self.bias_layer is None:
            return None
        return self.bias_activation(self.bias_layer(weight)).squeeze(-1)

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
        bias / bias_activation: the compositional bias ``act(w·e_v + a)`` of eq. 5, where
            "σ is the activation function" (not necessarily the sigmoid): tanh, as in the
            authors' code, or sigmoid (targetlm's earlier reading, for older checkpoints).
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
        depth: int = 2,
        activation: Literal["relu", "selu", "tanh"] = "relu",
        dropout: float = 0.0,
        bias: bool = True,
        bias_activation: Literal["tanh", "sigmoid"] = "tanh",
        update_prob: float = 1.0,
        char_size: int = 16,
        widths: Widths = (1, 2, 3, 4, 5, 6),
        channels_per_width: int = 32,
        highway_layers: int = 1,
        max_word_length: int = 20,
        max_relations: int = 3,
        max_definition: int = 10,
        lexicon_drop: float = 0.0,
        lexicon_seed: int = 0,
        share_encoder: bool | Literal["auto"] = "auto",
    ) -> None:
        lexicon = _prepare_lexicon(
            lexicon,
            relations or definitions,
            max_relations,
            max_definition,
            lexicon_drop,
            lexicon_seed,
        )
        encoder = None
        if share_encoder is not False:
            encoder = _shared_encoder(
                embedding, hidden_size, relations, definitions, required=share_encoder is True
            )
        if encoder is None:
            encoder = GroundedEncoder(
                hidden_size,
                relations,
                definitions,
                char_size,
                widths,
                channels_per_width,
                highway_layers,
            )
        super().__init__(
            words,
            lexicon,
            encoder,
            ResidualNetwork(hidden_size, depth, activation, dropout),
            hidden_size,
            bias,
            update_prob,
            max_word_length,
            bias_activation,
            embedding_dropout=dropout if depth == 0 else 0.0,
        )


@OUTPUT_LAYERS.register("char_cnn")
class CharCnnOutput(CompositionalOutput):
    """CNN softmax (Józefowicz et al. 2016): ``E_out = W · highway(CNN(chars))``, with
    the optional per-word correction ``+ M · c_v`` (c_v of size ``correction``; it is the one
    vocabulary-dependent part, off by default; unseen words get none). d = the encoder's
    output size; the bias is compositional (``act(w·e_v + a)``), as in GroC.

    Args: as :class:`GrocOutput`'s bias and char-CNN options, plus ``correction``.
    """

    def __init__(
        self,
        words: Sequence[str],
        hidden_size: int,
        bias: bool = True,
        bias_activation: Literal["tanh", "sigmoid"] = "tanh",
        update_prob: float = 1.0,
        char_size: int = 16,
        widths: Widths = (1, 2, 3, 4, 5, 6),
        channels_per_width: int = 32,
        highway_layers: int = 1,
        max_word_length: int = 20,
        correction: int = 0,
    ) -> None:
        super().__init__(
            words,
            None,
            GroundedEncoder(
                hidden_size, False, False, char_size, widths, channels_per_width, highway_layers
            ),
            ResidualNetwork(hidden_size, 0),
            hidden_size,
            bias,
            update_prob,
            max_word_length,
            bias_activation,
        )
        if correction < 0:
            raise ValueError(f"correction must be >= 0, got {correction}")
        self.correction = nn.Embedding(len(self.words), correction) if correction else None
        self.correction_map = nn.Linear(correction, hidden_size, bias=False) if correction else None
        if correction:
            nn.init.zeros_(self.correction_map.weight)  # starts as the plain CNN softmax
        self.stoi = {w: i for i, w in enumerate(self.words)}

    def compose(self, index: StringIndex, words: Sequence[str] | None = None) -> torch.Tensor:
        weight = self.encoder(index)  # (V, d)
        if self.correction is None:
            return weight
        if words is None:
            return weight + self.correction_map(self.correction.weight)
        rows = torch.tensor([self.stoi.get(w, -1) for w in words], device=weight.device)
        known = (rows >= 0).to(weight.dtype)[:, None]  # unseen words: no correction
        return weight + known * self.correction_map(self.correction(rows.clamp(min=0)))


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

    def __init__(
        self,
        words: Sequence[str],
        lexicon: Lexicon | None = None,
        size: int = 200,
        relations: bool = True,
        definitions: bool = True,
        char_size: int = 16,
        widths: Widths = (1, 2, 3, 4, 5, 6),
        channels_per_width: int = 32,
        highway_layers: int = 1,
        max_word_length: int = 20,
        max_relations: int = 3,
        max_definition: int = 10,
        lexicon_drop: float = 0.0,
        lexicon_seed: int = 0,
    ) -> None:
        super().__init__()
        lexicon = _prepare_lexicon(
            lexicon,
            relations or definitions,
            max_relations,
            max_definition,
            lexicon_drop,
            lexicon_seed,
        )
        encoder = GroundedEncoder(
            size, relations, definitions, char_size, widths, channels_per_width, highway_layers
        )
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


def _shared_encoder(
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
    if problem is None:
        return embedding.encoder
    if required:
        raise ValueError(f"share_encoder needs {problem}")
    return None


def _prepare_lexicon(
    lexicon: Lexicon | None,
    needed: bool,
    max_relations: int,
    max_definition: int,
    drop: float,
    seed: int,
) -> Lexicon | None:
    if not needed:
        return None
    if lexicon is None:
        raise ValueError("relations/definitions need a lexicon (the model builder loads WordNet's)")
    if not 0 <= drop <= 1:
        raise ValueError(f"lexicon_drop must be in [0, 1], got {drop}")
    lexicon = lexicon.truncated(max_relations, max_definition)
    return lexicon.without(drop, seed) if drop else lexicon
