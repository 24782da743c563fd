"""Prompt lookup's matching rule: wall time against KV-cached greedy decoding.

Greedy generation of ``--new-tokens`` tokens after each of ``--prompts`` prompts of the test
split (``--batch`` at a time; 1 by default), for KV-cached greedy decoding and for prompt
lookup with each shortest matched n-gram of ``--min-ngram`` (1: a single repeated token starts
a draft, as Saxena's reference code and transformers do; 2: two tokens must repeat) and each
draft length of ``--lookup-tokens``. Every variant's tokens are checked identical to greedy's. All variants
run in the same rounds, in rotating order (``benchmarks/common.py``), after one warm-up round;
the median of the rounds is reported with every round's time.

    python benchmarks/lookup.py --run configs/smollm2-wt2-base.toml --threads 1 [--batch 1] \\
        [--prompts 8] [--new-tokens 128] [--rounds 2] [--min-ngram 1,2] [--lookup-tokens 4,10] \\
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
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from speculative import prompts_from  # noqa: E402

from targetlm.inference import drafters as speculative  # noqa: E402
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
    p.add_argument("--min-ngram", type=integers, default=[1, 2])
    p.add_argument("--lookup-tokens", type=integers, default=[4, 10])
    common.add_arguments(
        p, quick="smoke run: 1 prompt, 16 tokens, 1 variant", rounds=2, quick_rounds=1
    )
    args = p.parse_args(argv)
    common.resolve_rounds(args, p)
    if args.quick:
        args.prompts, args.new_tokens = 1, 16
        args.min_ngram, args.lookup_tokens = [1], [4]
        args.run = args.run or QUICK_RUN
    if args.run is None:
        p.error("--run is required (or --quick)")
    torch.set_num_threads(args.threads)
    common.warn_if_loaded()
    config, vocab, model, _ = load_run(args.run)
    prompts = prompts_from(config, vocab, count=args.prompts, lengths=LENGTHS)
    variants = {"greedy": None} | {
        f"lookup n>={n} k={k}": (n, k) for n in args.min_ngram for k in args.lookup_tokens
    }
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    counts: dict[str, tuple[int, float | None]] = {}
    reference: list[list[int]] = []
    original = speculative.PromptLookup

    def side(name: str, setting: tuple[int, int] | None) -> Callable[[], float]:
        """One variant's round: every prompt generated, its tokens checked against greedy's;
        returns the wall seconds (the process's CPU seconds go to ``cpu``)."""
        options: dict = {"temperature": 0, "max_tokens": args.new_tokens}
        if setting is not None:
            options |= {"speculative": "lookup", "draft_tokens": setting[1]}

        def run() -> float:
            if setting is not None:
                speculative.PromptLookup = functools.partial(original, min_ngram=setting[0])
            outputs, steps, accepted = [], 0, 0.0
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                for first in range(0, len(prompts), args.batch):
                    made = generate_batch(
                        model, vocab, prompts[first : first + args.batch], **options
                    )
                    outputs.extend(row.tokens for row in made.rows)
                    steps += made.verifications
                    accepted += (made.acceptance or 0.0) * made.verifications
            finally:
                speculative.PromptLookup = original
            elapsed, cpu_elapsed = time.perf_counter() - started, time.process_time() - cpu_started
            if setting is None and not reference:
                reference.extend(outputs)
            if outputs != reference:
                raise SystemExit(f"{name}: output differs from greedy's")
            cpu[name].append(cpu_elapsed)
            counts[name] = (steps, accepted / steps if steps else None)
            print(f"{name}: {elapsed:.1f} s ({cpu_elapsed:.1f} s CPU)", flush=True)
            return elapsed

        return run

    # greedy first in the warm-up round, so every variant is checked against its tokens
    sides = {name: side(name, setting) for name, setting in variants.items()}
    seconds = common.interleaved(sides, args.rounds, warmup=1, order="rotate")
    cpu = {name: times[1:] for name, times in cpu.items()}  # the warm-up round's dropped
    greedy = common.median(seconds["greedy"])
    greedy_cpu = common.median(cpu["greedy"])
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
                "median_s": round(common.median(times), 2),
                "speedup": round(greedy / common.median(times), 2),
                "rounds_s": [round(t, 2) for t in times],
                "median_cpu_s": round(common.median(cpu[name]), 2),
                "speedup_cpu": round(greedy_cpu / common.median(cpu[name]), 2),
                "rounds_cpu_s": [round(t, 2) for t in cpu[name]],
                "drafting_steps": counts[name][0],
                "accepted_per_step": None if counts[name][1] is None else round(counts[name][1], 2),
            }
            for name, times in seconds.items()
        },
    }
    common.emit(result, args.json_out, samples=seconds, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
