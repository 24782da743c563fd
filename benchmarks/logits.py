"""The logit layer + loss, full against chunked (``train.loss_impl``): peak memory and step time.

One training step of the logit layer alone (x̂ a leaf tensor standing in for the encoder's
output; E_out (V, d) and b learnt; Zipfian target ids): forward + backward of the objective
through :class:`targetlm.objectives.NgramLoss` with ``loss_impl = "full"`` and
``"chunked"``, for

    ce        cross entropy
    ce_ls     cross entropy, label smoothing 0.1
    al        augmented loss (τ = 20, α = 10, ỹ from E_out)
    ngram     N = 4 simple heads (their MLPs run in both), cross entropy
    wdr       N = 4 WDR heads, cross entropy

Each (case, impl) runs in a fresh subprocess: the inputs are allocated, then the RSS
high-water mark (``getrusage().ru_maxrss``) is read as the baseline; the peak after the
steps minus the baseline is the step's memory (logits, softmax, gradients, the heads'
activations; the same inputs on both sides). Step time: the fastest of ``--steps`` timed
steps after one warm-up step (``--steps 0``: memory only, one step).

    python benchmarks/logits.py                       # the default subset (~10-15 min, 1 thread)
    python benchmarks/logits.py --vocab 10000,33278,49152 --tokens 4096,8192 --dims 256,576
    python benchmarks/logits.py --losses wdr --vocab 49152 --steps 0 --chunk-tokens 128
    python benchmarks/logits.py --quick                # one small case, seconds

Prints a markdown table with the ratios chunked / full and one line ``JSON {...}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time

import common

LOSSES = ("ce", "ce_ls", "al", "ngram", "wdr")


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def worker(case: dict) -> dict:
    """One (case, impl) in this process: memory of one step over the baseline, step times."""
    import torch
    from common import zipf_ids
    from torch import nn

    from targetlm.modules.heads import HEADS
    from targetlm.modules.model import Prediction
    from targetlm.objectives import AugmentedLossObjective, CrossEntropyObjective, NgramLoss

    torch.set_num_threads(case["threads"])
    torch.manual_seed(0)
    M, V, d, loss = case["tokens"], case["vocab"], case["dim"], case["loss"]
    B = max(1, M // 1024)  # rows of 1024 tokens, as a Transformer's blocks
    T = M // B
    n = 4 if loss in ("ngram", "wdr") else 1
    if loss == "al":
        objective: nn.Module = AugmentedLossObjective(tau=20.0, gamma=0.5, target_source="output")
    else:
        objective = CrossEntropyObjective(label_smoothing=0.1 if loss == "ce_ls" else 0.0)
    heads = None
    if n > 1:
        heads = HEADS.build("simple" if loss == "ngram" else "wdr", {"n": n}, embedding_dim=d)
    chunk = (case["chunk_tokens"], case["chunk_vocab"])
    ngram = NgramLoss(objective, heads, 1.0, case["impl"], *chunk)
    predicted = torch.randn(B, T, d, requires_grad=True)
    weight = nn.Parameter(torch.randn(V, d) * d**-0.5)
    bias = nn.Parameter(torch.zeros(V))
    targets = zipf_ids(V, (B, T + n - 1))
    parameters = [predicted, weight, bias, *([] if heads is None else heads.parameters())]

    def step() -> float:
        started = time.perf_counter()
        outputs = None if heads is None else heads(predicted)
        out = ngram(Prediction(predicted, outputs, None), targets, weight, bias)
        out.loss.backward()
        seconds = time.perf_counter() - started
        for p in parameters:
            p.grad = None
        return seconds

    gc.collect()
    baseline = _max_rss_mib()
    times = [step() for _ in range(1 + case["steps"])]
    return {
        **case,
        "memory_mib": _max_rss_mib() - baseline,
        "seconds": min(times[1:]) if case["steps"] else None,
        "times": times[1:],
        "chunked": ngram.uses_chunked(M * n, V),
    }


def run_case(case: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(case["threads"])}
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(case)],
        env=env,
        cwd=here,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"case {case} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--losses", default=",".join(LOSSES), help=f"of {', '.join(LOSSES)}")
    parser.add_argument("--vocab", type=_ints, default=[10_000, 33_278, 49_152])
    parser.add_argument("--tokens", type=_ints, default=[4096], help="M, e.g. 4096,8192")
    parser.add_argument("--dims", type=_ints, default=[256], help="d, e.g. 256,576")
    parser.add_argument("--steps", type=int, default=1, help="timed steps; 0: memory only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--chunk-vocab", type=int, default=65_536)
    common.add_arguments(parser, quick="smoke run: ce, V 2,000, M 1,024, d 64, one step")
    args = parser.parse_args()
    if args.quick:
        args.losses, args.vocab, args.tokens, args.dims, args.steps = "ce", [2000], [1024], [64], 1
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    losses = [x for x in args.losses.split(",") if x]
    unknown = set(losses) - set(LOSSES)
    if unknown:
        parser.error(f"unknown losses {sorted(unknown)}; choose from {', '.join(LOSSES)}")
    print(f"load average before: {common.LOAD_BEFORE:.2f}; threads {args.threads}", flush=True)
    rows = []
    started = time.perf_counter()
    grid = [
        (loss, v, m, d)
        for m in args.tokens
        for d in args.dims
        for v in args.vocab
        for loss in losses
    ]
    for index, (loss, V, M, d) in enumerate(grid):
        case = {
            "loss": loss,
            "vocab": V,
            "tokens": M,
            "dim": d,
            "steps": args.steps,
            "threads": args.threads,
            "chunk_tokens": args.chunk_tokens,
            "chunk_vocab": args.chunk_vocab,
        }
        order = common.round_order(("full", "chunked"), index)  # ABBA
        result = {impl: run_case({**case, "impl": impl}) for impl in order}
        rows.append(result)
        full, chunked = result["full"], result["chunked"]
        print(
            f"[{time.perf_counter() - started:6.0f} s] {loss} V={V} M={M} d={d}: memory "
            f"{full['memory_mib']:.0f} -> {chunked['memory_mib']:.0f} MiB, time "
            f"{full['seconds']} -> {chunked['seconds']} s",
            flush=True,
        )
    print()
    print(table(rows))
    summary = [
        {
            "loss": r["full"]["loss"],
            "vocab": r["full"]["vocab"],
            "tokens": r["full"]["tokens"],
            "dim": r["full"]["dim"],
            "memory_mib": {k: r[k]["memory_mib"] for k in ("full", "chunked")},
            "seconds": {k: r[k]["seconds"] for k in ("full", "chunked")},
        }
        for r in rows
    ]
    result = {
        "threads": args.threads,
        "chunk": [args.chunk_tokens, args.chunk_vocab],
        "rows": summary,
    }
    samples = {
        f"{r[impl]['loss']} V={r[impl]['vocab']} M={r[impl]['tokens']} d={r[impl]['dim']} {impl}": (
            r[impl]["times"]
        )
        for r in rows
        for impl in ("full", "chunked")
        if r[impl]["times"]
    }
    common.emit(result, args.json_out, samples=samples or None, indent=1)


def table(rows: list[dict]) -> str:
    """Markdown: memory and step time of each side, and chunked / full."""
    lines = [
        "| loss | V | M | d | full MiB | chunked MiB | memory chunked/full | full s/step "
        "| chunked s/step | time chunked/full |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        full, chunked = r["full"], r["chunked"]
        memory = (
            chunked["memory_mib"] / full["memory_mib"] if full["memory_mib"] > 0 else float("nan")
        )
        if full["seconds"]:
            times = f"{full['seconds']:.2f} | {chunked['seconds']:.2f} | {chunked['seconds'] / full['seconds']:.2f}"
        else:
            times = "- | - | -"
        lines.append(
            f"| {full['loss']} | {full['vocab']} | {full['tokens']} | {full['dim']} "
            f"| {full['memory_mib']:.0f} | {chunked['memory_mib']:.0f} | {memory:.3f} | {times} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
