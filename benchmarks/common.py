"""The harness every benchmark script runs on (``python benchmarks/<name>.py``).

- **Options**: :func:`add_arguments` gives a script ``--quick`` (its smallest mode, which the
  slow tests run), ``--rounds`` and ``--json-out``.
- **Rounds and interleaving**: each side of a comparison is a callable that returns one
  measurement (seconds, or units per second); :func:`interleaved` calls every side once per
  round in alternating order so that drift of the machine hits all sides alike.
- **Medians with min–max**: :func:`median`, :func:`spread` and :func:`summary` summarise each
  side's rounds.
- **Load average**: read when this module is imported (:data:`LOAD_BEFORE`, before the
  script's work) and again when the record is written; :func:`warn_if_loaded` says when other
  work competes for the cores.
- **JSON record**: a script ends with :func:`emit`, whose last stdout line is ``JSON {...}``;
  a dict record gets a ``harness`` entry (load average before and after, each side's median
  with min–max when the samples are given, threads, versions)::

    sides = {"a": seconds_of(lambda: timed(step_a, 10)), "b": ...}
    samples = interleaved(sides, rounds=args.rounds, warmup=1)
    emit({"ms": {name: median(v) * 1e3 for name, v in samples.items()}}, args.json_out,
         samples=samples)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

K = TypeVar("K", bound=Hashable)
Order = Literal["abba", "rotate"]

LOAD_BEFORE = os.getloadavg()[0]  # the 1-minute load average before the script's work


def load_average() -> float:
    """The 1-minute load average now."""
    return os.getloadavg()[0]


def warn_if_loaded(threshold: float = 0.5) -> None:
    """Say on stderr when the load before the script started was ``threshold`` or more: other
    processes compete for the cores, and timings (and ratios) will be noisy."""
    if threshold <= LOAD_BEFORE:
        print(
            f"warning: load average {LOAD_BEFORE:.1f} before starting: other processes compete "
            "for the cores; timings will be noisy",
            file=sys.stderr,
            flush=True,
        )


def add_arguments(
    parser: argparse.ArgumentParser,
    *,
    quick: str,
    rounds: int | None = None,
    quick_rounds: int | None = None,
) -> None:
    """The harness's options: ``--quick`` (``quick`` says what it runs), ``--json-out`` and,
    when the script measures in rounds, ``--rounds`` (default ``rounds``; with ``--quick``,
    ``quick_rounds``: :func:`resolve_rounds` sets it after parsing)."""
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json-out", type=Path, help="also write the JSON record to this file")
    if rounds is not None:
        shown = f"; --quick: {quick_rounds}" if quick_rounds is not None else ""
        parser.add_argument(
            "--rounds", type=int, default=None, help=f"timed rounds (default {rounds}{shown})"
        )
        parser.set_defaults(default_rounds=(rounds, quick_rounds or rounds))


def resolve_rounds(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``args.rounds`` as given, else the default of :func:`add_arguments` for this mode; at
    least 1 (else a parser error)."""
    if args.rounds is None:
        full, quick = args.default_rounds
        args.rounds = quick if args.quick else full
    if args.rounds < 1:
        parser.error(f"--rounds: at least 1, not {args.rounds}")
    return args.rounds


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


def summary(samples: Mapping[K, Sequence[float]]) -> dict[K, dict[str, float | int]]:
    """Each side's median with its min and max over the rounds, and the number of rounds."""
    return {
        name: {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "rounds": len(values),
        }
        for name, values in samples.items()
    }


def harness_record(samples: Mapping[Any, Sequence[float]] | None = None) -> dict[str, Any]:
    """What the harness adds to a record: load average before and after, each side's median
    with min–max (``samples``: side -> its rounds), threads and versions."""
    record: dict[str, Any] = {
        "load_average": {"before": round(LOAD_BEFORE, 2), "after": round(load_average(), 2)},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if samples is not None:
        record["sides"] = {str(name): value for name, value in summary(samples).items()}
    return record


def emit(
    result: Any,
    json_out: Path | str | None = None,
    *,
    samples: Mapping[Any, Sequence[float]] | None = None,
    compact: bool = False,
    indent: int | None = 2,
    ensure_ascii: bool = True,
) -> None:
    """Print ``JSON {...}`` as the last line (``compact``: no spaces); with ``json_out``, also
    write the object there (``indent``: None for one line). A dict ``result`` gets the
    :func:`harness_record` under ``harness`` (with ``samples``: each side's rounds)."""
    if isinstance(result, dict):
        result = {**result, "harness": harness_record(samples)}
    if json_out:
        path = Path(json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(result, indent=indent, ensure_ascii=ensure_ascii)
        path.write_text(text + "\n", encoding="utf-8")
    separators = (",", ":") if compact else None
    line = json.dumps(result, separators=separators, ensure_ascii=ensure_ascii)
    print("JSON " + line, flush=True)
