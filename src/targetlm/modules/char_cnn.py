"""Strings to vectors: string indexing and the character CNN (no parameter depends on a vocabulary).

* :func:`index_strings`: a word list (and, when asked, its lexicon relatives and gloss words)
  indexed once into the unique strings it uses, sorted by length, and bags of string ids, so
  one batched char-CNN pass per step encodes each string once.
* :class:`CharCnn`: the surface encoder of Józefowicz et al. (2016) / Kim et al. (2016):
  characters -> convolutions of several widths -> max over time -> highway layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.lexicon.characters import NUM_CHARACTERS, PAD, encode_characters
from targetlm.lexicon.lexicon import Lexicon
from targetlm.registry import Size

Widths = tuple[Size, ...]  # the convolutions' widths in characters


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
    sources = (None, None) if lexicon is None else (lexicon.relations, lexicon.definition)
    for wanted, entries in zip((relations, definitions), sources):
        flat: list[int] = []
        offsets = [0]
        for w in words:
            if wanted and entries is not None:
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
        for layer in self._linears():
            nn.init.constant_(layer.bias[size:], -2.0)

    def _linears(self) -> Iterable[nn.Linear]:
        return cast("Iterable[nn.Linear]", self.layers)  # a ModuleList of them

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

    widths: torch.Tensor  # (S,) buffer: each output channel's filter width

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
            [F.pad(conv.weight, (0, K - conv.kernel_size[0])) for conv in self._convolutions()]
        ).flatten(1)
        return weight, torch.cat([conv.get_parameter("bias") for conv in self._convolutions()])

    def _convolutions(self) -> Iterable[nn.Conv1d]:
        return cast("Iterable[nn.Conv1d]", self.convolutions)  # a ModuleList of them

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
