"""``targetlm finetune RUN_DIR --run-dir NEW_DIR``: continue a trained run on new data."""

from __future__ import annotations

import argparse
from pathlib import Path

from targetlm import builders
from targetlm import config as config_lib
from targetlm.cli.train import train_and_report
from targetlm.training.trainer import RunDirError


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm finetune``; returns the exit status."""
    from targetlm.runs import CONFIG, read_best

    source = str(Path(args.source).resolve())
    if args.resume:  # the finetuning run's own config: its source and vocabulary are recorded
        if not (args.run_dir / CONFIG).is_file():
            raise RunDirError(f"nothing to resume: {args.run_dir / CONFIG} does not exist")
        config = builders.load_config(args.run_dir / CONFIG, args.set)
        if config.train.init_from != source:
            raise RunDirError(
                f"{args.run_dir} was finetuned from {config.train.init_from}, not {source}"
            )
    else:  # the source run's config, changed by --set (typically data.* and train.*)
        from targetlm.training.finetune import reuse_tokenizer

        checkpoint, _, _ = read_best(args.source)
        data = config_lib.apply_overrides(checkpoint["config"], args.set)
        data.setdefault("train", {})["init_from"] = source
        reuse_tokenizer(checkpoint["config"], data, Path(source))
        config = builders.config_from_dict(data)
    return train_and_report(config, args.run_dir, args.resume)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm finetune`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "finetune",
        help="continue a trained run on new data, its vocabulary extended (Pappas et al. 2020)",
    )
    p.add_argument("source", metavar="RUN_DIR", help="the trained run (its best checkpoint)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override the source run's config, e.g. data.name=brown data.train='news[:0.8]'",
    )
    p.add_argument("--run-dir", type=Path, required=True, help="the new run directory")
    p.add_argument("--resume", action="store_true", help="continue the finetuning run exactly")
    p.set_defaults(func=run)
