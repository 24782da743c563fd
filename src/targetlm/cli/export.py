"""``targetlm export RUN_DIR --output DIR [--format hf|speculators|medusa]``.

``hf`` (the default): a run with an ``hf`` backbone as a plain Hugging Face model directory
(``save_pretrained``, with its tokenizer), loadable by ``transformers`` alone; the N-gram
heads are saved beside it in ``heads.safetensors``.

``speculators`` / ``medusa``: the run's drafting heads alone, as a serving engine loads them
beside their verifier (``targetlm.modules.serving``): eagle heads in the ``speculators``
package's Eagle3 format, medusa heads in vLLM's Medusa layout. The verifier named in the
config is ``--verifier`` (a Hugging Face id or a model directory, e.g. this run exported with
``--format hf``), or by default the run's backbone ``path`` when the run's backbone weights
are still those (the body was not fine-tuned).

An existing non-empty ``--output`` is replaced only with ``--force``, and never when it holds
the run, the backbone it was trained from or the verifier; the directory and its files get
the umask's modes. Every check runs before anything is written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from targetlm.cli.outputs import add_force_option, check_output

FORMATS = ("hf", "speculators", "medusa")


def _verifier(args: argparse.Namespace, model, source: Path | None) -> tuple[str, list[str]]:
    """The verifier's name for the drafter's config, and its architectures."""
    from targetlm.modules.serving import same_weights
    from targetlm.registry import ConfigError

    pretrained = model.encoder.pretrained[0]
    architectures = list(getattr(pretrained.config, "architectures", None) or [])
    architectures = architectures or [type(pretrained).__name__]
    if args.verifier is None:
        if source is None:
            raise ConfigError(
                f"export --format {args.format}: the run's backbone was built from a config, "
                "not a model directory: export it with --format hf and name that directory "
                "with --verifier"
            )
        if not same_weights(model, source):
            raise ConfigError(
                f"export --format {args.format}: the run's backbone weights differ from "
                f"{source} (the body was fine-tuned): export the run with --format hf and name "
                "that directory with --verifier"
            )
        return str(source.resolve()), architectures
    local = Path(args.verifier)
    if not local.exists():  # a Hugging Face id: the engine fetches it
        return args.verifier, architectures
    config_file = local / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            f"--verifier {args.verifier}: no config.json there (not a model directory)"
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"--verifier {args.verifier}: unreadable config.json ({error})") from None
    theirs = (config.get("hidden_size"), config.get("vocab_size"))
    ours = (pretrained.config.hidden_size, pretrained.get_input_embeddings().num_embeddings)
    if theirs != ours:
        raise ConfigError(
            f"--verifier {args.verifier}: hidden size and vocabulary {theirs} are not the "
            f"run's backbone's {ours}"
        )
    if not same_weights(model, local):
        raise ConfigError(
            f"--verifier {args.verifier}: its weights are not the run's backbone's (the heads "
            "draft for the body they were trained on)"
        )
    return str(local.resolve()), list(config.get("architectures") or architectures)


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm export``; returns the exit status."""
    from targetlm.pretrained import resolve
    from targetlm.registry import ConfigError
    from targetlm.runs import load_run

    if args.format not in FORMATS:  # argparse's choices say it too; kept for callers of run()
        raise ConfigError(f"export: unknown --format {args.format!r} (known: {', '.join(FORMATS)})")
    if args.verifier is not None and args.format == "hf":
        raise ConfigError(
            "export: --verifier names the verifier of drafting heads (--format speculators or medusa)"
        )
    check_output(args.output, "--output", [args.run_dir], args.force, directory=True)
    config, _, model, _ = load_run(args.run_dir)
    if config.model.backbone.kind != "hf":
        raise ConfigError(f"{args.run_dir}: export needs a run with model.backbone.kind = 'hf'")
    path = config.model.backbone.options.get("path")
    source = resolve(path) if path else None
    inputs = [args.run_dir, source]
    if args.verifier is not None and Path(args.verifier).exists():
        inputs.append(Path(args.verifier))
    check_output(args.output, "--output", inputs, args.force, directory=True)
    model = model.cpu()
    if args.format == "hf":
        from targetlm.modules.hf import export

        export(model, source or Path(args.run_dir), args.output, replace=args.force)
        print(f"exported {args.run_dir} to {args.output}")
        return 0
    from targetlm.modules.serving import draft_checkpoint, export_drafter

    draft_checkpoint(model, args.format, "", [])  # the heads' checks, before the verifier's
    verifier, architectures = _verifier(args, model, source)
    written = export_drafter(
        model, args.format, verifier, architectures, args.output, replace=args.force
    )
    steps = (
        written.get("num_heads")
        or written["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    )
    print(
        f"exported the heads of {args.run_dir} to {args.output} ({args.format}: {steps} drafted "
        f"tokens a step; verifier {verifier})"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm export`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "export",
        help="write an hf-backbone run as a Hugging Face model directory, or its drafting heads "
        "for a serving engine",
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--output", type=Path, required=True)
    p.add_argument(
        "--format",
        default="hf",
        choices=FORMATS,
        help="hf: the model as a Hugging Face directory (default); speculators: eagle heads in "
        "the speculators package's Eagle3 format (vLLM); medusa: medusa heads in vLLM's Medusa "
        "layout",
    )
    p.add_argument(
        "--verifier",
        default=None,
        help="speculators/medusa: the verifier's Hugging Face id or model directory, written "
        "into the config (default: the run's backbone path, when its weights are unchanged)",
    )
    add_force_option(p)
    p.set_defaults(func=run)
