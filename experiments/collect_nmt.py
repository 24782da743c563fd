"""Collect the Multi30k translation runs of experiments/nmt_multi30k.sh into a markdown table.

    python experiments/collect_nmt.py runs/nmt

One row per run (DIRECTION-PRESET-sSEED): test BLEU / chrF of beam 5 without the ensemble
(results.json, written at the end of training) and with it (λ chosen on val among the
translate-val-lambda*.json, test from translate-test-lambda*.json), validation perplexity,
parameters, training tokens/s (mean over the logged steps), steps, wall time, sentences/s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean


def row(run: Path) -> dict | None:
    results = run / "results.json"
    if not results.is_file():
        return None
    r = json.loads(results.read_text())
    direction, preset, seed = run.name.rsplit("-", 2)
    train = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    tok_s = mean(m["tok_s"] for m in train if m["kind"] == "train")
    epochs = max(m["epoch"] for m in train if m["kind"] == "valid")
    out = {
        "direction": direction,
        "preset": preset,
        "seed": seed[1:],
        "valid_ppl": r["valid"]["ppl"],
        "val_bleu": r["valid"]["bleu"],
        "test_bleu": r["test"]["bleu"],
        "test_chrf": r["test"]["chrf"],
        "signature": r["test"]["bleu_signature"],
        "params": r["total_params"],
        "tok_s": tok_s,
        "steps": r["steps"],
        "epochs": epochs,
        "wall_min": r["wall_time_s"] / 60,
        "sent_s": r["test"]["sentences_per_s"],
    }
    vals = {
        float(p.stem.removeprefix("translate-val-lambda")): json.loads(p.read_text())
        for p in run.glob("translate-val-lambda*.json")
    }
    if vals:
        lam = max(vals, key=lambda k: vals[k]["bleu"])
        test = run / f"translate-test-lambda{lam:g}.json"
        out.update(lam=lam, val_bleu_ens=vals[lam]["bleu"], val_grid=vals)
        if test.is_file():
            t = json.loads(test.read_text())
            out.update(
                test_bleu_ens=t["bleu"], test_chrf_ens=t["chrf"], sent_s_ens=t["sentences_per_s"]
            )
    return out


def main(root: str) -> None:
    rows = [r for run in sorted(Path(root).iterdir()) if run.is_dir() and (r := row(run))]
    print(
        "| direction | model | seed | valid ppl | val BLEU | test BLEU | test chrF | λ (val) "
        "| val BLEU ens | test BLEU ens | test chrF ens | params | train tok/s | epochs | "
        "min | sent/s beam 5 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ens = (
            f"{r['lam']:g} | {r['val_bleu_ens']:.2f} | {r.get('test_bleu_ens', float('nan')):.2f} "
            f"| {r.get('test_chrf_ens', float('nan')):.2f}"
            if "lam" in r
            else "– | – | – | –"
        )
        print(
            f"| {r['direction']} | {r['preset']} | {r['seed']} | {r['valid_ppl']:.2f} "
            f"| {r['val_bleu']:.2f} | {r['test_bleu']:.2f} | {r['test_chrf']:.2f} | {ens} "
            f"| {r['params']:,} | {r['tok_s']:.0f} | {r['epochs']} | {r['wall_min']:.0f} "
            f"| {r['sent_s']:.1f} |"
        )
    for r in rows:
        if "val_grid" in r:
            grid = ", ".join(f"λ {k:g}: {v['bleu']:.2f}" for k, v in sorted(r["val_grid"].items()))
            print(f"\n{r['direction']}-{r['preset']}-s{r['seed']} val BLEU by λ: {grid}")
    if rows:
        print(f"\nSacreBLEU signature: `{rows[0]['signature']}`")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/nmt")
