"""Data-parallel training (``torchrun -m targetlm train``): two CPU processes (gloo) take the
steps one process takes on the same global batch, rank 0 alone writes, resume continues."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from conftest import model_config, tiny_config

from targetlm import builders
from targetlm import config as config_lib
from targetlm.config import ComponentConfig
from targetlm.modules.model import build_model
from targetlm.registry import ConfigError
from targetlm.tasks import Batch
from targetlm.training import Trainer, distributed
from targetlm.training.distributed import shard_rows, shard_state, state_batch_dims

# no dropout: its masks differ between one process and two (a rank draws for its rows only)
NO_DROPOUT = {"train.threads": 1, "train.epochs": 1, "data.synthetic.train_sentences": 80}
TRANSFORMER_WDR_AL = {
    **NO_DROPOUT,
    # 736 training targets: the stream ends with its last row, so in the last step rank 1's
    # rows have fewer N-gram head targets than rank 0's (each head's mean weighs its counts)
    "data.synthetic.train_sentences": 78,
    "model.encoder": '{kind = "transformer", num_layers = 1, num_heads = 2, ff_size = 16, '
    "max_context = 16, dropout = 0.0}",
    "model.heads": '{kind = "wdr", n = 3}',
    "objective": '{kind = "augmented", tau = 2.0, gamma = 0.5}',
    "train.carry_state": "false",
    "train.optimizer": '"adam"',
    "train.lr": 0.01,
    # the heads alone first: DDP searches those steps for the frozen body's parameters
    "train.heads_only_steps": 2,
}


def _quiet(message: str) -> None:
    pass


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _torchrun(config_path: Path, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 -m targetlm train CONFIG --run-dir DIR ARGS`` on the CPU."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", "2", "-m", "targetlm", "train", str(config_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*command, "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _write(config: config_lib.Config, path: Path) -> Path:
    path.write_text(config_lib.dumps(config), encoding="utf-8")
    return path


@pytest.mark.slow  # torchrun processes: about 40 s in all; CI runs the slow set of this file
@pytest.mark.parametrize(
    "overrides, stop_at",
    [(NO_DROPOUT, 9), (TRANSFORMER_WDR_AL, 0)],
    ids=["lstm-carried-state-resumed", "transformer-wdr-heads-al"],
)
def test_two_processes_take_the_steps_of_one_with_the_same_global_batch(
    tmp_path, overrides, stop_at
):
    config = tiny_config(**overrides)
    one = Trainer(config, tmp_path / "one", log=_quiet).train()
    path = _write(config, tmp_path / "config.toml")

    two = tmp_path / "two"
    if stop_at:  # stopped mid-epoch (the carried LSTM state is in last.pt), then resumed
        stopped = _torchrun(path, two, "--set", f"train.max_steps={stop_at}")
        assert stopped.returncode == 0, stopped.stderr
        assert len(_records(two, "train")) == stop_at
        finished = _torchrun(path, two, "--resume")
        assert f"resumed {two} at epoch 1, step {stop_at}" in finished.stdout
    else:
        finished = _torchrun(path, two)
    assert finished.returncode == 0, finished.stderr

    single, double = _records(tmp_path / "one", "train"), _records(two, "train")
    assert [r["step"] for r in double] == [r["step"] for r in single]  # rank 0's lines only
    assert [r["loss"] for r in double] == pytest.approx([r["loss"] for r in single], abs=1e-5)
    valid = [r["ppl"] for r in _records(two, "valid")]
    assert valid == pytest.approx([r["ppl"] for r in _records(tmp_path / "one", "valid")], rel=1e-5)
    results = json.loads((two / "results.json").read_text())
    assert results["test"]["ppl"] == pytest.approx(one["test"]["ppl"], rel=1e-5)
    # one process printed: the others log nothing and write nothing
    assert finished.stdout.count("test perplexity:") == 1
    assert finished.stdout.count("valid ppl") == 2  # the validation and the final line


@pytest.mark.slow  # torchrun processes: about 40 s in all; CI runs the slow set of this file
def test_translation_weighs_the_ranks_by_their_tokens(tmp_path):
    """Sentence pairs are shared by rows: the ranks score different numbers of tokens, and a
    batch of one pair (the token budget is tiny) leaves rank 1 without rows."""
    from test_translation import tiny_translation_config, write_corpus

    data = write_corpus(tmp_path / "data", pairs=60)
    config = builders.load_config(
        tiny_translation_config(tmp_path, data, heads="wdr"),
        [
            "model.encoder.dropout=0.0",
            "data.max_tokens=14",
            "train.max_steps=16",
            "train.log_every=1",
            "eval.beam=1",
        ],
    )
    one = Trainer(config, tmp_path / "one", log=_quiet).train()
    finished = _torchrun(_write(config, tmp_path / "config.toml"), tmp_path / "two")
    assert finished.returncode == 0, finished.stderr

    single, double = _records(tmp_path / "one", "train"), _records(tmp_path / "two", "train")
    assert len(double) == len(single) == 16
    assert [r["loss"] for r in double] == pytest.approx([r["loss"] for r in single], abs=1e-5)
    results = json.loads((tmp_path / "two" / "results.json").read_text())
    assert results["test"]["ppl"] == pytest.approx(one["test"]["ppl"], rel=1e-5)


@pytest.mark.slow  # torchrun processes: about 30 s in all; CI runs the slow set of this file
def test_diffusion_on_two_processes_takes_the_steps_of_one_and_resumes(tmp_path):
    """Diffusion with WDR heads: every rank draws the whole batch's times and noise and keeps
    its rows, so each row is noised as in one process; the MSEs (each head's own count), the
    anchor cross entropy (target tokens) and the length loss (sentences) are each divided by
    the whole batch's count. Stopped after 5 steps and resumed (σ_min's batch counter and the
    random streams travel in last.pt)."""
    from test_diffusion import tiny_diffusion_config
    from test_translation import write_corpus

    data = write_corpus(tmp_path / "data", pairs=60)
    config = builders.load_config(
        tiny_diffusion_config(tmp_path, data, heads="wdr"),
        [
            "model.encoder.dropout=0.0",
            "data.max_tokens=40",  # a few pairs per batch, of uneven lengths
            "train.log_every=1",
            "task.clip_every=2",
            "task.decode_steps=1",
            "task.samples=1",
        ],
    )
    one = Trainer(config, tmp_path / "one", log=_quiet).train()
    path = _write(config, tmp_path / "config.toml")
    two = tmp_path / "two"
    stopped = _torchrun(path, two, "--set", "train.max_steps=5")
    assert stopped.returncode == 0, stopped.stderr
    finished = _torchrun(path, two, "--resume")
    assert finished.returncode == 0, finished.stderr
    assert f"resumed {two} at epoch 1, step 5" in finished.stdout

    single, double = _records(tmp_path / "one", "train"), _records(two, "train")
    assert len(single) > 5
    assert [r["step"] for r in double] == [r["step"] for r in single]
    assert [r["loss"] for r in double] == pytest.approx([r["loss"] for r in single], abs=1e-5)
    valid = [r["ppl"] for r in _records(two, "valid")]
    assert valid == pytest.approx([r["ppl"] for r in _records(tmp_path / "one", "valid")], rel=1e-5)
    results = json.loads((two / "results.json").read_text())
    for key in ("loss", "mse", "ppl", "length_loss"):
        assert results["test"][key] == pytest.approx(one["test"][key], rel=1e-5), key
    assert results["test"]["head_mse"] == pytest.approx(one["test"]["head_mse"], rel=1e-5)


def test_a_batch_the_processes_cannot_share_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="data.batch_size = 3 rows cannot be shared by 2"):
        Trainer(tiny_config(**{"data.batch_size": 3}), tmp_path / "run")
    assert not tmp_path.joinpath("run").exists()
    assert not torch.distributed.is_initialized()  # refused before the process group starts


def test_more_processes_than_rows_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="--nproc_per_node 4 is larger than the batch's"):
        Trainer(tiny_config(**{"data.batch_size": 2}), tmp_path / "run")
    assert not tmp_path.joinpath("run").exists()


def test_alone_the_processes_are_a_no_op(monkeypatch):
    for world_size in (None, "1"):  # no torchrun; torchrun --nproc_per_node 1
        if world_size is None:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("WORLD_SIZE", world_size)
        processes = distributed.start(tiny_config())
        assert processes.is_main and processes.world_size == 1 and not processes.several
        assert processes.sum([2, 3.5]) == [2.0, 3.5]
        assert processes.broadcast({"ppl": 7.0}) == {"ppl": 7.0}
        module = torch.nn.Linear(2, 2)
        assert processes.wrap(module, find_unused_parameters=False) is module
        batches = [Batch(torch.zeros(4, 2, dtype=torch.long), torch.zeros(4, 2, dtype=torch.long))]
        assert processes.shard(batches) is batches
    assert not torch.distributed.is_initialized()


def test_the_step_declares_when_it_may_leave_parameters_unused():
    from targetlm.training.step import TrainingStep

    words = [f"w{i}" for i in range(20)]
    plain = TrainingStep(None, build_model(model_config("lstm"), words), torch.nn.Identity())
    assert not plain.may_leave_parameters_unused()
    plain.model.output.may_leave_parameters_unused = True  # as GroC's sparse updates
    assert plain.may_leave_parameters_unused()


class _ThreadRanks:
    """K ranks as K threads of this process, for :func:`divide_once`: each rank's
    ``sum_tensor`` all-reduces through a barrier (what the step asks of its processes)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * world_size

    def processes(self, rank: int) -> SimpleNamespace:
        def sum_tensor(values: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = values.detach().clone()
            self.barrier.wait()
            total = torch.stack(cast(list[torch.Tensor], self.slots)).sum(0)
            self.barrier.wait()  # every rank has read the slots before the next collective
            return total

        return SimpleNamespace(
            several=True,
            world_size=self.world_size,
            device=torch.device("cpu"),
            sum_tensor=sum_tensor,
        )


@pytest.mark.parametrize("impl", ["full", "chunked"])
def test_each_rank_divides_each_heads_sum_by_the_whole_batchs_count(impl):
    """Two ranks with uneven scored positions per head (rank 1's rows end early): each
    divides its heads' sums by the whole batch's counts over 2, all-reduced in the step, so
    both see the whole batch's loss, NLL and count, and their averaged gradients are the
    whole batch's gradients in one process."""
    from targetlm.objectives import build_objective
    from targetlm.training.step import divide_once

    torch.manual_seed(0)
    config = dataclasses.replace(model_config("lstm"), heads=ComponentConfig("wdr", {"n": 3}))
    model = build_model(config, [f"w{i}" for i in range(20)]).eval()  # no dropout: rows agree
    objective = build_objective(ComponentConfig("cross_entropy", {"ngram_alpha": 0.5}), model, impl)
    inputs, targets = torch.randint(20, (4, 5)), torch.randint(20, (4, 7))
    targets[2, 3:], targets[3, 1:] = -100, -100  # rank 1 scores fewer positions per head
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_of(rows: slice, processes=None):
        prediction = model(inputs[rows])
        weight, bias = model.output()
        parts = objective(prediction, targets[rows], weight, bias)
        out = divide_once(parts, processes)
        return parts.counts, out, torch.autograd.grad(out.loss, params, allow_unused=True)

    _, whole, whole_grads = loss_of(slice(None))
    ranks = _ThreadRanks(2)
    results: list[Any] = [None, None]

    def run(rank: int) -> None:
        results[rank] = loss_of(slice(2 * rank, 2 * rank + 2), ranks.processes(rank))

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (counts_0, out_0, grads_0), (counts_1, out_1, grads_1) = results
    assert counts_0 == (10, 10, 10) and counts_1 == (4, 2, 1)  # L0, L1, L2 per rank
    for out in (out_0, out_1):
        torch.testing.assert_close(out.loss, whole.loss)
        torch.testing.assert_close(out.nll_sum, whole.nll_sum.double())
        assert int(out.count) == whole.count == 14
    for a, b, expected in zip(grads_0, grads_1, whole_grads):
        if expected is None:
            assert a is None and b is None
            continue
        torch.testing.assert_close((a + b) / 2, expected)
    # a rank's loss alone (its own counts) is not the whole batch's: the counts matter
    assert not torch.allclose(loss_of(slice(2, 4))[1].loss, whole.loss)


def test_rows_are_shared_in_contiguous_slices_and_short_batches_leave_ranks_empty():
    batch = Batch(torch.arange(12).view(6, 2), torch.arange(18).view(6, 3))
    parts = [shard_rows(batch, rank, 4) for rank in range(4)]
    assert [p.inputs.size(0) for p in parts] == [2, 2, 1, 1]
    assert torch.equal(torch.cat([p.targets for p in parts]), batch.targets)
    lonely = Batch(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long))
    assert shard_rows(lonely, 1, 2).inputs.shape == (0, 5)


@pytest.mark.parametrize("encoder", ["lstm", "transformer"])
def test_a_carried_state_splits_into_the_ranks_rows_and_joins_back(encoder):
    model = build_model(model_config(encoder), [f"w{i}" for i in range(20)])
    rows = state_batch_dims(model, torch.device("cpu"))
    _, state = model.encode(torch.randint(20, (4, 6)))
    parts = [shard_state(state, rows, rank, 2) for rank in range(2)]
    flat = distributed._leaves
    for whole, *halves, dim in zip(flat(state), *map(flat, parts), rows):
        assert whole.size(dim) == 4 and all(h.size(dim) == 2 for h in halves)
        assert torch.equal(torch.cat(halves, dim), whole)
