"""Helpers shared by the benchmark scripts (run as ``python benchmarks/<name>.py``).

The timing harness: each side of a comparison is a callable that returns one measurement
(seconds, or units per second); :func:`interleaved` calls every side once per round in
alternating order so that drift of the machine hits all sides alike, and :func:`median` /
:func:`spread` summarise each side's rounds. A script ends with :func:`emit`, whose last
stdout line is ``JSON {...}``::

    sides = {"a": seconds_of(lambda: timed(step_a, 10)), "b": ...}
    samples = interleaved(sides, rounds=5, warmup=1)
    emit({"ms": {name: median(v) * 1e3 for name, v in samples.items()}}, args.json_out)
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

K = TypeVar("K", bound=Hashable)
Order = Literal["abba", "rotate"]


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


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued CUDA work on ``device`` (nothing for CPU or ``None``)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(
    step: Callable[[], object], steps: int, device: torch.device | str | None = None
) -> float:
    """Mean seconds per call of ``step`` over ``steps`` calls (synchronised on CUDA)."""
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - started) / steps


def seconds_of(
    work: Callable[[], object], device: torch.device | str | None = None
) -> Callable[[], float]:
    """A side for :func:`interleaved`: runs ``work`` and returns its wall seconds."""
    return lambda: timed(work, 1, device)


def rate(
    work: Callable[[], float], device: torch.device | str | None = None
) -> Callable[[], float]:
    """A side for :func:`interleaved`: runs ``work`` (which returns units done) and returns
    units per second."""

    def run() -> float:
        synchronize(device)
        started = time.perf_counter()
        units = work()
        synchronize(device)
        return units / (time.perf_counter() - started)

    return run


def round_order(names: Sequence[K], index: int, order: Order = "abba") -> list[K]:
    """The sides' order in round ``index``: ``abba`` reverses every other round (AB BA …),
    ``rotate`` starts each round one side later (ABC BCA CAB …)."""
    if order == "abba":
        return list(names) if index % 2 == 0 else list(reversed(names))
    shift = index % len(names)
    return list(names[shift:]) + list(names[:shift])


def interleaved(
    sides: Mapping[K, Callable[[], float]],
    rounds: int,
    *,
    warmup: int = 0,
    order: Order = "abba",
    after_round: Callable[[int], None] | None = None,
) -> dict[K, list[float]]:
    """Each side's measurements, one per round, the sides called in :func:`round_order`.

    ``warmup``: untimed calls of every side before the first round (first-call allocation,
    kernel selection, caches). ``after_round(index)`` runs after each round (progress logs).
    """
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            sides[name]()
    samples: dict[K, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in round_order(names, index, order):
            samples[name].append(sides[name]())
        if after_round is not None:
            after_round(index)
    return samples


def median(values: Sequence[float]) -> float:
    """The median of one side's rounds."""
    return statistics.median(values)


def spread(values: Sequence[float]) -> float:
    """(max − min) / median of one side's rounds: how far they scatter."""
    return (max(values) - min(values)) / statistics.median(values)


def medians(samples: Mapping[K, Sequence[float]]) -> dict[K, float]:
    """Each side's median."""
    return {name: statistics.median(values) for name, values in samples.items()}


def emit(
    result: Any,
    json_out: Path | str | None = None,
    *,
    compact: bool = False,
    indent: int | None = 2,
    ensure_ascii: bool = True,
) -> None:
    """Print ``JSON {...}`` as the last line (``compact``: no spaces); with ``json_out``, also
    write the object there (``indent``: None for one line)."""
    if json_out:
        path = Path(json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(result, indent=indent, ensure_ascii=ensure_ascii)
        path.write_text(text + "\n", encoding="utf-8")
    separators = (",", ":") if compact else None
    line = json.dumps(result, separators=separators, ensure_ascii=ensure_ascii)
    print("JSON " + line, flush=True)
