"""``targetlm translate RUN_DIR --input SRC``: translate a file with a trained translation run.

With ``--reference REF`` it prints SacreBLEU's BLEU and chrF (with their signatures) of the
detokenized output against the raw reference. ``--output FILE`` writes one translation per
line, and only once every line is translated (nothing is written on an error).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from targetlm.cli.common import SIZE, add_set_option, combiner_range, declared_range, number_in
from targetlm.cli.outputs import add_force_option, add_quiet_option, check_output, run_inputs
from targetlm.config import RANGES
from targetlm.data.parallel import (
    check_aligned,
    check_nonempty,
    encode_lines,
    read_file_lines,
)
from targetlm.data.vocab import DataError
from targetlm.files import atomic_write
from targetlm.registry import MAX_SIZE, ConfigError, Range
from targetlm.tasks import TASKS, SentencePairTask, build_task


def read_sources(path: Path, lowercase: bool) -> list[str]:
    lines = read_file_lines(path, lowercase)
    if not lines:
        raise DataError(f"{path} is empty: nothing to translate")
    check_nonempty(path, lines)
    return lines


def translate_file(
    run_dir: Path,
    source_path: Path,
    *,
    ensemble_lambda: float = 0.0,
    beam: dict[str, Any] | None = None,
    diffusion: dict[str, Any] | None = None,
    reference_path: Path | None = None,
    overrides: Sequence[str] = (),
) -> tuple[list[str], dict[str, Any]]:
    """The translations of ``source_path``'s lines and a summary (BLEU, chrF and their
    signatures with a reference; sentences, seconds, sentences/s), decoded by the run's task
    (:class:`~targetlm.tasks.SentencePairTask`). ``beam``: beam search's options given on the
    command line, ``diffusion``: diffusion decoding's (steps, length_beam, samples, seed,
    sampler, oracle_length); None values are not given (the run's defaults). The task refuses
    the options of a decoder it does not use."""
    from targetlm.inference.translate import score_translations
    from targetlm.runs import load_run

    config, vocab, model, _ = load_run(run_dir, list(overrides), streams=False)
    task = build_task(config)
    assert isinstance(task, SentencePairTask)  # (load_run refused a stream run)
    diffusion = dict(diffusion or {})
    oracle_length = bool(diffusion.get("oracle_length"))
    options = task.decoding_options(ensemble_lambda, dict(beam or {}), diffusion)
    if oracle_length and reference_path is None:
        raise ConfigError("--oracle-length decodes at the reference's lengths: give --reference")
    options.check(model)
    lines = read_sources(source_path, config.data.lowercase)
    references = None
    if reference_path is not None:
        references = read_file_lines(reference_path)
        check_aligned(source_path, lines, reference_path, references)
    tokenizer = vocab.require_tokenizer()
    sources = encode_lines(tokenizer, vocab, lines)
    context = model.encoder.max_context  # None: an unbounded encoder takes any length
    for number, ids in enumerate(sources, 1):
        if context is not None and len(ids) > context:
            raise DataError(
                f"{source_path}, line {number}: {len(ids)} source tokens exceed the model's "
                f"max_context {context}"
            )
    target_lengths = None
    if oracle_length:  # each reference's length in target tokens, <eos> included
        assert references is not None  # --oracle-length without --reference was refused above
        targets = encode_lines(tokenizer, vocab, references)
        target_lengths = [len(ids) for ids in targets]
    hypotheses, seconds = task.translate_texts(
        model,
        vocab,
        sources,
        options,
        batch_size=config.eval.batch_size,
        device=config.train.device,
        target_lengths=target_lengths,
    )
    summary: dict[str, Any] = {
        "sentences": len(hypotheses),
        "seconds": seconds,
        "sentences_per_s": len(hypotheses) / max(seconds, 1e-9),
        "beam": options.beam,
        "ensemble_lambda": options.ensemble_lambda,
        "length_penalty": options.length_penalty,
        "input": str(source_path),
    }
    summary.update(task.decoding_summary(options), oracle_length=oracle_length)
    if references is not None:
        summary.update(score_translations(hypotheses, references))
        summary["reference"] = str(reference_path)
    return hypotheses, summary


def write_lines_atomic(path: Path, lines: list[str]) -> None:
    """Write ``lines`` to ``path`` whole or not at all (:func:`targetlm.files.atomic_write`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, "".join(line + "\n" for line in lines))


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm translate``; returns the exit status."""
    if args.output is not None:
        inputs = [args.input, args.reference, *run_inputs(args.run_dir)]
        check_output(args.output, "--output", inputs, args.force)
    hypotheses, summary = translate_file(
        args.run_dir,
        args.input,
        ensemble_lambda=args.ensemble_lambda,
        beam={  # None: not given (the decoder's default)
            "beam": args.beam,
            "length_penalty": args.length_penalty,
            "max_len_a": args.max_len_a,
            "max_len_b": args.max_len_b,
        },
        reference_path=args.reference,
        overrides=args.set,
        diffusion={
            "steps": args.steps,
            "length_beam": args.length_beam,
            "samples": args.samples,
            "seed": args.seed,
            "sampler": args.sampler,
            "oracle_length": args.oracle_length,
        },
    )
    if args.output is not None:
        write_lines_atomic(args.output, hypotheses)
        summary["output"] = str(args.output)
    if args.json:
        print(json.dumps(summary))
        return 0
    if args.output is None:
        for line in hypotheses:
            print(line)
    if "bleu" in summary:
        print(f"BLEU {summary['bleu']:.2f}  {summary['bleu_signature']}")
        print(f"chrF {summary['chrf']:.2f}  {summary['chrf_signature']}")
    print(
        f"{summary['sentences']} sentences in {summary['seconds']:.1f} s "
        f"({summary['sentences_per_s']:.1f} sentences/s, "
        f"{summary.get('decoding', 'beam ' + str(summary['beam']))}, "
        f"ensemble λ {args.ensemble_lambda:g})"
    )
    return 0


def decoding(option: str) -> Callable[[str], float]:
    """The argparse ``type=`` of a flag that overrides the diffusion task's ``option``."""
    return number_in(declared_range(TASKS, "diffusion", option), integer=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm translate`` to the subcommands ``sub``."""
    p = sub.add_parser("translate", help="translate a file with a translation run (BLEU, chrF)")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--input", type=Path, required=True, help="source sentences, one per line")
    p.add_argument("--reference", type=Path, help="reference translations: print BLEU and chrF")
    p.add_argument("--output", type=Path, help="write the translations here (default: stdout)")
    add_force_option(p)
    add_quiet_option(p)
    p.add_argument(
        "--beam",
        type=number_in(RANGES["eval.beam"], integer=True),
        help="beam size (1: greedy; default 5)",
    )
    p.add_argument(
        "--ensemble-lambda",
        type=number_in(combiner_range("head_ensemble", "lambdas")),
        default=0.0,
        metavar="L",
        help="λ of the N-gram head ensemble inside beam search (default 0: off)",
    )
    p.add_argument(
        "--length-penalty", type=number_in(Range(0)), help="α of score / length^α (default 1)"
    )
    p.add_argument(
        "--max-len-a",
        type=number_in(Range(0, MAX_SIZE)),
        help="max output length a·|src| + b (default a 1.5)",
    )
    p.add_argument("--max-len-b", type=SIZE, help="(default b 10)")
    diffusion = p.add_argument_group("diffusion runs (default: the run's [task] decode_* settings)")
    diffusion.add_argument(
        "--steps", type=decoding("decode_steps"), metavar="K", help="denoising steps"
    )
    diffusion.add_argument(
        "--length-beam", type=decoding("length_beam"), metavar="B", help="lengths per sentence"
    )
    diffusion.add_argument(
        "--samples", type=decoding("samples"), metavar="S", help="noise samples per length"
    )
    diffusion.add_argument(
        "--seed", type=decoding("decode_seed"), help="the noise generator's seed"
    )
    diffusion.add_argument(
        "--sampler", choices=["renoise", "posterior"], help="DINOISER's or Difformer's step"
    )
    diffusion.add_argument(
        "--oracle-length",
        action="store_true",
        default=None,
        help="decode at the reference's lengths (needs --reference) instead of the predicted ones",
    )
    add_set_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (the summary)")
    p.set_defaults(func=run)
