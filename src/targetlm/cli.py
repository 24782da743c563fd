"""The ``targetlm`` command line.

    targetlm train CONFIG [--set key=value ...] [--run-dir DIR] [--resume]
    targetlm finetune RUN_DIR --run-dir NEW_DIR [--set key=value ...] [--resume]
    targetlm eval RUN_DIR [--split valid|test | --file PATH] [--set key=value ...] [--ensemble-lambda L,L,...] [--json]
                  [--open-vocab] [--uniform-weight MU] [--new-word-weight OMEGA] [--lowercase]
                  [--unigram-cache LAMBDA] [--neural-cache LAMBDA [--neural-theta T] [--neural-window N]]
    targetlm score RUN_DIR --file PATH --out SCORES.jsonl [--ensemble-lambda L,...] [scoring options]
    targetlm generate RUN_DIR --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--seed S]
    targetlm describe CONFIG [--set key=value ...] [--json]
    targetlm data info|download NAME
    targetlm lexicon stats --data NAME [--dir DIR] [--drop F --seed S] [--json]
    targetlm analyze subspace --out DIR [--config C] [--set ...] [--betas ...] [--taus ...]
    targetlm analyze word-probs RUN_DIR [RUN_DIR ...] [--words W,W,...] [--split test]
    targetlm analyze tsne RUN_DIR --out PNG [--levels 0,1,2] [--tokens M] [--split test]
    targetlm analyze freq-bins RUN_A RUN_B --out PNG [--split test] [--set ...] [--json] [scoring options]

Every expected failure (bad config, missing data, unusable checkpoint or run
directory, diverged training) is one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from targetlm import config as config_lib
from targetlm.data import (
    DATASETS,
    DataError,
    Vocabulary,
    count_words,
    load_corpus,
    read_file,
    read_lines,
    read_split,
    with_context_token,
)
from targetlm.data.datasets import get_spec
from targetlm.inference.scoring import Combiners, TokenScores
from targetlm.registry import ConfigError
from targetlm.training.checkpoint import CheckpointError
from targetlm.training.trainer import RunDirError, TrainingDiverged

if TYPE_CHECKING:
    from targetlm.modules.model import LanguageModel

EXPECTED_ERRORS = (ConfigError, DataError, CheckpointError, RunDirError, TrainingDiverged)


def _train(args: argparse.Namespace) -> int:
    from targetlm.training import Trainer

    config = config_lib.load(args.config, args.set)
    run_dir = (
        args.run_dir or Path("runs") / f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    results = Trainer(
        config, run_dir, resume=args.resume, log=lambda m: print(m, flush=True)
    ).train()
    if results.get("interrupted"):
        return 130
    print(f"test perplexity: {results['test']['ppl']:.2f}")
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from targetlm.runs import CONFIG, read_best
    from targetlm.training import Trainer

    source = str(Path(args.source).resolve())
    if args.resume:  # the finetuning run's own config: its source and vocabulary are recorded
        if not (args.run_dir / CONFIG).is_file():
            raise RunDirError(f"nothing to resume: {args.run_dir / CONFIG} does not exist")
        config = config_lib.load(args.run_dir / CONFIG, args.set)
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
        config = config_lib.from_dict(data)
    results = Trainer(
        config, args.run_dir, resume=args.resume, log=lambda m: print(m, flush=True)
    ).train()
    if results.get("interrupted"):
        return 130
    print(f"test perplexity: {results['test']['ppl']:.2f}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from targetlm.inference import evaluate_ensemble, evaluate_stream
    from targetlm.inference.evaluate import per_word, perplexity
    from targetlm.runs import load_run

    combiners = _combiners(args)
    if args.file is not None and args.split is not None:
        raise ConfigError("--file and --split exclude each other: evaluate a file or a split")
    config, vocab, model, _ = load_run(args.run_dir, _eval_overrides(args))
    _check_combiners(args, config, model)
    split = args.split or "test"
    if args.file is not None:
        lines, source = read_file(args.file, config.data.lowercase), str(args.file)
    else:
        source = getattr(config.data, split)
        lines = read_lines(config.data, source)
    tokens = vocab.tokenizer.tokenize(lines)  # the run's tokenizer and vocabulary
    words = count_words(lines)
    where = {"split": None if args.file is not None else split, "file": source}
    if combiners is not None:  # per-token scoring: every combiner composes, one pass
        combiners = dataclasses.replace(combiners, ensemble_lambdas=tuple(args.ensemble_lambda))
        main, *streams = _score_streams(model, vocab, config, tokens, args.open_vocab, combiners)
        result = {**per_word(main.summary(), words), **_settings(config, args, combiners)}
        result.update(where)
        if streams:
            result["ensemble"] = [
                {"lambda": lam, **per_word(s.summary(), words)}
                for lam, s in zip(args.ensemble_lambda, streams)
            ]
        if args.json:
            print(json.dumps(result))
        else:
            _print_summary(result)
            for row in result.get("ensemble", []):
                print(f"  head ensemble λ = {row['lambda']:g}: ppl {row['ppl']:.2f}")
        return 0
    ids = with_context_token(vocab.encode(tokens), vocab.eos_id)
    segment = config.eval.segment or config.data.bptt
    if args.ensemble_lambda:  # one pass: the main head's ppl and every λ's
        result = evaluate_ensemble(
            model, ids, config.eval.batch_size, segment, args.ensemble_lambda, config.train.device
        )
    else:
        result = evaluate_stream(model, ids, config.eval.batch_size, segment, config.train.device)
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
    context = getattr(model.encoder, "max_context", None)
    if context is not None:
        result["context"] = context
        result["min_context"] = context - segment + 1
    if args.json:
        print(json.dumps(result))
    else:
        name = source if args.file is not None else f"{split} ({source})"
        print(
            f"{name}: ppl {result['ppl']:.2f} over {result['tokens']:,} tokens, "
            f"OOV rate {result['oov_rate']:.2%}" + _per_word_text(result)
        )
        for row in result.get("ensemble", []):
            print(f"  head ensemble λ = {row['lambda']:g}: ppl {row['ppl']:.2f}")
    return 0


def _check_combiners(
    args: argparse.Namespace, config: config_lib.Config, model: LanguageModel
) -> None:
    """One clear error for a combiner that cannot apply to this run (before anything runs)."""
    if args.ensemble_lambda and model.num_heads < 1:
        raise ConfigError(
            f"--ensemble-lambda: {args.run_dir} has no N-gram heads (model.heads.kind = "
            f"{config.model.heads.kind!r}, needs n >= 2)"
        )
    if any(not 0 <= lam <= 1 for lam in args.ensemble_lambda):
        raise ConfigError(
            f"--ensemble-lambda: every λ must be in [0, 1], got {args.ensemble_lambda}"
        )
    if args.open_vocab and config.data.tokenizer != "whitespace":
        raise ConfigError(
            f"--open-vocab: a {config.data.tokenizer} tokenizer reads any text with its own "
            "symbols, so there are no new words to add"
        )


def _score_file(args: argparse.Namespace) -> int:
    """``targetlm score``: one JSON record per token of a file, with any combiners."""
    import os
    import tempfile

    from targetlm.runs import load_run

    combiners = _combiners(args) or Combiners()
    config, vocab, model, _ = load_run(args.run_dir, _eval_overrides(args))
    _check_combiners(args, config, model)
    lines = read_file(args.file, config.data.lowercase)
    tokens = list(vocab.tokenizer.tokenize(lines))
    combiners = dataclasses.replace(combiners, ensemble_lambdas=tuple(args.ensemble_lambda))
    main, *streams = _score_streams(model, vocab, config, tokens, args.open_vocab, combiners)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # written whole or not at all: a temporary file renamed over the output
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for i, token in enumerate(tokens):
                record = {
                    "position": i,
                    "token": token,
                    "log_prob": float(main.log_probs[i]),
                    "new": bool(main.is_new[i]),
                }
                if streams:
                    record["ensemble"] = {
                        f"{lam:g}": float(s.log_probs[i])
                        for lam, s in zip(args.ensemble_lambda, streams)
                    }
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    summary = main.summary()
    print(
        f"{out}: {summary['tokens']:,} tokens of {args.file}, ppl {summary['ppl']:.2f}, "
        f"OOV rate {summary['oov_rate']:.2%}"
    )
    return 0


SCORING_OPTIONS = (
    "uniform_weight",
    "new_word_weight",
    "unigram_cache",
    "neural_cache",
    "neural_theta",
    "neural_window",
)


def _combiners(args: argparse.Namespace) -> Combiners | None:
    """The scoring options as :class:`Combiners`; None when none is given (plain evaluation)."""
    given = {k: getattr(args, k) for k in SCORING_OPTIONS if getattr(args, k) is not None}
    if not given and not args.open_vocab:
        return None
    if {"neural_theta", "neural_window"} & given.keys() and not args.neural_cache:
        raise ConfigError("--neural-theta and --neural-window need --neural-cache LAMBDA > 0")
    if "new_word_weight" in given and not args.open_vocab:
        raise ConfigError(
            "--new-word-weight needs --open-vocab (a closed vocabulary has no new words)"
        )
    if given.get("neural_window", 1) < 1:
        raise ConfigError(f"--neural-window: must be >= 1, got {args.neural_window}")
    try:
        return Combiners(**given)
    except ValueError as error:  # "unigram_cache must be in [0, 1), got 1.5"
        raise ConfigError(f"--{str(error).split()[0].replace('_', '-')}: {error}") from None


def _eval_overrides(args: argparse.Namespace) -> list[str]:
    return [*args.set, *(["data.lowercase=true"] if args.lowercase else [])]


def _score(
    model: LanguageModel,
    vocab: Vocabulary,
    config: config_lib.Config,
    tokens: list[str],
    open_vocab: bool,
    combiners: Combiners,
) -> TokenScores:
    """Per-token scores of ``tokens`` (``score_text``) with the run's evaluation batching."""
    return _score_streams(model, vocab, config, tokens, open_vocab, combiners)[0]


