"""``targetlm data info|download NAME``: dataset information and download."""

from __future__ import annotations

import argparse
from pathlib import Path

from targetlm import config as config_lib
from targetlm.data import (
    DATASETS,
    DataError,
    Vocabulary,
    read_split,
)
from targetlm.data.catalogue import get_spec


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm data``; returns the exit status."""
    from targetlm.data import download

    spec = get_spec(args.name)
    if args.action == "download":
        path = download(args.name, Path(args.dir) if args.dir else None)
        print(f"{args.name}: downloaded and verified into {path}")
        return 0
    base = config_lib.DataConfig(name=args.name, dir=args.dir)
    print(f"{spec.name}: {spec.description}")
    if spec.availability:
        print(f"availability: {spec.availability}")
    if spec.describe is not None:
        print("\n".join(spec.describe(args.dir)))
        return 0
    if spec.languages:
        return _parallel_info(base, spec)
    if args.name == "text":  # your own files: the three it reads, named before any is read
        directory = Path(args.dir or ".")
        missing = [
            s for s in spec.splits if not any((directory / n).is_file() for n in (s, f"{s}.txt"))
        ]
        if missing:
            raise DataError(
                f"data info text reads the files {', '.join(spec.splits)} (or NAME.txt) of "
                f"--dir {directory}; it has no {', '.join(missing)} (a training run names its "
                "own files with data.train / data.valid / data.test)"
            )
    splits = {s: read_split(base, s) for s in spec.splits}
    vocab = Vocabulary.build(splits["train"]) if "train" in splits else None
    if vocab is not None:
        print(f"vocabulary (train): {len(vocab):,}")
    header = f"{'split':<18}{'tokens':>12}{'types':>10}"
    print(header + (f"{'OOV rate':>10}{'unigram ppl':>13}" if vocab else ""))
    for split, tokens in splits.items():
        line = f"{split:<18}{len(tokens):>12,}{len(set(tokens)):>10,}"
        if vocab is not None:
            line += f"{vocab.oov_rate(tokens):>10.2%}{vocab.unigram_perplexity(tokens):>13.1f}"
        print(line)
    return 0


def _parallel_info(base: config_lib.DataConfig, spec) -> int:
    """Sentence pairs, words and word types per split and language of a parallel corpus."""
    from targetlm.data.parallel import read_file_lines, split_file

    print(f"{'split':<18}{'language':>9}{'sentences':>11}{'words':>10}{'types':>9}")
    for split in spec.splits:
        for language in spec.languages:
            lines = read_file_lines(split_file(base, split, language))
            words = [w for line in lines for w in line.split()]
            print(
                f"{split:<18}{language:>9}{len(lines):>11,}{len(words):>10,}{len(set(words)):>9,}"
            )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm data`` to the subcommands ``sub``."""
    p = sub.add_parser("data", help="dataset information and download")
    p.add_argument("action", choices=["info", "download"])
    p.add_argument("name", choices=sorted(DATASETS))
    p.add_argument("--dir", help="dataset directory (info) or download target")
    p.set_defaults(func=run)
