"""What several commands share: the scoring/combiner options of ``eval``, ``score`` and
``analyze freq-bins``, and reading a run's split.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from targetlm import config as config_lib
from targetlm.data import (
    Vocabulary,
    read_lines,
)
from targetlm.inference.combiners import COMBINERS
from targetlm.inference.scoring import Combiners, TokenScores
from targetlm.modules.interfaces import OpenVocabularyOutput
from targetlm.registry import MAX_SEED, MAX_SIZE, ConfigError, Range, Registry, option_range

FINITE = Range()  # any number but NaN and ±inf

if TYPE_CHECKING:
    from targetlm.modules.model import LanguageModel


def check_combiners(
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


SCORING_OPTIONS = (
    "uniform_weight",
    "new_word_weight",
    "unigram_cache",
    "neural_cache",
    "neural_theta",
    "neural_window",
)


def combiners_from_args(args: argparse.Namespace) -> Combiners | None:
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


def eval_overrides(args: argparse.Namespace) -> list[str]:
    return [*args.set, *(["data.lowercase=true"] if args.lowercase else [])]


def score_streams(
    model: LanguageModel,
    vocab: Vocabulary,
    config: config_lib.Config,
    tokens: Sequence[str],
    open_vocab: bool,
    combiners: Combiners,
) -> list[TokenScores]:
    """Per-token scores of the main head and of each ensemble λ of ``combiners`` (none: the
    main head's alone; ``score_streams``, one pass) with the run's evaluation batching."""
    from targetlm.inference.scoring import score_streams

    if (
        combiners.uniform_weight is not None
        and open_vocab
        and isinstance(model.output, OpenVocabularyOutput)
    ):
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


def settings(
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


def run_tokens(config: config_lib.Config, vocab: Vocabulary, split: str) -> Sequence[str]:
    """The tokens of a split of a run's data, read with the run's tokenizer."""
    return vocab.require_tokenizer().tokenize(read_lines(config.data, split))


class _ShowDefaults(argparse.HelpFormatter):
    """Help that ends each option's line with its default, where it has one worth showing (not
    None, False or empty) and the help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            default is None
            or default is False
            or default == []
            or default is argparse.SUPPRESS
            or "default" in text
            or not action.option_strings
        ):
            return action.help
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one :class:`ConfigError` line like every other
    expected error ("argument --top-p: 1.5 is not in (0, 1] (see targetlm generate --help)"),
    not the usage followed by the error. Subcommands' parsers are of the same class. ``--help``
    shows each option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _ShowDefaults)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)")


def number_in(valid: Range = FINITE, integer: bool = False) -> Callable[[str], float]:
    """An argparse ``type=``: the flag's value is a number (an integer) in ``valid``; anything
    else (NaN, ±inf, out of range) is argparse's one error line naming the flag and the range.
    """

    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if value not in valid:
            raise argparse.ArgumentTypeError(f"{value!r} is not in {valid}")
        return value

    parse.__name__ = "integer" if integer else "number"
    return parse


def numbers_in(valid: Range = FINITE, at_least_one: bool = False) -> Callable[[str], list[float]]:
    """An argparse ``type=``: comma-separated numbers, each in ``valid`` (``at_least_one``: an
    empty list is refused too)."""
    one = number_in(valid)

    def parse(text: str) -> list[float]:
        try:
            values = [one(x) for x in text.split(",") if x.strip()]
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
        if at_least_one and not values:
            raise argparse.ArgumentTypeError(f"{text!r}: expected one or more numbers in {valid}")
        return values

    parse.__name__ = "numbers"
    return parse


floats = numbers_in()  # any finite numbers
SIZE = number_in(Range(1, MAX_SIZE), integer=True)  # a count of tokens, steps, ...: at least 1
SEED = number_in(Range(0, MAX_SEED), integer=True)


def declared_range(registry: Registry, kind: str, option: str) -> Range:
    """The range the registered ``kind`` declares for its ``option``: a flag that sets that
    option takes the same values."""
    found = option_range(registry.hints(kind)[option])
    if found is None:
        raise LookupError(f"{registry.kind} {kind!r}: the option {option!r} declares no range")
    return found


def combiner_range(kind: str, option: str) -> Range:
    """The range of a combiner's option (:data:`targetlm.inference.combiners.COMBINERS`)."""
    return declared_range(COMBINERS, kind, option)


# --ensemble-lambda L,L,...: the head ensemble's λ values
ENSEMBLE_LAMBDAS = numbers_in(combiner_range("head_ensemble", "lambdas"), at_least_one=True)


def add_set_option(
    p: argparse.ArgumentParser, help: str | None = None, flag: str = "--set"
) -> None:
    """``flag`` KEY=VALUE, repeatable: an option of what the command builds (--set: a
    configuration override)."""
    p.add_argument(flag, action="append", default=[], metavar="KEY=VALUE", help=help)


def add_evaluation_options(p: argparse.ArgumentParser, ensemble_help: str) -> None:
    """What ``eval`` and ``score`` read a run with: --set, --ensemble-lambda L,L,... (the
    head ensemble's λ values, scored in the same pass; ``ensemble_help`` says what the command
    reports of them) and the scoring options (:func:`add_scoring_options`)."""
    add_set_option(p)
    p.add_argument(
        "--ensemble-lambda",
        type=ENSEMBLE_LAMBDAS,
        default=[],
        metavar="L,L,...",
        help=ensemble_help,
    )
    add_scoring_options(p)


def add_scoring_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group(
        "open-vocabulary scoring and caches (Pappas et al. 2020); all but --lowercase "
        "switch to per-token scoring"
    )
    group.add_argument(
        "--open-vocab",
        action="store_true",
        help="score the text's new words too (V_train ∪ V_text)",
    )
    # each flag sets one option of a combiner and takes the values that option declares
    options: list[tuple[str, str, str, str, str]] = [
        (
            "--uniform-weight",
            "uniform",
            "weight",
            "MU",
            "μ of the uniform mixture of a closed output layer "
            "(default: 0.01 when the text has new words)",
        ),
        (
            "--new-word-weight",
            "new_word_weight",
            "weight",
            "OMEGA",
            "ω in (0, 1] of the new-word down-weighting (default 1: off)",
        ),
        ("--unigram-cache", "unigram_cache", "weight", "LAMBDA", "λ of the unigram cache"),
        (
            "--neural-cache",
            "neural_cache",
            "weight",
            "LAMBDA",
            "λ of the neural cache (Grave et al.)",
        ),
        (
            "--neural-theta",
            "neural_cache",
            "theta",
            "THETA",
            f"θ of the neural cache (default {Combiners.neural_theta})",
        ),
        (
            "--neural-window",
            "neural_cache",
            "window",
            "N",
            f"positions the neural cache remembers (default {Combiners.neural_window})",
        ),
    ]
    for flag, kind, option, metavar, help in options:
        valid = combiner_range(kind, option)
        group.add_argument(
            flag,
            type=number_in(valid, integer=option == "window"),  # a window counts positions
            metavar=metavar,
            help=help,
        )
    group.add_argument(
        "--lowercase",
        action="store_true",
        help="lower-case the evaluation text (data.lowercase = true), e.g. Brown for a PTB model",
    )
