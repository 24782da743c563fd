"""Training and evaluation throughput of targetlm against a plain PyTorch loop of the same math.

For each configuration the targetlm model (built by ``targetlm.modules.build_model``) and a
reference model written here with stock ``torch.nn`` layers are timed in alternating rounds,
so that machine noise hits both sides alike; each side's tokens/s is the median over rounds.

* targetlm training runs ``Trainer.train_step`` itself (forward with the carried, detached
  state, ``model.output()``, the built objective (``NgramLoss`` around ``CrossEntropyObjective``), zero_grad, backward,
  ``clip_grad_norm_``, SGD step) and evaluation runs ``evaluate_stream`` itself
  (forward + loss under ``no_grad``, state carried across segments).
* the reference does the same math the way a PyTorch user would write it: ``nn.Embedding``,
  ``nn.LSTM(num_layers=2)`` or ``nn.TransformerEncoderLayer`` stacks, ``nn.Linear`` (or the
  tied embedding), ``F.cross_entropy``, SGD with gradient clipping.

All dropout is 0 and the data are random token ids with fixed seeds (no dataset needed).
MFU is the model's matmul FLOP/s divided by an fp32 matmul peak measured in the same run.

Usage::

    python benchmarks/throughput.py [--quick] [--configs lstm-small,lstm-medium,tf-small]
                                    [--threads N] [--json-out PATH]

Prints a table, then one line ``JSON {...}`` with every ratio (targetlm / reference) and MFU.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import common
import torch
import torch.nn.functional as F
from torch import nn

from targetlm.builders import load_config, validate
from targetlm.config import ComponentConfig, Config, DataConfig, ModelConfig, TrainConfig
from targetlm.inference.evaluate import evaluate_stream
from targetlm.modules import build_model
from targetlm.objectives import build_objective
from targetlm.tasks import TASKS
from targetlm.training.optim import build_optimizer
from targetlm.training.trainer import Trainer

try:  # the one training step module; absent in checkouts before it (timed for before/after)
    from targetlm.training.step import TrainingStep
except ImportError:
    TrainingStep = None  # type: ignore[assignment,misc]

VOCAB = 10_000
SEED = 1234
TRAIN_SEGMENTS = 8  # distinct training batches cycled through (the state keeps being carried)
WARMUP_STEPS = 1  # untimed; full runs add one more untimed step to calibrate the round length
GOAL_RATIO = 1.0
GOAL_LSTM_MFU = 0.60

Mode = Literal["train", "eval"]
StepRunner = Callable[[int], int]  # runs k steps, returns the number of target tokens processed


# --- configurations ------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """One benchmarked configuration; dropout is 0 everywhere so both sides do the same math."""

    name: str
    encoder: Literal["lstm", "transformer"]
    batch: int  # B rows
    segment: int  # T: BPTT length (LSTM) or block length = max context (Transformer)
    size: int  # embedding size = LSTM units = d_model
    layers: int
    init_range: float
    lr: float  # SGD learning rate (constant)
    clip: float  # max gradient norm
    heads: int = 0
    ff_size: int = 0

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.segment

    def model_config(self) -> ModelConfig:
        """The targetlm model, as a config file would describe it (LSTMs untied, TF tied)."""
        if self.encoder == "lstm":
            return ModelConfig(
                embedding=ComponentConfig(
                    "lookup", {"size": self.size, "init_range": self.init_range}
                ),
                encoder=ComponentConfig(
                    "lstm",
                    {
                        "hidden_size": self.size,
                        "num_layers": self.layers,
                        "variational": False,
                        "init_range": self.init_range,
                    },
                ),
                output=ComponentConfig("lookup", {"init_range": self.init_range}),
            )
        return ModelConfig(
            embedding=ComponentConfig("lookup", {"size": self.size, "init_range": self.init_range}),
            encoder=ComponentConfig(
                "transformer",
                {
                    "num_layers": self.layers,
                    "num_heads": self.heads,
                    "ff_size": self.ff_size,
                    "dropout": 0.0,
                    "max_context": self.segment,
                    "positions": "learned",
                },
            ),
            output=ComponentConfig("tied"),
        )

    def config(self) -> Config:
        """The full targetlm config ``Trainer.train_step`` reads (SGD, constant lr, mean loss)."""
        return Config(
            data=DataConfig(batch_size=self.batch, bptt=self.segment),
            model=self.model_config(),
            train=TrainConfig(
                optimizer="sgd",
                lr=self.lr,
                clip=self.clip,
                loss_reduction="mean",
                carry_state=self.encoder == "lstm",
                progress=False,
                seed=SEED,
            ),
        )


def spec_from_preset(name: str, preset: str, **timing: float) -> Spec:
    """The configuration of preset ``configs/<preset>.toml``: its batch, segment, sizes, layers,
    initialisation, learning rate and clipping (``timing`` replaces the last two where the
    preset's optimiser is not SGD). Everything else is the benchmark's: dropout 0, SGD at a
    constant rate, random ids, so that the reference does the same math."""
    config = load_config(PRESETS / f"{preset}.toml")
    embedding, encoder = config.model.embedding.options, config.model.encoder.options
    kind = config.model.encoder.kind
    if kind not in ("lstm", "transformer"):
        raise ValueError(f"{preset}: the benchmark times lstm and transformer encoders, not {kind}")
    if kind == "lstm" and encoder["hidden_size"] != embedding["size"]:
        raise ValueError(f"{preset}: the reference LSTM needs embedding size = hidden size")
    values: dict[str, float] = {"lr": config.train.lr, "clip": config.train.clip, **timing}
    return Spec(
        name,
        kind,
        config.data.batch_size,
        config.data.bptt,
        embedding["size"],
        encoder["num_layers"],
        init_range=embedding["init_range"],
        lr=values["lr"],
        clip=values["clip"],
        heads=encoder.get("num_heads", 0),
        ff_size=encoder.get("ff_size", 0),
    )


PRESETS = Path(__file__).resolve().parent.parent / "configs"
SPECS: dict[str, Spec] = {
    # Zaremba et al. (2014) small: 200-d embedding, 2x200 LSTM, untied 10k output
    "lstm-small": spec_from_preset("lstm-small", "zaremba-small-ptb"),
    # Zaremba et al.'s medium size (Inan et al.'s medium base): 2x650 LSTM, untied, its
    # dropout off for timing
    "lstm-medium": spec_from_preset("lstm-medium", "inan-medium-ptb-base"),
    # Heo et al. small decoder Transformer: d 256, d_ff 2100, 6 layers, 4 heads, tied output;
    # timed pre-LN with GELU (nn.TransformerEncoderLayer's fast path on the reference side)
    # and with SGD (lr 0.1, clip 1) in place of the preset's Adam
    "tf-small": spec_from_preset("tf-small", "tf-small-ptb-base", lr=0.1, clip=1.0),
}


def forward_flops_per_token(spec: Spec) -> float:
    """Matmul FLOPs of one forward pass per token (2 per multiply-add; training = 3x this).

    LSTM: per layer 2·4H·(in + H) (the four gates); output 2·d·V. Transformer: 2 x the
    matmul weights per layer (qkv 3d², projection d², feed-forward 2·d·d_ff), attention
    2·2·T·d per layer (QKᵀ and AV, counted over the full T x T, PaLM's convention, although
    the causal kernel only needs about half), output 2·d·V. Embedding lookups, norms,
    nonlinearities and softmax are not matmuls and are not counted.
    """
    output = 2 * spec.size * VOCAB
    if spec.encoder == "lstm":
        sizes = [spec.size] * (spec.layers + 1)  # embedding = hidden size in these configs
        return sum(2 * 4 * h * (i + h) for i, h in zip(sizes, sizes[1:])) + output
    d = spec.size
    per_layer = 2 * (4 * d * d + 2 * d * spec.ff_size) + 2 * 2 * spec.segment * d
    return spec.layers * per_layer + output


# --- reference models (plain PyTorch) ------------------------------------------------------
LstmState = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (layers, B, H)


class ReferenceLstm(nn.Module):
    """nn.Embedding -> nn.LSTM(num_layers, batch_first) -> nn.Linear, untied."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, spec.size)
        self.lstm = nn.LSTM(spec.size, spec.size, num_layers=spec.layers, batch_first=True)
        self.decoder = nn.Linear(spec.size, VOCAB)
        for parameter in self.parameters():
            nn.init.uniform_(parameter, -spec.init_range, spec.init_range)

    def forward(
        self, tokens: torch.Tensor, state: LstmState | None
    ) -> tuple[torch.Tensor, LstmState]:
        hidden, state = self.lstm(self.embedding(tokens), state)  # (B, T, H)
        return self.decoder(hidden), state  # logits (B, T, V)


class ReferenceTransformer(nn.Module):
    """Embedding + learned positions -> pre-LN nn.TransformerEncoderLayer x L (causal) -> LayerNorm
    -> tied output with bias."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        d = spec.size
        self.embedding = nn.Embedding(VOCAB, d)
        nn.init.uniform_(self.embedding.weight, -spec.init_range, spec.init_range)
        self.positions = nn.Parameter(torch.randn(spec.segment, d) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d,
                spec.heads,
                spec.ff_size,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(spec.layers)
        )
        self.norm = nn.LayerNorm(d)
        self.bias = nn.Parameter(torch.zeros(VOCAB))
        mask = nn.Transformer.generate_square_subsequent_mask(spec.segment)  # (T, T), -inf above
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor, state: None = None) -> tuple[torch.Tensor, None]:
        length = tokens.size(1)
        h = self.embedding(tokens) + self.positions[:length]  # (B, T, d)
        mask = self.mask[:length, :length]
        for layer in self.layers:
            # is_causal lets attention use SDPA's causal kernel; the mask is still required
            h = layer(h, src_mask=mask, is_causal=True)
        return F.linear(self.norm(h), self.embedding.weight, self.bias), None  # (B, T, V)


def build_reference(spec: Spec) -> nn.Module:
    return ReferenceLstm(spec) if spec.encoder == "lstm" else ReferenceTransformer(spec)


# --- data ----------------------------------------------------------------------------------
def random_stream(spec: Spec, segments: int, seed: int) -> torch.Tensor:
    """(B·T·segments + 1,) random ids: exactly ``segments`` full (B, T) segments, no padding."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(VOCAB, (spec.tokens_per_step * segments + 1,), generator=generator)


def as_rows(ids: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's batchify: B contiguous rows, targets shifted by one. Each (B, L)."""
    return ids[:-1].view(batch, -1), ids[1:].view(batch, -1)


# --- the two sides -------------------------------------------------------------------------
class Side:
    """One side of the comparison: ``train(k)`` / ``evaluate(k)`` run k segments, return tokens."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._eval_streams: dict[int, torch.Tensor] = {}

    def eval_stream(self, segments: int) -> torch.Tensor:
        """The same random evaluation stream for both sides, made outside the timed call."""
        if segments not in self._eval_streams:
            self._eval_streams[segments] = random_stream(self.spec, segments, SEED + 1)
        return self._eval_streams[segments]

    def runners(self) -> dict[Mode, StepRunner]:
        return {"train": self.train, "eval": self.evaluate}

    def train(self, steps: int) -> int:
        raise NotImplementedError

    def evaluate(self, steps: int) -> int:
        raise NotImplementedError


class TargetlmSide(Side):
    """targetlm's own code: ``Trainer.train_step`` and ``evaluate_stream``, on random streams."""

    def __init__(self, spec: Spec, workdir: Path) -> None:
        super().__init__(spec)
        config = spec.config()
        validate(config)
        # The constructor only checks the (non-existent) run directory; nothing is written.
        self.trainer = trainer = Trainer(config, workdir / "unused-run", log=lambda _: None)
        # What Trainer._setup sets, minus the corpus: the attributes train_step reads.
        torch.manual_seed(SEED)
        trainer.device = torch.device("cpu")
        trainer.model = build_model(config.model, VOCAB)
        trainer.objective = build_objective(config.objective, trainer.model)
        trainer.optimizer = build_optimizer(
            config.train, list(trainer.model.parameters()) + list(trainer.objective.parameters())
        )
        trainer.task = TASKS.build(config.task.kind, config.task.options, "task")
        if TrainingStep is not None:
            # the step's loss as one module (what torch's DDP would wrap), one process here
            trainer.step_module = TrainingStep(trainer.task, trainer.model, trainer.objective)
            trainer.trainable = trainer.processes.wrap(
                trainer.step_module, find_unused_parameters=False
            )
        trainer.compiled, trainer.compiled_shape = None, None  # eager: train.compile = "off"
        trainer.epoch, trainer.step, trainer.state = 1, 0, None
        # the batches Trainer._setup would make from a training split
        stream = random_stream(spec, TRAIN_SEGMENTS, SEED)
        self.batches = trainer.task.batches(stream, spec.batch, spec.segment, train=True)

    def train(self, steps: int) -> int:
        trainer = self.trainer
        trainer.model.train()
        tokens = 0
        for _ in range(steps):  # Trainer._loop, without logging, validation and checkpoints
            batch = self.batches[trainer.step % len(self.batches)]  # (B, T) each
            _, count = trainer.train_step(batch, trainer.config.train.lr)
            trainer.step += 1
            tokens += count
        return tokens

    def evaluate(self, steps: int) -> int:
        ids = self.eval_stream(steps)
        result = evaluate_stream(self.trainer.model, ids, self.spec.batch, self.spec.segment)
        return int(result["tokens"])


class ReferenceSide(Side):
    """The plain PyTorch loop, as a PyTorch user would write it, over the same random streams.

    In evaluation ``nn.TransformerEncoderLayer`` takes PyTorch's fused inference fast path
    (``torch._transformer_encoder_layer_fwd``): that is what plain PyTorch gives.
    """

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        torch.manual_seed(SEED)
        self.model = build_reference(spec)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=spec.lr)
        self.carry = spec.encoder == "lstm"  # the Transformer trains on independent blocks
        self.state: LstmState | None = None
        self.step = 0
        self.inputs, self.targets = as_rows(random_stream(spec, TRAIN_SEGMENTS, SEED), spec.batch)

    def train(self, steps: int) -> int:
        model, optimizer, T = self.model, self.optimizer, self.spec.segment
        model.train()
        tokens = 0
        for _ in range(steps):
            start = self.step % TRAIN_SEGMENTS * T
            inputs = self.inputs[:, start : start + T]  # (B, T)
            targets = self.targets[:, start : start + T]
            state = None
            if self.carry and self.state is not None:
                state = tuple(s.detach() for s in self.state)  # truncated BPTT
            logits, state = model(inputs, state)  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), self.spec.clip)
            optimizer.step()
            loss.item()  # a real loop logs it (targetlm reads it too)
            self.state, self.step = state, self.step + 1
            tokens += targets.numel()
        return tokens

    @torch.no_grad()
    def evaluate(self, steps: int) -> int:
        inputs, targets = as_rows(self.eval_stream(steps), self.spec.batch)  # (B, steps·T) views
        T = self.spec.segment
        self.model.eval()
        state, total = None, 0.0
        for start in range(0, inputs.size(1), T):
            logits, state = self.model(inputs[:, start : start + T], state)  # (B, T, V)
            y = targets[:, start : start + T]
            nll = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), reduction="sum")
            total += nll.item()
        return targets.numel()


