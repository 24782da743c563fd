"""Plot the gradient diversity logged by experiments/diversity.sh (Heo et al. 2025, Fig. 2).

python experiments/plot_diversity.py [--runs runs/diversity] [--out docs/figures/gradient-diversity.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/diversity"))
    parser.add_argument("--out", type=Path, default=Path("docs/figures/gradient-diversity.png"))
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for run in sorted(args.runs.glob("*-s*")):
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        points = [(r["step"], r["gradient_diversity"]) for r in records if r["kind"] == "diversity"]
        if points:
            steps, values = zip(*points)
            mean = sum(values) / len(values)
            ax.plot(steps, values, marker="o", markersize=3, label=f"{run.name} (mean {mean:.3f})")
            print(f"{run.name}: {len(values)} measurements, mean {mean:.4f}, last {values[-1]:.4f}")
    ax.set_xlabel("training step")
    ax.set_ylabel("gradient diversity")
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
