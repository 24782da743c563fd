"""Training-step speed of the papers' small models: the eager step against ``train.compile``.

For each preset and each mode (``train.compile`` = ``off``, ``default``, ``graphs``) the
script builds the real :class:`~targetlm.training.Trainer` of the preset (its model, objective,
optimiser and batches) and runs ``Trainer.train_step`` itself, on whatever device it is given:

* **correctness**: the first ``--compare`` steps from the same seed, eagerly and compiled;
  ``max_abs_loss_diff`` is the largest difference of a step's loss (dropout on: the compiled
  step draws the eager step's masks, so the two agree to float rounding);
* **speed**: after the warm-up (compilation, CUDA-graph recording), steps for ``--seconds``
  seconds, the device synchronised before the clock is read: steps/s, tokens/s (target
  tokens), and achieved TFLOP/s;
* **FLOPs**: the model FLOPs of one eager step counted by ``torch.utils.flop_counter`` (every
  matmul, attention and convolution of the forward and backward; elementwise work uncounted),
  so TFLOP/s = counted FLOPs × steps/s;
* ``--concurrent K``: K copies of the measurement side by side (separate processes, as the
  GPU packs run a table; each times its steps once all K have compiled): the per-run rate.

Usage::

    python benchmarks/gpu_step.py --quick                # CPU stand-ins, < 3 min on 2 cores
    TARGETLM_DATA=../shared/data python benchmarks/gpu_step.py --device cuda \\
        [--presets inan-small-ptb-real,tf-small-ptb-wdr-n4] [--modes off,graphs] \\
        [--seconds 10] [--concurrent 18] [--set train.loss_impl='"chunked"'] [--json-out PATH]

``--quick`` runs small stand-ins of an LSTM preset (``inan-small-ptb-real``: the variational
LSTM with REAL) and a Transformer-with-heads preset (``tf-small-ptb-wdr-n4``) on synthetic data,
modes ``off`` and ``default``. The last stdout line is one JSON object: ``max_abs_loss_diff``
and, per preset, ``eager_steps_s`` and ``compiled_steps_s`` (the fastest compiled mode) with
every mode's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import torch
from common import synchronize

from targetlm import builders
from targetlm.training import Trainer

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ("inan-small-ptb-base", "inan-small-ptb-real", "tf-small-ptb-base", "tf-small-ptb-wdr-n4")
SYNTHETIC = [
    'data.name="synthetic"',
    "data.synthetic.train_sentences=400",
    "data.synthetic.valid_sentences=20",
    "data.synthetic.test_sentences=20",
]
# --quick: the presets' code paths at a size a 2-core CPU compiles and runs in seconds
QUICK = {
    "inan-small-ptb-real": SYNTHETIC
    + [
        "data.batch_size=8",
        "data.bptt=12",
        "model.embedding.size=32",
        "model.encoder.hidden_size=32",
    ],
    "tf-small-ptb-wdr-n4": SYNTHETIC
    + [
        "data.batch_size=4",
        "data.bptt=32",
        "model.embedding.size=32",
        "model.encoder.num_layers=2",
        "model.encoder.ff_size=64",
        "model.encoder.max_context=32",
        "eval.segment=16",
    ],
}


def build(preset: str, mode: str, device: str, overrides: list[str], run_dir: Path) -> Trainer:
    """The preset's trainer, set up (model, objective, optimiser, batches), nothing written."""
    config = builders.load_config(
        ROOT / "configs" / f"{preset}.toml",
        [
            *overrides,
            f'train.device="{device}"',
            f'train.compile="{mode}"',
            "train.progress=false",
            "train.threads=1" if device == "cpu" else "train.threads=0",
        ],
    )
    trainer = Trainer(config, run_dir, log=lambda message: None)
    trainer._setup()
    return trainer


def train(trainer: Trainer, index: int) -> tuple[torch.Tensor, Any]:
    """One training step on batch ``index`` (cycling): its summed NLL and target count, as
    ``Trainer.train_step`` returns them (nothing read from the device)."""
    batch = trainer.batches[index % len(trainer.batches)]
    result = trainer.train_step(batch, trainer._scheduled_lr())
    trainer.step += 1
    return result


def step(trainer: Trainer, index: int) -> float:
    """One training step; its main loss per target (a float: reads the device)."""
    nll, count = train(trainer, index)
    return float(nll) / int(count)


def run_steps(trainer: Trainer, index: int, steps: int) -> int:
    """``steps`` steps from batch ``index`` without reading the device; the next index."""
    for _ in range(steps):
        train(trainer, index)
        index += 1
    return index


