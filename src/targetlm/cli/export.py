"""``targetlm export RUN_DIR --output DIR``: a run with an ``hf`` backbone as a plain Hugging
Face model directory (``save_pretrained``, with its tokenizer), loadable by ``transformers``
alone; the N-gram heads are saved beside it in ``heads.safetensors``. An existing non-empty
``--output`` is replaced only with ``--force``, and never when it holds the run or the backbone
it was trained from; the directory and its files get the umask's modes."""

from __future__ import annotations

import argparse
from pathlib import Path

from targetlm.cli.outputs import add_force_option, check_output


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm export``; returns the exit status."""
    from targetlm.modules.hf import export
    from targetlm.pretrained import resolve
    from targetlm.registry import ConfigError
    from targetlm.runs import load_run

    check_output(args.output, "--output", [args.run_dir], args.force, directory=True)
    config, _, model, _ = load_run(args.run_dir)
    if config.model.backbone.kind != "hf":
        raise ConfigError(f"{args.run_dir}: export needs a run with model.backbone.kind = 'hf'")
    path = config.model.backbone.options.get("path")
    source = resolve(path) if path else Path(args.run_dir)  # the model's tokenizer files
    check_output(args.output, "--output", [args.run_dir, source], args.force, directory=True)
    export(model.cpu(), source, args.output, replace=args.force)
    print(f"exported {args.run_dir} to {args.output}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm export`` to the subcommands ``sub``."""
    p = sub.add_parser("export", help="write an hf-backbone run as a Hugging Face model directory")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--output", type=Path, required=True)
    add_force_option(p)
    p.set_defaults(func=run)
