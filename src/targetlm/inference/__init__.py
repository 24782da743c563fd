"""Using a trained model: perplexity evaluation and generation.

The head ensemble (Heo et al.) is in ``ensemble``; later issues add caches and
open-vocabulary interpolation here.
"""

from targetlm.inference.ensemble import HeadEstimates, evaluate_ensemble
from targetlm.inference.evaluate import evaluate_stream
from targetlm.inference.generate import generate

__all__ = ["HeadEstimates", "evaluate_ensemble", "evaluate_stream", "generate"]