def _score_streams(
    model: LanguageModel,
    vocab: Vocabulary,
    config: config_lib.Config,
    tokens: list[str],
    open_vocab: bool,
    combiners: Combiners,
) -> list[TokenScores]:
    """Per-token scores of the main head and of each ensemble λ (``score_streams``, one pass)
    with the run's evaluation batching."""
    from targetlm.inference.scoring import score_streams

    if combiners.uniform_weight is not None and open_vocab and hasattr(model.output, "embed_words"):
        raise ConfigError(
            f"--uniform-weight: the output layer ({config.model.output.kind}) is compositional: "
            "it scores new words itself and is never mixed with the uniform distribution"
        )
    return score_streams(
        model,
        vocab,
        tokens,
        open_vocabulary=open_vocab,
        combiners=combiners,
        batch_size=config.eval.batch_size,
        segment=config.eval.segment or config.data.bptt,
        device=config.train.device,
    )


def _settings(
    config: config_lib.Config,
    args: argparse.Namespace,
    combiners: Combiners,
    split: str | None = None,
) -> dict:
    """What an open-vocabulary / cache evaluation used (``uniform_weight`` None: score_text's
    default, 0.01 for a closed output layer when the text has new words)."""
    return {
        "split": args.split,
        "file": split,
        "data": config.data.name,
        "tokenizer": config.data.tokenizer,
        "lowercase": config.data.lowercase,
        "open_vocab": args.open_vocab,
        **dataclasses.asdict(combiners),
        "batch_size": config.eval.batch_size,
        "segment": config.eval.segment or config.data.bptt,
    }


def _print_summary(result: dict) -> None:
    def ppl(key: str) -> str:
        return "-" if result[key] is None else f"{result[key]:.2f}"

    vocabulary = "open vocabulary" if result["open_vocab"] else "closed vocabulary"
    name = result["split"] or "file"
    print(
        f"{name} ({result['data']} {result['file']}), {vocabulary}: ppl {ppl('ppl')} "
        f"over {result['tokens']:,} tokens (new words: ppl {ppl('ppl_new')} over "
        f"{result['new_tokens']:,}; known: ppl {ppl('ppl_known')}), OOV rate {result['oov_rate']:.2%}"
        + _per_word_text(result)
    )


def _per_word_text(result: dict) -> str:
    """The per-word perplexity, where the tokens are not the words."""
    if result["words"] == result["tokens"]:
        return ""
    return f"; per word: ppl {result['word_ppl']:.2f} over {result['words']:,} words"


def _generate(args: argparse.Namespace) -> int:
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


def _describe(args: argparse.Namespace) -> int:
    from targetlm.lexicon import Lexicon
    from targetlm.modules import build_model

    config = config_lib.load(args.config, args.set)
    vocab = load_corpus(config.data, (config.data.train,)).vocab  # the tokenizer's, if any
    # parameters never depend on the lexicon's contents, so counting needs no WordNet
    model = build_model(config.model, vocab.itos, lexicon=Lexicon())
    params = model.parameter_counts()
    total = sum(params.values())
    if args.json:
        print(json.dumps({"total_params": total, "params": params, "vocab_size": len(vocab)}))
        return 0
    print(f"vocabulary: {len(vocab):,} {_entries(config)} ({config.data.name})")
    parts = {
        "input_embedding": config.model.embedding,
        "encoder": config.model.encoder,
        "output": config.model.output,
        "heads": config.model.heads,
    }
    for name, count in params.items():
        kind = f" ({parts[name].kind})" if name in parts else ""
        print(f"{name + kind:<32}{count:>14,}")
    print(f"{'total':<32}{total:>14,}")
    return 0


def _entries(config: config_lib.Config) -> str:
    return "words" if config.data.tokenizer == "whitespace" else f"{config.data.tokenizer} symbols"


def _run_tokens(config: config_lib.Config, vocab: Vocabulary, split: str) -> Sequence[str]:
    """The tokens of a split of a run's data, read with the run's tokenizer."""
    return vocab.tokenizer.tokenize(read_lines(config.data, split))


def _data(args: argparse.Namespace) -> int:
    from targetlm.data import download

    spec = get_spec(args.name)
    if args.action == "download":
        path = download(args.name, Path(args.dir) if args.dir else None)
        print(f"{args.name}: downloaded and verified into {path}")
        return 0
    base = config_lib.DataConfig(name=args.name, dir=args.dir)
    print(f"{spec.name}: {spec.description}")
    splits = {s: read_split(base, s) for s in spec.splits}
    vocab = Vocabulary.build(splits["train"]) if "train" in splits else None
    if vocab is not None:
        print(f"vocabulary (train): {len(vocab):,}")
    header = f"{'split':<18}{'tokens':>12}{'types':>10}"
    print(header + (f"{'OOV rate':>10}{'unigram ppl':>13}" if vocab else ""))
    for split, tokens in splits.items():
        line = f"{split:<18}{len(tokens):>12,}{len(set(tokens)):>10,}"
        if vocab is not None:
            line += f"{vocab.oov_rate(tokens):>10.2%}{vocab.unigram_perplexity(tokens):>13.1f}"
        print(line)
    return 0


def _lexicon(args: argparse.Namespace) -> int:
    from targetlm.lexicon import load_lexicon

    config = config_lib.DataConfig(name=args.data, dir=args.dir)
    vocab = Vocabulary.build(read_split(config, config.train))
    lexicon = load_lexicon(vocab.itos)
    if args.drop:
        lexicon = lexicon.without(args.drop, args.seed)
    stats = {"data": args.data, **lexicon.coverage(vocab.itos)}
    if args.json:
        print(json.dumps(stats))
    else:
        print(
            f"{args.data}: {stats['words']:,} words; WordNet relations {stats['relations']:.1%}, "
            f"definitions {stats['definitions']:.1%}"
        )
    return 0


def _analyze_subspace(args: argparse.Namespace) -> int:
    from targetlm.analysis.subspace import run_subspace_analysis, sweep

    config = config_lib.load(args.config, args.set)
    out_dir = Path(args.out)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise RunDirError(
            f"output directory {out_dir} exists and is not empty; choose another --out"
        )
    rows = run_subspace_analysis(
        config,
        out_dir,
        sweep(args.betas, args.taus, args.beta_tau),
        log=lambda m: print(m, flush=True),
    )
    print((out_dir / "subspace.md").read_text(encoding="utf-8"), end="")
    return 0 if rows else 1


def _analyze_word_probs(args: argparse.Namespace) -> int:
    from targetlm.analysis.word_probs import mean_word_probabilities
    from targetlm.runs import load_run

    rows = []
    for run_dir in args.run_dirs:
        config, vocab, model, _ = load_run(run_dir, args.set)
        missing = [w for w in args.words if w not in vocab]
        if missing:
            raise DataError(f"{run_dir}: not in the vocabulary: {', '.join(missing)}")
        tokens = _run_tokens(config, vocab, getattr(config.data, args.split))
        ids = with_context_token(vocab.encode(tokens), vocab.eos_id)
        segment = config.eval.segment or config.data.bptt
        result = mean_word_probabilities(
            model, ids, [vocab.stoi[w] for w in args.words], config.eval.batch_size, segment
        )
        rows.append((str(run_dir), result))
    if args.json:
        print(json.dumps({run: dict(zip(args.words, r["mean_prob"])) for run, r in rows}))
        return 0
    print(f"mean predicted probability on the {args.split} split (frequency in the text)")
    print(
        f"{'word':<10}"
        + "".join(f"{Path(run).name[-22:]:>24}" for run, _ in rows)
        + f"{'frequency':>12}"
    )
    for i, word in enumerate(args.words):
        cells = "".join(f"{r['mean_prob'][i]:>24.4f}" for _, r in rows)
        print(f"{word:<10}{cells}{rows[0][1]['frequency'][i]:>12.4f}")
    return 0


def _analyze_tsne(args: argparse.Namespace) -> int:
    from targetlm.analysis.tsne import plot_tsne, target_tsne
    from targetlm.runs import load_run

    config, vocab, model, _ = load_run(args.run_dir, args.set)
    levels = [int(n) for n in args.levels]
    if any(n < 0 for n in levels) or args.tokens <= max(levels, default=0) + 1:
        raise ConfigError("--levels must be >= 0 and --tokens larger than the highest level + 1")
    ids = vocab.encode(_run_tokens(config, vocab, getattr(config.data, args.split)))[: args.tokens]
    weight, _ = model.output()
    points = target_tsne(weight, ids, levels, seed=args.seed)
    plot_tsne(
        points, args.out, f"{Path(args.run_dir).name}: targets of {len(ids)} {args.split} words"
    )
    print(f"wrote {args.out} ({', '.join(f'level {n}: {len(p)}' for n, p in points.items())})")
    return 0


