"""A training run's checkpoints: ``last.pt`` for exact resume, ``best.pt`` for the best model.

``last.pt`` holds everything the next step depends on (model, optimiser, schedule, position in
the epoch, carried encoder state, training caches, RNG states), so a resumed run computes the
same losses as one that was never interrupted (on CPU). With ``train.parallel = "fsdp"`` the
model and optimiser are sharded into a directory beside it (``last-step<N>.dcp``), which
last.pt names. ``best.pt`` holds the best model's weights with its vocabulary and config
(:func:`write_best`, also used by ``targetlm train-heads``).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from targetlm import checkpoint as checkpoint_lib
from targetlm import rundir, runs
from targetlm.checkpoint import CheckpointError
from targetlm.config import Config
from targetlm.data import Vocabulary
from targetlm.files import atomic_write
from targetlm.modules.interfaces import HasTrainingCache
from targetlm.modules.model import detach_state, state_to_list
from targetlm.training import distributed
from targetlm.training.distributed import Processes
from targetlm.training.run_directory import RESUME_KEYS, check_same_config
from targetlm.training.step import TrainingStep

if TYPE_CHECKING:
    from targetlm.training.build import RunParts


def write_best(
    path: Path,
    model_state: dict[str, Any],
    vocab: Vocabulary,
    config: Config,
    valid_ppl: float | None,
    step: int | None,
    **extra: Any,
) -> None:
    """Write a best.pt at ``path`` (atomically): the model's weights, the vocabulary and config
    to rebuild it, its validation perplexity and step, and any ``extra`` entries. (The writer
    is looked up when called, so a test can stand a failing one in for it.)"""
    checkpoint_lib.save_atomic(
        {
            "model": model_state,
            "vocab": vocab.state_dict(),
            "config": config.to_dict(),
            "valid_ppl": valid_ppl,
            "step": step,
            **extra,
        },
        path,
    )


# what last.pt's "progress" holds besides its step (the trainer's position and counters)
PROGRESS_KEYS = (
    "epoch",
    "batch_index",
    "best_valid",
    "bad_evaluations",
    "elapsed",
    "window",
    "metrics_records",
)


def check_layout(checkpoint: dict[str, Any], path: Path) -> None:
    """One error when a last.pt ``checkpoint`` (read with :data:`RESUME_KEYS`) lacks an entry
    today's layout writes: a checkpoint of an earlier targetlm, which resume does not read."""
    missing = [key for key in ("config", "caches") if key not in checkpoint]
    progress = checkpoint["progress"]
    if not isinstance(progress, dict):
        missing.append("progress")
    else:
        missing += [f"progress.{key}" for key in ("step", *PROGRESS_KEYS) if key not in progress]
    if missing:
        raise CheckpointError(
            f"{path}: a checkpoint of an earlier targetlm (no {', '.join(missing)}); it cannot "
            "be resumed: train again in a new run directory"
        )


