"""``targetlm compare DIR...``: the table of finished runs (or committed records), grouped
by setting with the seeds aggregated; see :mod:`targetlm.compare`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from targetlm import compare
from targetlm.cli.common import combiner_range, number_in
from targetlm.cli.outputs import add_force_option, check_output, run_inputs

PLOT_FORMATS = (".png", ".pdf", ".svg")


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm compare``; returns the exit status (2: bad input, one line on stderr)."""
    try:
        if args.plot is not None:
            plot = Path(args.plot)
            if plot.suffix.lower() not in PLOT_FORMATS:
                raise compare.CompareError(
                    f"--plot: {plot} should end in one of {', '.join(PLOT_FORMATS)}"
                )
            if not plot.parent.is_dir():
                raise compare.CompareError(f"--plot: no directory {plot.parent} to write into")
        links: list[Path] = []
        runs, unfinished = compare.discover(args.dirs, links)
        if args.plot is not None:  # never over a compared run's file; --force to replace
            inputs = [path for run in runs for path in run_inputs(run.path)]
            inputs += [path for run_dir in unfinished for path in run_inputs(run_dir)]
            check_output(args.plot, "--plot", inputs, args.force)
        compare.check_one_task(runs)
        groups = compare.group_runs(runs, args.group_by)
        rows = compare.build_rows(
            groups,
            metric=args.metric,
            lambda_on=args.lambda_on,
            fixed_lambda=args.fixed_lambda,
            decoding=args.decoding,
            baseline=args.baseline,
            paired=args.paired,
        )
    except compare.CompareError as error:
        print(f"targetlm: error: {error}", file=sys.stderr)
        return 2
    if unfinished:
        shown = ", ".join(str(path) for path in unfinished)
        print(
            f"targetlm compare: skipped unfinished runs (no results yet): {shown}", file=sys.stderr
        )
    if links:
        shown = ", ".join(str(path) for path in links)
        print(
            f"targetlm compare: skipped symbolic links (not followed out of a folder): {shown}",
            file=sys.stderr,
        )
    formats = {"md": compare.to_markdown, "csv": compare.to_csv, "json": compare.to_json}
    sys.stdout.write(formats[args.format](rows))
    if args.plot is not None:
        compare.plot(rows, args.plot)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm compare`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "compare",
        help="tables of finished runs: mean ± sd over seeds per setting, λ, Δ to a baseline",
        description="Read run directories or committed records (a run: config.toml with "
        "results.json, eval-*.json or translate-*.json), group the runs that differ only in "
        "seed, and print mean ± sample sd per group.",
    )
    p.add_argument(
        "dirs",
        nargs="+",
        metavar="[LABEL:]DIR",
        help="a run, or a folder of runs (searched at any depth); LABEL: names its runs' group "
        "(--group-by label) or prefixes their preset (LABEL/PRESET)",
    )
    p.add_argument(
        "--group-by",
        choices=["preset", "label"],
        default="preset",
        help="preset: the run directory's name less -sSEED (default); label: the LABEL: given",
    )
    p.add_argument("--metric", choices=list(compare.METRICS), default="ppl")
    choice = p.add_mutually_exclusive_group()
    choice.add_argument(
        "--lambda-on",
        choices=["valid"],
        help="each run's head-ensemble λ: the best on valid, then read on test",
    )
    choice.add_argument(
        "--lambda",
        dest="fixed_lambda",
        type=number_in(combiner_range("head_ensemble", "lambdas")),
        metavar="L",
        help="read every run with a head ensemble at this λ (e.g. the paper's)",
    )
    p.add_argument(
        "--decoding",
        help="only this decoding of translate-*.json (e.g. k20-predicted; '' the run's own); "
        "default: a row per decoding",
    )
    p.add_argument(
        "--baseline",
        metavar="GROUP",
        help="the difference of each group to GROUP (or to LABEL/GROUP within each label), "
        "with a 95%% Welch t-interval",
    )
    p.add_argument(
        "--paired",
        action="store_true",
        help="the difference to the baseline paired by seed (each run against the baseline's "
        "run of its seed, over the seeds both have), with a 95%% paired t-interval",
    )
    p.add_argument("--format", choices=["md", "csv", "json"], default="md")
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="also draw the groups' learning curves (and the λ sweep on valid) into PNG",
    )
    add_force_option(p)
    p.set_defaults(func=run)
