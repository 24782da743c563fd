"""Tables from finished runs: what ``targetlm compare`` prints.

A *run* is a directory with a ``config.toml`` and at least one result file: ``results.json``
(what ``targetlm train`` writes at the end), ``eval-{valid,test}.json`` (``targetlm eval
--json``, with the head ensemble's figure per λ under ``"ensemble"``) or
``translate-{val,test}-*.json`` (``targetlm translate --json``; the file name carries the
decoding, e.g. ``translate-test-k10-lambda0.1-predicted.json``). Committed records
(``docs/records/<experiment>/<run>/``) are runs in this sense.

The steps, each a plain function over plain data (TOML and JSON only: no model code):

1. :func:`discover` turns the command line's directories into :class:`Run` records;
2. :func:`group_runs` puts runs whose configurations differ only in the seed into one
   :class:`Group` (named by the run's preset: its directory name less ``-sSEED``, or by a label);
3. :func:`build_rows` reads one metric per run (optionally at the ensemble λ chosen on valid)
   and aggregates each group: mean, sample standard deviation, seed count, and the difference
   to a baseline group with a Welch t-interval, or paired by seed (a seed fixes the order of
   the batches, so runs of one seed can be compared pair by pair);
4. :func:`to_markdown`, :func:`to_csv`, :func:`to_json` and :func:`plot` present the rows.

Every bad input raises :class:`CompareError` with one line that names the run or group.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from targetlm import config as config_lib
from targetlm.files import write_figure
from targetlm.registry import ConfigError

METRICS = ("ppl", "bleu", "chrf", "accuracy", "macro_f1")  # the last two: classification
LOWER_IS_BETTER = {"ppl": True, "bleu": False, "chrf": False, "accuracy": False, "macro_f1": False}
DIGITS = {"accuracy": 4, "macro_f1": 4}  # fractions: 2 digits would hide the differences
DEFAULT_DECODING = ""  # the figures of the run's own decoding (results.json, eval-*.json)
# configuration keys that never change what a run computes: left out of the grouping key
IGNORED_KEYS = frozenset(
    {
        "train.seed",
        "train.threads",
        "train.progress",
        "train.log_every",
        "train.device",
        "data.dir",  # where the corpus lies on one machine
        "data.tokenizer_file",  # a path (a fine-tuned run's saved tokenizer)
        "train.init_from",  # a path (each seed may start from its own run)
    }
)
SEED_SUFFIX = re.compile(r"-s(\d+)$")
# the largest step a metrics.jsonl record may name (a float holds every whole number up to it)
MAX_STEP = 2**53
# the most points of a learning curve drawn by --plot (a longer one is thinned evenly)
MAX_PLOTTED_POINTS = 2000
TRANSLATE_NAME = re.compile(r"translate-(val|valid|test)-(.*)\.json")
LAMBDA_PART = re.compile(r"(?:^|-)lambda([0-9.]+)(?=-|$)")
SPLIT_NAMES = {"val": "valid", "valid": "valid", "test": "test"}
RESULT_FILES = ("results.json", "eval-*.json", "translate-*.json")


class CompareError(Exception):
    """Input that cannot make a table: the message is one line naming the run or group."""


# figures of one run: (split, metric, decoding) -> {λ: value}; λ 0 is the model alone
FigureKey = tuple[str, str, str]


@dataclass
class Run:
    """One finished run, read from its directory.

    Attributes:
        path: the run directory.
        preset: the directory name less a trailing ``-sSEED`` (the group name by preset).
        label: the ``LABEL:`` given with the directory on the command line ("" if none).
        seed: ``train.seed`` of its config (else the name's ``-sSEED``; None if neither).
        config: the flattened configuration (``{"train.lr": 0.001, ...}``), defaults filled in
            where the config still loads.
        figures: ``{(split, metric, decoding): {λ: value}}``; split is "valid" or "test",
            decoding "" for the run's own decoding, else the translate file's name less split
            and λ (``"k10-predicted"``).
        params: ``total_params`` of results.json (None without one).
        epochs: (the epoch of the best validation, the last epoch) from metrics.jsonl.
        curve: ``[(step, valid ppl), ...]`` from metrics.jsonl, by step.
    """

    path: Path
    preset: str
    label: str
    seed: int | None
    config: dict[str, Any]
    figures: dict[FigureKey, dict[float, float]] = field(default_factory=dict)
    params: int | None = None
    epochs: tuple[int, int] | None = None
    curve: list[tuple[int, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.label}:{self.path}" if self.label else str(self.path)


@dataclass
class Group:
    """Runs that differ only in their seed, under one name (preset or label)."""

    name: str
    label: str
    runs: list[Run]


# ---------------------------------------------------------------------------- 1. discovery


def is_run(path: Path) -> bool:
    """A directory with a config.toml and at least one result file."""
    return (path / "config.toml").is_file() and _has_results(path)


def _has_results(path: Path) -> bool:
    return any(next(path.glob(pattern), None) is not None for pattern in RESULT_FILES)


def split_label(argument: str) -> tuple[str, Path]:
    """``"LABEL:DIR"`` -> ("LABEL", DIR); a plain directory (even one with a colon) -> ("", DIR)."""
    label, colon, rest = argument.partition(":")
    if colon and rest and not Path(argument).exists():
        return label, Path(rest)
    return "", Path(argument)


def discover(
    arguments: Sequence[str], skipped_links: list[Path] | None = None
) -> tuple[list[Run], list[Path]]:
    """The runs named by the command line's ``[LABEL:]DIR`` arguments.

    A DIR is a run or a folder holding runs at any depth (a run's own subfolders are not
    searched). Inside a folder, a directory with a config.toml but no result file yet is an
    unfinished run: it is skipped and returned in the second list. A symbolic link inside a
    folder is not followed (it may lead out of it, or around in a loop): it is skipped and
    added to ``skipped_links`` where given.

    Raises:
        CompareError: a DIR that does not exist, is an unfinished run, or holds no run.
    """
    runs: list[Run] = []
    unfinished: list[Path] = []
    for argument in arguments:
        label, pattern = split_label(argument)
        for root in _expand(pattern):
            found = _runs_under(root, unfinished, skipped_links)
            runs += [read_run(path, label) for path in found]
    return runs, unfinished


def _expand(pattern: Path) -> list[Path]:
    """``pattern`` itself, or the directories its glob characters match (the shell leaves a
    pattern behind ``LABEL:`` alone, so compare expands it)."""
    if pattern.exists() or not any(c in str(pattern) for c in "*?["):
        return [pattern]
    base = Path(pattern.anchor) if pattern.is_absolute() else Path()
    relative = pattern.relative_to(base) if pattern.is_absolute() else pattern
    matches = sorted(p for p in base.glob(str(relative)) if p.is_dir())
    if not matches:
        raise CompareError(f"{pattern}: no directory matches")
    return matches


def _runs_under(
    root: Path, unfinished: list[Path], skipped_links: list[Path] | None = None
) -> list[Path]:
    """The runs of one DIR argument: itself, or the runs it holds."""
    if not root.is_dir():
        raise CompareError(f"{root}: no such directory")
    if (root / "config.toml").is_file() and not _has_results(root):
        raise CompareError(
            f"{root} is not a finished run: it has a config.toml but no results.json, "
            "eval-*.json or translate-*.json"
        )
    before = len(unfinished)
    found = _find_runs(root, unfinished, [] if skipped_links is None else skipped_links)
    if not found and len(unfinished) > before:
        shown = ", ".join(str(path) for path in unfinished[before:])
        raise CompareError(f"{root} holds only unfinished runs (no results yet): {shown}")
    if not found:
        raise CompareError(
            f"{root} is not a run directory (a config.toml beside results.json, "
            "eval-*.json or translate-*.json) and holds none"
        )
    return found


def _find_runs(root: Path, unfinished: list[Path], skipped_links: list[Path]) -> list[Path]:
    if is_run(root):
        return [root]
    if (root / "config.toml").is_file():
        unfinished.append(root)
        return []
    found = []
    for child in sorted(p for p in root.iterdir() if not p.name.startswith(".")):
        if child.is_symlink():
            skipped_links.append(child)
        elif child.is_dir():
            found += _find_runs(child, unfinished, skipped_links)
    return found


def read_run(path: Path, label: str = "") -> Run:
    """One run directory as a :class:`Run` (see :func:`discover`); a file of it that does not
    hold what a run writes is a :class:`CompareError` naming the run."""
    try:
        return _read_run(path, label)
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise CompareError(
            f"{path}: a file of this run does not hold what targetlm writes "
            f"({type(error).__name__}: {error})"
        ) from None


def _read_run(path: Path, label: str) -> Run:
    config = flat_config(_read_toml(path / "config.toml"))
    match = SEED_SUFFIX.search(path.name)
    preset = path.name[: match.start()] if match else path.name
    seed = config.get("train.seed", int(match[1]) if match else None)
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"train.seed = {seed!r} is not a whole number")
    run = Run(path=path, preset=preset, label=label, seed=seed, config=config)
    results = _read_json(path / "results.json") if (path / "results.json").is_file() else None
    if results is not None:
        run.params = results.get("total_params")
        _add_split_figures(run.figures, results, overwrite=False)
    for split in ("valid", "test"):
        evaluated = path / f"eval-{split}.json"
        if evaluated.is_file():
            _add_eval_figures(run.figures, _read_json(evaluated), split)
    for translated in sorted(path.glob("translate-*.json")):
        _add_translate_figures(run.figures, translated)
    metrics = path / "metrics.jsonl"
    if metrics.is_file():
        run.epochs, run.curve = _validation_log(metrics)
    return run


def flat_config(data: dict[str, Any]) -> dict[str, Any]:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}`` (lists as tuples), with the defaults
    of :mod:`targetlm.config` filled in where the table still loads (an old record may not:
    then its keys as written)."""
    with contextlib.suppress(ConfigError, TypeError, ValueError):
        data = config_lib.from_dict(data).to_dict()
    flat: dict[str, Any] = {}

    def walk(table: dict[str, Any], prefix: str) -> None:
        for key, value in table.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, f"{name}.")
            else:
                flat[name] = tuple(value) if isinstance(value, list) else value

    walk(data, "")
    return flat


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return config_lib.load_table(path)
    except ConfigError as error:  # the config reader's message, as compare's error
        raise CompareError(str(error)) from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CompareError(f"{path}: not valid JSON ({error})") from None
    except RecursionError:
        raise CompareError(f"{path}: not a record (nested too deeply)") from None


