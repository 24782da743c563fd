"""Peak memory of one whole training step of a SmolLM2-135M-shaped model with WDR heads,
``train.loss_impl = "full"`` against ``"chunked"``.

The model is built from targetlm's own parts with SmolLM2-135M's shape (the pretrained model
itself needs the pretrained-LM issue): vocabulary 49,152, d 576, 30 decoder layers, 9
attention heads, a tied output layer, feed-forward width 2,304 (SmolLM2's SwiGLU has three
576 × 1,536 matrices; two 576 × 2,304 ones hold the same parameters), pre-LN, learned
positions, context 1,024; + WDR heads, N = 4. One step = forward, the N-gram loss through
``NgramLoss`` with the chosen ``loss_impl``, backward, Adam. Each (tokens, impl) runs in a
fresh process; memory = the RSS high-water mark after the step minus the one after building
the model and the optimiser state (so: activations, logits, gradients).

    python benchmarks/logits_model.py                      # 1×1024 and 8×1024 tokens, both impls
    python benchmarks/logits_model.py --rows 2,8 --impls chunked
    python benchmarks/logits_model.py --quick               # a small stand-in, seconds

From two token counts it also prints the largest tokens per step that fit a memory budget
(default 24 GiB), extrapolated linearly (memory grows linearly with tokens at a fixed context).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import common

SHAPE = {"vocab": 49_152, "dim": 576, "layers": 30, "heads": 9, "ff": 2_304, "context": 1_024}
QUICK_SHAPE = {
    **SHAPE,
    "vocab": 4_096,
    "dim": 64,
    "layers": 2,
    "heads": 2,
    "ff": 128,
    "context": 128,
}


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(case: dict) -> dict:
    import torch

    from targetlm.config import ComponentConfig, ModelConfig
    from targetlm.modules import build_model
    from targetlm.objectives import build_objective

    torch.set_num_threads(case["threads"])
    torch.manual_seed(0)
    s = case.get("shape", SHAPE)
    config = ModelConfig(
        embedding=ComponentConfig("lookup", {"size": s["dim"], "init_std": 0.02}),
        encoder=ComponentConfig(
            "transformer",
            {
                "num_layers": s["layers"],
                "num_heads": s["heads"],
                "ff_size": s["ff"],
                "dropout": 0.0,
                "max_context": s["context"],
            },
        ),
        output=ComponentConfig("tied", {"bias": False}),
        heads=ComponentConfig("wdr", {"n": 4}),
    )
    model = build_model(config, s["vocab"])
    objective = build_objective(
        ComponentConfig("cross_entropy", {"ngram_alpha": 0.1}), model, loss_impl=case["impl"]
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():  # Adam's state exists before the baseline is read
        optimizer.state[p] = {
            "step": torch.tensor(0.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }
    B, T = case["rows"], s["context"]
    tokens = torch.randint(s["vocab"], (B, T + 4))
    baseline = _max_rss_mib()
    started = time.perf_counter()
    prediction = model(tokens[:, :T])
    weight, bias = model.output()
    out = objective(prediction, tokens[:, 1:], weight, bias)
    out.loss.backward()
    optimizer.step()
    seconds = time.perf_counter() - started
    return {
        **case,
        "params": sum(p.numel() for p in model.parameters()),
        "memory_mib": _max_rss_mib() - baseline,
        "seconds": seconds,
        "loss": float(out.loss),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,8", help="rows of 1,024 tokens per step")
    parser.add_argument("--impls", default="full,chunked")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-gib", type=float, default=24.0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    common.add_arguments(parser, quick="smoke run: a 2-layer, 4k-vocabulary, 128-token stand-in")
    args = parser.parse_args()
    shape = QUICK_SHAPE if args.quick else SHAPE
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))))
        return
    results = []
    for index, rows in enumerate(int(r) for r in args.rows.split(",")):
        for impl in common.round_order(args.impls.split(","), index):  # ABBA
            case = {"rows": rows, "impl": impl, "threads": args.threads}
            if args.quick:
                case["shape"] = shape
            run = subprocess.run(
                [sys.executable, __file__, "--worker", json.dumps(case)],
                capture_output=True,
                text=True,
                check=True,
            )
            line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
            results.append(json.loads(line.removeprefix("RESULT ")))
            print(f"done: {results[-1]}", file=sys.stderr, flush=True)
    print(f"SmolLM2-135M shape {shape}, WDR N = 4, {results[0]['params']:,} parameters")
    print("| tokens per step | impl | step memory MiB | step s | loss |")
    print("|---:|---|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['rows'] * shape['context']:,} | {r['impl']} | {r['memory_mib']:,.0f} "
            f"| {r['seconds']:.1f} | {r['loss']:.4f} |"
        )
    budget = args.budget_gib * 1024
    for impl in args.impls.split(","):
        points = sorted((r["rows"], r["memory_mib"]) for r in results if r["impl"] == impl)
        if len(points) >= 2:
            (r0, m0), (r1, m1) = points[0], points[-1]
            per_row = (m1 - m0) / (r1 - r0)
            fit = int((budget - (m0 - per_row * r0)) / per_row)
            print(
                f"{impl}: {per_row:,.0f} MiB per 1,024 tokens; about {fit * shape['context']:,} "
                f"tokens per step fit {args.budget_gib:g} GiB beyond the model and Adam "
                "(linear extrapolation)"
            )
    common.emit({"shape": shape, "results": results}, args.json_out, indent=1)


if __name__ == "__main__":
    main()
