"""``report.md`` and the learning-curve plot of a run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from targetlm.config import Config
from targetlm.files import write_figure

CURVE = "learning_curve.png"

# the figures of a report's results table, by the figure of the test split that says what
# kind of run it is: (heading, key of the split's results, format)
FIGURES: dict[str, list[tuple[str, str, str]]] = {
    "bleu": [  # a translation run
        ("perplexity", "ppl", ".2f"),
        ("tokens", "tokens", ","),
        ("BLEU", "bleu", ".2f"),
        ("chrF", "chrf", ".2f"),
    ],
    "unigram_ppl": [  # a language model
        ("perplexity", "ppl", ".2f"),
        ("unigram perplexity", "unigram_ppl", ".2f"),
        ("tokens", "tokens", ","),
        ("OOV rate", "oov_rate", ".2%"),
    ],
}


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def plot_learning_curve(metrics: list[dict[str, Any]], path: Path) -> bool:
    """Training and validation perplexity against steps (log scale). False if nothing to plot."""
    train = [(m["step"], m["ppl"]) for m in metrics if m["kind"] == "train"]
    valid = [(m["step"], m["ppl"]) for m in metrics if m["kind"] == "valid"]
    if not train and not valid:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    if train:
        axes.plot(*zip(*train), label="train", linewidth=1)
    if valid:
        axes.plot(*zip(*valid), "o-", label="valid")
    axes.set_xlabel("step")
    axes.set_ylabel("perplexity")
    axes.set_yscale("log")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    write_figure(path, figure, dpi=100)
    plt.close(figure)
    return True


def _heads(config: Config) -> str:
    heads = config.model.heads
    if heads.kind == "none":
        return ""
    options = ", ".join(f"{key} = {value}" for key, value in heads.options.items())
    return f" · heads `{heads.kind}`" + (f" ({options})" if options else "")


def write_report(run_dir: Path, config: Config, results: dict[str, Any]) -> Path:
    has_curve = plot_learning_curve(read_metrics(run_dir), run_dir / CURVE)
    lines = [
        f"# targetlm run: {run_dir.name}",
        "",
        f"Data `{config.data.name}` · encoder `{config.model.encoder.kind}` · output "
        f"`{config.model.output.kind}` · objective `{config.objective.kind}`"
        + _heads(config)
        + f" · vocabulary {results['vocab_size']:,}",
        "",
    ]
    test = results["test"]
    kind = next((key for key in FIGURES if key in test), None)
    # another task (masked LM, classification): its own figures, as reported
    own = [(key, key, "") for key, value in test.items() if isinstance(value, (int, float))]
    lines += _splits_table(results, FIGURES[kind] if kind else own)
    if kind == "bleu":
        lines += ["", f"Beam {test['beam']}; `{test['bleu_signature']}`."]
    lines += ["", "| part | parameters |", "|---|---:|"]
    lines += [f"| {part} | {count:,} |" for part, count in results["params"].items()]
    lines += [f"| **total** | **{results['total_params']:,}** |", ""]
    lines.append(f"Training: {results['steps']:,} steps, {results['wall_time_s']:.1f} s wall time.")
    if has_curve:
        lines += ["", f"![learning curve]({CURVE})"]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _splits_table(results: dict[str, Any], figures: list[tuple[str, str, str]]) -> list[str]:
    """A results table: a row per split (valid, test), a column per figure (heading, key of
    the split's results, format; "": :func:`_figure`'s)."""
    headings = [heading for heading, _, _ in figures]
    lines = ["| split | " + " | ".join(headings) + " |", "|---|" + "---:|" * len(figures)]
    for split in ("valid", "test"):
        row = results[split]
        cells = [format(row[key], spec) if spec else _figure(row[key]) for _, key, spec in figures]
        lines.append(f"| {split} | " + " | ".join(cells) + " |")
    return lines


def _figure(value: float) -> str:
    """A number of a results table: integers with separators, others to 4 digits."""
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"