def _lambda(value: Any) -> float:
    """A record's head-ensemble λ, a number in [0, 1] (ValueError otherwise)."""
    lam = float(value or 0.0)
    if not 0.0 <= lam <= 1.0:  # NaN too
        raise ValueError(f"ensemble λ {value!r} is not in [0, 1]")
    return lam


def _put(figures: dict, key: FigureKey, lam: float, value: Any, overwrite: bool) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if not math.isfinite(value):
        split, metric, _ = key
        raise ValueError(f"{split} {metric} is {value}, not a figure")
    by_lambda = figures.setdefault(key, {})
    if overwrite or lam not in by_lambda:
        by_lambda[lam] = float(value)


def _add_split_figures(figures: dict, splits: dict, overwrite: bool) -> None:
    """results.json or a translation run's eval: ``{"valid": {...}, "test": {...}}``."""
    for split in ("valid", "test"):
        entry = splits.get(split)
        if not isinstance(entry, dict):
            continue
        lam = _lambda(entry.get("ensemble_lambda"))
        for metric in METRICS:
            _put(figures, (split, metric, DEFAULT_DECODING), lam, entry.get(metric), overwrite)


def _add_eval_figures(figures: dict, result: dict, split: str) -> None:
    """eval-SPLIT.json: a language model's ``{"ppl", "ensemble": [{"lambda", "ppl"}]}``, or a
    translation / diffusion run's ``{SPLIT: {...}}``; these full-split figures take precedence
    over results.json's (whose valid figure may be of the slice used for model selection)."""
    if "ppl" not in result:
        _add_split_figures(figures, result, overwrite=True)
        return
    key = (split, "ppl", DEFAULT_DECODING)
    _put(figures, key, 0.0, result["ppl"], overwrite=True)
    for row in result.get("ensemble", []):
        lam = _lambda(row["lambda"])
        if lam != 0.0:
            _put(figures, key, lam, row.get("ppl"), overwrite=True)


