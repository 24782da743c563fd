"""Cross-domain, open-vocabulary evaluation on Brown genres (Pappas et al. 2020, Table 5 analog).

    python experiments/cross_domain.py RUN [RUN ...] [--genres news,editorial,...] [--grid]
        [--out FILE]

Each genre (lower-cased, as PTB is) is cut by lines into a finetuning part [0, 0.8), a
validation part [0.8, 0.9) and a test part [0.9, 1) (``data.train = "news[:0.8]"`` etc. for
``targetlm finetune``). Every run is scored on each genre's test part in open vocabulary:
alone, with a unigram cache and with a neural cache, with the paper's cache settings (App.
C.4): λ = 0.034 for either cache (their λ = 0.966 weights the model), θ = 0.5, a window of
10,000 words, and for compositional output layers (GroC, char-CNN) the new-word down-weighting
ω = 0.1 before cache interpolation (§5.1). ``--grid`` also picks λ (and θ) on the validation
part from the paper's grid (5 values each, App. C.4) and reports it beside them. Prints a
markdown table and writes all figures as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from targetlm.config import Config, DataConfig
from targetlm.data.readers import read_split
from targetlm.data.vocab import Vocabulary
from targetlm.inference.scoring import Combiners, score_text
from targetlm.modules.model import LanguageModel
from targetlm.runs import load_run

NEAR, FAR = ("news", "editorial"), ("fiction", "learned")
CACHE_WEIGHT = 0.034  # App. C.4: "λ = 0.966 for unigram and neural cache" weights the model
NEURAL = dict(neural_theta=0.5, neural_window=10_000)  # App. C.4: θ = 0.5, "10,000" at test
NEW_WORD_WEIGHT = 0.1  # §5.1: "we down-weighted the model's predictions for new words ... by 0.1"
# App. C.4's grid: "λ ranging over 5 values from 0.833 to 0.966" (here 1 − λ, rounded) and
# "θ ... ranging over 5 values from 0 to 1"
GRID_WEIGHTS = (0.034, 0.067, 0.1, 0.134, 0.167)
GRID_THETAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def paper_combiners(compositional: bool) -> dict[str, Combiners]:
    """The paper's cache settings; ω = 0.1 only for layers that score new words themselves
    (a closed layer's new words get the uniform mixture's mass instead)."""
    omega = NEW_WORD_WEIGHT if compositional else 1.0
    return {
        "unigram_cache": Combiners(new_word_weight=omega, unigram_cache=CACHE_WEIGHT),
        "neural_cache": Combiners(new_word_weight=omega, neural_cache=CACHE_WEIGHT, **NEURAL),
    }


def grid_combiners(compositional: bool) -> dict[str, list[Combiners]]:
    """The paper's validation grid around :func:`paper_combiners` (same ω and window)."""
    omega = NEW_WORD_WEIGHT if compositional else 1.0
    window = NEURAL["neural_window"]
    return {
        "unigram_cache": [
            Combiners(new_word_weight=omega, unigram_cache=lam) for lam in GRID_WEIGHTS
        ],
        "neural_cache": [
            Combiners(
                new_word_weight=omega, neural_cache=lam, neural_theta=theta, neural_window=window
            )
            for lam in GRID_WEIGHTS
            for theta in GRID_THETAS
        ],
    }


def _score(
    model: LanguageModel, vocab: Vocabulary, config: Config, tokens: list[str], combiners: Combiners
) -> dict:
    scores = score_text(
        model,
        vocab,
        tokens,
        open_vocabulary=True,
        combiners=combiners,
        batch_size=config.eval.batch_size,
        segment=config.data.bptt,
        device=config.train.device,
    )
    return scores.summary()


def evaluate_run(run: Path, genres: list[str], grid: bool) -> list[dict]:
    config, vocab, model, _ = load_run(run)
    compositional = hasattr(model.output, "embed_words")
    brown = DataConfig(name="brown", lowercase=True)
    rows = []
    for genre in genres:
        test = read_split(brown, f"{genre}[0.9:]")
        row = {
            "run": str(run),
            "genre": genre,
            "alone": _score(model, vocab, config, test, Combiners()),
        }
        chosen = paper_combiners(compositional)
        if grid:
            valid = read_split(brown, f"{genre}[0.8:0.9]")
            for name, candidates in grid_combiners(compositional).items():
                ppls = [_score(model, vocab, config, valid, c)["ppl"] for c in candidates]
                chosen[f"{name}_grid"] = candidates[ppls.index(min(ppls))]
        for name, combiners in chosen.items():
            scores = _score(model, vocab, config, test, combiners)
            row[name] = {**scores, "combiners": combiners.__dict__}
        rows.append(row)
        line = (
            f"{run.name:>24} {genre:>10}: alone {row['alone']['ppl']:8.1f} "
            f"(oov {row['alone']['oov_rate']:.3f}) unigram {row['unigram_cache']['ppl']:8.1f} "
            f"neural {row['neural_cache']['ppl']:8.1f}"
        )
        if grid:
            line += (
                f" | grid: unigram {row['unigram_cache_grid']['ppl']:8.1f} "
                f"neural {row['neural_cache_grid']['ppl']:8.1f}"
            )
        print(line, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--genres", default=",".join(NEAR + FAR))
    parser.add_argument(
        "--grid",
        action="store_true",
        help="also choose the cache weights (and θ) on the validation part (App. C.4's grid)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/cross-domain.json"))
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    genres = args.genres.split(",")
    rows = [row for run in args.runs for row in evaluate_run(run, genres, args.grid)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    grid = " + unigram (grid) | + neural (grid) |" if args.grid else ""
    print(f"\n| run | genre | OOV rate | alone | + unigram cache | + neural cache |{grid}")
    print("|---|---|---:|---:|---:|---:|" + ("---:|---:|" if args.grid else ""))
    for r in rows:
        cells = [r["alone"], r["unigram_cache"], r["neural_cache"]]
        if args.grid:
            cells += [r["unigram_cache_grid"], r["neural_cache_grid"]]
        ppls = " | ".join(f"{c['ppl']:.1f}" for c in cells)
        print(f"| {Path(r['run']).name} | {r['genre']} | {r['alone']['oov_rate']:.3f} | {ppls} |")


if __name__ == "__main__":
    main()
