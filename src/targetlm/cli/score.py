"""``targetlm score RUN_DIR --file PATH --out JSONL``: per-token log-probabilities."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from targetlm.cli.common import (
    add_evaluation_options,
    check_combiners,
    combiners_from_args,
    eval_overrides,
    score_streams,
)
from targetlm.cli.eval import oov_options, oov_text
from targetlm.cli.outputs import add_force_option, add_quiet_option, check_output, run_inputs
from targetlm.data import (
    read_file,
)
from targetlm.files import atomic_write
from targetlm.inference.scoring import Combiners


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm score``: one JSON record per token of a file, with any combiners."""
    from targetlm.runs import load_run

    out = Path(args.out)
    check_output(out, "--out", [args.file, *run_inputs(args.run_dir)], args.force)
    combiners = combiners_from_args(args) or Combiners()
    config, vocab, model, _ = load_run(args.run_dir, eval_overrides(args))
    check_combiners(args, config, model)
    lines = read_file(args.file, config.data.lowercase)
    tokens = list(vocab.require_tokenizer().tokenize(lines))
    combiners = dataclasses.replace(combiners, ensemble_lambdas=tuple(args.ensemble_lambda))
    main, *streams = score_streams(model, vocab, config, tokens, args.open_vocab, combiners)
    out.parent.mkdir(parents=True, exist_ok=True)
    records = []
    for i, token in enumerate(tokens):
        record = {
            "position": i,
            "token": token,
            "log_prob": float(main.log_probs[i]),
            "new": bool(main.is_new[i]),
        }
        if streams:
            record["ensemble"] = {
                f"{lam:g}": float(s.log_probs[i]) for lam, s in zip(args.ensemble_lambda, streams)
            }
        records.append(json.dumps(record, ensure_ascii=False) + "\n")
    atomic_write(out, "".join(records))  # whole or not at all
    summary = main.summary()
    print(
        f"{out}: {summary['tokens']:,} tokens of {args.file}, ppl {summary['ppl']:.2f}, "
        + oov_text(
            summary["oov_rate"], summary["ppl_known"], args.open_vocab, oov_options(args, config)
        )
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm score`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "score", help="per-token log-probabilities of a text file (JSON lines), with any combiners"
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--file", type=Path, required=True, metavar="PATH", help="the text to score")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="JSONL",
        help="one record per token: position, token, log_prob (natural log), new",
    )
    add_force_option(p)
    add_quiet_option(p)
    add_evaluation_options(
        p, "also each λ's log-probability (record key 'ensemble'), in the same pass"
    )
    p.set_defaults(func=run)
