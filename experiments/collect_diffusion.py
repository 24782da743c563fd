"""Collect the Multi30k diffusion runs of experiments/diffusion_multi30k.sh into markdown tables.

    python experiments/collect_diffusion.py runs/diffusion

One row per run (DIRECTION-PRESET-sSEED) and decoding (K steps, λ, predicted or oracle
length): test BLEU / chrF, sentences/s, and the run's validation losses (results.json).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from statistics import mean

NAME = re.compile(r"translate-test-k(\d+)-lambda([0-9.]+)-(predicted|oracle)\.json")


def rows(run: Path) -> list[dict]:
    results = run / "results.json"
    if not results.is_file():
        return []
    r = json.loads(results.read_text())
    direction, preset, seed = run.name.rsplit("-", 2)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    base = {
        "direction": direction,
        "preset": preset,
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


def main(root: str) -> None:
    table = [r for run in sorted(Path(root).iterdir()) if run.is_dir() for r in rows(run)]
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
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/diffusion")
