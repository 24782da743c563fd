"""The ``targetlm`` command line.

    targetlm train CONFIG [--set key=value ...] [--run-dir DIR] [--resume]
    targetlm train --resume --run-dir DIR [--set key=value ...]   (DIR's own config.toml)
    targetlm finetune RUN_DIR --run-dir NEW_DIR [--set key=value ...] [--resume]
    targetlm train-heads RUN_DIR --corpus FILE|SPLIT --steps S --run-dir NEW_DIR [--heads-kind K] [--n N]
                         [--heads-set key=value ...] [--init-heads RUN] [--cache-mb MB] [--json]
    targetlm eval RUN_DIR [--split valid|test | --file PATH] [--set key=value ...] [--ensemble-lambda L,L,...] [--json]
                  [--open-vocab] [--uniform-weight MU] [--new-word-weight OMEGA] [--lowercase]
                  [--unigram-cache LAMBDA] [--neural-cache LAMBDA [--neural-theta T] [--neural-window N]]
    targetlm score RUN_DIR --file PATH --out SCORES.jsonl [--force] [--ensemble-lambda L,...] [scoring options]
    targetlm generate RUN_DIR --prompt TEXT [--prompt ...] [--prompt-file F] [--max-tokens N] [--temperature T]
                      [--top-k K] [--top-p P] [--seed S] [--stop STRING ...] [--speculative] [--json]
    targetlm translate RUN_DIR --input SRC [--reference REF] [--beam 5] [--ensemble-lambda L] [--output FILE [--force]] [--json]
    targetlm export RUN_DIR --output DIR [--force]   (an hf-backbone run as a Hugging Face model directory)
    targetlm describe CONFIG [--set key=value ...] [--json]
    targetlm data info|download NAME
    targetlm lexicon stats --data NAME [--dir DIR] [--drop F --seed S] [--json]
    targetlm analyze subspace --out DIR [--config C] [--set ...] [--betas ...] [--taus ...]
    targetlm analyze word-probs RUN_DIR [RUN_DIR ...] [--words W,W,...] [--split test]
    targetlm analyze tsne RUN_DIR --out PNG [--levels 0,1,2] [--tokens M] [--split test]
    targetlm analyze freq-bins RUN_A RUN_B --out PNG [--split test] [--set ...] [--json] [scoring options]
    targetlm compare [LABEL:]DIR... [--group-by preset|label] [--metric ppl|bleu|chrf|accuracy|macro_f1]
                     [--lambda-on valid | --lambda L] [--decoding NAME] [--baseline GROUP]
                     [--format md|csv|json] [--plot PNG]

Every expected failure (bad config, missing data, unusable checkpoint or run
directory, diverged training) is one line on stderr and a non-zero exit. An output is never
written over an input, and an existing one is replaced only with ``--force``; ``eval``,
``score``, ``generate`` and ``translate`` show a progress bar on a terminal (``--quiet``: none).
"""

from __future__ import annotations

import argparse
import sys

from targetlm.checkpoint import CheckpointError
from targetlm.cli import (
    analyze,
    compare,
    data,
    describe,
    export,
    finetune,
    generate,
    lexicon,
    score,
    train,
    train_heads,
    translate,
)
from targetlm.cli import eval as eval_command
from targetlm.cli.common import ArgumentParser
from targetlm.data import DataError
from targetlm.inference.progress import showing_progress, wanted
from targetlm.registry import ConfigError
from targetlm.rundir import RunDirError
from targetlm.training.guards import TrainingDiverged

EXPECTED_ERRORS = (ConfigError, DataError, CheckpointError, RunDirError, TrainingDiverged)
COMMANDS = (
    train,
    finetune,
    train_heads,
    eval_command,
    score,
    generate,
    translate,
    export,
    describe,
    analyze,
    compare,
    lexicon,
    data,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``targetlm`` parser: one subcommand per module of this package."""
    parser = ArgumentParser(prog="targetlm", description=__doc__.split("\n\n")[0])
    parser.set_defaults(quiet=True)  # no progress bar but where a command offers --quiet
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``targetlm`` on ``argv`` (default ``sys.argv[1:]``); returns the exit status
    (2: an expected error, printed as one line on stderr; 3: training diverged; 130: stopped
    by Ctrl-C, one line without a traceback)."""
    try:
        args = build_parser().parse_args(argv)
        with showing_progress(wanted(args.quiet)):
            return args.func(args)
    except EXPECTED_ERRORS as error:
        print(f"targetlm: error: {error}", file=sys.stderr)
        return 3 if isinstance(error, TrainingDiverged) else 2
    except OSError as error:
        print(f"targetlm: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        print(f"targetlm: {interrupt or 'interrupted'}", file=sys.stderr)
        return 130
