"""Cost of N-gram heads (Heo et al. 2024, 2025): training step time with N = 2, 3, 4 simple and
WDR heads relative to plain next-word training, next to the ratio their extra FLOPs predict.

The Zaremba small LSTM preset (2x200, vocabulary 10k, batch 20, BPTT 35) on Zipf-distributed
tokens; every variant trains the same model and data, timed in rounds whose order rotates so
machine noise hits all of them; ratios are of median step times in one run.

    python benchmarks/heads.py [--rounds 4] [--steps 5] [--threads N] [--json-out PATH] [--quick]

Prints a table and one line ``JSON {...}``. Each head adds its MLP (two d×d matmuls) and one
more logit layer (B·T × d × V) plus its softmax, forward and backward, so with V ≫ d a head
costs roughly one more logit layer; WDR adds only the (detached) conjugate, n·d adds per
position.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from common import emit, interleaved, medians, timed, zipf_ids

from targetlm import config as config_lib
from targetlm.config import ComponentConfig
from targetlm.modules import build_model, detach_state
from targetlm.objectives import build_objective
from targetlm.training.optim import build_optimizer, clip_gradients

VOCAB, BATCH, BPTT = 10_000, 20, 35
VARIANTS = [("none", 1)] + [(kind, n) for kind in ("simple", "wdr") for n in (2, 3, 4)]


def make_step(config: config_lib.Config, kind: str, n: int, lookahead_data: torch.Tensor):
    torch.manual_seed(0)
    heads = ComponentConfig(kind, {"n": n} if kind != "none" else {})
    model = build_model(dataclasses.replace(config.model, heads=heads), VOCAB).train()
    objective = build_objective(config.objective, model)
    optimizer = build_optimizer(config.train, model.parameters())
    lookahead = objective.lookahead
    inputs = lookahead_data[:, :BPTT]
    targets = lookahead_data[:, 1 : BPTT + 1 + lookahead]  # the segment's targets + N − 1 more
    state = None

    def step() -> None:
        nonlocal state
        prediction = model(inputs, detach_state(state))
        state = prediction.state
        weight, bias = model.output()
        loss = objective(prediction, targets, weight, bias).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_gradients(model.parameters(), config.train.clip)
        optimizer.step()

    return step, model


def step_flops(model) -> float:
    """Matmul FLOPs per training step (forward + backward ≈ 3 × forward)."""
    d = model.output.embedding_dim
    per_token = 0.0
    for layer in model.encoder.layers:  # LSTM: 4 gates × (input + hidden) × hidden
        per_token += 2 * 4 * layer.hidden_size * (layer.input_size + layer.hidden_size)
    if not isinstance(model.projection, torch.nn.Identity):
        per_token += 2 * model.projection.in_features * d
    per_token += 2 * d * VOCAB  # main logit layer
    if model.heads is not None:
        for mlp in model.heads.mlps:
            per_token += sum(
                2 * m.in_features * m.out_features for m in mlp if hasattr(m, "in_features")
            )
            per_token += 2 * d * VOCAB  # the head's own pass through the shared logit layer
    return 3 * per_token * BATCH * BPTT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/zaremba-small-ptb.toml")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 1 step")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    config = config_lib.load(args.config, ["data.name=synthetic"])
    data = zipf_ids(VOCAB, (BATCH, BPTT + 4))  # room for the largest lookahead (N − 1 = 3)
    names = [f"{kind}-n{n}" if kind != "none" else "baseline" for kind, n in VARIANTS]
    steps, flops = {}, {}
    for name, (kind, n) in zip(names, VARIANTS):
        steps[name], model = make_step(config, kind, n, data)
        flops[name] = step_flops(model)
        timed(steps[name], 1)  # warm-up
    sides = {name: (lambda step=steps[name]: timed(step, args.steps)) for name in names}
    samples = interleaved(sides, args.rounds, order="rotate")
    median = medians(samples)
    base = median["baseline"]
    print(f"{'variant':<12}{'ms/step':>10}{'ratio':>8}{'FLOP ratio':>12}")
    rows = {}
    for name in names:
        ratio, predicted = median[name] / base, flops[name] / flops["baseline"]
        rows[name] = {"ms_per_step": median[name] * 1e3, "ratio": ratio, "flop_ratio": predicted}
        print(f"{name:<12}{median[name] * 1e3:>10.1f}{ratio:>8.2f}{predicted:>12.2f}")
    result = {
        "config": args.config,
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "steps": args.steps,
        "variants": rows,
    }
    emit(result, args.json_out, samples=samples)


if __name__ == "__main__":
    main()
