"""Cost of the augmented loss (Inan et al. 2017): training step time of AL relative to plain CE.

The small VD-LSTM (2x200, vocabulary 10k, batch 20, BPTT 35) on Zipf-distributed tokens, dropout as in
the preset; the same model and data for both objectives, timed in alternating rounds (ABBA)
so machine noise hits both; the ratio is of median step times in one run.

    python benchmarks/augmented.py [--rounds 6] [--steps 10] [--threads N] [--quick]

Prints a table and one line ``JSON {...}``. AL adds one (N, V) similarity matmul
(E_out[y] · E_outᵀ) and two (N, V) softmaxes per step, so it should cost roughly one more
logit layer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import emit, interleaved, medians, timed, zipf_ids

from targetlm import config as config_lib
from targetlm.modules import build_model, detach_state
from targetlm.objectives import OBJECTIVES
from targetlm.training.optim import build_optimizer, clip_gradients

VOCAB, BATCH, BPTT = 10_000, 20, 35


def make_step(config: config_lib.Config, objective_kind: str, options: dict):
    torch.manual_seed(0)
    model = build_model(config.model, VOCAB).train()
    objective = OBJECTIVES.build(objective_kind, options, embedding=model.embedding)
    optimizer = build_optimizer(config.train, model.parameters())
    data = zipf_ids(VOCAB, (BATCH, BPTT + 1))  # AL's cost depends on the distinct targets
    state = None

    def step() -> None:
        nonlocal state
        predicted, _, state = model(data[:, :-1], detach_state(state))
        weight, bias = model.output()
        loss = objective(predicted, data[:, 1:], weight, bias).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_gradients(model.parameters(), config.train.clip)
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/inan-small-ptb-real.toml")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 1 step")
    parser.add_argument("--json-out", type=Path, help="also write the JSON record to this file")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    config = config_lib.load(args.config, ["data.name=synthetic"])
    al_options = dict(config.objective.options) if config.objective.kind == "augmented" else {}
    steps = {
        "cross_entropy": make_step(config, "cross_entropy", {}),
        "augmented": make_step(config, "augmented", al_options),
    }
    sides = {name: (lambda step=step: timed(step, args.steps)) for name, step in steps.items()}
    for step in steps.values():  # warm-up
        timed(step, 2)
    samples = interleaved(sides, args.rounds)
    median = medians(samples)
    ratio = median["augmented"] / median["cross_entropy"]
    print(f"{'objective':<16}{'ms/step':>10}{'tok/s':>10}")
    for name, seconds in median.items():
        print(f"{name:<16}{seconds * 1e3:>10.1f}{BATCH * BPTT / seconds:>10.0f}")
    print(f"AL / CE step time: {ratio:.3f}")
    result = {
        "config": args.config,
        "threads": torch.get_num_threads(),
        "ms_per_step": {k: v * 1e3 for k, v in median.items()},
        "al_over_ce": ratio,
    }
    emit(result, args.json_out, samples=samples)


if __name__ == "__main__":
    main()