def _add_translate_figures(figures: dict, path: Path) -> None:
    match = TRANSLATE_NAME.fullmatch(path.name)
    if match is None:
        return
    split, rest = SPLIT_NAMES[match[1]], match[2]
    summary = _read_json(path)
    found = LAMBDA_PART.search(rest)
    if found is not None:
        lam = _lambda(found[1])
        decoding = (rest[: found.start()] + rest[found.end() :]).strip("-")
    else:
        lam = _lambda(summary.get("ensemble_lambda"))
        decoding = rest
    for metric in ("bleu", "chrf"):
        _put(figures, (split, metric, decoding), lam, summary.get(metric), overwrite=True)


def _validation_log(path: Path) -> tuple[tuple[int, int] | None, list[tuple[int, float]]]:
    """(best epoch, last epoch) and the validation curve of a metrics.jsonl."""
    by_step: dict[int, tuple[int, float]] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise CompareError(f"{path}: not UTF-8 text ({error})") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill: the rest of the log still counts
        except RecursionError:
            raise CompareError(f"{path}, line {number}: not a record (nested too deeply)") from None
        if isinstance(entry, dict) and entry.get("kind") == "valid" and "ppl" in entry:
            step, ppl = entry["step"], entry["ppl"]
            if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
                raise CompareError(f"{path}, line {number}: step {step!r} is not a step count")
            if not isinstance(ppl, (int, float)) or not math.isfinite(ppl):
                raise CompareError(f"{path}, line {number}: valid ppl {ppl!r} is not a figure")
            by_step[step] = (int(entry.get("epoch", 0)), float(ppl))
    if not by_step:
        return None, []
    ordered = sorted(by_step.items())
    best = min(ordered, key=lambda item: item[1][1])[1][0]
    last = max(epoch for _, (epoch, _) in ordered)
    return (best, last), [(step, ppl) for step, (_, ppl) in ordered]


