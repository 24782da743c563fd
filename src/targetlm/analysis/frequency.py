"""Per-token loss differences by training frequency (Pappas et al. 2020, Figure 3)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from targetlm.files import write_figure
from targetlm.inference.scoring import TokenScores

# bin k holds words seen [EDGES[k], EDGES[k+1]) times in training; 0 = new words
EDGES = (0, 1, 10, 100, 1_000, 10_000)


def frequency_bin_table(
    first: TokenScores,
    second: TokenScores,
    train_counts: dict[str, int],
    edges: Sequence[int] = EDGES,
) -> list[dict[str, Any]]:
    """Median of ``loss_first − loss_second`` per token, by the target's training count.

    Both scores must be of the same text. Negative medians: ``first`` is better in that bin.
    """
    if first.targets != second.targets:
        raise ValueError("the two scores are of different texts")
    groups: dict[int, list[float]] = {k: [] for k in range(len(edges))}
    differences = (second.log_probs.double() - first.log_probs.double()).tolist()
    for word, difference in zip(first.targets, differences):
        count = train_counts.get(word, 0)
        groups[max(k for k, edge in enumerate(edges) if count >= edge)].append(difference)
    rows = []
    for k, values in groups.items():
        upper = f"{edges[k + 1] - 1}" if k + 1 < len(edges) else "inf"
        rows.append(
            {
                "bin": f"{edges[k]}-{upper}" if edges[k] else "new (0)",
                "tokens": len(values),
                "median_loss_difference": statistics.median(values) if values else None,
            }
        )
    return rows


def plot_frequency_bins(rows: list[dict[str, Any]], path: Path, label: str) -> None:
    """Bar chart of the median loss differences per frequency bin, in the format of ``path``'s
    suffix (.png, .pdf, .svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["median_loss_difference"] is not None]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar([r["bin"] for r in shown], [r["median_loss_difference"] for r in shown])
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("training frequency of the target word")
    ax.set_ylabel("median loss difference (nats)")
    ax.set_title(label, fontsize=9)
    fig.tight_layout()
    write_figure(path, fig)
    plt.close(fig)
