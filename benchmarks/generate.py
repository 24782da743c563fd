"""Generation speed: the Transformer's KV cache and self-speculative decoding with N-gram heads.

Tokens/s of greedy generation of ``--new-tokens`` (256) tokens after one prompt, for

  (a) windowed recomputation: the old path, every new token re-encodes the whole window
      (``encoder.kv_cache = False``);
  (b) KV-cached greedy decoding: one forward of one token per new token;
  (c) self-speculative greedy decoding with N = 2, 3, 4: heads 1..N−1 draft, one forward
      verifies; the acceptance rate is the mean number of drafted tokens kept per step.

All variants must print the same tokens (checked). A model with N = 4 heads serves every N
(heads 1..N−1 of it: each head is trained towards its own word, whatever N is).

The model: a trained run with Transformer + N-gram heads (``--run DIR``), or else a small
Transformer LM with WDR heads (N = 4) trained here for ``--train-steps`` steps (~2 minutes on one
core) on the built-in synthetic corpus, or on PTB when ``$TARGETLM_DATA`` holds it. Its window
covers the prompt and all new tokens, so (b) and (c) never slide it. Each variant runs
``--rounds`` times in rotating order; the median is reported.

    python benchmarks/generate.py [--run DIR] [--train-steps 500] [--new-tokens 256] [--quick]
                                  [--rounds 3] [--threads 1] [--json-out PATH]

Prints a table with ratios against (b) and one line ``JSON {...}``.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import emit, interleaved, medians

from targetlm import builders
from targetlm.data import Vocabulary, read_lines
from targetlm.inference.generate import generate_batch
from targetlm.modules import CausalTransformer
from targetlm.modules.hf import HfEncoder
from targetlm.modules.model import LanguageModel
from targetlm.runs import load_run

PROMPT_TOKENS = 16


def training_config(
    steps: int, context: int, seed: int, heads: str = "wdr", corpus: str | None = None
) -> dict:
    """A small pre-LN Transformer (d 128, 2 layers) with ``heads`` heads (default WDR), N = 4,
    trained on independent blocks of the whole window (every position of it is trained)."""
    data = {"name": "synthetic", "batch_size": 4, "bptt": context, "shuffle": True}
    if corpus is None and os.environ.get("TARGETLM_DATA"):
        corpus = "ptb" if (Path(os.environ["TARGETLM_DATA"]) / "ptb").is_dir() else None
    if corpus is not None:
        data = {**data, "name": corpus}
    return {
        "data": data,
        "model": {
            "embedding": {"kind": "lookup", "size": 128},
            "encoder": {
                "kind": "transformer",
                "num_layers": 2,
                "num_heads": 4,
                "ff_size": 512,
                "dropout": 0.1,
                "max_context": context,
                "norm": "pre",
            },
            "output": {"kind": "tied"},
            "heads": {"kind": heads, "n": 4},
        },
        "objective": {"kind": "cross_entropy"},
        "train": {
            "optimizer": "adam",
            "lr": 0.002,
            "epochs": 1000,
            "max_steps": steps,
            "carry_state": False,
            "clip": 1.0,
            "log_every": 100,
            "seed": seed,
            "progress": False,
        },
        "eval": {"batch_size": 4},
    }


def train_model(
    steps: int,
    context: int,
    seed: int,
    run_dir: Path,
    heads: str = "wdr",
    corpus: str | None = None,
) -> Path:
    """Train :func:`training_config` (``corpus`` None: PTB when ``$TARGETLM_DATA`` has it)."""
    from targetlm.training import Trainer

    config = builders.config_from_dict(training_config(steps, context, seed, heads, corpus))
    started = time.perf_counter()
    results = Trainer(config, run_dir, log=lambda m: None).train()
    print(
        f"trained {config.data.name}: {steps} steps in {time.perf_counter() - started:.0f} s, "
        f"test ppl {results['test']['ppl']:.2f}"
    )
    return run_dir


def with_heads(model: LanguageModel, n: int) -> LanguageModel:
    """The same model (shared modules) with its first n − 1 heads only."""
    smaller = copy.copy(model.heads)  # any head kind: its per-head modules are ``mlps``
    smaller._modules = dict(smaller._modules)
    smaller.num_predictions = n
    smaller.mlps = torch.nn.ModuleList(list(model.heads.mlps)[: n - 1])  # the same modules
    sub = LanguageModel(model.embedding, model.encoder, model.output, smaller)
    sub.projection = model.projection
    return sub.eval()


def prompt_from(config, vocab: Vocabulary) -> list[str]:
    """The first PROMPT_TOKENS tokens of the test split (a sentence start, no <eos>)."""
    lines = [line for line in read_lines(config.data, config.data.test)[:20] if line.strip()]
    tokens = list(vocab.tokenizer.tokenize(lines))  # the run's tokenizer (words or subwords)
    return [t for t in tokens if t != "<eos>"][:PROMPT_TOKENS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run", type=Path, help="a trained run with heads (a Transformer or an hf backbone)"
    )
    parser.add_argument("--train-steps", type=int, default=500)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 30 training steps, 16 tokens, 2 rounds"
    )
    args = parser.parse_args()
    if args.quick:
        args.train_steps, args.new_tokens, args.rounds = 30, 16, 2
    torch.set_num_threads(args.threads)
    context = PROMPT_TOKENS + 1 + args.new_tokens + 8  # prompt, its <eos>, new tokens, N
    with tempfile.TemporaryDirectory() as scratch:
        corpus = "synthetic" if args.quick else None
        run = args.run or train_model(
            args.train_steps, context, args.seed, Path(scratch) / "run", corpus=corpus
        )
        config, vocab, model, _ = load_run(run)
    if model.num_heads < 1 or not isinstance(model.encoder, (CausalTransformer, HfEncoder)):
        parser.error(f"{run}: needs a Transformer or hf-backbone run with N-gram heads")
    prompt = prompt_from(config, vocab)
    encoder = model.encoder

    def run_variant(name: str) -> tuple[float, list[str], float | None]:
        encoder.kv_cache = name != "windowed"
        n = int(name[-1]) if name.startswith("speculative") else 0
        result = generate_batch(
            with_heads(model, n) if n else model,
            vocab,
            [prompt],
            max_tokens=args.new_tokens,
            temperature=0,
            speculative="heads" if n else None,
        )
        encoder.kv_cache = True
        return args.new_tokens / result.seconds, result.rows[0].tokens, result.acceptance

    variants = ["windowed", "cached"] + [
        f"speculative N={n}" for n in (2, 3, 4) if n <= model.num_heads + 1
    ]
    outputs, acceptance = {}, {}

    def side(name: str) -> Callable[[], float]:
        def run() -> float:
            speed, outputs[name], acceptance[name] = run_variant(name)
            return speed

        return run

    run_variant("cached")  # warm-up
    speeds = interleaved({v: side(v) for v in variants}, args.rounds, order="rotate")
    identical = all(outputs[v] == outputs["cached"] for v in variants)
    median = medians(speeds)
    base = median["cached"]
    print(
        f"\n{args.new_tokens} new tokens after a {len(prompt)}-token prompt, batch 1, "
        f"{args.threads} thread(s), max_context {encoder.max_context}, "
        f"median of {args.rounds} rounds; outputs identical: {'yes' if identical else 'NO'}\n"
    )
    print(f"| {'variant':<22} | {'tokens/s':>9} | {'vs (b)':>7} | {'accepted/step':>13} |")
    print(f"|{'-' * 24}|{'-' * 11}|{'-' * 9}|{'-' * 15}|")
    labels = {"windowed": "(a) windowed recompute", "cached": "(b) KV-cached greedy"}
    for v in variants:
        accepted = "" if acceptance[v] is None else f"{acceptance[v]:.2f}"
        label = labels.get(v, f"(c) {v}")
        print(f"| {label:<22} | {median[v]:>9.1f} | {median[v] / base:>6.2f}x | {accepted:>13} |")
    result = {
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "identical": identical,
        "tokens_per_s": median,
        "acceptance": {v: a for v, a in acceptance.items() if a is not None},
    }
    emit(result, args.json_out, samples=speeds)


if __name__ == "__main__":
    main()