# ------------------------------------------------------------------------------- 2. groups


def check_one_task(runs: Sequence[Run]) -> None:
    """Refuse runs of several tasks in one table: a language model's, a masked LM's, a
    classifier's and a translation's figures are different measures under one column name."""
    kinds: dict[str, int] = {}
    for run in runs:
        kind = str(run.config.get("task.kind", "lm"))
        kinds[kind] = kinds.get(kind, 0) + 1
    if len(kinds) > 1:
        counted = ", ".join(f"{kind}: {n} runs" for kind, n in sorted(kinds.items()))
        raise CompareError(
            f"the runs are of several tasks ({counted}); their figures are different measures: "
            "compare each task's runs in a table of their own"
        )


def group_runs(runs: Sequence[Run], group_by: str = "preset") -> list[Group]:
    """Runs under one name, in the order first seen; each group's runs differ only in seed.

    Args:
        runs: from :func:`discover`.
        group_by: "preset" (the directory name less ``-sSEED``, after the label if any:
            ``LABEL/PRESET``) or "label" (the ``LABEL:`` of the command line).

    Raises:
        CompareError: a run without a label under ``group_by="label"``; runs of one group
            whose configurations differ in more than the seed (every differing key listed);
            one seed twice in a group.
    """
    groups: dict[str, Group] = {}
    for run in runs:
        if group_by == "label":
            if not run.label:
                raise CompareError(f"--group-by label: {run.path} has no label (write LABEL:DIR)")
            name = run.label
        else:
            name = f"{run.label}/{run.preset}" if run.label else run.preset
        groups.setdefault(name, Group(name, run.label, [])).runs.append(run)
    for group in groups.values():
        group.runs.sort(key=lambda r: (r.seed is None, r.seed or 0, str(r.path)))
        _check_only_seed_differs(group)
    return list(groups.values())


def _check_only_seed_differs(group: Group) -> None:
    absent = "(absent)"
    keys = sorted(set().union(*(run.config for run in group.runs)) - IGNORED_KEYS)
    differing = []
    for key in keys:
        first_seen: dict[str, Run] = {}
        for run in group.runs:
            first_seen.setdefault(repr(run.config.get(key, absent)), run)
        if len(first_seen) > 1:
            shown = ", ".join(f"{value} in {run.path}" for value, run in first_seen.items())
            differing.append(f"{key} ({shown})".replace("'(absent)'", absent))
    if differing:
        raise CompareError(
            f"group {group.name!r}: its runs differ in more than the seed: "
            + "; ".join(differing)
            + " (give each setting its own LABEL:DIR)"
        )
    seeds = Counter(run.seed for run in group.runs)
    twice = [seed for seed, count in seeds.items() if count > 1]
    if twice:
        paths = ", ".join(str(r.path) for r in group.runs if r.seed == twice[0])
        raise CompareError(
            f"group {group.name!r}: seed {twice[0]} more than once ({paths}; give each "
            "folder its own LABEL:DIR)"
        )


# ------------------------------------------------------------------------------ 3. numbers


@dataclass
class Spread:
    """Values over seeds: their mean and sample standard deviation (n - 1; None for n < 2)."""

    values: list[float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float | None:
        return statistics.stdev(self.values) if self.n > 1 else None

    def text(self, digits: int = 2) -> str:
        """``"5.18 ± 0.26"`` (the mean alone for one seed)."""
        if self.sd is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.sd:.{digits}f}"


@dataclass
class Difference:
    """mean(group) - mean(baseline) with a 95 % t-interval (None where n < 2): Welch's over
    the two groups, or, when ``pairs`` is set, the mean of the differences of the runs with
    the same seed (those seeds in ``pairs``) and their one-sample interval."""

    delta: float
    low: float | None
    high: float | None
    df: float | None
    pairs: list[int] | None = None

    def text(self, digits: int = 2) -> str:
        if self.low is None or self.high is None:
            return f"{self.delta:+.{digits}f} [n < 2: no interval]"
        return f"{self.delta:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below the mean
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * fraction / a


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(probability: float, df: float) -> float:
    """The t with P(T <= t) = ``probability`` (in (0.5, 1)), by bisection on the CDF."""
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < probability:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if student_t_cdf(middle, df) < probability:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def welch_difference(group: Spread, baseline: Spread, level: float = 0.95) -> Difference:
    """mean(group) - mean(baseline), and Welch's t-interval at ``level``: the difference
    ± t(df) · sqrt(s₁²/n₁ + s₂²/n₂), df by Welch–Satterthwaite. Needs two seeds on each side."""
    delta = group.mean - baseline.mean
    if group.sd is None or baseline.sd is None:
        return Difference(delta, None, None, None)
    part_group = group.sd**2 / group.n
    part_baseline = baseline.sd**2 / baseline.n
    se = math.sqrt(part_group + part_baseline)
    if se == 0.0:  # identical values on both sides: no spread to widen the difference
        return Difference(delta, delta, delta, math.inf)
    df = se**4 / (part_group**2 / (group.n - 1) + part_baseline**2 / (baseline.n - 1))
    half = student_t_quantile(1 - (1 - level) / 2, df) * se
    return Difference(delta, delta - half, delta + half, df)


