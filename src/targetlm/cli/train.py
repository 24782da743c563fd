"""``targetlm train CONFIG``: train a model from a TOML config; ``targetlm train --resume
--run-dir R``: continue R from its own ``config.toml``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from targetlm import builders
from targetlm import config as config_lib
from targetlm.cli.common import add_set_option
from targetlm.registry import ConfigError
from targetlm.rundir import RunDirError, read_results
from targetlm.runs import CONFIG, RESULTS


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm train``; returns the exit status."""
    if args.config is None:  # the run's own config (--set may change its budget)
        if not (args.resume and args.run_dir):
            raise ConfigError(
                "give a config file (targetlm train CONFIG), or --resume --run-dir R to "
                "continue the run R"
            )
        if not (args.run_dir / CONFIG).is_file():
            raise RunDirError(f"nothing to resume: {args.run_dir / CONFIG} does not exist")
        args.config = args.run_dir / CONFIG
    if args.resume and args.run_dir and (args.run_dir / RESULTS).is_file():
        read_results(args.run_dir / RESULTS)  # a finished run returns them: refuse a bad one
    config = builders.load_config(args.config, args.set)
    run_dir = (
        args.run_dir or Path("runs") / f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    return train_and_report(config, run_dir, args.resume)


def train_and_report(config: config_lib.Config, run_dir: Path, resume: bool) -> int:
    """Train ``config`` in ``run_dir`` and print its test figures (the task's summary: the
    perplexity, BLEU for translation, accuracy for a classifier); the exit status (130 if
    interrupted, with a resumable checkpoint left). Under ``torchrun`` with several
    processes, each is one rank of a data-parallel run (:mod:`targetlm.training.distributed`)
    and rank 0 prints."""
    from targetlm.training import Trainer

    trainer = Trainer(config, run_dir, resume=resume, log=lambda m: print(m, flush=True))
    results = trainer.train()
    code = 130 if results.get("interrupted") else 0
    if code == 0 and trainer.processes.is_main:
        from targetlm.tasks import build_task

        # the task's figures (a finished run that is resumed returns its results without setup)
        for line in build_task(config).summary(results):
            print(line)
    if trainer.processes.several:  # a torchrun rank, its process group already ended
        # end the process here: freeing DDP's reducer from Python later drops the last reference
        # to torch's gloo process group, whose destructor joins a thread that waits for the GIL
        # the destructor holds (a rank seen hung so, after its run was complete)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm train`` to the subcommands ``sub``."""
    p = sub.add_parser("train", help="train a model from a TOML config")
    p.add_argument(
        "config", nargs="?", help="the TOML config (with --resume: default RUN_DIR/config.toml)"
    )
    add_set_option(p, help="override a config key")
    p.add_argument("--run-dir", type=Path, help="run directory (default: runs/<config>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir exactly")
    p.set_defaults(func=run)
