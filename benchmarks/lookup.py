"""Prompt lookup's matching rule: wall time against KV-cached greedy decoding.

Greedy generation of ``--new-tokens`` tokens after each of ``--prompts`` prompts of the test
split (``--batch`` at a time; 1 by default), for KV-cached greedy decoding and for prompt
lookup with each shortest matched n-gram of ``--min-ngram`` (1: a single repeated token starts
a draft, as Saxena's reference code and transformers do; 2: two tokens must repeat) and each
draft length of ``--lookup-tokens``. Every variant's tokens are checked identical to greedy's. All variants
run in the same rounds, in rotating order; the first round is a warm-up, the median of the
others is reported with every round's time.

    python benchmarks/lookup.py --run configs/smollm2-wt2-base.toml --threads 1 [--batch 1] \\
        [--prompts 8] [--new-tokens 128] [--rounds 3] [--min-ngram 1,2] [--lookup-tokens 4,10] \\
        [--json-out FILE]
    python benchmarks/lookup.py --quick      # SmolLM2, 1 prompt, 16 tokens: a smoke run

The last stdout line is one JSON object (also written to ``--json-out``): per variant the
median seconds, the speed-up over greedy, each measured round's seconds, the same in CPU time
of the process (less disturbed by other processes on a shared machine), drafting steps and
drafted tokens accepted per step.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median  # noqa: E402
from speculative import prompts_from  # noqa: E402

from targetlm.inference import speculative  # noqa: E402
from targetlm.inference.generate import generate_batch  # noqa: E402
from targetlm.runs import load_run  # noqa: E402

QUICK_RUN = "configs/smollm2-wt2-base.toml"
LENGTHS = (16, 9, 24, 12, 20, 14, 18, 10, 22, 16, 12, 26)  # prompt lengths, in tokens


def integers(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="a run directory or config (e.g. SmolLM2's; --quick: SmolLM2's)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1, help="prompts generated together")
    p.add_argument("--prompts", type=int, default=8, choices=range(1, len(LENGTHS) + 1))
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3, help="the first is a warm-up")
    p.add_argument("--min-ngram", type=integers, default=[1, 2])
    p.add_argument("--lookup-tokens", type=integers, default=[4, 10])
    p.add_argument("--json-out", type=Path)
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 1 prompt, 16 tokens, 2 rounds, 1 variant"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens, args.rounds = 1, 16, 2
        args.min_ngram, args.lookup_tokens = [1], [4]
        args.run = args.run or QUICK_RUN
    if args.run is None:
        p.error("--run is required (or --quick)")
    if args.rounds < 2:
        p.error("--rounds: at least 2 (the first is a warm-up)")
    torch.set_num_threads(args.threads)
    config, vocab, model, _ = load_run(args.run)
    prompts = prompts_from(config, vocab, count=args.prompts, lengths=LENGTHS)
    variants = {"greedy": None} | {
        f"lookup n>={n} k={k}": (n, k) for n in args.min_ngram for k in args.lookup_tokens
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    counts: dict[str, tuple[int, float | None]] = {}
    original = speculative.PromptLookup
    reference = None
    try:
        for round_ in range(args.rounds):
            names = list(variants)
            names = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in names:
                setting = variants[name]
                options: dict = {"temperature": 0, "max_tokens": args.new_tokens}
                if setting is not None:
                    min_ngram, tokens = setting
                    speculative.PromptLookup = functools.partial(original, min_ngram=min_ngram)
                    options |= {"speculative": "lookup", "draft_tokens": tokens}
                started, outputs, steps, accepted = time.perf_counter(), [], 0, 0.0
                cpu_started = time.process_time()
                for first in range(0, len(prompts), args.batch):
                    made = generate_batch(
                        model, vocab, prompts[first : first + args.batch], **options
                    )
                    outputs.extend(row.tokens for row in made.rows)
                    steps += made.verifications
                    accepted += (made.acceptance or 0.0) * made.verifications
                elapsed = time.perf_counter() - started
                cpu_elapsed = time.process_time() - cpu_started
                speculative.PromptLookup = original
                if setting is None and reference is None:
                    reference = outputs
                if reference is not None and outputs != reference:
                    raise SystemExit(f"{name}: output differs from greedy's")
                if round_ > 0:
                    seconds[name].append(elapsed)
                    cpu[name].append(cpu_elapsed)
                counts[name] = (steps, accepted / steps if steps else None)
                print(
                    f"round {round_} {name}: {elapsed:.1f} s ({cpu_elapsed:.1f} s CPU)", flush=True
                )
    finally:
        speculative.PromptLookup = original
    greedy = median(seconds["greedy"])
    greedy_cpu = median(cpu["greedy"])
    result = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "batch": args.batch,
        "run": args.run,
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "identical": True,
        "variants": {
            name: {
                "median_s": round(median(times), 2),
                "speedup": round(greedy / median(times), 2),
                "rounds_s": [round(t, 2) for t in times],
                "median_cpu_s": round(median(cpu[name]), 2),
                "speedup_cpu": round(greedy_cpu / median(cpu[name]), 2),
                "rounds_cpu_s": [round(t, 2) for t in cpu[name]],
                "drafting_steps": counts[name][0],
                "accepted_per_step": None if counts[name][1] is None else round(counts[name][1], 2),
            }
            for name, times in seconds.items()
        },
    }
    print(json.dumps(result))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
