"""Helpers shared by the benchmark scripts (run as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def zipf_ids(vocab_size: int, shape: tuple[int, ...], seed: int = 1) -> torch.Tensor:
    """Token ids with p ∝ 1/rank, like running text over a frequency-ranked vocabulary.

    Costs that depend on how many distinct words a batch has (AL's ỹ, GroC's strings) would
    be overstated by uniform ids.
    """
    generator = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
    count = 1
    for size in shape:
        count *= size
    return torch.multinomial(weights, count, True, generator=generator).view(shape)


def timed(step: Callable[[], None], steps: int) -> float:
    """Mean seconds per call of ``step`` over ``steps`` calls."""
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps
