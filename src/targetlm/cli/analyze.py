"""``targetlm analyze ...``: analyses that train and compare several models."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from targetlm import builders
from targetlm.cli.common import (
    SIZE,
    add_scoring_options,
    add_set_option,
    combiners_from_args,
    eval_overrides,
    floats,
    number_in,
    run_tokens,
    score_streams,
    settings,
)
from targetlm.cli.compare import PLOT_FORMATS
from targetlm.cli.outputs import add_force_option, check_output, run_inputs
from targetlm.config import Config
from targetlm.data import (
    DataError,
    with_context_token,
)
from targetlm.inference.scoring import Combiners
from targetlm.modules.model import LanguageModel
from targetlm.registry import MAX_SIZE, ConfigError, Range
from targetlm.rundir import RunDirError

TSNE_SEED = number_in(Range(0, 2**32 - 1), integer=True)  # scikit-learn's random_state
LEVEL = number_in(Range(0, MAX_SIZE), integer=True)


def levels(text: str) -> list[int]:
    """``--levels 0,1,2``: one or more WDR levels n, each a whole number >= 0."""
    values = [int(LEVEL(x)) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected one or more levels, e.g. 0,1,2")
    return values


def check_plot(out: Path, inputs: list[Path], force: bool) -> None:
    """Refuse ``--out`` unless it ends in an image suffix of ``compare --plot`` (so the plot is
    written to exactly that path: matplotlib would add ``.png`` to a bare name after the
    checks) and passes :func:`check_output` against ``inputs``."""
    if out.suffix.lower() not in PLOT_FORMATS:
        raise ConfigError(f"--out: {out} should end in one of {', '.join(PLOT_FORMATS)}")
    check_output(out, "--out", inputs, force)


def subspace(args: argparse.Namespace) -> int:
    """Run ``targetlm analyze subspace``; returns the exit status."""
    from targetlm.analysis.subspace import run_subspace_analysis, sweep

    config = builders.load_config(args.config or _subspace_preset(), args.set)
    runs = sweep(args.betas, args.taus, args.beta_tau)
    if not runs:
        raise ConfigError("--betas and --taus are both empty: there is no model to train")
    out_dir = Path(args.out)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise RunDirError(
            f"output directory {out_dir} exists and is not empty; choose another --out"
        )
    rows = run_subspace_analysis(
        config, out_dir, runs, train=_train_quietly, log=lambda m: print(m, flush=True)
    )
    print((out_dir / "subspace.md").read_text(encoding="utf-8"), end="")
    return 0 if rows else 1


def _train_quietly(config: Config, run_dir: Path) -> tuple[LanguageModel, dict[str, Any]]:
    """One run of the subspace sweep: the trainer's model and results, its log not printed."""
    from targetlm.training.trainer import Trainer

    trainer = Trainer(config, run_dir, log=lambda message: None)
    results = trainer.train()
    return trainer.model, results


def word_probs(args: argparse.Namespace) -> int:
    """Run ``targetlm analyze word-probs``; returns the exit status."""
    from targetlm.analysis.word_probs import mean_word_probabilities
    from targetlm.runs import load_run

    rows = []
    for run_dir in args.run_dirs:
        config, vocab, model, _ = load_run(run_dir, args.set)
        missing = [w for w in args.words if w not in vocab]
        if missing:
            raise DataError(f"{run_dir}: not in the vocabulary: {', '.join(missing)}")
        tokens = run_tokens(config, vocab, getattr(config.data, args.split))
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


def tsne(args: argparse.Namespace) -> int:
    """Run ``targetlm analyze tsne``; returns the exit status."""
    from targetlm.analysis.tsne import plot_tsne, target_tsne
    from targetlm.runs import load_run

    if args.tokens <= max(args.levels) + 1:
        raise ConfigError(
            f"--tokens {args.tokens}: must be larger than the highest of --levels + 1 "
            f"({max(args.levels) + 1})"
        )
    check_plot(args.out, run_inputs(args.run_dir), args.force)
    config, vocab, model, _ = load_run(args.run_dir, args.set)
    ids = vocab.encode(run_tokens(config, vocab, getattr(config.data, args.split)))[: args.tokens]
    if len(ids) <= max(args.levels) + 1:
        raise DataError(
            f"the {args.split} split has {len(ids)} words: too few for level {max(args.levels)}"
        )
    weight, _ = model.output()
    points = target_tsne(weight, ids, args.levels, seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_tsne(
        points, args.out, f"{Path(args.run_dir).name}: targets of {len(ids)} {args.split} words"
    )
    print(f"wrote {args.out} ({', '.join(f'level {n}: {len(p)}' for n, p in points.items())})")
    return 0


def freq_bins(args: argparse.Namespace) -> int:
    """Run ``targetlm analyze freq-bins``; returns the exit status."""
    from targetlm.analysis.frequency import frequency_bin_table, plot_frequency_bins
    from targetlm.runs import load_run

    check_plot(args.out, [*run_inputs(args.run_a), *run_inputs(args.run_b)], args.force)
    combiners = combiners_from_args(args) or Combiners()
    overrides = eval_overrides(args)
    config, vocab, model_a, _ = load_run(args.run_a, overrides)
    config_b, vocab_b, model_b, _ = load_run(args.run_b, overrides)
    if vocab_b != vocab or vocab_b.counts != vocab.counts:
        raise DataError(
            f"{args.run_a} and {args.run_b} were not trained on the same data (their "
            "vocabularies differ): the frequency bins need one training count per word"
        )
    split = getattr(config.data, args.split)
    tokens = run_tokens(config, vocab, split)  # the same text for both runs
    [first] = score_streams(model_a, vocab, config, tokens, args.open_vocab, combiners)
    [second] = score_streams(model_b, vocab, config_b, tokens, args.open_vocab, combiners)
    rows = frequency_bin_table(first, second, dict(zip(vocab.itos, vocab.counts)))
    name_a, name_b = Path(args.run_a).name, Path(args.run_b).name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_frequency_bins(rows, args.out, f"loss({name_a}) − loss({name_b}), {split}")
    if args.json:
        result = {
            "run_a": str(args.run_a),
            "run_b": str(args.run_b),
            **settings(config, args, combiners, split),
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


SUBSPACE_PRESET = "inan-subspace-ptb.toml"


def _subspace_preset() -> Path:
    """The checkout's ``configs/inan-subspace-ptb.toml``, wherever the command runs from."""
    path = Path(__file__).resolve().parents[3] / "configs" / SUBSPACE_PRESET
    if not path.is_file():
        raise ConfigError(
            f"analyze subspace: no --config given and no configs/{SUBSPACE_PRESET} beside this "
            "installation (it ships with the checkout): pass --config"
        )
    return path


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm analyze`` to the subcommands ``sub``."""
    p = sub.add_parser("analyze", help="analyses that train and compare several models")
    analyses = p.add_subparsers(dest="analysis", required=True)
    a = analyses.add_parser(
        "subspace", help="Inan et al. Fig. 1: input/output embedding subspace distance"
    )
    a.add_argument(
        "--config", help="the model to train (default: the checkout's inan-subspace-ptb preset)"
    )
    add_set_option(a)
    a.add_argument("--out", required=True, help="directory for the runs, table and plot")
    a.add_argument("--betas", type=floats, default=[0.0, 0.25, 0.5, 0.75, 1.0])
    a.add_argument("--taus", type=floats, default=[2.0, 5.0, 10.0, 20.0])
    a.add_argument("--beta-tau", type=float, default=10.0, help="τ of the β sweep")
    a.set_defaults(func=subspace)

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
    add_set_option(a)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=word_probs)

    a = analyses.add_parser(
        "tsne", help="t-SNE of target embeddings and their n-level WDRs (Heo et al.)"
    )
    a.add_argument("run_dir", type=Path)
    a.add_argument("--out", type=Path, required=True, help="the plot (.png, .pdf or .svg)")
    a.add_argument("--levels", type=levels, default=[0, 1, 2], help="WDR levels n")
    a.add_argument("--tokens", type=SIZE, default=1000, help="target words from the split")
    a.add_argument("--split", choices=["train", "valid", "test"], default="test")
    a.add_argument("--seed", type=TSNE_SEED, default=0)
    add_set_option(a)
    add_force_option(a)
    a.set_defaults(func=tsne)

    a = analyses.add_parser(
        "freq-bins",
        help="Pappas et al. Fig. 3: median per-token loss difference of two runs by training "
        "frequency",
    )
    a.add_argument("run_a", type=Path, help="the first run (its vocabulary gives the counts)")
    a.add_argument("run_b", type=Path, help="the second run, trained on the same data")
    a.add_argument("--out", type=Path, required=True, help="the plot (.png, .pdf or .svg)")
    a.add_argument("--split", choices=["train", "valid", "test"], default="test")
    add_set_option(a)
    a.add_argument("--json", action="store_true")
    add_force_option(a)
    add_scoring_options(a)
    a.set_defaults(func=freq_bins)
