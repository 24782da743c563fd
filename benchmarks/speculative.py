"""Speculative decoding against KV-cached greedy decoding, batch 1 and batch 4.

Tokens/s of greedy generation of ``--new-tokens`` tokens after prompts from the test split,
for KV-cached greedy decoding and for speculative decoding drafted by the run's N-gram heads
(``heads``), by prompt lookup (``lookup``) and by both, at batch 1 (the first prompt) and
batch 4 (four prompts of different lengths, each row keeping its own accepted length). Every
variant's tokens are checked identical to greedy's. Each variant runs ``--rounds`` times in
rotating order after one warm-up round; the median is reported with the spread (min–max).

The models: a trained run (``--run DIR``, a Transformer or hf backbone with heads), or small
pre-LN Transformers (d 128, 2 layers), one per kind of ``--heads`` (comma-separated registry
kinds, N = 4), each trained here for ``--train-steps`` steps on PTB when ``$TARGETLM_DATA``
holds it, else the synthetic corpus. ``--distill KIND[,KIND]``: heads of each kind trained by
self-distillation on the (first) body, as ``targetlm train-heads`` does
(``targetlm.training.distill``: ``--distill-steps`` steps on ``--distill-tokens`` tokens of
``--distill-corpus``), benchmarked beside the body's own heads (the same greedy baseline).
``--quick``: 300 training steps on the synthetic corpus (a small vocabulary: PTB's 10k-word
logit layer under the N-gram loss costs about a second a step), 64 new tokens, 3 rounds.

    python benchmarks/speculative.py --quick
    python benchmarks/speculative.py [--run DIR] [--heads medusa,gloeckle,mtp] [--train-steps 1500]
                                     [--distill medusa,gloeckle,mtp --distill-steps 2000]
                                     [--new-tokens 128] [--rounds 5] [--threads 1]

The last stdout line is one JSON object: ``identical``, ``speedup_b1`` and ``speedup_b4``
(the best drafter's median tokens/s over its body's greedy), ``accepted_per_step`` (that
drafter's drafted tokens kept per row and step at batch 1) and the whole table under
``variants`` (one row per model, batch and drafter; ``model`` names the heads).
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
from targetlm.inference import speculative  # noqa: E402
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

        window = model.heads.window if model.heads is not None else 1
        columns = model(ids[:, : prefix + 1], None, run_heads=False).main[:, -window:]
        words = ids[:, prefix + 2 - columns.size(1) : prefix + 1]
        first = model.logits(last[:, -1]).argmax(-1)

        def draft():  # what a decoding step drafts with (the heads' window of columns)
            length = model.num_heads
            return speculative.draft(model.heads, weight, bias, first, columns, length, words)

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


def distilled(model, config, vocab, kind: str, steps: int, tokens: int, corpus: str):
    """A copy of ``model`` sharing its body, with new ``kind`` heads (N = 4, or the body's own
    N) trained by self-distillation on ``tokens`` tokens of the ``corpus`` split."""
    import copy
    import time

    from targetlm.config import ComponentConfig
    from targetlm.data import with_context_token
    from targetlm.modules.heads import build_heads
    from targetlm.training import distill

    n = model.heads.num_predictions if model.heads is not None else 4
    lines = read_lines(config.data, getattr(config.data, corpus))
    ids = with_context_token(vocab.encode(vocab.tokenizer.tokenize(lines)), vocab.eos_id)
    segment = 64
    ids = ids[: min(tokens, ids.numel()) // segment * segment].view(-1, segment)
    student = copy.copy(model)
    student._modules = dict(model._modules)
    torch.manual_seed(0)
    student.heads = build_heads(ComponentConfig(kind, {"n": n}), model.output.embedding_dim)
    for parameter in student.parameters():
        parameter.requires_grad_(False)
    for parameter in student.heads.parameters():
        parameter.requires_grad_(True)
    held = max(1, ids.size(0) // 10)
    started = time.perf_counter()
    train = distill.HiddenCache.build(student, ids[:-held])
    held_out = distill.HiddenCache.build(student, ids[-held:])
    distill.train_drafting_heads(student, train, steps, lr=1e-3, batch_size=8)
    with torch.no_grad():
        weight, bias = student.output()
    agreement = distill.head_agreement(student.heads, held_out, weight, bias)
    print(
        f"distilled {kind} heads: {steps} steps on {train.hidden.shape[0] * segment} tokens in "
        f"{time.perf_counter() - started:.0f} s; held-out agreement "
        + ", ".join(f"{a:.2f}" for a in agreement)
    )
    return student.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a trained run with N-gram heads")
    parser.add_argument(
        "--heads", default="medusa", help="head kinds of the models trained here (comma-separated)"
    )
    parser.add_argument("--train-steps", type=int, default=1500)
    parser.add_argument("--distill", default="", help="head kinds to train by self-distillation")
    parser.add_argument("--distill-steps", type=int, default=1000)
    parser.add_argument("--distill-tokens", type=int, default=200_000)
    parser.add_argument("--distill-corpus", default="train")
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
    models = {}  # label -> (model, body label)
    with tempfile.TemporaryDirectory() as scratch:
        corpus = "synthetic" if args.quick else None
        kinds = [None] if args.run else [k for k in args.heads.split(",") if k]
        for kind in kinds:
            run = args.run or train_model(
                args.train_steps, context, args.seed, Path(scratch) / f"run-{kind}", kind, corpus
            )
            config, vocab, model, _ = load_run(run)
            label = type(model.heads).__name__ if model.heads is not None else "none"
            models[label] = (model.eval(), label)
    body_label, (body, _) = next(iter(models.items()))
    for kind in [k for k in args.distill.split(",") if k]:
        student = distilled(
            body, config, vocab, kind, args.distill_steps, args.distill_tokens, args.distill_corpus
        )
        models[f"{kind}-distilled"] = (student, body_label)
    costs = {label: step_costs(model, vocab) for label, (model, _) in models.items()}
    for label, (model, _) in models.items():
        one = costs[label]["verify_1"]
        print(
            f"\n{label}: KV-cached forward over k new tokens (cache of {costs[label]['prefix']}):"
        )
        print(", ".join(f"k {k}: {costs[label][f'verify_{k}'] / one:.2f}x" for k in VERIFY_WIDTHS))
        n_drafted = model.num_heads or 4
        draft_cost = costs[label].get("draft", 0.0) / one
        width = max(k for k in VERIFY_WIDTHS if k <= min(n_drafted + 1, max(VERIFY_WIDTHS)))
        costs[label]["break_even"] = draft_cost + costs[label][f"verify_{width}"] / one - 1
        costs[label]["draft_cost"] = draft_cost
        print(
            f"drafting with the heads: {draft_cost:.2f}x a token; break-even with {n_drafted} "
            f"drafted tokens (verify {width}): {costs[label]['break_even']:.2f} accepted per step"
        )
    prompts = prompts_from(config, vocab)
    variants = []  # (batch, model label, drafter)
    for b in (1, 4):
        for label, (model, body_of) in models.items():
            own_body = body_of == label
            drafters = ["greedy", "lookup"] if own_body else []
            if model.num_heads > 0:
                drafters += ["heads", "both"]
            variants += [(b, label, d) for d in drafters]

    def run_variant(batch: int, label: str, drafter: str):
        result = generate_batch(
            models[label][0],
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

    def greedy_of(b: int, label: str) -> tuple:
        return (b, models[label][1], "greedy")

    identical = all(outputs[v] == outputs[greedy_of(v[0], v[1])] for v in variants)
    median = {v: statistics.median(s) for v, s in speeds.items()}
    print(
        f"\n{args.new_tokens} new tokens, {args.threads} thread(s), median of {args.rounds} "
        f"rounds (min-max); outputs identical: {'yes' if identical else 'NO'}\n"
    )
    print("| batch | model | drafter | tokens/s | min-max | vs greedy | accepted/step |")
    print("|---:|---|---|---:|---:|---:|---:|")
    table = []
    for v in variants:
        b, label, d = v
        ratio = median[v] / median[greedy_of(b, label)]
        accepted = acceptance[v]
        low, high = min(speeds[v]), max(speeds[v])
        print(
            f"| {b} | {label} | {d} | {median[v]:.1f} | {low:.0f}-{high:.0f} | {ratio:.2f}x | "
            f"{'' if accepted is None else f'{accepted:.2f}'} |"
        )
        table.append(
            {
                "batch": b,
                "model": label,
                "drafter": d,
                "tokens_per_s": median[v],
                "spread": [low, high],
                "speedup": ratio,
                "accepted_per_step": accepted,
            }
        )
    drafting = [row for row in table if row["drafter"] != "greedy"]
    best_b1 = max((row for row in drafting if row["batch"] == 1), key=lambda r: r["speedup"])
    first_costs = costs[body_label]
    one = first_costs["verify_1"]
    result = {
        "identical": identical,
        "speedup_b1": best_b1["speedup"],
        "speedup_b4": max(row["speedup"] for row in drafting if row["batch"] == 4),
        "accepted_per_step": best_b1["accepted_per_step"],
        "best_b1": f"{best_b1['model']} {best_b1['drafter']}",
        "heads": body_label,
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "verify_cost": {k: first_costs[f"verify_{k}"] / one for k in VERIFY_WIDTHS},
        "draft_cost": {label: c["draft_cost"] for label, c in costs.items()},
        "break_even_accepted": {label: c["break_even"] for label, c in costs.items()},
        "variants": table,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