def paired_difference(
    group: dict[int, float], baseline: dict[int, float], level: float = 0.95
) -> Difference:
    """The mean of group[seed] - baseline[seed] over the seeds both have, and its t-interval
    at ``level``: mean ± t(n - 1) · sd / √n (n pairs; no interval for n < 2). ``group`` and
    ``baseline`` map seeds to values; at least one seed must be shared."""
    seeds = sorted(group.keys() & baseline.keys())
    if not seeds:
        raise ValueError("no seed in common")
    differences = Spread([group[seed] - baseline[seed] for seed in seeds])
    mean, sd, n = differences.mean, differences.sd, differences.n
    if sd is None:
        return Difference(mean, None, None, None, seeds)
    half = student_t_quantile(1 - (1 - level) / 2, n - 1) * sd / math.sqrt(n)
    return Difference(mean, mean - half, mean + half, n - 1, seeds)


@dataclass
class Row:
    """One group at one decoding: what each output format shows.

    ``test`` is the figure the comparison is about: the test metric at the λ given per run in
    ``lambdas`` (None for a run without a head ensemble: its model alone), else at λ 0.
    """

    group: Group
    decoding: str
    metric: str
    valid: Spread | None  # λ 0, None if a run lacks it
    test_alone: Spread  # λ 0
    test: Spread
    lambdas: list[float | None]
    lambda_rule: str  # "" | "valid" | "fixed"
    difference: Difference | None = None
    baseline: str | None = None

    @property
    def seeds(self) -> list[int | None]:
        return [run.seed for run in self.group.runs]


def build_rows(
    groups: Sequence[Group],
    metric: str = "ppl",
    lambda_on: str | None = None,
    fixed_lambda: float | None = None,
    decoding: str | None = None,
    baseline: str | None = None,
    paired: bool = False,
) -> list[Row]:
    """One :class:`Row` per group and decoding (every decoding the group's runs have, or the
    one named), with the ensemble λ chosen on valid per run (``lambda_on="valid"``) or fixed,
    and the difference to ``baseline`` at the same decoding.

    Args:
        groups: from :func:`group_runs`.
        metric: "ppl" (lower is better), "bleu", "chrf", or a classifier's "accuracy" or
            "macro_f1" (results.json's valid and test figures).
        lambda_on: "valid": each run's λ is the best of its valid figures (λ 0 included), then
            read at that λ on test.
        fixed_lambda: read every run that has a head ensemble at this λ.
        decoding: only this decoding ("" is the run's own; else a translate file's, e.g.
            ``"k20-predicted"``).
        baseline: a group name, or a preset that names one group per label (``LABEL/NAME``).
        paired: the difference to ``baseline`` paired by seed (:func:`paired_difference`)
            instead of Welch's.

    Raises:
        CompareError: a run lacks the metric (or the decoding, the valid figures to choose λ
            on, or the test figure at its λ); the baseline names no group; ``paired`` without
            a baseline, or a group that shares no seed with it.
    """
    if metric not in METRICS:
        raise CompareError(f"--metric: {metric!r} is not one of {', '.join(METRICS)}")
    if lambda_on not in (None, "valid"):
        raise CompareError(f"--lambda-on: {lambda_on!r} is not 'valid'")
    if lambda_on is not None and fixed_lambda is not None:
        raise CompareError("--lambda-on and --lambda exclude each other: choose λ or fix it")
    if paired and baseline is None:
        raise CompareError("--paired: pairs runs with the baseline's by seed; give --baseline")
    rows: list[Row] = []
    for group in groups:
        for name in _decodings(group, metric, decoding):
            rows.append(_row(group, metric, name, lambda_on, fixed_lambda))
    if baseline is not None:
        _add_differences(rows, groups, baseline, paired)
    return rows


def _describe_figures(run: Run) -> str:
    have = sorted({(split, metric, dec or "default") for split, metric, dec in run.figures})
    return ", ".join(f"{split} {metric} ({dec})" for split, metric, dec in have) or "no figures"


