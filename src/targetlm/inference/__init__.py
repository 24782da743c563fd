"""Using a trained model: perplexity evaluation and generation.

Later issues add the head ensemble, caches and open-vocabulary interpolation here.
"""

from targetlm.inference.evaluate import evaluate_stream
from targetlm.inference.generate import generate

__all__ = ["evaluate_stream", "generate"]
