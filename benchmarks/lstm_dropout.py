"""Cost of recurrent (variational) dropout in LstmEncoder: training step time of the fused
``nn.LSTM`` path (``dropout_recurrent = 0``) against the per-step loop it needs when > 0.

The Inan et al. small shape (2 layers x 200, input 200, batch 20, BPTT 35), timed two ways:
``encoder`` is the encoder alone (forward with the carried state, backward of a random
projection of its output); ``model`` is a whole training step of
``configs/inan-small-ptb-base.toml`` (10k vocabulary, untied output, cross entropy, clipping,
SGD) on Zipf-distributed ids. Input, between-layer and output dropout are the preset's
(0.7) in every variant; only the recurrent dropout differs. Variants: ``fused``
(dropout_recurrent 0), ``loop`` (0.5) and, for the encoder, ``loop-jit`` (0.5, with
``lstm_recurrence`` compiled by ``torch.jit.script``). Timed in rounds whose order rotates;
ratios are of median step times in one run.

    python benchmarks/lstm_dropout.py [--rounds 5] [--steps 5] [--threads 1] [--out PATH] [--quick]

Prints a table and one line ``JSON {...}``, also written to ``--out``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from common import emit, interleaved, median, spread, timed, zipf_ids

from targetlm import config as config_lib
from targetlm.modules import LstmEncoder, build_model, detach_state, encoders
from targetlm.objectives import build_objective
from targetlm.training.optim import build_optimizer, clip_gradients

VOCAB, BATCH, BPTT, SIZE, LAYERS, DROPOUT = 10_000, 20, 35, 200, 2, 0.7
CONFIG = "configs/inan-small-ptb-base.toml"


def with_recurrence(step: Callable[[], None], recurrence: Callable | None) -> Callable[[], None]:
    """``step`` with ``encoders.lstm_recurrence`` swapped for ``recurrence`` while it runs."""
    if recurrence is None:
        return step

    def swapped() -> None:
        original = encoders.lstm_recurrence
        encoders.lstm_recurrence = recurrence
        try:
            step()
        finally:
            encoders.lstm_recurrence = original

    return swapped


def encoder_step(p: float) -> Callable[[], None]:
    """Forward + backward of the encoder alone, state carried from step to step."""
    torch.manual_seed(0)
    encoder = LstmEncoder(
        SIZE,
        SIZE,
        LAYERS,
        dropout_input=DROPOUT,
        dropout_hidden=DROPOUT,
        dropout_output=DROPOUT,
        dropout_recurrent=p,
        init_range=0.05,
    ).train()
    x = torch.randn(BATCH, BPTT, SIZE)
    weight = torch.randn(BATCH, BPTT, SIZE)
    state = None

    def step() -> None:
        nonlocal state
        out, state = encoder(x, detach_state(state))
        encoder.zero_grad(set_to_none=True)
        (out * weight).sum().backward()

    return step


def model_step(p: float, data: torch.Tensor) -> Callable[[], None]:
    """One training step of the Inan small preset with ``dropout_recurrent = p``."""
    config = config_lib.load(
        CONFIG,
        [
            "data.name=synthetic",
            f"model.encoder.dropout_recurrent={p}",
            "model.encoder.tie_recurrent_mask=false",
        ],
    )
    torch.manual_seed(0)
    model = build_model(config.model, VOCAB).train()
    objective = build_objective(config.objective, model)
    optimizer = build_optimizer(config.train, model.parameters())
    inputs, targets = data[:, :BPTT], data[:, 1 : BPTT + 1]
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

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="default docs/lstm_dropout.json (none: --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 1 step")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, 1
    elif args.out is None:
        args.out = Path("docs/lstm_dropout.json")
    torch.set_num_threads(args.threads)
    scripted = torch.jit.script(encoders.lstm_recurrence)
    data = zipf_ids(VOCAB, (BATCH, BPTT + 1))
    steps = {
        ("encoder", "fused"): encoder_step(0.0),
        ("encoder", "loop"): encoder_step(0.5),
        ("encoder", "loop-jit"): with_recurrence(encoder_step(0.5), scripted),
        ("model", "fused"): model_step(0.0, data),
        ("model", "loop"): model_step(0.5, data),
    }
    for step in steps.values():
        timed(step, 2)  # warm-up (and the TorchScript profiling runs)
    names = list(steps)
    sides = {name: (lambda step=steps[name]: timed(step, args.steps)) for name in names}
    times = interleaved(sides, args.rounds, order="rotate")
    print(f"{'level':<9}{'variant':<10}{'ms/step':>10}{'ratio':>8}{'spread':>8}")
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for level, variant in names:
        seconds = median(times[level, variant])
        base = median(times[level, "fused"])
        rows.setdefault(level, {})[variant] = {
            "ms_per_step": seconds * 1e3,
            "ratio": seconds / base,
            "spread": spread(times[level, variant]),
        }
        row = rows[level][variant]
        print(
            f"{level:<9}{variant:<10}{seconds * 1e3:>10.1f}{row['ratio']:>8.2f}{row['spread']:>8.0%}"
        )
    result = {
        "shape": {"layers": LAYERS, "hidden": SIZE, "input": SIZE, "batch": BATCH, "bptt": BPTT},
        "config": CONFIG,
        "dropout_recurrent": 0.5,
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "steps": args.steps,
        "torch": torch.__version__,
        "results": rows,
    }
    emit(
        result, args.out, samples={f"{level} {variant}": v for (level, variant), v in times.items()}
    )


if __name__ == "__main__":
    main()