def _decodings(group: Group, metric: str, decoding: str | None) -> list[str]:
    """The decodings every run of ``group`` has a test ``metric`` for, checked run by run."""
    per_run = [
        {dec for split, m, dec in run.figures if split == "test" and m == metric}
        for run in group.runs
    ]
    for run, have in zip(group.runs, per_run):
        if not have:
            raise CompareError(f"{run.name} has no test {metric}; it has: {_describe_figures(run)}")
        if decoding is not None and decoding not in have:
            shown = ", ".join(sorted(d or "''" for d in have))
            raise CompareError(
                f"{run.name} has no test {metric} with decoding {decoding or chr(39) * 2}; "
                f"it has: {shown}"
            )
    if decoding is not None:
        return [decoding]
    union = set().union(*per_run)
    for run, have in zip(group.runs, per_run):
        if have != union:
            missing = ", ".join(sorted(d or "default" for d in union - have))
            raise CompareError(
                f"{run.name} lacks the test {metric} of decoding {missing} that other runs of "
                f"group {group.name!r} have (pick one with --decoding)"
            )
    return sorted(union)


def _row(
    group: Group, metric: str, decoding: str, lambda_on: str | None, fixed: float | None
) -> Row:
    lower = LOWER_IS_BETTER[metric]
    shown = decoding or "default"
    valid_alone, test_alone, test, lambdas = [], [], [], []
    for run in group.runs:
        on_test = run.figures[("test", metric, decoding)]
        on_valid = run.figures.get(("valid", metric, decoding), {})
        if 0.0 not in on_test:
            raise CompareError(
                f"{run.name} has no test {metric} of the model alone (λ 0) for decoding {shown}"
            )
        test_alone.append(on_test[0.0])
        valid_alone.append(on_valid.get(0.0))
        has_ensemble = any(lam > 0 for lam in on_test) or any(lam > 0 for lam in on_valid)
        lam: float | None = None
        if lambda_on == "valid" and has_ensemble:
            if not any(lam > 0 for lam in on_valid):
                raise CompareError(
                    f"--lambda-on valid: {run.name} has no valid {metric} of its head ensemble "
                    f"(λ > 0) for decoding {shown} to choose λ on"
                )
            lam = (min if lower else max)(on_valid, key=lambda x: (on_valid[x], x))
        elif fixed is not None and has_ensemble:
            lam = fixed
        if lam is not None and lam not in on_test:
            have = ", ".join(f"{x:g}" for x in sorted(on_test))
            how = "chosen on valid" if lambda_on else "given"
            raise CompareError(
                f"{run.name} has no test {metric} at λ {lam:g} ({how}) for decoding {shown}; "
                f"it has λ {have}"
            )
        lambdas.append(lam)
        test.append(on_test[lam if lam is not None else 0.0])
    present = [v for v in valid_alone if v is not None]
    valid = Spread(present) if len(present) == len(valid_alone) else None
    rule = "valid" if lambda_on else "fixed" if fixed is not None else ""
    return Row(group, decoding, metric, valid, Spread(test_alone), Spread(test), lambdas, rule)


def _add_differences(rows: list[Row], groups: Sequence[Group], baseline: str, paired: bool) -> None:
    names = {group.name for group in groups}
    labelled = {f"{group.label}/{baseline}" for group in groups if group.label}
    if baseline not in names and not labelled & names:
        raise CompareError(f"--baseline: no group {baseline!r}; groups: {', '.join(names)}")
    by_key = {(row.group.name, row.decoding): row for row in rows}
    for row in rows:
        name = baseline if baseline in names else f"{row.group.label}/{baseline}"
        reference = by_key.get((name, row.decoding))
        if reference is None:
            continue
        row.baseline = name
        if name == row.group.name:  # the baseline's own row says "baseline"
            continue
        if not paired:
            row.difference = welch_difference(row.test, reference.test)
            continue
        values, reference_values = _values_by_seed(row), _values_by_seed(reference)
        try:
            row.difference = paired_difference(values, reference_values)
        except ValueError:
            raise CompareError(
                f"--paired: {row.group.name} (seeds {_seeds_text(values)}) shares no "
                f"seed with {name} (seeds {_seeds_text(reference_values)})"
            ) from None


def _values_by_seed(row: Row) -> dict[int, float]:
    """The row's test figure per seed; a run without a seed cannot be paired."""
    values = {}
    for run, value in zip(row.group.runs, row.test.values):
        if run.seed is None:
            raise CompareError(f"--paired: {run.name} has no train.seed to pair it by")
        values[run.seed] = value
    return values


def _seeds_text(values: dict[int, float]) -> str:
    return ", ".join(str(seed) for seed in sorted(values))


# ------------------------------------------------------------------------------ 4. output