# --- measuring -----------------------------------------------------------------------------
def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 FLOP/s of an n x n x n ``torch.matmul`` (the MFU denominator)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.matmul(a, b, out=out)  # warm-up: thread pool, packing buffers
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # --clock: "cpu" counts this process's CPU time (on a shared
# machine, time lost to other processes is then not counted; one thread: tokens/CPU-second)


def timed(runner: StepRunner, steps: int) -> tuple[float, int]:
    """(seconds, tokens) of ``steps`` steps."""
    start = clock()
    tokens = runner(steps)
    return clock() - start, tokens


def interleaved(
    sides: dict[str, StepRunner], rounds: int, round_seconds: float
) -> dict[str, list[float]]:
    """Tokens/s of each side per round, the sides alternating (ABBA order) so drift cancels.

    The number of steps per round is calibrated from one timed step of each side so that a
    round of one side lasts about ``round_seconds`` (``0``: one step, no calibration); both
    sides run the same number of steps.
    """
    for runner in sides.values():
        runner(WARMUP_STEPS)  # first-call allocation, kernel selection, caches
    steps = 1
    if round_seconds > 0:
        step_seconds = [timed(runner, 1)[0] for runner in sides.values()]
        steps = max(1, round(round_seconds / statistics.mean(step_seconds)))

    def tokens_per_second(runner: StepRunner) -> Callable[[], float]:
        def run() -> float:
            seconds, tokens = timed(runner, steps)
            return tokens / seconds

        return run

    return common.interleaved({n: tokens_per_second(r) for n, r in sides.items()}, rounds)


