"""Model pipeline: input embeddings, encoders, output layers and the model that wires them."""

from targetlm.modules.compositional import (
    CharCnn,
    CharCnnOutput,
    GrocEmbedding,
    GrocOutput,
    GroundedEncoder,
)
from targetlm.modules.embeddings import INPUT_EMBEDDINGS, LookupEmbedding
from targetlm.modules.encoders import ENCODERS, LockedDropout, LstmEncoder, TransformerEncoder
from targetlm.modules.heads import HEADS, NgramHeads, SimpleHeads, WdrHeads, build_heads
from targetlm.modules.model import (
    LanguageModel,
    Prediction,
    build_model,
    detach_state,
    state_to_list,
)
from targetlm.modules.outputs import (
    OUTPUT_LAYERS,
    AdaptiveOutput,
    BilinearOutput,
    DeepResidualOutput,
    LookupOutput,
    OutputLayer,
    ResidualNetwork,
    TiedOutput,
)

__all__ = [
    "AdaptiveOutput",
    "BilinearOutput",
    "CharCnn",
    "CharCnnOutput",
    "DeepResidualOutput",
    "GrocEmbedding",
    "GrocOutput",
    "GroundedEncoder",
    "ResidualNetwork",
    "ENCODERS",
    "HEADS",
    "INPUT_EMBEDDINGS",
    "OUTPUT_LAYERS",
    "LanguageModel",
    "Prediction",
    "LockedDropout",
    "LookupEmbedding",
    "LookupOutput",
    "LstmEncoder",
    "NgramHeads",
    "OutputLayer",
    "SimpleHeads",
    "TiedOutput",
    "TransformerEncoder",
    "WdrHeads",
    "build_heads",
    "build_model",
    "detach_state",
    "state_to_list",
]
