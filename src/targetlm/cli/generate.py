"""``targetlm generate RUN_DIR --prompt TEXT``: continue prompts with a trained run.

Several ``--prompt`` (or ``--prompt-file``, one prompt a line) are continued in one batch;
greedy (``--temperature 0``) or sampled (``--top-k``, ``--top-p``, ``--seed``), each row ending
at ``--max-tokens`` or a ``--stop`` string; ``--speculative [heads|lookup|both]`` is greedy
decoding drafted by the run's heads, prompt lookup or both (the same text, fewer forwards),
``--draft-tokens`` tokens a step. Prints each prompt with its continuation,
or with ``--json`` one list of ``{prompt, text, tokens, tokens_per_s, stopped}`` objects (the
continuation only in ``text``; ``tokens`` generated, over the batch's wall time in
``tokens_per_s``; with ``--speculative`` also ``acceptance``, the batch's mean number of
drafted tokens kept per verification step).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from targetlm.cli.common import SEED, SIZE, number_in
from targetlm.cli.outputs import add_quiet_option
from targetlm.data import DataError
from targetlm.data.vocab import normalize_separators, read_text_lines
from targetlm.registry import MAX_VOCAB, Range


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The ``--prompt`` values, then the non-empty lines of ``--prompt-file`` (read like every
    text file: :func:`targetlm.data.vocab.read_text`); no prompt at all is an error."""
    prompts = [normalize_separators(prompt) for prompt in args.prompt or []]
    if args.prompt_file is not None:
        lines = read_text_lines(args.prompt_file, kind="prompt file")
        given = [line for line in lines if line.strip()]
        if not given:
            raise DataError(f"{args.prompt_file} has no prompt (only blank lines)")
        prompts += given
    if not prompts:
        raise DataError("no prompt: give --prompt TEXT or --prompt-file FILE")
    return prompts


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm generate``; returns the exit status."""
    from targetlm.inference.generate import generate_batch
    from targetlm.runs import load_run

    texts = read_prompts(args)
    config, vocab, model, _ = load_run(args.run_dir)
    tokenizer = vocab.require_tokenizer()
    # each prompt's tokens, without the <eos> that would end its last line
    prompts = [list(tokenizer.tokenize(text.split("\n")))[:-1] for text in texts]
    result = generate_batch(
        model,
        vocab,
        prompts,
        max_tokens=args.max_tokens,
        # --speculative is greedy decoding: it implies --temperature 0 unless one is given
        temperature=(0.0 if args.speculative else 1.0)
        if args.temperature is None
        else args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
        speculative=args.speculative,
        device=config.train.device,
        draft_tokens=args.draft_tokens,
    )
    if args.json:
        records = [
            {
                "prompt": text,
                "text": row.text,
                "tokens": len(row.tokens),
                "tokens_per_s": len(row.tokens) / result.seconds,
                "stopped": row.stopped,
            }
            | ({"acceptance": result.acceptance} if args.speculative else {})
            for text, row in zip(texts, result.rows)
        ]
        print(json.dumps(records))
        return 0
    for prompt, row in zip(prompts, result.rows):
        print((tokenizer.decode(prompt) + row.text).rstrip("\n"))
    if args.speculative and result.acceptance is not None:
        print(
            f"speculative: {result.acceptance:.2f} drafted tokens accepted per verification "
            f"step ({result.verifications} steps)",
            file=sys.stderr,
        )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm generate`` to the subcommands ``sub``."""
    p = sub.add_parser("generate", help="continue prompts with a trained run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--prompt", action="append", help="a prompt (repeatable: one batch)")
    p.add_argument("--prompt-file", type=Path, help="a UTF-8 file of prompts, one per line")
    p.add_argument("--max-tokens", type=SIZE, default=30, help="tokens per prompt at most")
    p.add_argument(
        "--temperature",
        type=number_in(Range(0)),
        help="0: greedy (default 1, and 0 with --speculative)",
    )
    p.add_argument(
        "--top-k",
        type=number_in(Range(0, MAX_VOCAB), integer=True),
        default=0,
        help="sample among the k most likely (0: all)",
    )
    p.add_argument(
        "--top-p",
        type=number_in(Range(0, 1, low_open=True)),
        default=1.0,
        help="nucleus sampling mass, in (0, 1]",
    )
    p.add_argument("--seed", type=SEED, help="the same seed gives the same text")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        help="a string that ends a prompt's continuation (cut off; repeatable)",
    )
    p.add_argument(
        "--speculative",
        nargs="?",
        const="heads",
        metavar="{heads,lookup,both}",
        help="greedy speculative decoding (--temperature 0), drafted by the run's heads "
        "(heads, the default), prompt lookup (lookup: the tokens that followed the last "
        "n-gram's latest earlier occurrence) or both (lookup where it matches, else the heads "
        "while they pay)",
    )
    p.add_argument(
        "--draft-tokens",
        type=SIZE,
        help="tokens drafted per step with --speculative (default: the heads' N - 1, 10 for "
        "lookup; the heads draft at most N - 1)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON list, one object a prompt")
    add_quiet_option(p)
    p.set_defaults(func=run)
