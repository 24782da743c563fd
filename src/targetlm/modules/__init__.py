"""Model pipeline: input embeddings, encoders, output layers and the model that wires them."""

from targetlm.modules.bidirectional import CrammedBertEncoder
from targetlm.modules.char_cnn import CharCnn, StringIndex, index_strings
from targetlm.modules.diffusion import DiffusionDenoiser
from targetlm.modules.eagle import EagleHead  # registers the head kind "eagle"
from targetlm.modules.embeddings import INPUT_EMBEDDINGS, LookupEmbedding
from targetlm.modules.encoders import (
    ENCODERS,
    CausalTransformer,
    Encoder,
    LockedDropout,
    LstmEncoder,
)
from targetlm.modules.groc_embedding import GrocEmbedding
from targetlm.modules.groc_output import CharCnnOutput, CompositionalOutput, GrocOutput
from targetlm.modules.grounded import GroundedEncoder
from targetlm.modules.heads import (
    HEADS,
    MedusaHeads,
    NgramHeads,
    SimpleHeads,
    WdrHeads,
    build_heads,
)
from targetlm.modules.interfaces import (
    EmbeddingTable,
    HasTrainingCache,
    OpenVocabularyEmbedding,
    OpenVocabularyOutput,
)
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
from targetlm.modules.reformer import ReformerEncoder
from targetlm.modules.seq2seq import DecoderState, TransformerSeq2Seq
from targetlm.modules.tensorized import TensorizedTransformer

__all__ = [
    "AdaptiveOutput",
    "BilinearOutput",
    "CausalTransformer",
    "CharCnn",
    "CrammedBertEncoder",
    "CharCnnOutput",
    "CompositionalOutput",
    "DeepResidualOutput",
    "DiffusionDenoiser",
    "GrocEmbedding",
    "GrocOutput",
    "GroundedEncoder",
    "ResidualNetwork",
    "ReformerEncoder",
    "StringIndex",
    "ENCODERS",
    "EmbeddingTable",
    "HasTrainingCache",
    "OpenVocabularyEmbedding",
    "OpenVocabularyOutput",
    "Encoder",
    "HEADS",
    "EagleHead",
    "INPUT_EMBEDDINGS",
    "OUTPUT_LAYERS",
    "LanguageModel",
    "Prediction",
    "LockedDropout",
    "LookupEmbedding",
    "LookupOutput",
    "LstmEncoder",
    "MedusaHeads",
    "NgramHeads",
    "OutputLayer",
    "SimpleHeads",
    "TensorizedTransformer",
    "TiedOutput",
    "TransformerSeq2Seq",
    "DecoderState",
    "WdrHeads",
    "build_heads",
    "build_model",
    "index_strings",
    "detach_state",
    "state_to_list",
]
