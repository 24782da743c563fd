"""Model pipeline: input embeddings, encoders, output layers and the model that wires them."""

from targetlm.modules.embeddings import INPUT_EMBEDDINGS, LookupEmbedding
from targetlm.modules.encoders import ENCODERS, LockedDropout, LstmEncoder, TransformerEncoder
from targetlm.modules.model import LanguageModel, build_model, detach_state, state_to_list
from targetlm.modules.outputs import OUTPUT_LAYERS, LookupOutput, OutputLayer, TiedOutput

__all__ = [
    "ENCODERS",
    "INPUT_EMBEDDINGS",
    "OUTPUT_LAYERS",
    "LanguageModel",
    "LockedDropout",
    "LookupEmbedding",
    "LookupOutput",
    "LstmEncoder",
    "OutputLayer",
    "TiedOutput",
    "TransformerEncoder",
    "build_model",
    "detach_state",
    "state_to_list",
]