@dataclass
class Row:
    """One table row: a configuration in one mode."""

    config: str
    mode: Mode
    shape: str
    flops_per_token: float  # model FLOPs per token in this mode (training: 3x forward)
    tok_s: dict[str, float]  # median per side
    spread: dict[str, float]  # (max - min) / median per side
    samples: dict[str, list[float]]  # each side's tokens/s per round

    @property
    def ratio(self) -> float:
        return self.tok_s["targetlm"] / self.tok_s["reference"]

    def mfu(self, side: str, peak: float) -> float:
        """Achieved model FLOP/s of one side over the measured peak."""
        return self.tok_s[side] * self.flops_per_token / peak


def measure(spec: Spec, rounds: int, round_seconds: float, workdir: Path) -> list[Row]:
    """Both modes of one configuration, targetlm and reference interleaved."""
    sides = {
        "targetlm": TargetlmSide(spec, workdir).runners(),
        "reference": ReferenceSide(spec).runners(),
    }
    rows = []
    for mode in ("train", "eval"):
        start = time.perf_counter()
        runners = {name: side[mode] for name, side in sides.items()}
        samples = interleaved(runners, rounds, round_seconds)
        median = common.medians(samples)
        rows.append(
            Row(
                config=spec.name,
                mode=mode,
                shape=f"{spec.batch}x{spec.segment}",
                # backward = 2x forward (gradients of activations and of weights)
                flops_per_token=forward_flops_per_token(spec) * (3 if mode == "train" else 1),
                tok_s=median,
                spread={name: common.spread(v) for name, v in samples.items()},
                samples=samples,
            )
        )
        seconds = time.perf_counter() - start
        log(f"  {spec.name} {mode}: ratio {rows[-1].ratio:.3f} ({seconds:.1f} s)")
    return rows


