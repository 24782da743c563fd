"""``targetlm describe CONFIG``: parameters per part of a configured model."""

from __future__ import annotations

import argparse
import json

from targetlm import builders
from targetlm import config as config_lib
from targetlm.cli.common import add_set_option
from targetlm.tasks import build_task


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm describe``; returns the exit status."""
    from targetlm.lexicon import Lexicon

    config = builders.load_config(args.config, args.set)
    vocab = build_task(config).vocabulary(config)
    # parameters never depend on the lexicon's contents, so counting needs no WordNet
    model = builders.build_model(config.model, vocab.itos, lexicon=Lexicon())
    params = model.parameter_counts()
    total = sum(params.values())
    if args.json:
        print(json.dumps({"total_params": total, "params": params, "vocab_size": len(vocab)}))
        return 0
    print(f"vocabulary: {len(vocab):,} {_entries(config)} ({config.data.name})")
    m = config.model
    # a pretrained backbone supplies the embedding, encoder and output layer: its kind names them
    pipeline = (
        (m.embedding, m.encoder, m.output) if m.backbone.kind == "none" else (m.backbone,) * 3
    )
    parts = dict(zip(("input_embedding", "encoder", "output"), pipeline, strict=True))
    parts |= {"heads": m.heads, "source_embedding": m.source_embedding}
    for name, count in params.items():
        kind = f" ({parts[name].kind})" if name in parts else ""
        print(f"{name + kind:<32}{count:>14,}")
    print(f"{'total':<32}{total:>14,}")
    return 0


def _entries(config: config_lib.Config) -> str:
    return "words" if config.data.tokenizer == "whitespace" else f"{config.data.tokenizer} symbols"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm describe`` to the subcommands ``sub``."""
    p = sub.add_parser("describe", help="parameters per part of a configured model")
    p.add_argument("config")
    add_set_option(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)