def _range(values: Sequence[Any]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    low, high = min(present), max(present)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _lambda_text(lambdas: Sequence[float | None]) -> str:
    """The λ of each run: one value when all agree, else the mode and every seed's."""
    present = [lam for lam in lambdas if lam is not None]
    if not present:
        return "–"
    counts = Counter(present)
    if len(counts) == 1 and len(present) == len(lambdas):
        return f"{present[0]:g}"
    mode = counts.most_common(1)[0][0]
    each = ", ".join("–" if lam is None else f"{lam:g}" for lam in lambdas)
    return f"{mode:g} ({each})"


def _epochs_text(group: Group) -> str:
    pairs = [run.epochs for run in group.runs if run.epochs is not None]
    if len(pairs) < len(group.runs):
        return "–"
    return f"{_range([p[0] for p in pairs])}/{_range([p[1] for p in pairs])}"


def _columns(rows: Sequence[Row]) -> dict[str, bool]:
    return {
        "decoding": any(row.decoding != DEFAULT_DECODING for row in rows),
        "lambda": any(row.lambda_rule for row in rows),
        "baseline": any(row.baseline is not None for row in rows),
    }


def _table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """Header and cells shared by markdown and csv."""
    show = _columns(rows)
    metric = rows[0].metric if rows else "ppl"
    digits = DIGITS.get(metric, 2)
    header = ["group"] + (["decoding"] if show["decoding"] else [])
    header += ["n", "params", "epochs (best/last)", f"valid {metric}", f"test {metric}"]
    if show["lambda"]:
        rule = rows[0].lambda_rule
        header += ["λ (valid)" if rule == "valid" else "λ", f"test {metric} at λ"]
    header.append(f"test {metric} per seed")
    if show["baseline"]:
        baselines = sorted({row.baseline for row in rows if row.baseline})
        header.append(f"Δ vs {' / '.join(baselines)} [95% CI]")
    cells = []
    for row in rows:
        line = [row.group.name] + ([row.decoding or "default"] if show["decoding"] else [])
        line += [
            str(row.test.n),
            _range([run.params for run in row.group.runs]),
            _epochs_text(row.group),
            row.valid.text(digits) if row.valid else "–",
            row.test_alone.text(digits),
        ]
        if show["lambda"]:
            line += [_lambda_text(row.lambdas), row.test.text(digits)]
        line.append(
            ", ".join(
                f"s{seed}: {value:.{digits}f}" if seed is not None else f"{value:.{digits}f}"
                for seed, value in zip(row.seeds, row.test.values)
            )
        )
        if show["baseline"]:
            if row.baseline == row.group.name:
                line.append("baseline")
            elif row.difference is None:
                line.append("–")
            else:
                pairs = row.difference.pairs
                shown = f" ({len(pairs)} pairs)" if pairs and len(pairs) < row.test.n else ""
                line.append(row.difference.text(digits) + shown)
        cells.append(line)
    return header, cells


def to_markdown(rows: Sequence[Row]) -> str:
    """A markdown table, then one line saying what the numbers are."""
    header, cells = _table(rows)
    align = ["---" if h in ("group", "decoding") or "per seed" in h else "---:" for h in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(line) + " |" for line in cells]
    notes = "mean ± sample sd over seeds (n); epochs: of the best validation / the last"
    if rows and rows[0].lambda_rule == "valid":
        notes += "; λ: each run's best on valid, read on test (one value, or the mode and each)"
    if _columns(rows)["baseline"]:
        if any(row.difference and row.difference.pairs for row in rows):
            notes += (
                "; Δ: mean difference to the baseline's run of the same seed, 95% paired "
                "t-interval (pairs: the seeds both have)"
            )
        else:
            notes += "; Δ: difference of means, 95% Welch t-interval"
    return "\n".join(lines) + f"\n\n{notes}.\n"


def to_csv(rows: Sequence[Row]) -> str:
    """The same table as CSV, with means and sds in their own columns."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        [
            "group", "decoding", "metric", "n", "seeds", "params", "best_epoch", "last_epoch",
            "valid_mean", "valid_sd", "test_alone_mean", "test_alone_sd", "lambdas",
            "test_mean", "test_sd", "baseline", "delta", "delta_low", "delta_high",
            "delta_paired_seeds",
        ]
    )  # fmt: skip

    def number(value: float | None) -> str:
        return "" if value is None else repr(value)

    for row in rows:
        epochs = [run.epochs for run in row.group.runs]
        writer.writerow(
            [
                row.group.name,
                row.decoding,
                row.metric,
                row.test.n,
                " ".join(str(s) for s in row.seeds),
                _range([run.params for run in row.group.runs]).replace(",", ""),
                " ".join(str(e[0]) for e in epochs if e),
                " ".join(str(e[1]) for e in epochs if e),
                number(row.valid.mean if row.valid else None),
                number(row.valid.sd if row.valid else None),
                number(row.test_alone.mean),
                number(row.test_alone.sd),
                _lambda_cells(row.lambdas),
                number(row.test.mean),
                number(row.test.sd),
                row.baseline or "",
                number(row.difference.delta if row.difference else None),
                number(row.difference.low if row.difference else None),
                number(row.difference.high if row.difference else None),
                " ".join(map(str, row.difference.pairs or [])) if row.difference else "",
            ]
        )
    return out.getvalue()


def _lambda_cells(lambdas: Sequence[float | None]) -> str:
    """Each run's λ, space-separated ("-" for a run without an ensemble; "" if none has one)."""
    if all(lam is None for lam in lambdas):
        return ""
    return " ".join("-" if lam is None else f"{lam:g}" for lam in lambdas)


def to_json(rows: Sequence[Row]) -> str:
    """One JSON object: ``{"rows": [...]}``, every value per seed and every aggregate."""

    def spread(s: Spread | None) -> dict | None:
        return None if s is None else {"mean": s.mean, "sd": s.sd, "n": s.n, "values": s.values}

    out = []
    for row in rows:
        entry = {
            "group": row.group.name,
            "decoding": row.decoding,
            "metric": row.metric,
            "runs": [str(run.path) for run in row.group.runs],
            "seeds": row.seeds,
            "params": [run.params for run in row.group.runs],
            "epochs": [list(run.epochs) if run.epochs else None for run in row.group.runs],
            "valid": spread(row.valid),
            "test_alone": spread(row.test_alone),
            "test": spread(row.test),
            "lambdas": row.lambdas,
            "lambda_rule": row.lambda_rule or None,
            "baseline": row.baseline,
            "difference": None,
        }
        if row.difference is not None:
            entry["difference"] = {
                "delta": row.difference.delta,
                "low": row.difference.low,
                "high": row.difference.high,
                "df": row.difference.df,
                "level": 0.95,
                "paired_seeds": row.difference.pairs,
            }
        out.append(entry)
    return json.dumps({"rows": out}, indent=1) + "\n"


def plot(rows: Sequence[Row], path: str | Path) -> None:
    """Learning curves (valid ppl by step: the mean over seeds, the band min–max) of each
    group; beside them, where λ is chosen or fixed, the valid figure by λ of each group with
    an ensemble (mean and min–max over seeds). Written with :func:`~targetlm.files.write_figure`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [row for row in rows if any(lam is not None for lam in row.lambdas)]
    fig, axes = plt.subplots(1, 2 if sweeps else 1, figsize=(11 if sweeps else 6, 4))
    axes = list(axes) if sweeps else [axes]
    # one colour per group in both panels (base draws no λ sweep); one line style per decoding
    names = dict.fromkeys(row.group.name for row in rows)
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    decodings = dict.fromkeys(row.decoding for row in sweeps)
    styles = {d: ("-", "--", ":", "-.")[i % 4] for i, d in enumerate(decodings)}
    seen = set()
    for row in rows:
        if row.group.name in seen:
            continue
        seen.add(row.group.name)
        curves = [dict(run.curve) for run in row.group.runs if run.curve]
        if not curves:
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        if not steps:
            continue
        if len(steps) > MAX_PLOTTED_POINTS:  # more than a figure can show: evenly thinned
            stride = math.ceil(len(steps) / MAX_PLOTTED_POINTS)
            steps = steps[::stride] + ([steps[-1]] if (len(steps) - 1) % stride else [])
        values = [[c[s] for c in curves] for s in steps]
        color = colors[row.group.name]
        axes[0].plot(
            steps, [statistics.fmean(v) for v in values], color=color, label=row.group.name
        )
        axes[0].fill_between(
            steps, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.2,
        )  # fmt: skip
    axes[0].set(xlabel="step", ylabel="valid ppl", title="learning curves (mean, min–max)")
    axes[0].set_yscale("log")
    if axes[0].lines:  # runs without a validation log draw no curve
        axes[0].legend(fontsize="small")
    for row in sweeps:
        key = ("valid", row.metric, row.decoding)
        grids = [run.figures.get(key, {}) for run in row.group.runs]
        lambdas = sorted(set.intersection(*(set(g) for g in grids))) if all(grids) else []
        if not lambdas:
            continue
        values = [[g[lam] for g in grids] for lam in lambdas]
        name = row.group.name + (f" ({row.decoding})" if row.decoding else "")
        color = colors[row.group.name]
        axes[1].plot(
            lambdas, [statistics.fmean(v) for v in values], marker="o",
            linestyle=styles[row.decoding], color=color, label=name,
        )  # fmt: skip
        axes[1].fill_between(
            lambdas, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.2,
        )  # fmt: skip
    if sweeps:
        metric = rows[0].metric
        axes[1].set(xlabel="λ", ylabel=f"valid {metric}", title="head ensemble: λ sweep on valid")
        if axes[1].lines:
            axes[1].legend(fontsize="small")
    fig.tight_layout()
    path = Path(path)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):  # left by a killed write
        stale.unlink(missing_ok=True)
    write_figure(path, fig)
    plt.close(fig)
