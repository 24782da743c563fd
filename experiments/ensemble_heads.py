"""Which heads should the diffusion head ensemble read? An analysis of one WDR run.

    python experiments/ensemble_heads.py RUN SOURCE REFERENCE [--steps 20] [--weight 0.05]

Decodes SOURCE with the run's own decoding settings at K = --steps, once without the ensemble
and once for every M = 1..N−1 with the ensemble over the first M heads only, each head
weighted --weight (λ = weight·M: the stock ensemble at λ 0.1 with N = 3 gives each head
0.05). Prints BLEU, chrF and the share of output words equal to the word before them
(adjacent repeats). M = N−1 is `targetlm translate --ensemble-lambda`; M < N−1 replaces
`targetlm.inference.diffusion.head_ensemble` for the run of this script only (an analysis,
not an option of targetlm).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from targetlm.cli.translate import translate_file
from targetlm.inference import diffusion
from targetlm.inference.translate import DecodeOptions, score_translations
from targetlm.runs import load_run

stock_ensemble = diffusion.head_ensemble


def first_heads(m: int):
    def ensemble(model, main, raw, lam):
        return stock_ensemble(model, main, None if raw is None else raw[:m], lam)

    return ensemble


def adjacent_repeats(lines: list[str]) -> float:
    words = [line.split() for line in lines]
    repeats = sum(sum(a == b for a, b in zip(w, w[1:])) for w in words)
    return repeats / max(sum(len(w) for w in words), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("source", type=Path)
    parser.add_argument("reference", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--weight", type=float, default=0.05, help="λ/M: each head's weight")
    args = parser.parse_args()
    _, _, model, _ = load_run(args.run, [], tasks=("diffusion",))
    heads = model.num_heads
    if heads < 1:
        raise SystemExit(f"{args.run}: no heads to ensemble")
    references = args.reference.read_text(encoding="utf-8").splitlines()
    for m in range(0, heads + 1):
        lam = args.weight * m
        diffusion.head_ensemble = first_heads(m) if 0 < m < heads else stock_ensemble
        hypotheses, summary = translate_file(
            args.run,
            args.source,
            DecodeOptions(ensemble_lambda=lam),
            diffusion={"steps": args.steps},
        )
        scores = score_translations(hypotheses, references)
        row = {
            "heads": m,
            "lambda": lam,
            "bleu": round(scores["bleu"], 2),
            "chrf": round(scores["chrf"], 2),
            "adjacent_repeats": round(adjacent_repeats(hypotheses), 3),
            "decoding": summary["decoding"],
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