# --- reporting -----------------------------------------------------------------------------
def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def table(rows: list[Row], peak: float) -> str:
    header = (
        f"{'config':<12} {'mode':<5} {'BxT':>7} {'targetlm tok/s':>15} {'reference tok/s':>16} "
        f"{'ratio':>6} {'MFU tlm':>8} {'MFU ref':>8} {'spread tlm':>10} {'spread ref':>10}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.config:<12} {r.mode:<5} {r.shape:>7} {r.tok_s['targetlm']:>15,.0f} "
            f"{r.tok_s['reference']:>16,.0f} {r.ratio:>6.3f} {r.mfu('targetlm', peak):>8.1%} "
            f"{r.mfu('reference', peak):>8.1%} {r.spread['targetlm']:>10.0%} {r.spread['reference']:>10.0%}"
        )
    return "\n".join(lines)


def summary(
    rows: list[Row], peak: float, args: argparse.Namespace, specs: list[Spec]
) -> dict[str, Any]:
    """The JSON object: every ratio and MFU, the measured peak, the goals."""
    results: dict[str, dict[str, Any]] = {}
    for r in rows:
        results.setdefault(r.config, {})[r.mode] = {
            "ratio": round(r.ratio, 4),
            "mfu_targetlm": round(r.mfu("targetlm", peak), 4),
            "mfu_reference": round(r.mfu("reference", peak), 4),
            "tok_s_targetlm": round(r.tok_s["targetlm"], 1),
            "tok_s_reference": round(r.tok_s["reference"], 1),
            "spread_targetlm": round(r.spread["targetlm"], 4),
            "spread_reference": round(r.spread["reference"], 4),
        }
    lstm_mfu = [r.mfu("targetlm", peak) for r in rows if r.config.startswith("lstm")]
    return {
        "results": results,
        "shapes": {
            s.name: {
                "batch": s.batch,
                "segment": s.segment,
                "forward_mflop_per_token": round(forward_flops_per_token(s) / 1e6, 3),
            }
            for s in specs
        },
        "peak_gflops": round(peak / 1e9, 2),
        "min_ratio": round(min(r.ratio for r in rows), 4),
        "goals": {
            "ratio_ge_1": all(r.ratio >= GOAL_RATIO for r in rows),
            # None when no LSTM configuration was run
            "lstm_mfu_ge_0.6": min(lstm_mfu) >= GOAL_LSTM_MFU if lstm_mfu else None,
        },
        "threads": torch.get_num_threads(),
        "load_average_before": round(common.LOAD_BEFORE, 2),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "quick": args.quick,
        "rounds": args.rounds,
        "clock": args.clock,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "attention_flops": "full T x T",
    }


