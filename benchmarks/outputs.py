"""Training step time of every output layer relative to ``tied``, with the same LSTM prefix.

Each variant is the model of ``configs/outputs-ptb-<name>.toml`` (the Zaremba-small prefix:
200-dim lookup input, 2x200 LSTM, batch 20, BPTT 35; only ``[model.output]`` differs), plus
GroC with sparse output updates (``update_prob`` 0.3). A step is what ``Trainer.train_step``
does: forward with the carried, detached state, ``model.output()``, cross entropy, zero_grad,
backward, gradient clipping, a step of the preset's optimiser. ``--device cuda`` times on a GPU
(synchronised: the loss is read every step, as the trainer does). The variants are timed in alternating rounds (ABBA
order, so machine drift hits all alike); each variant's step time is its median over rounds,
and every ratio (variant / tied) comes from the same run. Goal: GroC ≤ 2x tied.

The vocabulary is PTB's (``--data``, default ``$TARGETLM_DATA/ptb``) with its WordNet lexicon
(cached; built once if WordNet is installed); without them, 10,000 made-up words with a
synthetic lexicon of the same shape (3 relatives and 10 gloss words per word). Token ids are
Zipfian, like running text over a frequency-ranked vocabulary.

Usage::

    python benchmarks/outputs.py [--steps K] [--rounds R] [--threads N] [--device D] [--json-out PATH]
        [--quick]

Prints a table, then one line ``JSON {...}`` with every ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import sys
from pathlib import Path
from typing import Any

import common
import torch
from common import emit, interleaved, medians, spread, timed, zipf_ids

from targetlm import config as config_lib
from targetlm.config import DataConfig
from targetlm.data import Vocabulary, read_split
from targetlm.lexicon import Lexicon, LexiconError, load_lexicon
from targetlm.modules import build_model, detach_state
from targetlm.objectives import CrossEntropyObjective
from targetlm.training.optim import build_optimizer, clip_gradients

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
VARIANTS = {  # name -> (preset, output option overrides)
    "tied": ("tied", {}),
    "lookup": ("lookup", {}),
    "bilinear": ("bilinear", {}),
    "deep_residual": ("residual", {}),
    "adaptive": ("adaptive", {}),
    "char_cnn": ("charcnn", {}),
    "groc_p1": ("groc", {"update_prob": 1.0}),
    "groc_p0.3": ("groc", {"update_prob": 0.3}),
}
GOAL_RATIO = 2.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def vocabulary(data_dir: str | None) -> tuple[list[str], Lexicon, str]:
    """PTB's words and WordNet lexicon, or made-up ones of the same shape."""
    root = data_dir or (
        Path(os.environ["TARGETLM_DATA"]) / "ptb" if "TARGETLM_DATA" in os.environ else None
    )
    if root is not None and Path(root).is_dir():
        words = Vocabulary.build(read_split(DataConfig(name="ptb", dir=str(root)), "train")).itos
        try:
            return words, load_lexicon(words), "ptb+wordnet"
        except LexiconError as error:
            log(f"warning: {error}; using a synthetic lexicon")
            source = "ptb+synthetic-lexicon"
    else:
        rng = random.Random(0)
        letters = "abcdefghijklmnopqrstuvwxyz"
        words = ["<unk>", "<eos>"] + [
            "".join(rng.choices(letters, k=rng.randint(2, 11))) + str(i) for i in range(9998)
        ]
        source = "synthetic"
    rng = random.Random(1)
    pool = words + [f"gloss{i}" for i in range(5000)]  # gloss words outside the vocabulary too
    relations = {w: rng.sample(words, 3) for w in words[2:]}
    definitions = {
        w: [pool[min(int(rng.paretovariate(1.0)) * 7, len(pool) - 1)] for _ in range(10)]
        for w in words[2:]
    }
    return words, Lexicon(relations, definitions), source


class Variant:
    """One model and its optimiser, stepping through fixed Zipfian batches."""

    def __init__(
        self, name: str, words: list[str], lexicon: Lexicon, batches: list, device: torch.device
    ) -> None:
        preset, overrides = VARIANTS[name]
        config = config_lib.load(CONFIGS / f"outputs-ptb-{preset}.toml")
        output = dataclasses.replace(
            config.model.output, options={**config.model.output.options, **overrides}
        )
        model_config = dataclasses.replace(config.model, output=output)
        torch.manual_seed(0)
        self.model = build_model(model_config, words, lexicon=lexicon).to(device).train()
        self.objective = CrossEntropyObjective()
        self.optimizer = build_optimizer(config.train, self.model.parameters())
        self.clip = config.train.clip
        self.batches = [(x.to(device), y.to(device)) for x, y in batches]
        self.state: Any = None
        self.index = 0

    def step(self) -> None:
        inputs, targets = self.batches[self.index % len(self.batches)]
        self.index += 1
        predicted, _, state = self.model(inputs, detach_state(self.state))
        weight, bias = self.model.output()
        out = self.objective(predicted, targets, weight, bias)
        out.loss.item()  # the trainer reads the loss every step (divergence check)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        clip_gradients(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.state = state


def zipf_batches(vocab_size: int, count: int, batch: int = 20, bptt: int = 35) -> list:
    rows = zipf_ids(vocab_size, (count, batch, bptt + 1))
    return [(r[:, :-1].contiguous(), r[:, 1:].contiguous()) for r in rows]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    parser.add_argument("--data", help="PTB directory (default $TARGETLM_DATA/ptb)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")
    parser.add_argument("--json-out", type=Path, help="also write the JSON object to this file")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: tied and adaptive, 2 rounds of 1 step"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.variants = 1, 2, "tied,adaptive"
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.variants.split(",")
    if "tied" not in names:
        names.insert(0, "tied")
    common.warn_if_loaded()
    words, lexicon, source = vocabulary(args.data)
    batches = zipf_batches(len(words), 8)
    log(f"{len(words):,} words ({source}); building {len(names)} models ...")
    device = torch.device(args.device)
    variants = {name: Variant(name, words, lexicon, batches, device) for name in names}
    for variant in variants.values():
        variant.step()  # untimed: first-call allocations
    sides = {name: (lambda v=variants[name]: timed(v.step, args.steps, device)) for name in names}
    samples = interleaved(
        sides,
        args.rounds,
        after_round=lambda index: log(f"round {index + 1}/{args.rounds} done"),
    )
    seconds = medians(samples)
    ratios = {name: seconds[name] / seconds["tied"] for name in names}
    params = {name: v.model.parameter_counts()["output"] for name, v in variants.items()}
    print(f"{'output':<14}{'ms/step':>10}{'x tied':>8}{'spread':>8}{'output params':>15}")
    for name in names:
        print(
            f"{name:<14}{seconds[name] * 1e3:>10.1f}{ratios[name]:>8.2f}{spread(samples[name]):>8.2f}"
            f"{params[name]:>15,}"
        )
    result = {
        "ratio_vs_tied": ratios,
        "ms_per_step": {name: s * 1e3 for name, s in seconds.items()},
        "output_params": params,
        "goal_groc_ratio": GOAL_RATIO,
        "vocabulary": {"words": len(words), "source": source},
        "steps": args.steps,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "load_average_before": common.LOAD_BEFORE,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    emit(result, args.json_out, samples=samples, compact=True)
    return result


if __name__ == "__main__":
    main()
