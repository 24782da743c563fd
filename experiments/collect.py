"""Collect the experiment runs into the markdown tables of docs/results.md.

    python experiments/collect.py inan     [--runs runs/inan-small-ptb]   (or runs/inan-ptb-cpu)
    python experiments/collect.py heo      [--runs runs/heo-lstm-ptb]     (or runs/heo-tf-ptb)
    python experiments/collect.py outputs  [--runs runs/outputs-ptb]      (or runs/pappas-ptb-cpu)

Reads each run's results.json and, where the experiment script wrote them,
eval-{valid,test}.json (full splits; they take precedence over results.json, whose valid
perplexity may be of the validation slice used for model selection); prints mean ± sample
standard deviation over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def _runs(root: Path) -> dict[str, dict[int, Path]]:
    """{method: {seed: run_dir}} for finished runs named METHOD-sSEED."""
    found: dict[str, dict[int, Path]] = defaultdict(dict)
    for run in sorted(root.glob("*-s*")):
        method, _, seed = run.name.rpartition("-s")
        if (run / "results.json").is_file() and seed.isdigit():
            found[method][int(seed)] = run
    return found


def _results(seeds: dict[int, Path]) -> tuple[list[dict], list[float], list[float]]:
    """Each seed's results.json, and its valid and test perplexities (eval-*.json first)."""
    results = [json.loads((r / "results.json").read_text()) for r in seeds.values()]
    splits = {"valid": [], "test": []}
    for run, result in zip(seeds.values(), results):
        for split, values in splits.items():
            evaluated = run / f"eval-{split}.json"
            if evaluated.is_file():
                values.append(json.loads(evaluated.read_text())["ppl"])
            else:
                values.append(result[split]["ppl"])
    return results, splits["valid"], splits["test"]


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def inan(root: Path) -> None:
    paper = {"base": 87.3, "al": 82.9, "re": 85.1, "real": 82.7}
    print("| model | seeds | valid ppl | test ppl | per seed (test) | paper test |")
    print("|---|---:|---:|---:|---|---:|")
    runs = _runs(root)
    for method in ("base", "al", "re", "real"):
        seeds = runs.get(method, {})
        if not seeds:
            continue
        _, valid, test = _results(seeds)
        each = ", ".join(f"s{s}: {t:.2f}" for s, t in zip(seeds, test))
        print(
            f"| {method.upper()} | {len(seeds)} | {_mean_sd(valid)} | {_mean_sd(test)} | {each} "
            f"| {paper[method]} |"
        )


PAPER_HEO_TABLE1 = {  # Heo et al. 2025 Table 1 (TF decoder, PTB, 5 seeds), test ppl at λ = 0 .. 0.6
    "base": (161.0,),
    "sim-n2": (150.8, 134.6, 135.3, 156.3),
    "sim-n3": (153.3, 134.4, 133.0, 151.9),
    "sim-n4": (158.1, 133.6, 129.1, 147.1),
    "wdr-n2": (149.0, 136.5, 129.8, 128.1),
    "wdr-n3": (153.1, 136.1, 128.2, 128.8),
    "wdr-n4": (150.5, 131.6, 124.1, 127.5),
}


def heo(root: Path) -> None:
    runs = _runs(root)
    lambdas = ("0", "0.2", "0.4", "0.6")
    print("| model | seeds | params | " + " | ".join(f"test λ={lam}" for lam in lambdas), end="")
    print(" | best λ on valid → test | paper λ=0 / 0.2 / 0.4 / 0.6 |")
    print("|---|---:|---:|" + "---:|" * len(lambdas) + "---:|---|")
    for method in ("base", "sim-n2", "sim-n3", "sim-n4", "wdr-n2", "wdr-n3", "wdr-n4"):
        seeds = runs.get(method, {})
        if not seeds:
            continue
        per_lambda: dict[str, list[float]] = defaultdict(list)
        best: list[float] = []
        params = json.loads((next(iter(seeds.values())) / "results.json").read_text())
        for run in seeds.values():
            valid = json.loads((run / "eval-valid.json").read_text())
            test = json.loads((run / "eval-test.json").read_text())
            if "ensemble" not in test:  # no heads: λ does not apply
                per_lambda["0"].append(test["ppl"])
                best.append(test["ppl"])
                continue
            by_lambda = {f"{e['lambda']:g}": e["ppl"] for e in test["ensemble"]}
            for lam in lambdas:
                per_lambda[lam].append(by_lambda[lam])
            chosen = min(valid["ensemble"], key=lambda e: e["ppl"])["lambda"]
            best.append(by_lambda[f"{chosen:g}"])
        cells = [_mean_sd(per_lambda[lam]) if per_lambda[lam] else "–" for lam in lambdas]
        print(
            f"| {method} | {len(seeds)} | {params['total_params']:,} | "
            + " | ".join(cells)
            + f" | {_mean_sd(best)} | {' / '.join(map(str, PAPER_HEO_TABLE1[method]))} |"
        )


OUTPUT_ORDER = [
    "lookup", "tied", "bilinear", "residual", "adaptive", "charcnn",
    "groc", "groc-norel", "groc-nodef", "groc-noreldef", "groc-p0.3", "groc-ptb",
]  # fmt: skip
PAPER_TABLE2 = {"tied": 86.2, "adaptive": 79.3, "groc": 69.5}  # 2x1024 LSTM, converged
PAPER_TABLE9_PARAMS = {"tied": "10M", "adaptive": "8M", "groc": "9M"}


def outputs(root: Path) -> None:
    runs = _runs(root)
    order = [m for m in OUTPUT_ORDER if m in runs] + sorted(set(runs) - set(OUTPUT_ORDER))
    print(
        "| output layer | seeds | params | valid ppl | test ppl | per seed (test) | paper test "
        "| paper params |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for method in order:
        seeds = runs[method]
        results, valid, test = _results(seeds)
        per_seed = ", ".join(f"s{s}: {t:.1f}" for s, t in zip(seeds, test))
        print(
            f"| {method} | {len(seeds)} | {results[0]['total_params']:,} | {_mean_sd(valid)} "
            f"| {_mean_sd(test)} | {per_seed} | {PAPER_TABLE2.get(method, '–')} "
            f"| {PAPER_TABLE9_PARAMS.get(method, '–')} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", choices=["inan", "heo", "outputs"])
    parser.add_argument("--runs", type=Path)
    args = parser.parse_args()
    default = {"inan": "inan-small-ptb", "heo": "heo-lstm-ptb", "outputs": "outputs-ptb"}
    root = args.runs or Path("runs") / default[args.table]
    {"inan": inan, "heo": heo, "outputs": outputs}[args.table](root)


if __name__ == "__main__":
    main()
