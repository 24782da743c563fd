"""Speculative decoding against KV-cached greedy decoding, batch 1 and batch 4.

Tokens/s of greedy generation of ``--new-tokens`` tokens after prompts from the test split,
for KV-cached greedy decoding and for speculative decoding drafted by the run's N-gram heads
(``heads``), by prompt lookup (``lookup``) and by both, at batch 1 (the first prompt) and
batch 4 (four prompts of different lengths, each row keeping its own accepted length). Every
variant's tokens are checked identical to greedy's. Each variant runs ``--rounds`` times in
rotating order after one warm-up round; the median is reported with the spread (min–max).

The model: a trained run (``--run DIR``, a Transformer or hf backbone with heads), or a small
pre-LN Transformer (d 128, 2 layers) with ``--heads`` heads (N = 4) trained here for
``--train-steps`` steps on PTB when ``$TARGETLM_DATA`` holds it, else the synthetic corpus.
``--quick``: 300 training steps on the synthetic corpus (a small vocabulary: PTB's 10k-word
logit layer under the N-gram loss costs about a second a step), 64 new tokens, 3 rounds.

    python benchmarks/speculative.py --quick
    python benchmarks/speculative.py [--run DIR] [--heads medusa] [--train-steps 1500]
                                     [--new-tokens 128] [--rounds 5] [--threads 1]

The last stdout line is one JSON object: ``identical``, ``speedup_b1`` and ``speedup_b4``
(the best drafter's median tokens/s over greedy's), ``accepted_per_step`` (that drafter's
drafted tokens kept per row and step at batch 1) and the whole table under ``variants``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import train_model  # noqa: E402

from targetlm.data import read_lines  # noqa: E402
from targetlm.inference.generate import generate_batch  # noqa: E402
from targetlm.runs import load_run  # noqa: E402

DRAFTERS = ("heads", "lookup", "both")


def prompts_from(config, vocab, count: int = 4, lengths=(16, 9, 24, 12)) -> list[list[str]]:
    """``count`` prompts of different lengths from the test split's first lines."""
    lines = [line for line in read_lines(config.data, config.data.test)[:200] if line.strip()]
    tokens = [t for t in vocab.tokenizer.tokenize(lines) if t != "<eos>"]
    prompts, start = [], 0
    for length in lengths[:count]:
        prompts.append(tokens[start : start + length])
        start += length + 37
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a trained run with N-gram heads")
    parser.add_argument("--heads", default="medusa", help="head kind of the model trained here")
    parser.add_argument("--train-steps", type=int, default=1500)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="300 steps, 64 tokens, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.train_steps, args.new_tokens, args.rounds = 300, 64, 3
    torch.set_num_threads(args.threads)
    context = 24 + 1 + args.new_tokens + 8  # the longest prompt, its <eos>, new tokens, a draft
    with tempfile.TemporaryDirectory() as scratch:
        corpus = "synthetic" if args.quick else None
        run = args.run or train_model(
            args.train_steps, context, args.seed, Path(scratch) / "run", args.heads, corpus
        )
        config, vocab, model, _ = load_run(run)
    model.eval()
    prompts = prompts_from(config, vocab)
    drafters = [d for d in DRAFTERS if model.num_heads > 0 or d == "lookup"]
    variants = [(b, d) for b in (1, 4) for d in ("greedy", *drafters)]

    def run_variant(batch: int, drafter: str):
        result = generate_batch(
            model,
            vocab,
            prompts[:batch],
            max_tokens=args.new_tokens,
            temperature=0,
            speculative=False if drafter == "greedy" else drafter,
        )
        made = sum(len(r.tokens) for r in result.rows)
        return made / result.seconds, [r.tokens for r in result.rows], result.acceptance

    speeds = {v: [] for v in variants}
    outputs, acceptance = {}, {}
    for v in variants:  # warm-up
        run_variant(*v)
    for r in range(args.rounds):
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            speed, tokens, accepted = run_variant(*v)
            speeds[v].append(speed)
            outputs[v], acceptance[v] = tokens, accepted
    identical = all(outputs[(b, d)] == outputs[(b, "greedy")] for b, d in variants)
    median = {v: statistics.median(s) for v, s in speeds.items()}
    print(
        f"\n{args.new_tokens} new tokens, {args.threads} thread(s), median of {args.rounds} "
        f"rounds (min-max); outputs identical: {'yes' if identical else 'NO'}\n"
    )
    print("| batch | drafter | tokens/s | min-max | vs greedy | accepted/step |")
    print("|---:|---|---:|---:|---:|---:|")
    table = []
    for b, d in variants:
        ratio = median[(b, d)] / median[(b, "greedy")]
        accepted = acceptance[(b, d)]
        low, high = min(speeds[(b, d)]), max(speeds[(b, d)])
        print(
            f"| {b} | {d} | {median[(b, d)]:.1f} | {low:.0f}-{high:.0f} | {ratio:.2f}x | "
            f"{'' if accepted is None else f'{accepted:.2f}'} |"
        )
        table.append(
            {
                "batch": b,
                "drafter": d,
                "tokens_per_s": median[(b, d)],
                "spread": [low, high],
                "speedup": ratio,
                "accepted_per_step": accepted,
            }
        )
    best = max(drafters, key=lambda d: median[(1, d)])
    result = {
        "identical": identical,
        "speedup_b1": median[(1, best)] / median[(1, "greedy")],
        "speedup_b4": max(median[(4, d)] / median[(4, "greedy")] for d in drafters),
        "accepted_per_step": acceptance[(1, best)],
        "best_drafter_b1": best,
        "heads": type(model.heads).__name__ if model.heads is not None else None,
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "variants": table,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
