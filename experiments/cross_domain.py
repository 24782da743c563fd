"""Cross-domain, open-vocabulary evaluation on Brown genres (Pappas et al. 2020, Table 5 analog).

    python experiments/cross_domain.py RUN [RUN ...] [--genres news,editorial,...] [--out FILE]

Each genre (lower-cased, as PTB is) is cut by lines into a finetuning part [0, 0.8), a
validation part [0.8, 0.9) and a test part [0.9, 1) (``data.train = "news[:0.8]"`` etc. for
``targetlm finetune``). Every run is scored on each genre's test part in open vocabulary:
alone, with a unigram cache and with a neural cache, the cache weights (and θ) chosen on the
validation part from small grids. Prints a markdown table and writes all figures as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from targetlm.config import DataConfig
from targetlm.data.datasets import read_split
from targetlm.inference.scoring import Combiners, score_text
from targetlm.runs import load_run

NEAR, FAR = ("news", "editorial"), ("fiction", "learned")
UNIGRAM_GRID = [Combiners(unigram_cache=lam) for lam in (0.1, 0.2, 0.3, 0.4, 0.5)]
NEURAL_GRID = [
    Combiners(neural_cache=lam, neural_theta=theta, neural_window=500)
    for lam in (0.1, 0.2, 0.3)
    for theta in (0.3, 1.0, 3.0)
]


def _score(model, vocab, config, tokens, combiners: Combiners) -> dict:
    scores = score_text(
        model,
        vocab,
        tokens,
        open_vocabulary=True,
        combiners=combiners,
        batch_size=config.eval.batch_size,
        segment=config.data.bptt,
    )
    return scores.summary()


def evaluate_run(run: Path, genres: list[str]) -> list[dict]:
    config, vocab, model, _ = load_run(run)
    brown = DataConfig(name="brown", lowercase=True)
    rows = []
    for genre in genres:
        valid = read_split(brown, f"{genre}[0.8:0.9]")
        test = read_split(brown, f"{genre}[0.9:]")
        row = {
            "run": str(run),
            "genre": genre,
            "alone": _score(model, vocab, config, test, Combiners()),
        }
        for name, grid in (("unigram_cache", UNIGRAM_GRID), ("neural_cache", NEURAL_GRID)):
            best = min(grid, key=lambda c: _score(model, vocab, config, valid, c)["ppl"])
            row[name] = {**_score(model, vocab, config, test, best), "combiners": best.__dict__}
        rows.append(row)
        print(
            f"{run.name:>24} {genre:>10}: alone {row['alone']['ppl']:8.1f} "
            f"(oov {row['alone']['oov_rate']:.3f}) unigram {row['unigram_cache']['ppl']:8.1f} "
            f"neural {row['neural_cache']['ppl']:8.1f}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--genres", default=",".join(NEAR + FAR))
    parser.add_argument("--out", type=Path, default=Path("runs/cross-domain.json"))
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [row for run in args.runs for row in evaluate_run(run, args.genres.split(","))]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print("\n| run | genre | OOV rate | alone | + unigram cache | + neural cache |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {Path(r['run']).name} | {r['genre']} | {r['alone']['oov_rate']:.3f} "
            f"| {r['alone']['ppl']:.1f} | {r['unigram_cache']['ppl']:.1f} "
            f"| {r['neural_cache']['ppl']:.1f} |"
        )


if __name__ == "__main__":
    main()
