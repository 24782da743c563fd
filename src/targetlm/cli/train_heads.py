"""``targetlm train-heads RUN --corpus FILE_OR_SPLIT --steps S --run-dir NEW``: drafting heads
trained by self-distillation on the run's frozen body (``targetlm.training.heads``), written
with the body into a new run directory (whole or not at all), with per-head top-1 agreement
with the body on held-out text before and after."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from targetlm.cli.common import add_set_option
from targetlm.registry import MAX_SEED, MAX_SIZE, ConfigError

# the largest AdamW rate and body-state cache (MiB) train-heads takes: far beyond any useful one
MAX_LR = 10.0
MAX_CACHE_MB = 2**30
MAX_MINUTES = 10**6  # of training: about two years
HEADS_RESULTS = "heads.json"  # training/heads.HEADS_RESULTS


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm train-heads``; returns the exit status."""
    from targetlm.training.heads import HeadsRecipe, train_heads

    _check_numbers(args)
    # each field of the recipe is the flag of its name; the heads' options are --heads-set's
    given = vars(args) | {"heads_options": _heads_options(args.heads_set)}
    recipe = HeadsRecipe(**{f.name: given[f.name] for f in dataclasses.fields(HeadsRecipe)})
    result = train_heads(recipe, lambda line: print(line, flush=True))
    if args.json:
        print(json.dumps(result))
    return 0


def _check_numbers(args: argparse.Namespace) -> None:
    """Each numeric flag in a range the training can run (before anything is read)."""
    limits = {"steps": MAX_SIZE, "segment": MAX_SIZE, "batch_size": MAX_SIZE}
    limits |= {"log_every": MAX_SIZE, "cache_mb": MAX_CACHE_MB}
    for name, most in limits.items():
        value = getattr(args, name)
        if not 1 <= value <= most:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1 and <= {most}, got {value}")
    if not 0 <= args.seed <= MAX_SEED:
        raise ConfigError(f"--seed must be >= 0 and <= {MAX_SEED}, got {args.seed}")
    if not 0 < args.held_out < 1:
        raise ConfigError(f"--held-out must be in (0, 1), got {args.held_out}")
    if args.max_minutes is not None and not 0 < args.max_minutes <= MAX_MINUTES:
        raise ConfigError(
            f"--max-minutes must be a finite number > 0 and <= {MAX_MINUTES}, got {args.max_minutes}"
        )
    if not 0 < args.lr <= MAX_LR:
        raise ConfigError(f"--lr must be a finite number > 0 and <= {MAX_LR:g}, got {args.lr}")


def _heads_options(pairs: list[str]) -> dict:
    """``--heads-set KEY=VALUE`` pairs as the heads' options (values read as in a config)."""
    from targetlm import config as config_lib

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--heads-set {pair!r}: expected KEY=VALUE")
        options[key.strip()] = config_lib.parse_value(value.strip())
    return options


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm train-heads`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "train-heads",
        help="train drafting heads by self-distillation on a run's frozen body (Medusa-1)",
    )
    p.add_argument(
        "source",
        metavar="RUN_DIR",
        help="the trained run (its best checkpoint), or a config file: its model as built "
        "(a pretrained backbone as published)",
    )
    p.add_argument(
        "--corpus", required=True, help="a text file, or a split of the run's data (train, ...)"
    )
    p.add_argument("--steps", type=int, required=True, help="optimiser steps of the heads")
    p.add_argument("--run-dir", type=Path, required=True, help="the new run directory")
    p.add_argument("--heads-kind", help="train new heads of this kind (default: the run's)")
    p.add_argument("--n", type=int, help="N of the new heads (the main head counts)")
    add_set_option(p, "an option of the heads, e.g. num_layers=2 or window=8", "--heads-set")
    p.add_argument("--init-heads", type=Path, help="start from the heads of this run")
    p.add_argument("--segment", type=int, default=64, help="tokens per cached segment")
    p.add_argument("--batch-size", type=int, default=8, help="segments per step")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument(
        "--held-out",
        type=float,
        default=0.1,
        help="fraction of the segments read (the cached ones and these) kept apart for agreement",
    )
    p.add_argument(
        "--cache-mb",
        type=int,
        default=1024,
        help="bound of the in-memory cache of body states (the corpus is cut to fit)",
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        help="stop training once this long has passed since the body pass began (a budget)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--json", action="store_true", help="also print the result as JSON")
    p.set_defaults(func=run)