def cached_modules(model: nn.Module) -> list[tuple[str, HasTrainingCache]]:
    """Modules with training-time state outside their state_dict (``training_cache()``)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, HasTrainingCache)]


@dataclass(eq=False)
class Checkpointer:
    """Writes and restores the checkpoints of the run of ``config`` in ``run_dir``.

    Under ``torchrun`` every rank calls it (a sharded save and best.pt's weights are
    collectives); rank 0 writes the files. ``step`` is the step last.pt holds (None: none yet).
    """

    run_dir: Path
    config: Config
    processes: Processes
    log: Callable[[str], None]
    step: int | None = field(default=None, init=False)

    def kept(self) -> str:
        """What the run directory keeps after a failure, for its message."""
        if self.step is None:
            return (
                "no checkpoint was written; the run directory can be restarted with "
                f"`targetlm train --resume --run-dir {self.run_dir}`"
            )
        return f"the last good checkpoint (step {self.step}) is kept in {self.run_dir / runs.LAST}"

    def save_last(
        self, parts: RunParts, vocab: Vocabulary, progress: dict[str, Any], state: Any
    ) -> None:
        """Write last.pt of the run's ``parts`` (model, optimiser, schedule) at ``progress``
        (its ``step``, position, counters), with the carried ``state`` (the whole batch's);
        sharded checkpoints last.pt no longer names go."""
        model, optimizer, step = parts.model, parts.optimizer, progress["step"]
        weights: dict[str, Any] = {}
        if self.config.train.parallel == "fsdp":
            # the model and optimiser sharded (every rank its shards), beside last.pt
            weights["sharded"] = distributed.sharded_checkpoint_name(step)
            directory = self.run_dir / weights["sharded"]
            if self.processes.is_main and directory.exists():  # a write that was cut short
                shutil.rmtree(directory)
            self.processes.barrier()
            distributed.save_sharded(parts.step_module, optimizer, directory)
            self.processes.barrier()
        else:
            weights = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        if not self.processes.is_main:
            self.step = step
            return
        checkpoint_lib.save_atomic(
            {
                **weights,
                "schedule": parts.schedule.state_dict(),
                "progress": progress,
                "state": state_to_list(detach_state(state)),
                "rng": {"torch": torch.get_rng_state(), "python": _as_list(random.getstate())},
                "caches": {name: m.training_cache() for name, m in cached_modules(model)},
                "vocab": vocab.state_dict(),
                "config": self.config.to_dict(),
            },
            self.run_dir / runs.LAST,
        )
        self.step = step
        for older in self.run_dir.glob(distributed.sharded_checkpoint_name(0).replace("0", "*")):
            if older.name != weights.get("sharded"):  # last.pt no longer names it
                shutil.rmtree(older)

    def save_best(
        self, step_module: TrainingStep, vocab: Vocabulary, valid_ppl: float, step: int
    ) -> None:
        """Write best.pt: the whole model (gathered from its shards when sharded)."""
        model_state = distributed.full_model_state(step_module, self.processes)
        if not self.processes.is_main:
            return
        write_best(self.run_dir / runs.BEST, model_state, vocab, self.config, valid_ppl, step)

    def restore(
        self,
        parts: RunParts,
        vocab: Vocabulary,
        device: torch.device,
        freeze_body: Callable[[bool], None],
    ) -> tuple[dict[str, Any], Any]:
        """Read last.pt into the run's ``parts`` (model, optimiser, schedule), training caches
        and random number generators; returns its ``progress`` and the carried state (the whole batch's,
        on ``device``). ``freeze_body(frozen)`` sets which parameters train before a sharded
        optimiser state is read (during the heads-only warm-up, the heads alone)."""
        checkpoint = checkpoint_lib.load(self.run_dir / runs.LAST, RESUME_KEYS)
        check_layout(checkpoint, self.run_dir / runs.LAST)
        check_same_config(self.run_dir, runs.LAST, checkpoint["config"], self.config)
        # a key the saved config lacks has its default, as for the config check above
        saved_mode = checkpoint["config"].get("train", {}).get("compile", "off")
        if saved_mode != self.config.train.compile:
            self.log(
                f"train.compile was {saved_mode!r}, now {self.config.train.compile!r}: the "
                "run continues from the same weights, optimiser, position and random state; "
                "its losses match an uninterrupted run's to float rounding, not bit for bit"
            )
        saved_vocab = Vocabulary.from_state_dict(checkpoint["vocab"])
        if saved_vocab != vocab:
            raise CheckpointError(
                f"{self.run_dir / runs.LAST}: checkpoint vocabulary ({len(saved_vocab)} words) does not "
                f"match the training data's vocabulary ({len(vocab)} words)"
            )
        if "sharded" in checkpoint:  # train.parallel = "fsdp": beside it, any number of ranks
            # the optimiser state it holds is that of the parameters then trained: during the
            # heads-only warm-up, the heads' alone (torch builds the state it reads into from
            # the parameters that require gradients)
            freeze_body(checkpoint["progress"]["step"] < self.config.train.heads_only_steps)
            distributed.load_sharded(
                parts.step_module, parts.optimizer, self.run_dir / checkpoint["sharded"]
            )
        else:
            last = str(self.run_dir / runs.LAST)
            runs.load_state_into(parts.model, checkpoint["model"], vocab, last)
            parts.optimizer.load_state_dict(checkpoint["optimizer"])
        parts.schedule.load_state_dict(checkpoint["schedule"])
        progress = checkpoint["progress"]
        self.step = progress["step"]
        state = _to_device(checkpoint["state"], device)
        # the training caches, e.g. GroC's reused E_out (sparse updates)
        for name, module in cached_modules(parts.model):
            module.load_training_cache(_to_device(checkpoint["caches"].get(name), device))
        torch.set_rng_state(checkpoint["rng"]["torch"])
        random.setstate(_as_tuple(checkpoint["rng"]["python"]))
        return progress, state

    def forget_later_metrics(self, count: int, step: int) -> int:
        """Keep the first ``count`` records of metrics.jsonl, those logged before the restored
        checkpoint (of ``step``) was written; the rest will be logged again. Rewritten
        atomically; returns the records kept (rank 0; the other ranks keep no log: 0)."""
        if not self.processes.is_main:
            return 0
        metrics = self.run_dir / runs.METRICS
        records = rundir.read_metrics(metrics, self.log)
        if len(records) < count:
            self.log(
                f"warning: {metrics} has {len(records)} records, {count} when "
                f"{runs.LAST} was written at step {step}"
            )
        kept = records[:count]
        atomic_write(metrics, "".join(json.dumps(r) + "\n" for r in kept))
        return len(kept)


def _to_device(state: Any, device: torch.device) -> Any:
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return [_to_device(s, device) for s in state]


def _as_list(value: Any) -> Any:
    return [_as_list(v) for v in value] if isinstance(value, (tuple, list)) else value


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (tuple, list)) else value
