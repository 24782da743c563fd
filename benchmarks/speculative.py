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
VERIFY_WIDTHS = (1, 2, 4, 8, 16)


def step_costs(model, vocab, prefix: int = 128, rounds: int = 20) -> dict[str, float]:
    """Batch 1 with a KV cache of ``prefix`` tokens: the median seconds of one forward over k
    new tokens for each k of VERIFY_WIDTHS (``verify_k``) and of drafting with the heads (their
    forward on one column and each head's argmax logit, ``draft``), measured in rotating order.
    A draft-verify step with k drafted tokens costs ``draft + verify_{k+1}`` and emits 1 + a
    tokens (a accepted), so it beats greedy (``verify_1`` a token) once
    ``a > (draft + verify_{k+1}) / verify_1 − 1``: the break-even acceptance."""
    import time

    context = getattr(model.encoder, "max_context", None)
    if context is not None:  # the cache and the widest verification fit the window
        prefix = min(prefix, context - max(VERIFY_WIDTHS))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(len(vocab), (1, prefix + max(VERIFY_WIDTHS)), generator=generator)
    with torch.no_grad():
        state = model(ids[:, :prefix], None, run_heads=False).state
        weight, bias = model.output()
        last = model(ids[:, prefix : prefix + 1], state, run_heads=False).main[:, -1:]

        def verify(k):
            return lambda: model(ids[:, prefix : prefix + k], state, run_heads=False)

        def draft():
            raw = model.heads(last)  # (N−1, 1, 1, d)
            return (raw[:, 0, 0] @ weight.T + (0 if bias is None else bias)).argmax(-1)

        parts = {f"verify_{k}": verify(k) for k in VERIFY_WIDTHS}
        if model.heads is not None:
            parts["draft"] = draft
        times = {name: [] for name in parts}
        for part in parts.values():  # warm-up
            part()
        for r in range(rounds):
            names = list(parts)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                started = time.perf_counter()
                parts[name]()
                times[name].append(time.perf_counter() - started)
    return {"prefix": prefix, **{name: statistics.median(t) for name, t in times.items()}}


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
    costs = step_costs(model, vocab)
    one = costs["verify_1"]
    print(f"\nKV-cached forward over k new tokens (cache of {costs['prefix']}), batch 1, vs one:")
    print(", ".join(f"k {k}: {costs[f'verify_{k}'] / one:.2f}x" for k in VERIFY_WIDTHS))
    n_drafted = (model.heads.num_predictions - 1) if model.heads is not None else 4
    draft_cost = costs.get("draft", 0.0) / one
    width = min(n_drafted + 1, max(VERIFY_WIDTHS))
    width = max(k for k in VERIFY_WIDTHS if k <= width)
    break_even = draft_cost + costs[f"verify_{width}"] / one - 1
    print(
        f"drafting with the heads: {draft_cost:.2f}x a token; break-even with {n_drafted} drafted "
        f"tokens (verify {width}): {break_even:.2f} accepted per step"
    )
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
        "verify_cost": {k: costs[f"verify_{k}"] / one for k in VERIFY_WIDTHS},
        "draft_cost": draft_cost,
        "break_even_accepted": break_even,
        "variants": table,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
