"""Collect the SmolLM2 WikiText-2 runs of experiments/smollm2_wt2.sh into a markdown table.

    python experiments/collect_smollm2.py runs/smollm2

One row per run (PRESET-sSEED): token-level (SmolLM2 subwords) and word-level perplexity of
the valid and test slices, before fine-tuning (``before``) and after; for head models also
the head ensemble at the λ with the best validation perplexity (the same λ on test) and at
the paper's λ (Sim 0.08, WDR 0.04); seconds per step of the heads-only and the joint phase
(the mean over the logged steps of each phase).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean

PAPER_LAMBDA = {"sim": 0.08, "wdr": 0.04}


def _ensemble(result: dict, lam: float) -> dict:
    return next(row for row in result["ensemble"] if abs(row["lambda"] - lam) < 1e-9)


def row(run: Path) -> dict | None:
    files = {split: run / f"eval-{split}.json" for split in ("valid", "test")}
    if not all(f.is_file() for f in files.values()):
        return None
    valid, test = (json.loads(f.read_text()) for f in files.values())
    preset, seed = run.name.rsplit("-", 1)
    out = {
        "preset": preset,
        "seed": seed[1:],
        "valid_ppl": valid["ppl"],
        "test_ppl": test["ppl"],
        "test_word_ppl": test["word_ppl"],
        "test_tokens": test["tokens"],
        "test_words": test["words"],
    }
    if "ensemble" in valid:
        best = min(valid["ensemble"], key=lambda r: r["ppl"])["lambda"]
        out.update(
            best_lambda=best,
            test_ppl_ens=_ensemble(test, best)["ppl"],
            test_word_ppl_ens=_ensemble(test, best)["word_ppl"],
            test_ppl_paper=_ensemble(test, PAPER_LAMBDA[preset])["ppl"],
        )
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        train = [json.loads(x) for x in metrics.read_text().splitlines() if x]
        train = [m for m in train if m["kind"] == "train"]
        config = (run / "config.toml").read_text()
        heads_only = next(
            (
                int(line.split("=")[1])
                for line in config.splitlines()
                if line.startswith("heads_only_steps")
            ),
            0,
        )
        tokens = next(
            int(line.split("=")[1]) for line in config.splitlines() if line.startswith("bptt")
        )
        tokens *= next(
            int(line.split("=")[1]) for line in config.splitlines() if line.startswith("batch_size")
        )
        for name, phase in (
            ("s_step_heads_only", [m for m in train if m["step"] <= heads_only]),
            ("s_step_joint", [m for m in train if m["step"] > heads_only]),
        ):
            if phase:
                out[name] = mean(tokens / m["tok_s"] for m in phase)
        out["steps"] = json.loads((run / "results.json").read_text())["steps"]
    return out


def _formatter(r: dict):
    def f(key: str, fmt: str = ".2f") -> str:
        return format(r[key], fmt) if key in r else "—"

    return f


def main(root: str) -> None:
    order = {"before": 0, "base": 1, "sim": 2, "wdr": 3}
    rows = [r for run in sorted(Path(root).iterdir()) if (r := row(run))]
    rows.sort(key=lambda r: (order.get(r["preset"], 9), r["seed"]))
    print(
        "| model | seed | steps | valid ppl | test ppl (tokens) | test ppl (words) "
        "| λ (valid) | test ppl, ensemble | test word ppl, ensemble | test ppl at paper λ "
        "| s/step heads-only | s/step joint |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        f = _formatter(r)
        print(
            f"| {r['preset']} | {r['seed']} | {r.get('steps', 0)} | {f('valid_ppl')} | "
            f"{f('test_ppl')} | {f('test_word_ppl')} | {f('best_lambda', 'g')} | "
            f"{f('test_ppl_ens')} | {f('test_word_ppl_ens')} | {f('test_ppl_paper')} | "
            f"{f('s_step_heads_only', '.1f')} | {f('s_step_joint', '.1f')} |"
        )
    if rows:
        r = rows[0]
        print(f"\ntest slice: {r['test_tokens']:,} SmolLM2 tokens, {r['test_words']:,} words")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/smollm2")
