"""GroC's grounded word encoder (Pappas, Mulcaire, Smith 2020, §3.1), shared by its input
embedding and output layer, and the lexicon preparation both sides use."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.lexicon.lexicon import Lexicon
from targetlm.modules.char_cnn import CharCnn, StringIndex, select_bags


class GroundedEncoder(nn.Module):
    """GroC's word encoder (Pappas et al. 2020, §3.1): for word w,
    ``e_w = W · [s(w); mean_{r ∈ R(w)} s(r); mean_{g ∈ D(w)} s(g)]`` with s the char-CNN,
    R(w) its WordNet relatives and D(w) its gloss words; an empty mean is zero. Turning
    ``relations`` / ``definitions`` off drops that part (the paper's ablations).

    W has no bias: with a char-CNN of output size S = d it is the paper's "3d² parameters for
    projection" (§3.4); a bias would add the same vector to every word's embedding, which the
    prefix encoder's input bias, the softmax and the compositional bias's ``a`` absorb anyway.
    ``cnn`` is s (built by the caller, before W).
    """

    def __init__(self, size: int, relations: bool, definitions: bool, cnn: CharCnn) -> None:
        super().__init__()
        self.relations = relations
        self.definitions = definitions
        self.cnn = cnn
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


def prepare_lexicon(
    lexicon: Lexicon | None,
    needed: bool,
    max_relations: int,
    max_definition: int,
    drop: float,
    seed: int,
) -> Lexicon | None:
    """The lexicon a GroC side grounds its words in: truncated to ``max_relations`` relatives
    and ``max_definition`` gloss words, with ``drop`` of the words' entries removed (Table 4);
    None when neither relations nor definitions are ``needed``."""
    if not needed:
        return None
    if lexicon is None:
        raise ValueError("relations/definitions need a lexicon (the model builder loads WordNet's)")
    if not 0 <= drop <= 1:
        raise ValueError(f"lexicon_drop must be in [0, 1], got {drop}")
    lexicon = lexicon.truncated(max_relations, max_definition)
    return lexicon.without(drop, seed) if drop else lexicon
