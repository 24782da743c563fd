"""Using a trained model: one evaluation loop with composable combiners, and generation.

``evaluate`` holds the loop (:func:`evaluate_ids`), ``combiners`` the registered combiners
(head ensemble before the logit layer; uniform mixture, new-word weight, unigram and neural
caches after it), ``scoring`` per-token scoring with open vocabulary, ``ensemble`` the head
ensemble's estimates.
"""

from targetlm.inference.combiners import COMBINERS, CombinerError, Combiners, HeadEstimates
from targetlm.inference.ensemble import evaluate_ensemble, head_top1
from targetlm.inference.evaluate import evaluate_ids, evaluate_stream
from targetlm.inference.generate import generate

__all__ = [
    "COMBINERS",
    "CombinerError",
    "Combiners",
    "HeadEstimates",
    "evaluate_ensemble",
    "evaluate_ids",
    "evaluate_stream",
    "generate",
    "head_top1",
]
