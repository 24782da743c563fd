"""Collect the Multi30k diffusion runs of experiments/diffusion_multi30k.sh into markdown tables.

    python experiments/collect_diffusion.py runs/diffusion [runs/diffusion-control:control ...]

Each argument is a directory of runs, optionally ``:LABEL`` (appended to the model's name, for
runs of the same preset under other settings). First the comparison, one row per label,
direction and length: the mean test BLEU ± its standard deviation over seeds of base, of WDR
decoded plainly (λ 0) and with the head ensemble (the λ > 0 decoded), at K 10 and 20; then the
mean test BLEU over seeds of each model and decoding with every seed's value; then one row per
run (DIRECTION-PRESET-sSEED) and decoding (K steps, λ, predicted or oracle length): test BLEU /
chrF, sentences/s, and the run's validation losses (results.json).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from statistics import mean, stdev

NAME = re.compile(r"translate-test-k(\d+)-lambda([0-9.]+)-(predicted|oracle)\.json")


def rows(run: Path, label: str = "") -> list[dict]:
    results = run / "results.json"
    if not results.is_file():
        return []
    r = json.loads(results.read_text())
    direction, preset, seed = run.name.rsplit("-", 2)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    base = {
        "direction": direction,
        "preset": f"{preset} ({label})" if label else preset,
        "model": preset,
        "label": label,
        "seed": seed[1:],
        "valid_mse": r["valid"]["mse"],
        "valid_ppl": r["valid"]["ppl"],
        "length_accuracy": r["valid"]["length_accuracy"],
        "tok_s": mean(m["tok_s"] for m in metrics if m["kind"] == "train"),
        "steps": r["steps"],
        "wall_min": r["wall_time_s"] / 60,
    }
    out = []
    for path in sorted(run.glob("translate-test-*.json")):
        match = NAME.fullmatch(path.name)
        if match is None:
            continue
        t = json.loads(path.read_text())
        out.append(
            base
            | {
                "k": int(match[1]),
                "lam": float(match[2]),
                "length": match[3],
                "bleu": t["bleu"],
                "chrf": t["chrf"],
                "sent_s": t["sentences_per_s"],
                "signature": t["bleu_signature"],
            }
        )
    return out


def spread(values: list[float]) -> str:
    """mean ± standard deviation over seeds (the mean alone for one seed)."""
    if len(values) < 2:
        return f"{mean(values):.2f}"
    return f"{mean(values):.2f} ± {stdev(values):.2f}"


def comparison(table: list[dict]) -> None:
    """Base vs WDR (λ 0) vs WDR + ensemble (λ > 0): mean ± sd test BLEU over seeds, the
    ensemble's gain over base in means, and the mean chrF of each."""
    models = ("base", "wdr", "wdr-ens")
    cells: dict[tuple, list[dict]] = {}  # (label, direction, length, model, K) -> rows
    for r in table:
        model = "wdr-ens" if r["model"] != "base" and r["lam"] > 0 else r["model"]
        cells.setdefault((r["label"], r["direction"], r["length"], model, r["k"]), []).append(r)
    lambdas = sorted({r["lam"] for r in table if r["lam"] > 0})
    print(
        "| runs | direction | length | seeds (base / WDR) | K | base | WDR, λ 0 "
        f"| WDR, λ {'/'.join(f'{x:g}' for x in lambdas) or '–'} | ensemble − base "
        "| chrF: base / λ 0 / ensemble |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|")
    groups = sorted({key[:3] for key in cells}, key=lambda k: (k[0], k[1], k[2] != "predicted"))
    for label, direction, length in groups:
        for k in (10, 20):
            got = {m: cells.get((label, direction, length, m, k), []) for m in models}
            if not any(got.values()):
                continue
            bleu = {m: [r["bleu"] for r in rows] for m, rows in got.items()}
            counts = f"{len(got['base'])}/{len(got['wdr'])}"
            gain = (
                f"{mean(bleu['wdr-ens']) - mean(bleu['base']):+.2f}"
                if bleu["base"] and bleu["wdr-ens"]
                else "–"
            )
            shown = " | ".join(spread(v) if v else "–" for v in bleu.values())
            chrfs = " / ".join(
                f"{mean(r['chrf'] for r in rows):.1f}" if rows else "–" for rows in got.values()
            )
            print(
                f"| {label or '–'} | {direction} | {length} | {counts} | {k} | {shown} "
                f"| {gain} | {chrfs} |"
            )
    print()


def summary(table: list[dict]) -> None:
    groups: dict[tuple, list[dict]] = {}
    for r in table:
        key = (r["direction"], r["preset"], r["length"], r["k"], r["lam"])
        groups.setdefault(key, []).append(r)
    print(
        "| direction | model | length | K | λ | seeds | test BLEU, mean | per seed | chrF, mean |"
    )
    print("|---|---|---|---:|---:|---:|---:|---|---:|")
    for key in sorted(groups, key=lambda k: (k[0], k[2] != "predicted", k[1], k[3], k[4])):
        group = sorted(groups[key], key=lambda r: r["seed"])
        direction, preset, length, k, lam = key
        per_seed = ", ".join(f"{r['bleu']:.2f}" for r in group)
        print(
            f"| {direction} | {preset} | {length} | {k} | {lam:g} | {len(group)} "
            f"| {mean(r['bleu'] for r in group):.2f} | {per_seed} "
            f"| {mean(r['chrf'] for r in group):.2f} |"
        )
    print()


def main(roots: list[str]) -> None:
    table = []
    for argument in roots:
        root, _, label = argument.partition(":")
        for run in sorted(Path(root).iterdir()):
            if run.is_dir():
                table += rows(run, label)
    comparison(table)
    summary(table)
    print(
        "| direction | model | seed | K | λ | length | test BLEU | test chrF | sent/s "
        "| valid L₀ | valid anchor ppl | length acc. | train tok/s | steps | min |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(
        table,
        key=lambda r: (
            r["direction"],
            r["preset"],
            r["k"],
            r["lam"],
            r["length"] != "predicted",
            r["seed"],
        ),
    ):
        print(
            f"| {r['direction']} | {r['preset']} | {r['seed']} | {r['k']} | {r['lam']:g} "
            f"| {r['length']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['sent_s']:.1f} "
            f"| {r['valid_mse']:.4f} | {r['valid_ppl']:.1f} | {r['length_accuracy']:.1%} "
            f"| {r['tok_s']:.0f} | {r['steps']} | {r['wall_min']:.0f} |"
        )
    signatures = sorted({r["signature"] for r in table})
    print("\nSacreBLEU: " + "; ".join(signatures))


if __name__ == "__main__":
    main(sys.argv[1:] or ["runs/diffusion"])