# --- command line --------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_arguments(
        parser, quick="a few steps only (smoke test, < 60 s)", rounds=5, quick_rounds=2
    )
    parser.add_argument(
        "--configs", default=",".join(SPECS), help=f"comma-separated subset of {', '.join(SPECS)}"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)"
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time (default) or this process's CPU time (a machine shared with other "
        "work; meaningful with --threads 1)",
    )
    parser.add_argument(
        "--round-seconds",
        type=float,
        help="target length of one round of one side (default 2; --quick: 0 = one step)",
    )
    parser.add_argument(
        "--tf-shape", help="Transformer batch x block (default 16x256; --quick: 4x64)"
    )
    args = parser.parse_args(argv)
    common.resolve_rounds(args, parser)
    if args.round_seconds is None:
        args.round_seconds = 0.0 if args.quick else 2.0
    args.tf_shape = args.tf_shape or ("4x64" if args.quick else "16x256")
    unknown = [name for name in args.configs.split(",") if name not in SPECS]
    if unknown:
        parser.error(f"unknown config(s) {', '.join(unknown)}; choose from {', '.join(SPECS)}")
    try:
        args.tf_batch, args.tf_block = (int(x) for x in args.tf_shape.lower().split("x"))
    except ValueError:
        args.tf_batch = 0
    if args.tf_batch < 1 or args.tf_block < 1:
        parser.error(f"--tf-shape {args.tf_shape!r}: expected BxT, e.g. 16x256")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    specs = [SPECS[name] for name in args.configs.split(",")]
    specs = [  # the Transformer's shape is a command-line choice (2-core machines)
        dataclasses.replace(s, batch=args.tf_batch, segment=args.tf_block)
        if s.encoder == "transformer"
        else s
        for s in specs
    ]
    peak_repeats = 3 if args.quick else 5
    common.warn_if_loaded()  # torch's spinning OpenMP threads slow down badly under contention
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads; fp32 matmul peak ...")
    peak = matmul_peak(repeats=peak_repeats)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            rows += measure(spec, args.rounds, args.round_seconds, Path(tmp))
    peak = max(peak, matmul_peak(repeats=peak_repeats))  # again at the end: the best seen
    result = summary(rows, peak, args, specs)
    print(table(rows, peak))
    print(
        f"\nfp32 matmul peak {peak / 1e9:.1f} GFLOP/s (2048^3, best of {2 * peak_repeats}); "
        f"{args.rounds} rounds per side, median tok/s; attention FLOPs over the full T x T; "
        "spread = (max - min) / median over rounds"
    )
    samples = {f"{r.config} {r.mode} {side}": v for r in rows for side, v in r.samples.items()}
    common.emit(result, args.json_out, samples=samples, compact=True)
    return result


if __name__ == "__main__":
    main()
