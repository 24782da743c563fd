"""``targetlm lexicon stats --data NAME``: WordNet coverage of a dataset's vocabulary."""

from __future__ import annotations

import argparse
import json

from targetlm import config as config_lib
from targetlm.cli.common import number_in
from targetlm.data import (
    DATASETS,
    Vocabulary,
    read_split,
)
from targetlm.registry import Range


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm lexicon``; returns the exit status."""
    from targetlm.lexicon import load_lexicon

    config = config_lib.DataConfig(name=args.data, dir=args.dir)
    vocab = Vocabulary.build(read_split(config, config.train))
    lexicon = load_lexicon(vocab.itos)
    if args.drop:
        lexicon = lexicon.without(args.drop, args.seed)
    stats = {"data": args.data, **lexicon.coverage(vocab.itos)}
    if args.json:
        print(json.dumps(stats))
    else:
        print(
            f"{args.data}: {stats['words']:,} words; WordNet relations {stats['relations']:.1%}, "
            f"definitions {stats['definitions']:.1%}"
        )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm lexicon`` to the subcommands ``sub``."""
    p = sub.add_parser("lexicon", help="WordNet lexicon (GroC) of a dataset's vocabulary")
    p.add_argument("action", choices=["stats"])
    p.add_argument("--data", required=True, choices=sorted(DATASETS), help="dataset name")
    p.add_argument("--dir", help="dataset directory")
    p.add_argument(
        "--drop",
        type=number_in(Range(0, 1)),
        default=0.0,
        help="remove this fraction of entries, in [0, 1]",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --drop")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)