def _analyze_freq_bins(args: argparse.Namespace) -> int:
    from targetlm.analysis.frequency import frequency_bin_table, plot_frequency_bins
    from targetlm.runs import load_run

    combiners = _combiners(args) or Combiners()
    overrides = _eval_overrides(args)
    config, vocab, model_a, _ = load_run(args.run_a, overrides)
    config_b, vocab_b, model_b, _ = load_run(args.run_b, overrides)
    if vocab_b != vocab or vocab_b.counts != vocab.counts:
        raise DataError(
            f"{args.run_a} and {args.run_b} were not trained on the same data (their "
            "vocabularies differ): the frequency bins need one training count per word"
        )
    split = getattr(config.data, args.split)
    tokens = _run_tokens(config, vocab, split)  # the same text for both runs
    first = _score(model_a, vocab, config, tokens, args.open_vocab, combiners)
    second = _score(model_b, vocab, config_b, tokens, args.open_vocab, combiners)
    rows = frequency_bin_table(first, second, dict(zip(vocab.itos, vocab.counts)))
    name_a, name_b = Path(args.run_a).name, Path(args.run_b).name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_frequency_bins(rows, args.out, f"loss({name_a}) − loss({name_b}), {split}")
    if args.json:
        result = {
            "run_a": str(args.run_a),
            "run_b": str(args.run_b),
            **_settings(config, args, combiners, split),
            "summary": {"a": first.summary(), "b": second.summary()},
            "bins": rows,
            "plot": str(args.out),
        }
        print(json.dumps(result))
        return 0
    print(
        f"median per-token loss difference loss({name_a}) − loss({name_b}) in nats by training "
        f"frequency ({split}; negative: {name_a} is better)"
    )
    print(f"{'bin':<14}{'tokens':>10}{'median':>12}")
    for row in rows:
        median = row["median_loss_difference"]
        print(
            f"{row['bin']:<14}{row['tokens']:>10,}{'-' if median is None else f'{median:.4f}':>12}"
        )
    print(f"wrote {args.out}")
    return 0


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def _add_scoring_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group(
        "open-vocabulary scoring and caches (Pappas et al. 2020); all but --lowercase "
        "switch to per-token scoring"
    )
    group.add_argument(
        "--open-vocab",
        action="store_true",
        help="score the text's new words too (V_train ∪ V_text)",
    )
    group.add_argument(
        "--uniform-weight",
        type=float,
        metavar="MU",
        help="μ of the uniform mixture of a closed output layer "
        "(default: 0.01 when the text has new words)",
    )
    group.add_argument(
        "--new-word-weight",
        type=float,
        metavar="OMEGA",
        help="ω in (0, 1] of the new-word down-weighting (default 1: off)",
    )
    group.add_argument(
        "--unigram-cache", type=float, metavar="LAMBDA", help="λ of the unigram cache"
    )
    group.add_argument(
        "--neural-cache", type=float, metavar="LAMBDA", help="λ of the neural cache (Grave et al.)"
    )
    group.add_argument(
        "--neural-theta",
        type=float,
        metavar="THETA",
        help=f"θ of the neural cache (default {Combiners.neural_theta})",
    )
    group.add_argument(
        "--neural-window",
        type=int,
        metavar="N",
        help=f"positions the neural cache remembers (default {Combiners.neural_window})",
    )
    group.add_argument(
        "--lowercase",
        action="store_true",
        help="lower-case the evaluation text (data.lowercase = true), e.g. Brown for a PTB model",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="targetlm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model from a TOML config")
    p.add_argument("config")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key"
    )
    p.add_argument("--run-dir", type=Path, help="run directory (default: runs/<config>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir exactly")
    p.set_defaults(func=_train)

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
    p.set_defaults(func=_finetune)

    p = sub.add_parser("eval", help="perplexity of a trained run on a split or a text file")
    p.add_argument("run_dir", type=Path)
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
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--ensemble-lambda",
        type=_floats,
        default=[],
        metavar="L,L,...",
        help="also the N-gram head ensemble's ppl for each λ in [0, 1] (one pass; composes "
        "with --open-vocab and the caches, which then apply to every λ)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_scoring_options(p)
    p.set_defaults(func=_eval)

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
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--ensemble-lambda",
        type=_floats,
        default=[],
        metavar="L,L,...",
        help="also each λ's log-probability (record key 'ensemble'), in the same pass",
    )
    _add_scoring_options(p)
    p.set_defaults(func=_score_file)

    p = sub.add_parser("generate", help="sample text from a trained run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=30)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int)
    p.set_defaults(func=_generate)

    p = sub.add_parser("describe", help="parameters per part of a configured model")
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_describe)

    p = sub.add_parser("analyze", help="analyses that train and compare several models")
    analyses = p.add_subparsers(dest="analysis", required=True)
    a = analyses.add_parser(
        "subspace", help="Inan et al. Fig. 1: input/output embedding subspace distance"
    )
    a.add_argument("--config", default="configs/inan-subspace-ptb.toml")
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a.add_argument("--out", required=True, help="directory for the runs, table and plot")
    a.add_argument("--betas", type=_floats, default=[0.0, 0.25, 0.5, 0.75, 1.0])
    a.add_argument("--taus", type=_floats, default=[2.0, 5.0, 10.0, 20.0])
    a.add_argument("--beta-tau", type=float, default=10.0, help="τ of the β sweep")
    a.set_defaults(func=_analyze_subspace)

    a = analyses.add_parser(
        "word-probs", help="mean predicted probability of chosen words (Inan et al.)"
    )
    a.add_argument("run_dirs", nargs="+", type=Path)
    a.add_argument(
        "--words",
        type=lambda t: t.split(","),
        default=["<unk>", "the", "of", "a", "and", "to", "in"],
    )
    a.add_argument("--split", choices=["train", "valid", "test"], default="test")
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=_analyze_word_probs)

    a = analyses.add_parser(
        "tsne", help="t-SNE of target embeddings and their n-level WDRs (Heo et al.)"
    )
    a.add_argument("run_dir", type=Path)
    a.add_argument("--out", type=Path, required=True, help="the plot (PNG)")
    a.add_argument("--levels", type=_floats, default=[0.0, 1.0, 2.0], help="WDR levels n")
    a.add_argument("--tokens", type=int, default=1000, help="target words from the split")
    a.add_argument("--split", choices=["train", "valid", "test"], default="test")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a.set_defaults(func=_analyze_tsne)

    a = analyses.add_parser(
        "freq-bins",
        help="Pappas et al. Fig. 3: median per-token loss difference of two runs by training "
        "frequency",
    )
    a.add_argument("run_a", type=Path, help="the first run (its vocabulary gives the counts)")
    a.add_argument("run_b", type=Path, help="the second run, trained on the same data")
    a.add_argument("--out", type=Path, required=True, help="the plot (PNG)")
    a.add_argument("--split", choices=["train", "valid", "test"], default="test")
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a.add_argument("--json", action="store_true")
    _add_scoring_options(a)
    a.set_defaults(func=_analyze_freq_bins)

    p = sub.add_parser("lexicon", help="WordNet lexicon (GroC) of a dataset's vocabulary")
    p.add_argument("action", choices=["stats"])
    p.add_argument("--data", required=True, choices=sorted(DATASETS), help="dataset name")
    p.add_argument("--dir", help="dataset directory")
    p.add_argument("--drop", type=float, default=0.0, help="remove this fraction of entries")
    p.add_argument("--seed", type=int, default=0, help="seed of --drop")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_lexicon)

    p = sub.add_parser("data", help="dataset information and download")
    p.add_argument("action", choices=["info", "download"])
    p.add_argument("name", choices=sorted(DATASETS))
    p.add_argument("--dir", help="dataset directory (info) or download target")
    p.set_defaults(func=_data)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except EXPECTED_ERRORS as error:
        print(f"targetlm: error: {error}", file=sys.stderr)
        return 3 if isinstance(error, TrainingDiverged) else 2
    except OSError as error:
        print(f"targetlm: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
