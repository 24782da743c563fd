"""``targetlm generate RUN_DIR --prompt TEXT``: sample text from a trained run."""

from __future__ import annotations

import argparse
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm generate``; returns the exit status."""
    from targetlm.inference import generate
    from targetlm.runs import load_run

    config, vocab, model, _ = load_run(args.run_dir)
    tokenizer = vocab.tokenizer
    # the prompt's tokens, without the <eos> that would end its last line
    prompt = list(tokenizer.tokenize(args.prompt.split("\n")))[:-1]
    tokens = generate(
        model,
        vocab,
        prompt,
        args.max_tokens,
        args.temperature,
        args.top_k,
        args.seed,
        config.train.device,
    )
    print(tokenizer.decode(prompt + tokens).rstrip("\n"))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm generate`` to the subcommands ``sub``."""
    p = sub.add_parser("generate", help="sample text from a trained run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=30)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int)
    p.set_defaults(func=run)
