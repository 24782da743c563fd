"""Objective registry and the loss record every objective returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from targetlm.registry import Registry

# builders may hand objectives the built input embedding (Inan et al.'s analysis builds ỹ from it)
OBJECTIVES: Registry[nn.Module] = Registry("objective", context=("embedding",))


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar to back-propagate (mean over scored positions)
    nll_sum: torch.Tensor  # summed next-word negative log-likelihood, detached (perplexity)
    count: int  # scored positions
