"""Compositional word embeddings (moved by role; this module keeps the former import path).

* :mod:`targetlm.modules.char_cnn`: string indexing and the character CNN.
* :mod:`targetlm.modules.grounded`: GroC's grounded word encoder and lexicon preparation.
* :mod:`targetlm.modules.groc_embedding`: the ``groc`` input embedding and the shared-encoder rule.
* :mod:`targetlm.modules.groc_output`: the ``groc`` and ``char_cnn`` output layers.
"""

from targetlm.modules.char_cnn import (
    CharCnn,
    Highway,
    StringIndex,
    Widths,
    index_strings,
    select_bags,
)
from targetlm.modules.groc_embedding import GrocEmbedding, shared_encoder
from targetlm.modules.groc_output import (
    BIAS_ACTIVATIONS,
    CharCnnOutput,
    CompositionalOutput,
    GrocOutput,
)
from targetlm.modules.grounded import GroundedEncoder, prepare_lexicon

__all__ = [
    "BIAS_ACTIVATIONS",
    "CharCnn",
    "CharCnnOutput",
    "CompositionalOutput",
    "GrocEmbedding",
    "GrocOutput",
    "GroundedEncoder",
    "Highway",
    "StringIndex",
    "Widths",
    "index_strings",
    "prepare_lexicon",
    "select_bags",
    "shared_encoder",
]
