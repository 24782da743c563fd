"""What a run trains, built from its config: the corpus and vocabulary (with a finetuning
run's source), the model, the objective, the training batches, the step module (wrapped for
several processes, compiled), the optimiser and the learning-rate schedule.

The trainer builds these once, in this order (the random draws of the model's initial weights
and of the batches follow the seed), and then only runs them.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from targetlm import runs
from targetlm.config import Config
from targetlm.data import Vocabulary
from targetlm.modules.model import build_model
from targetlm.objectives import build_objective
from targetlm.registry import ConfigError
from targetlm.rundir import RunDirError
from targetlm.tasks import Task, TaskData
from targetlm.training import compile as compiling
from targetlm.training import distributed, finetune
from targetlm.training.optim import LrSchedule, build_optimizer
from targetlm.training.step import TrainingStep

# a finetuning run's source: its state, its vocabulary, where it was read
Source = tuple[dict[str, torch.Tensor], Vocabulary, str]


@dataclasses.dataclass
class RunParts:
    """What one run trains with (:func:`build_parts`).

    Attributes:
        model: what is trained: the language model, or the task's module around it.
        objective: what the step minimises: the objective, or the task's loss around it.
        lookahead: the objective's extra future targets per position (N-gram heads).
        batches: this process's training batches (on the GPU when training there).
        step_module: the step's loss as one module; divides it by the counts.
        trainable: ``step_module`` as the processes train it (DDP or FSDP, or itself).
        compiled: ``trainable`` through ``torch.compile`` (``train.compile``), or None.
        optimizer: over the model's and the objective's parameters (heads on their own rate).
        schedule: the learning-rate schedule over the steps after the heads-only warm-up.
    """

    model: Any
    objective: Any
    lookahead: int
    batches: Any
    step_module: TrainingStep
    trainable: Any
    compiled: Callable[..., Any] | None
    optimizer: torch.optim.Optimizer
    schedule: LrSchedule


def seed_and_device(config: Config, processes: distributed.Processes) -> torch.device:
    """Set the run's threads and seeds; returns the device it trains on (with several
    processes, this rank's)."""
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    torch.manual_seed(config.train.seed)
    random.seed(config.train.seed)
    return processes.device if processes.several else torch.device(config.train.device)


def load_data(
    config: Config,
    task: Task[Any],
    run_dir: Path,
    restart: bool,
    log: Callable[[str], None],
) -> tuple[TaskData, Source | None]:
    """Read the task's corpus; returns its data and the finetuning source (state, vocabulary,
    where) or None.

    Finetuning (``train.init_from``): the source run's words keep their ids; a resumed
    finetuning run has its own (already extended) vocabulary in ``run_dir``; one that starts
    again from step 0 (``restart``) takes the source's weights again.

    Raises:
        RunDirError: a resumed finetuning run's vocab.txt lacks words of the training split.
    """
    source, base = None, None
    finetuning = bool(config.train.init_from) and task.finetunable
    if finetuning:
        source = finetune.source_of(config.train.init_from) if restart else None
        base = Vocabulary.load(run_dir / runs.VOCAB) if source is None else source[1]
    data = task.load_data(config, base, log)
    if finetuning and source is None and base is not None:
        # a resumed finetuning run: its vocab.txt is already the extended one (the training
        # split's words and counts added once); extending it again would add the counts twice
        if data.vocab != base:
            raise RunDirError(
                f"{run_dir / runs.VOCAB} lacks words of the training split: it is not "
                "this finetuning run's vocabulary"
            )
        data = dataclasses.replace(data, vocab=base)
    return data, source


def training_batches(task: Task[Any], lookahead: int, processes: distributed.Processes) -> Any:
    """The task's training batches; with several processes, this rank's rows of them."""
    batches = task.training_batches(lookahead)
    if processes.several and task.conditional and len(batches):
        rows = max(batch.inputs.size(0) for batch in batches)
        if rows < processes.world_size:
            raise ConfigError(
                f"--nproc_per_node {processes.world_size} is larger than the training "
                f"batches' rows (at most {rows}): every process needs rows; use at most "
                f"{rows} processes or a larger data.max_tokens"
            )
    return processes.shard(batches)


def build_parts(
    config: Config,
    task: Task[Any],
    vocab: Vocabulary,
    source: Source | None,
    device: torch.device,
    processes: distributed.Processes,
) -> RunParts:
    """The model, objective, batches, step, optimiser and schedule of a run whose ``task``
    has been set up on its data (``vocab``); ``source``: the finetuning run's weights, or None.

    Raises:
        ConfigError: ``train.compile`` with several processes, or more processes than rows.
    """
    c = config
    language_model = build_model(c.model, vocab.itos).to(device)
    if source is not None:
        state, base, where = source
        finetune.transfer_weights(language_model, state, len(vocab) - len(base), where)
    # what is trained: the language model, or the task's module around it (a classifier)
    model: Any = task.model_to_train(language_model).to(device)
    loss = build_objective(
        c.objective, model, c.train.loss_impl, c.train.loss_chunk_tokens, c.train.loss_chunk_vocab
    ).to(device)
    lookahead = loss.lookahead
    # what the step minimises: the objective, or the task's loss around it (diffusion)
    objective: Any = task.training_objective(loss, model).to(device)
    task.prepare(model)
    batches = training_batches(task, lookahead, processes)
    if device.type == "cuda":  # on the GPU once: a step copies nothing from the host
        batches = [batches[i].to(device) for i in range(len(batches))]
    # the step's loss, one module, which divides it by the counts (with several processes
    # the whole batch's): under DDP with several processes (which broadcasts rank 0's
    # initial weights), itself alone; evaluation reads the objective (rank 0 alone: nothing
    # all-reduced)
    step_module = TrainingStep(task, model, objective, processes, c.train.loss_reduction)
    trainable = processes.wrap(
        step_module,
        find_unused_parameters=bool(c.train.heads_only_steps)
        or step_module.may_leave_parameters_unused(),
    )
    if c.train.compile != "off" and processes.several:
        raise ConfigError(
            f"train.compile = {c.train.compile!r} compiles the step of one process; "
            "train with several processes eagerly (train.compile = 'off')"
        )
    compiled = compiling.compile_step(trainable, c.train.compile)
    heads = [] if model.heads is None else list(model.heads.parameters())
    optimizer = build_optimizer(
        c.train,
        list(model.parameters()) + list(objective.parameters()),
        heads,
        fused=device.type == "cuda" and not processes.sharded,
    )
    steps_per_epoch = math.ceil(len(batches) / c.train.accumulate)
    budget = c.train.max_steps or c.train.epochs * steps_per_epoch
    schedule = LrSchedule(c.train, budget - c.train.heads_only_steps)
    return RunParts(
        model, objective, lookahead, batches, step_module, trainable, compiled, optimizer, schedule
    )