def counted_flops(trainer: Trainer, index: int) -> int:
    """Matmul, attention and convolution FLOPs of one eager step (forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step(trainer, index)
    return counter.get_total_flops()


def measure(args: argparse.Namespace, preset: str, mode: str, ready: Path | None = None):
    """{"losses": the first --compare steps' losses, "steps_s", "tokens_s", "seconds",
    "steps"} of one preset in one mode, timed after the warm-up; with ``ready`` (a folder),
    the timing starts once --concurrent files are there (every copy has compiled)."""
    overrides = (QUICK[preset] if args.quick else []) + args.set
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(1)
        trainer = build(preset, mode, args.device, overrides, Path(tmp) / "run")
        losses = [step(trainer, i) for i in range(args.compare)]
        index = run_steps(trainer, args.compare, args.warmup)
        synchronize(args.device)
        if ready is not None:
            (ready / str(os.getpid())).touch()
            while len(list(ready.iterdir())) < args.concurrent:
                time.sleep(0.05)
        started, steps = time.perf_counter(), 0
        while True:
            index = run_steps(trainer, index, args.chunk)
            steps += args.chunk
            synchronize(args.device)
            seconds = time.perf_counter() - started
            if seconds >= args.seconds:
                break
        batch = trainer.batches[0]
        tokens = batch.targets[:, : batch.inputs.size(1)].numel()
        flops = counted_flops(trainer, index) if mode == "off" else None
    return {
        "losses": losses,
        "steps": steps,
        "seconds": seconds,
        "steps_s": steps / seconds,
        "tokens_s": steps * tokens / seconds,
        "flops_per_step": flops,
        "compiled": mode == "off" or trainer.compiled is not None,
    }


def measure_side_by_side(args: argparse.Namespace, preset: str, mode: str) -> dict[str, Any]:
    """--concurrent copies of :func:`measure` in separate processes; the per-run figures."""
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        ready.mkdir()
        outputs = [Path(tmp) / f"run{i}.json" for i in range(args.concurrent)]
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    f"{preset}:{mode}:{ready}:{out}",
                    *sys.argv[1:],
                ]
            )
            for out in outputs
        ]
        if any(child.wait() != 0 for child in children):
            raise SystemExit(f"gpu_step: a side-by-side copy of {preset} ({mode}) failed")
        runs = [json.loads(out.read_text()) for out in outputs]
    rates = [run["steps_s"] for run in runs]
    return {
        "runs": args.concurrent,
        "steps_s_mean": sum(rates) / len(rates),
        "steps_s_min": min(rates),
        "tokens_s_total": sum(run["tokens_s"] for run in runs),
    }


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_arguments(parser, quick="CPU stand-ins, a few seconds each")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--presets", default=None, help="comma-separated (default: all four)")
    parser.add_argument(
        "--modes", default=None, help="train.compile modes (default: off,default; cuda: +graphs)"
    )
    parser.add_argument("--seconds", type=float, default=None, help="timed seconds a mode")
    parser.add_argument("--compare", type=int, default=6, help="steps compared with eager")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps after those")
    parser.add_argument("--chunk", type=int, default=5, help="steps between clock reads")
    parser.add_argument("--concurrent", type=int, default=1, help="copies side by side")
    parser.add_argument(
        "--set", action="append", default=[], help="KEY=VALUE config override (repeatable)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.presets = (args.presets or ",".join(QUICK if args.quick else PRESETS)).split(",")
    args.modes = (args.modes or ("off,default,graphs" if cuda else "off,default")).split(",")
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 10.0
    for preset in args.presets:
        if args.quick and preset not in QUICK:
            parser.error(f"--quick has stand-ins of {', '.join(QUICK)} only, not {preset}")
        if not (ROOT / "configs" / f"{preset}.toml").is_file():
            parser.error(f"no preset {preset!r} in configs/")
    if not args.quick and not os.environ.get("TARGETLM_DATA"):
        parser.error("the presets read PTB: set TARGETLM_DATA (or run --quick)")
    if "off" not in args.modes:
        args.modes.insert(0, "off")  # the reference of the loss comparison
    return args


def main(argv: list[str]) -> dict[str, Any]:
    args = parse(argv)
    if args.child:  # one side-by-side copy: measure, write, exit
        preset, mode, ready, out = args.child.split(":")
        result = measure(args, preset, mode, Path(ready))
        Path(out).write_text(json.dumps(result))
        return result
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(args.device) if args.device != "cpu" else "cpu",
        "torch": torch.__version__,
        "seconds": args.seconds,
        "overrides": args.set,
        "presets": {},
    }
    worst = 0.0
    print(f"{'preset':<22} {'mode':<8} {'steps/s':>9} {'tok/s':>10} {'TFLOP/s':>8} {'Δloss':>9}")
    for preset in args.presets:
        entry: dict[str, Any] = {}
        flops = None
        eager_losses: list[float] = []
        for mode in args.modes:
            started = time.perf_counter()
            result = measure(args, preset, mode)
            if mode == "off":
                eager_losses, flops = result["losses"], result["flops_per_step"]
            diff = max(abs(a - b) for a, b in zip(result["losses"], eager_losses))
            worst = max(worst, diff) if mode != "off" else worst
            tflops = None if flops is None else flops * result["steps_s"] / 1e12
            figures = {
                "steps_s": result["steps_s"],
                "tokens_s": result["tokens_s"],
                "tflop_s": tflops,
                "max_abs_loss_diff": diff,
                "compiled": result["compiled"],
                "wall_s": time.perf_counter() - started,
            }
            if args.concurrent > 1:
                figures["side_by_side"] = measure_side_by_side(args, preset, mode)
            entry[mode] = figures
            print(
                f"{preset:<22} {mode:<8} {result['steps_s']:>9.2f} {result['tokens_s']:>10.0f} "
                f"{tflops if tflops is not None else float('nan'):>8.3f} {diff:>9.2e}"
                + (
                    f"  side by side x{args.concurrent}: "
                    f"{figures['side_by_side']['steps_s_mean']:.2f} steps/s a run"
                    if args.concurrent > 1
                    else ""
                ),
                flush=True,
            )
        compiled = [m for m in args.modes if m != "off" and entry[m]["compiled"]]
        best = max(compiled, key=lambda m: entry[m]["steps_s"], default=None)
        entry["flops_per_step"] = flops
        entry["eager_steps_s"] = entry["off"]["steps_s"]
        entry["compiled_steps_s"] = entry[best]["steps_s"] if best else None
        entry["compiled_mode"] = best
        report["presets"][preset] = entry
    report["max_abs_loss_diff"] = worst
    common.emit(report, args.json_out)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
