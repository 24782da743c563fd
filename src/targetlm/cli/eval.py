"""``targetlm eval RUN_DIR``: perplexity of a trained run on a split or a text file (or of a
config file's model before training: ``targetlm eval CONFIG.toml``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from targetlm.cli.common import (
    add_evaluation_options,
    check_combiners,
    combiners_from_args,
    eval_overrides,
    score_streams,
    settings,
)
from targetlm.cli.outputs import add_quiet_option
from targetlm.data import (
    count_words,
    read_file,
    read_lines,
    with_context_token,
)
from targetlm.inference.scoring import Combiners
from targetlm.registry import ConfigError
from targetlm.tasks import Task, build_task

# an evaluation with more out-of-vocabulary tokens than this says so in its printed line, with
# the perplexity over the known words beside the one over all tokens
HIGH_OOV_RATE = 0.10


def oov_text(
    rate: float, known_ppl: float | None, open_vocab: bool, options: Sequence[str] = ()
) -> str:
    """``OOV rate 12.50%`` for a printed result line; above :data:`HIGH_OOV_RATE`, what is
    true of it: the share of tokens outside the vocabulary (scored as ``<unk>`` in a closed
    vocabulary, by their spelling with ``open_vocab``), the perplexity over the known words
    (``known_ppl``; None: there are none) and ``options``, the options not given that may help
    (:func:`oov_options`)."""
    text = f"OOV rate {rate:.2%}"
    if rate <= HIGH_OOV_RATE:
        return text
    scored = "new words, scored by their spelling" if open_vocab else "scored as <unk>"
    known = "no known words" if known_ppl is None else f"known words only: ppl {known_ppl:.2f}"
    hint = f"; is the text like the training data? try {' or '.join(options)}" if options else ""
    return (
        f"{text} (high, over {HIGH_OOV_RATE:.0%}: {rate:.2%} of the tokens are out of the "
        f"vocabulary, {scored}; {known}{hint})"
    )


def oov_options(args: argparse.Namespace, config) -> list[str]:
    """The options that may help a text with many unknown words and were not given:
    ``--lowercase`` (a run whose text is not lower-cased) and ``--open-vocab`` (a whitespace
    tokenizer's run, scored in a closed vocabulary)."""
    options = [] if config.data.lowercase else ["--lowercase"]
    if not args.open_vocab and config.data.tokenizer == "whitespace":
        options.append("--open-vocab")
    return options


def known_word_perplexity(model, vocab, config, tokens: Sequence[str]) -> float | None:
    """The perplexity over the tokens of ``tokens`` that are vocabulary words (a second,
    per-token pass, as ``targetlm score`` scores them); None when there are none."""
    [main] = score_streams(model, vocab, config, tokens, False, Combiners())
    return main.summary()["ppl_known"]


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm eval``; returns the exit status."""
    from targetlm.inference import evaluate_ensemble, evaluate_stream, head_top1
    from targetlm.inference.evaluate import per_word, perplexity
    from targetlm.runs import load_run, wraps_model

    combiners = combiners_from_args(args)
    if args.file is not None and args.split is not None:
        raise ConfigError("--file and --split exclude each other: evaluate a file or a split")
    if wraps_model(args.run_dir):
        return _eval_wrapped(args)
    config, vocab, model, _ = load_run(args.run_dir, eval_overrides(args), streams=None)
    task = build_task(config)
    if task.reads != "stream":  # its splits, with the task's figures
        return _eval_task_splits(args, task, config, vocab, model)
    check_combiners(args, config, model)
    if args.head_top1 and model.heads is None:
        raise ConfigError("--head-top1 needs a model with N-gram heads (model.heads.n >= 2)")
    split = args.split or "test"
    if args.file is not None:
        lines, source = read_file(args.file, config.data.lowercase), str(args.file)
    else:
        source = getattr(config.data, split)
        lines = read_lines(config.data, source)
    tokens = vocab.require_tokenizer().tokenize(lines)  # the run's tokenizer and vocabulary
    words = count_words(lines)
    where = {"split": None if args.file is not None else split, "file": source}
    ids = with_context_token(vocab.encode(tokens), vocab.eos_id)
    segment = config.eval.segment or config.data.bptt
    if combiners is not None:  # per-token scoring: every combiner composes, one pass
        combiners = dataclasses.replace(combiners, ensemble_lambdas=tuple(args.ensemble_lambda))
        main, *streams = score_streams(model, vocab, config, tokens, args.open_vocab, combiners)
        result = {**per_word(main.summary(), words), **settings(config, args, combiners)}
        result.update(where)
        if streams:
            result["ensemble"] = [
                {"lambda": lam, **per_word(s.summary(), words)}
                for lam, s in zip(args.ensemble_lambda, streams)
            ]
    else:
        if args.ensemble_lambda:  # one pass: the main head's ppl and every λ's
            result = evaluate_ensemble(
                model,
                ids,
                config.eval.batch_size,
                segment,
                args.ensemble_lambda,
                config.train.device,
            )
        else:
            result = evaluate_stream(
                model,
                ids,
                config.eval.batch_size,
                segment,
                config.train.device,
                loss_impl=config.train.loss_impl,
            )
        result = per_word(result, words)
        for row in result.get("ensemble", []):
            row["word_ppl"] = perplexity(row["nll"] * result["tokens"] / words)
        result.update(
            **where,
            tokenizer=config.data.tokenizer,
            oov_rate=vocab.oov_rate(tokens),
            batch_size=config.eval.batch_size,
            segment=segment,
        )
        if result["oov_rate"] > HIGH_OOV_RATE:  # the perplexity then mixes in many <unk>
            result["ppl_known"] = known_word_perplexity(model, vocab, config, tokens)
        context = model.encoder.max_context
        if context is not None:
            result["context"] = context
            result["min_context"] = context - segment + 1
    if args.head_top1:
        result["head_top1"] = head_top1(
            model, ids, config.eval.batch_size, segment, config.train.device
        )
    if args.json:
        print(json.dumps(result))
        return 0
    if combiners is not None:
        _print_summary(result, oov_options(args, config))
    else:
        name = source if args.file is not None else f"{split} ({source})"
        print(
            f"{name}: ppl {result['ppl']:.2f} over {result['tokens']:,} tokens, "
            + oov_text(
                result["oov_rate"], result.get("ppl_known"), False, oov_options(args, config)
            )
            + _per_word_text(result)
        )
    _print_heads(result)
    return 0


def _print_heads(result: dict) -> None:
    for row in result.get("ensemble", []):
        print(f"  head ensemble λ = {row['lambda']:g}: ppl {row['ppl']:.2f}")
    for row in result.get("head_top1", []):
        who = "main head" if row["ahead"] == 1 else f"head {row['ahead']}"
        print(f"  {who} (word t+{row['ahead']}): top-1 {row['top1']:.4f} over {row['count']:,}")


def _eval_task_splits(args: argparse.Namespace, task: Task, config, vocab, model) -> int:
    """A run that is not scored as a token stream, on valid and test (or ``--split``): the
    figures its task writes to results.json (:meth:`Task.evaluate_run`; translation:
    teacher-forced loss and perplexity, BLEU / chrF of beam search with
    ``--ensemble-lambda``'s first λ inside it; diffusion: its validation losses; masked LM:
    the masked tokens' perplexity)."""
    kind = config.task.kind
    if args.file is not None or combiners_from_args(args) is not None:
        use = "use `targetlm translate` for a file; " if task.conditional else ""
        raise ConfigError(
            f"a {kind!r} run is evaluated on its splits: {use}--file and the scoring options "
            "are for causal language models"
        )
    if args.head_top1:
        raise ConfigError(f"--head-top1 reads a causal language model's heads, not a {kind!r} run")
    lam = args.ensemble_lambda[0] if args.ensemble_lambda else 0.0
    splits = [args.split] if args.split else ["valid", "test"]
    task.setup(config, task.run_data(config, vocab, splits), config.train.device)
    return _print_splits(args, task, {s: task.evaluate_run(model, s, lam) for s in splits})


def _eval_wrapped(args: argparse.Namespace) -> int:
    """A run whose model wraps a language model (a classifier) on valid and test (or
    ``--split``): the task's figures (accuracy, macro-F1, ...), from its best checkpoint."""
    from targetlm.runs import load_wrapped_run

    if args.file is not None or combiners_from_args(args) is not None or args.ensemble_lambda:
        raise ConfigError(
            f"{args.run_dir} is a classifier run, evaluated on its labelled splits: --file, "
            "--ensemble-lambda and the scoring options are for language models"
        )
    if args.head_top1 or args.split == "train":
        raise ConfigError(
            f"{args.run_dir} is a classifier run: "
            + ("--head-top1 reads N-gram heads" if args.head_top1 else "--split is valid or test")
        )
    _, task, model = load_wrapped_run(args.run_dir, eval_overrides(args))
    splits = [args.split] if args.split else ["valid", "test"]
    return _print_splits(args, task, {split: task.evaluate(model, split) for split in splits})


def _print_splits(args: argparse.Namespace, task: Task, results: dict) -> int:
    """Print the task's figures of each split (one JSON object with ``--json``)."""
    if args.json:
        print(json.dumps(results))
        return 0
    for split, result in results.items():
        print(task.describe(split, result))
    return 0


def _print_summary(result: dict, options: Sequence[str]) -> None:
    def ppl(key: str) -> str:
        return "-" if result[key] is None else f"{result[key]:.2f}"

    vocabulary = "open vocabulary" if result["open_vocab"] else "closed vocabulary"
    name = result["split"] or "file"
    print(
        f"{name} ({result['data']} {result['file']}), {vocabulary}: ppl {ppl('ppl')} "
        f"over {result['tokens']:,} tokens (new words: ppl {ppl('ppl_new')} over "
        f"{result['new_tokens']:,}; known: ppl {ppl('ppl_known')}), "
        + oov_text(result["oov_rate"], result["ppl_known"], result["open_vocab"], options)
        + _per_word_text(result)
    )


def _per_word_text(result: dict) -> str:
    """The per-word perplexity, where the tokens are not the words."""
    if result["words"] == result["tokens"]:
        return ""
    return f"; per word: ppl {result['word_ppl']:.2f} over {result['words']:,} words"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm eval`` to the subcommands ``sub``."""
    p = sub.add_parser("eval", help="perplexity of a trained run on a split or a text file")
    p.add_argument(
        "run_dir",
        type=Path,
        help="a run directory, or a config file: its model before training (e.g. a pretrained "
        "backbone as published)",
    )
    p.add_argument(
        "--split",
        choices=["train", "valid", "test"],
        help="a split of the run's data (default test)",
    )
    p.add_argument(
        "--file",
        type=Path,
        metavar="PATH",
        help="any text file instead, read like a split with the run's tokenizer and vocabulary",
    )
    add_evaluation_options(
        p,
        "also the N-gram head ensemble's ppl for each λ in [0, 1] (one pass; composes "
        "with --open-vocab and the caches, which then apply to every λ)",
    )
    p.add_argument(
        "--head-top1",
        action="store_true",
        help="also each N-gram head's top-1 accuracy on the words it predicts (the main head's "
        "on the next word, head n's on the word n ahead; a second pass)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_quiet_option(p)
    p.set_defaults(func=run)
