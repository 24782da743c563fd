"""The training loop: one loop for every encoder, output layer and objective, in one
process or as one rank of a ``torchrun`` job (:mod:`targetlm.training.distributed`).

Exact resume: ``last.pt`` holds everything the next step depends on (model,
optimiser, schedule, position in the epoch, carried encoder state, RNG states),
so an interrupted run that is resumed computes the same losses as one that was
never interrupted (on CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import re
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from tqdm import tqdm

from targetlm import builders, rundir, runs
from targetlm import config as config_lib
from targetlm.checkpoint import CheckpointError, save_atomic
from targetlm.checkpoint import load as load_checkpoint
from targetlm.config import Config
from targetlm.data import Vocabulary
from targetlm.files import DiskFullError, atomic_write, disk_full
from targetlm.inference.evaluate import perplexity
from targetlm.modules.interfaces import HasTrainingCache
from targetlm.modules.model import build_model, detach_state, state_to_list
from targetlm.objectives import NgramLoss, build_objective
from targetlm.objectives.diffusion import DiffusionLoss
from targetlm.registry import ConfigError
from targetlm.rundir import RunDirError
from targetlm.tasks import Batch, Task, TaskData, build_task
from targetlm.training import compile as compiling
from targetlm.training import distributed, finetune
from targetlm.training.optim import LrSchedule, build_optimizer, clip_gradients, set_lr
from targetlm.training.step import TrainingStep

# keys a resumed run may change: the budget and cosmetics, never the model or the data
RESUMABLE_CHANGES = {
    "train.epochs",
    "train.max_steps",
    "train.progress",
    "train.threads",
    "train.log_every",
    "train.compile",  # the same function (training/compile.py): a run resumes in either mode
}


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


# what a run that stopped before its first last.pt leaves (it can be started again)
BEFORE_FIRST_CHECKPOINT = {runs.CONFIG, runs.VOCAB, runs.TOKENIZER, runs.METRICS, runs.BEST}
# what every last.pt holds (its weights: "model" and "optimizer", or "sharded": their directory)
RESUME_KEYS = ("vocab", "schedule", "progress", "state", "rng")


def _changed_keys(saved: dict, current: dict) -> set[str]:
    """The keys of two configs (as dicts) whose values differ, beyond RESUMABLE_CHANGES."""
    saved, current = _flatten(saved), _flatten(current)
    defaults = _flatten(Config().to_dict())
    changed = {
        key
        for key in saved.keys() | current.keys()
        if saved.get(key, defaults.get(key)) != current.get(key, defaults.get(key))
    }  # (a key added since the saved config was written is its default there)
    return changed - RESUMABLE_CHANGES


def _flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


class Trainer:
    """Train ``config`` in ``run_dir`` (new and empty, or resumed with ``resume=True``);
    with ``train.init_from``, finetune that run (:mod:`targetlm.training.finetune`).

    Under ``torchrun`` with several processes, each process's trainer is one rank of a
    data-parallel run: ``self.processes`` (:class:`~targetlm.training.distributed.Processes`,
    a no-op alone) says who writes and sums and broadcasts what the ranks must agree on; a
    process group it starts ends with :meth:`train`.
    """

    def __init__(
        self,
        config: Config,
        run_dir: str | Path,
        resume: bool = False,
        log: Callable[[str], None] = print,
    ) -> None:
        builders.validate(config)  # every component's options, before any work starts
        builders.check_device(config)
        self.processes = distributed.start(config)
        if not self.processes.is_main:  # one progress bar, one log
            config, log = config.replace(["train.progress=false"]), _silent
        self.config = config
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.log = log
        self.stop_requested = False
        self._interrupted = False  # Ctrl-C seen by this rank (several processes)
        self.checkpoint_step: int | None = None  # the step last.pt holds (None: none yet)
        self.metrics_records = 0  # records in metrics.jsonl (last.pt keeps their count)
        # the losses not yet checked for NaN, with their steps (:meth:`_check_finite`)
        self._unchecked_losses: list[tuple[int, torch.Tensor]] = []
        self._state_dims: list[int] | None = None  # the carried state's row dimensions
        try:
            rundir.check_unlocked(self.run_dir)
            rundir.check_outside_runs(self.run_dir)
            self._check_run_dir()
        except Exception:
            self.processes.close()
            raise
        self.processes.barrier()  # every rank has checked the run directory before rank 0 writes

    # --- the run directory ------------------------------------------------------------
    def _check_run_dir(self) -> None:
        """Refuse a run directory that cannot be used as asked (reads only). Sets
        ``self.restart``: no last.pt yet, training starts at step 0 (a new run, or one that
        stopped before its first checkpoint); ``self.finished_results``: a resumed run that
        has already finished (its results.json)."""
        self.restart, self.finished_results = not self.resume, None
        files = {p.name for p in self.run_dir.iterdir()} if self.run_dir.is_dir() else set()
        files = {f for f in files if f != rundir.LOCK and not _temporary(f)}
        if runs.LAST not in files:  # a sharded checkpoint no last.pt names: its write was cut
            files = {f for f in files if not _sharded_checkpoint(f)}  # (the next one replaces it)
        stuck = runs.CONFIG in files and runs.LAST not in files
        stuck = stuck and files <= BEFORE_FIRST_CHECKPOINT
        if self.resume:
            if runs.CONFIG not in files:
                raise RunDirError(f"nothing to resume: {self.run_dir / runs.CONFIG} does not exist")
            self._check_same_config(runs.CONFIG, config_lib.load(self.run_dir / runs.CONFIG))
            if runs.LAST not in files:
                if not stuck:
                    raise RunDirError(
                        f"nothing to resume: {self.run_dir / runs.LAST} does not exist"
                    )
                self.restart = True
            elif runs.RESULTS in files and self._reached_budget(
                load_checkpoint(self.run_dir / runs.LAST, RESUME_KEYS)["progress"]
            ):
                self.finished_results = json.loads((self.run_dir / runs.RESULTS).read_text())
        elif stuck:  # the same run again, from step 0
            saved = config_lib.load(self.run_dir / runs.CONFIG)
            if _changed_keys(saved.to_dict(), self.config.to_dict()):
                raise RunDirError(
                    f"run directory {self.run_dir} holds a run that stopped before its first "
                    f"checkpoint, with another config ({self._changes(saved)} differ); restart "
                    f"it with `targetlm train --resume --run-dir {self.run_dir}` or choose "
                    "another --run-dir"
                )
        elif files:
            raise RunDirError(
                f"run directory {self.run_dir} exists and is not empty; "
                "pass --resume to continue it or choose another --run-dir"
            )

    def _check_same_config(self, where: str, saved: Config | dict) -> None:
        """Refuse a run whose ``where`` (config.toml, last.pt) holds another config than
        this one (beyond RESUMABLE_CHANGES)."""
        saved = saved.to_dict() if isinstance(saved, Config) else saved
        if _changed_keys(saved, self.config.to_dict()):
            raise RunDirError(
                f"cannot resume {self.run_dir} with a different config: "
                f"{self._changes(saved)} changed from its {where} "
                f"(only {', '.join(sorted(RESUMABLE_CHANGES))} may change)"
            )

    def _changes(self, saved: Config | dict) -> str:
        saved = saved.to_dict() if isinstance(saved, Config) else saved
        return ", ".join(sorted(_changed_keys(saved, self.config.to_dict())))

    def _reached_budget(self, progress: dict[str, Any]) -> bool:
        """Whether a run at ``progress`` (last.pt's) has nothing left to train."""
        c = self.config.train
        return (
            progress["epoch"] > c.epochs
            or bool(c.max_steps and progress["step"] >= c.max_steps)
            or bool(c.early_stopping and progress["bad_evaluations"] >= c.early_stopping)
        )

    @contextlib.contextmanager
    def _hold_run_dir(self) -> Any:
        """Hold the run directory's lock while training: checked again under it, stale
        temporary files removed. (Under ``torchrun`` rank 0 alone holds it.)"""
        if not self.processes.is_main:
            yield
            return
        with rundir.RunLock(self.run_dir, self.log):
            self._check_run_dir()
            for path in rundir.remove_stale_temporaries(self.run_dir):
                self.log(f"removed {path.name}, left by an interrupted write")
            yield

    def _kept(self) -> str:
        """What the run directory keeps after a failure, for its message."""
        if self.checkpoint_step is None:
            return (
                "no checkpoint was written; the run directory can be restarted with "
                f"`targetlm train --resume --run-dir {self.run_dir}`"
            )
        return (
            f"the last good checkpoint (step {self.checkpoint_step}) is kept in "
            f"{self.run_dir / runs.LAST}"
        )

    # --- setup ------------------------------------------------------------------------
    def _setup(self) -> None:
        c = self.config
        if c.train.threads:
            torch.set_num_threads(c.train.threads)
        torch.manual_seed(c.train.seed)
        random.seed(c.train.seed)
        self.device = (
            self.processes.device if self.processes.several else torch.device(c.train.device)
        )
        self.task: Task[Any] = build_task(c)
        source = self._load_data()
        model = build_model(c.model, self.vocab.itos).to(self.device)
        if source is not None:
            state, base, where = source
            finetune.transfer_weights(model, state, len(self.vocab) - len(base), where)
        # what is trained: the language model, or the task's module around it (a classifier)
        self.model: Any = self.task.model_to_train(model, self.data, c).to(self.device)
        objective = build_objective(
            c.objective,
            self.model,
            c.train.loss_impl,
            c.train.loss_chunk_tokens,
            c.train.loss_chunk_vocab,
        ).to(self.device)
        self.lookahead = objective.lookahead
        # what the step minimises: the objective, or the task's loss around it (diffusion)
        self.objective = self.task.training_objective(objective, self.model).to(self.device)
        step_objective: nn.Module = self.objective
        if self.processes.several:  # each part divided by the whole batch's count
            if not isinstance(self.objective, (NgramLoss, DiffusionLoss)):
                raise ConfigError(
                    f"task.kind = {c.task.kind!r}: its loss is not shared by rows across "
                    "processes yet; train it in one process"
                )
            step_objective = distributed.ShardedObjective(self.objective, self.processes)
        self.task.prepare(self.data, c, self.model, self.log)
        self.batches = self._training_batches()
        if self.device.type == "cuda":  # on the GPU once: a step copies nothing from the host
            self.batches = [self.batches[i].to(self.device) for i in range(len(self.batches))]
        # the step's loss, one module: under DDP with several processes (which broadcasts
        # rank 0's initial weights), itself alone; evaluation reads self.objective (rank 0
        # alone: nothing all-reduced)
        self.step_module = TrainingStep(self.task, self.model, step_objective)
        self.trainable = self.processes.wrap(
            self.step_module,
            find_unused_parameters=bool(c.train.heads_only_steps)
            or self.step_module.may_leave_parameters_unused(),
        )
        if c.train.compile != "off" and self.processes.several:
            raise ConfigError(
                f"train.compile = {c.train.compile!r} compiles the step of one process; "
                "train with several processes eagerly (train.compile = 'off')"
            )
        self.compiled = compiling.compile_step(self.trainable, c.train.compile)
        self.compiled_shape: tuple | None = None  # the one batch shape the compiled step runs
        heads = [] if self.model.heads is None else list(self.model.heads.parameters())
        self.optimizer = build_optimizer(
            c.train,
            list(self.model.parameters()) + list(self.objective.parameters()),
            heads,
            fused=self.device.type == "cuda" and not self.processes.sharded,
        )
        steps_per_epoch = math.ceil(len(self.batches) / c.train.accumulate)
        budget = c.train.max_steps or c.train.epochs * steps_per_epoch
        self.schedule = LrSchedule(c.train, budget - c.train.heads_only_steps)
        self.epoch, self.batch_index, self.step = 1, 0, 0
        self.best_valid, self.bad_evaluations = math.inf, 0
        self._elapsed_before, self._session_start = 0.0, time.perf_counter()
        self.state: Any = None
        # the train records' window: summed NLL (float64, on the device) and targets since
        # the last record
        self.window_nll = torch.zeros((), dtype=torch.float64, device=self.device)
        self.window_count: int | torch.Tensor = 0  # (a tensor: counted by a compiled step)
        self._unchecked_losses = []

    # --- the data, evaluation and final figures: the task's ----------------------------------
    def _load_data(self) -> Any:
        """Read the task's corpus (``self.data``, ``self.vocab``); returns the finetuning
        source (state, vocabulary, where) or None."""
        c = self.config
        source, base = None, None
        if c.train.init_from and self.task.finetunable:
            # finetuning: the source run's words keep their ids; a resumed finetuning run has
            # its own (already extended) vocabulary; one that starts again from step 0 takes
            # the source's weights again
            source = finetune.source_of(c.train.init_from) if self.restart else None
            base = Vocabulary.load(self.run_dir / runs.VOCAB) if source is None else source[1]
        self.data: TaskData = self.task.load_data(c, base, self.log)
        if c.train.init_from and self.task.finetunable and source is None and base is not None:
            # a resumed finetuning run: its vocab.txt is already the extended one (the training
            # split's words and counts added once); extending it again would add the counts twice
            if self.data.vocab != base:
                raise RunDirError(
                    f"{self.run_dir / runs.VOCAB} lacks words of the training split: it is not "
                    "this finetuning run's vocabulary"
                )
            self.data = dataclasses.replace(self.data, vocab=base)
        self.vocab: Vocabulary = self.data.vocab
        return source

    def _training_batches(self) -> Any:
        """The task's training batches; with several processes, this rank's rows of them."""
        batches = self.task.training_batches(self.data, self.config, self.lookahead)
        if self.processes.several and self.task.conditional and len(batches):
            rows = max(batch.inputs.size(0) for batch in batches)
            if rows < self.processes.world_size:
                raise ConfigError(
                    f"--nproc_per_node {self.processes.world_size} is larger than the training "
                    f"batches' rows (at most {rows}): every process needs rows; use at most "
                    f"{rows} processes or a larger data.max_tokens"
                )
        return self.processes.shard(batches)

    def _evaluate(self, split: str) -> dict[str, Any]:
        """The task's figures of the model on ``split`` ("valid" or "test"): at least
        ``nll`` and ``ppl``. With several processes, rank 0 evaluates and every rank gets
        its figures (the schedule and early stopping agree)."""
        if self.processes.sharded:  # every rank holds a share of the model: all evaluate
            with self.processes.whole(self.step_module):
                return self.task.evaluate(
                    self.model, self.data, split, self.objective, self.config, self.device
                )
        result = None
        if self.processes.is_main:
            result = self.task.evaluate(
                self.model, self.data, split, self.objective, self.config, self.device
            )
        return self.processes.broadcast(result)

    def _split_results(self, split: str) -> dict[str, Any]:
        """The final figures of ``split`` in results.json (the task's)."""
        return self.task.final_results(
            self.model, self.data, split, self.objective, self.config, self.device, self.log
        )

    def _start_run_dir(self) -> None:
        if not self.processes.is_main:
            return
        if self.resume:
            self.log(f"{self.run_dir}: no checkpoint yet: starting from step 0")
        elif (self.run_dir / runs.CONFIG).is_file():
            self.log(f"{self.run_dir}: no checkpoint yet: starting the run again from step 0")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.run_dir / runs.CONFIG, config_lib.dumps(self.config))
        self.vocab.save(self.run_dir / runs.VOCAB)
        atomic_write(self.run_dir / runs.METRICS, "")

    def _restore(self) -> None:
        checkpoint = load_checkpoint(self.run_dir / runs.LAST, RESUME_KEYS)
        if "config" in checkpoint:
            self._check_same_config(runs.LAST, checkpoint["config"])
            saved_mode = checkpoint["config"].get("train", {}).get("compile", "off")
            if saved_mode != self.config.train.compile:
                self.log(
                    f"train.compile was {saved_mode!r}, now {self.config.train.compile!r}: the "
                    "run continues from the same weights, optimiser, position and random state; "
                    "its losses match an uninterrupted run's to float rounding, not bit for bit"
                )
        saved_vocab = Vocabulary.from_state_dict(checkpoint["vocab"])
        if saved_vocab != self.vocab:
            raise CheckpointError(
                f"{self.run_dir / runs.LAST}: checkpoint vocabulary ({len(saved_vocab)} words) does not "
                f"match the training data's vocabulary ({len(self.vocab)} words)"
            )
        if "sharded" in checkpoint:  # train.parallel = "fsdp": beside it, any number of ranks
            # the optimiser state it holds is that of the parameters then trained: during the
            # heads-only warm-up, the heads' alone (torch builds the state it reads into from
            # the parameters that require gradients)
            self._freeze_body(checkpoint["progress"]["step"] < self.config.train.heads_only_steps)
            distributed.load_sharded(
                self.step_module, self.optimizer, self.run_dir / checkpoint["sharded"]
            )
        else:
            runs.load_state_into(
                self.model, checkpoint["model"], self.vocab, str(self.run_dir / runs.LAST)
            )
            self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.schedule.load_state_dict(checkpoint["schedule"])
        p = checkpoint["progress"]
        self.epoch, self.batch_index, self.step = p["epoch"], p["batch_index"], p["step"]
        self.best_valid, self.bad_evaluations = p["best_valid"], p["bad_evaluations"]
        self._elapsed_before, self._session_start = p["elapsed"], time.perf_counter()
        window_nll, self.window_count = p.get("window", (0.0, 0))
        self.window_nll = torch.tensor(window_nll, dtype=torch.float64, device=self.device)
        self.checkpoint_step = self.step
        stopping = self.config.train.early_stopping
        if stopping and self.bad_evaluations >= stopping:  # stopped early, then killed
            self.epoch = self.config.train.epochs + 1
        self.state = checkpoint["state"]
        if self.state is not None:  # the whole batch's: this rank's rows of it
            self.state = _to_device(self.state, self.device)
            if self.processes.several:
                self.state = distributed.shard_state(
                    self.state, self._state_rows(), self.processes.rank, self.processes.world_size
                )
        for name, module in self._cached_modules():  # e.g. GroC's reused E_out (sparse updates)
            module.load_training_cache(
                _to_device(checkpoint.get("caches", {}).get(name), self.device)
            )
        torch.set_rng_state(checkpoint["rng"]["torch"])
        random.setstate(_as_tuple(checkpoint["rng"]["python"]))
        self._forget_later_metrics(p.get("metrics_records"))
        self.log(f"resumed {self.run_dir} at epoch {self.epoch}, step {self.step}")

    def _forget_later_metrics(self, count: int | None) -> None:
        """Keep the first ``count`` records of metrics.jsonl, those logged before the restored
        checkpoint was written (a checkpoint without the count: those up to its step); the
        rest will be logged again. Rewritten atomically."""
        if not self.processes.is_main:
            return
        metrics = self.run_dir / runs.METRICS
        records = rundir.read_metrics(metrics, self.log)
        if count is None:
            kept = [r for r in records if r["step"] <= self.step]
        else:
            if len(records) < count:
                self.log(
                    f"warning: {metrics} has {len(records)} records, {count} when "
                    f"{runs.LAST} was written"
                )
            kept = records[:count]
        atomic_write(metrics, "".join(json.dumps(r) + "\n" for r in kept))
        self.metrics_records = len(kept)

    def _state_rows(self) -> list[int]:
        if self._state_dims is None:
            self._state_dims = distributed.state_batch_dims(self.model, self.device)
        return self._state_dims

    def _checkpoint(self) -> None:
        self._check_finite()
        state = self.state
        if self.processes.several and state is not None:  # the whole batch's (every rank)
            state = distributed.gather_state(state, self._state_rows(), self.processes)
        weights: dict[str, Any] = {}
        if self.config.train.parallel == "fsdp":
            # the model and optimiser sharded (every rank its shards), beside last.pt
            weights["sharded"] = distributed.sharded_checkpoint_name(self.step)
            directory = self.run_dir / weights["sharded"]
            if self.processes.is_main and directory.exists():  # a write that was cut short
                shutil.rmtree(directory)
            self.processes.barrier()
            distributed.save_sharded(self.step_module, self.optimizer, directory)
            self.processes.barrier()
        else:
            weights = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if not self.processes.is_main:
            self.checkpoint_step = self.step
            return
        save_atomic(
            {
                **weights,
                "schedule": self.schedule.state_dict(),
                "progress": {
                    "epoch": self.epoch,
                    "batch_index": self.batch_index,
                    "step": self.step,
                    "best_valid": self.best_valid,
                    "bad_evaluations": self.bad_evaluations,
                    "elapsed": self.elapsed,
                    "window": (float(self.window_nll), int(self.window_count)),
                    "metrics_records": self.metrics_records,
                },
                "state": state_to_list(detach_state(state)),
                "rng": {"torch": torch.get_rng_state(), "python": _as_list(random.getstate())},
                "caches": {name: m.training_cache() for name, m in self._cached_modules()},
                "vocab": self.vocab.state_dict(),
                "config": self.config.to_dict(),
            },
            self.run_dir / runs.LAST,
        )
        self.checkpoint_step = self.step
        for older in self.run_dir.glob(distributed.sharded_checkpoint_name(0).replace("0", "*")):
            if older.name != weights.get("sharded"):  # last.pt no longer names it
                shutil.rmtree(older)

    def _cached_modules(self) -> list[tuple[str, HasTrainingCache]]:
        """Modules with training-time state outside their state_dict (``training_cache()``)."""
        return [(n, m) for n, m in self.model.named_modules() if isinstance(m, HasTrainingCache)]

    def _save_best(self, valid_ppl: float) -> None:
        model_state = distributed.full_model_state(self.step_module, self.processes)
        if not self.processes.is_main:
            return
        save_atomic(
            {
                "model": model_state,
                "vocab": self.vocab.state_dict(),
                "config": self.config.to_dict(),
                "valid_ppl": valid_ppl,
                "step": self.step,
            },
            self.run_dir / runs.BEST,
        )

    def _write_metrics(self, record: dict[str, Any]) -> None:
        if not self.processes.is_main:
            return
        rundir.append_metrics(self.run_dir / runs.METRICS, record)
        self.metrics_records += 1

    # --- the loop ---------------------------------------------------------------------
    def _order(self) -> list[int]:
        if not self.config.data.shuffle:
            return list(range(len(self.batches)))
        generator = torch.Generator().manual_seed(self.config.train.seed * 100003 + self.epoch)
        return torch.randperm(len(self.batches), generator=generator).tolist()

    def _evaluate_validation_split(self) -> bool:
        """Validate, keep the best model, step the schedule; True when training should stop early."""
        self._check_finite()
        c = self.config
        result = self._evaluate("valid")
        if not math.isfinite(result["ppl"]):  # a finite loss above 709 nats a word
            raise TrainingDiverged(
                f"valid perplexity is {result['ppl']} (loss {result['nll']:.4g}) at step "
                f"{self.step} (epoch {self.epoch}); training stopped: {self._kept()}"
            )
        self.schedule.on_validation(result["nll"])
        improved = result["ppl"] < self.best_valid
        if improved:
            self.best_valid, self.bad_evaluations = result["ppl"], 0
            self._save_best(result["ppl"])
        else:
            self.bad_evaluations += 1
        self._write_metrics(
            {"kind": "valid", "step": self.step, "epoch": self.epoch, "ppl": result["ppl"]}
        )
        self.log(
            f"epoch {self.epoch} step {self.step}: valid ppl {result['ppl']:.2f}"
            + (" (best)" if improved else f" (no improvement x{self.bad_evaluations})")
        )
        return bool(c.train.early_stopping) and self.bad_evaluations >= c.train.early_stopping

    def train_step(
        self, batch: Batch | list[Batch], lr: float
    ) -> tuple[torch.Tensor, int | torch.Tensor]:
        """One optimiser step on ``batch`` (or the gradients of several, ``train.accumulate``)
        at learning rate ``lr`` (the carried state continues the stream); returns the main
        head's summed NLL (a float64 tensor on the device: read at the logging interval, so
        a step waits for no device) and its number of targets (an int; a tensor on the
        device when the compiled step counted them). Its loss is checked for NaN at
        the next record, validation or checkpoint (:meth:`_check_finite`)."""
        c = self.config.train
        if not self.model.training:  # whatever an evaluation left it in: dropout trains
            self.model.train()  # (only on a change: GroC's train() drops its reused E_out)
        set_lr(self.optimizer, lr)
        self._freeze_body(self.step < c.heads_only_steps)
        micro_batches = batch if isinstance(batch, list) else [batch]
        self.optimizer.zero_grad(set_to_none=True)
        nll_sum, count = torch.zeros((), dtype=torch.float64, device=self.device), 0
        # a base model's heads-only steps train nothing: no backward, so no DDP either
        trains = any(p.requires_grad for p in self.step_module.parameters())
        step = self.trainable if trains else self.step_module
        for index, batch in enumerate(micro_batches):
            state = detach_state(self.state) if c.carry_state else None
            batch = batch.to(self.device)
            if c.gradient_diversity_every and (self.step + 1) % c.gradient_diversity_every == 0:
                self._measure_diversity(batch.inputs, batch.targets, state)
            # gradients are averaged over the processes after the last micro-batch only
            with self.processes.accumulating(step, final=index == len(micro_batches) - 1):
                with self._autocast():
                    out, self.state = self._run_step(step, batch, state, trains)
                # checked for NaN at the next record, validation or checkpoint (no host sync)
                # (a copy: a CUDA graph's next replay reuses the loss's memory)
                self._unchecked_losses.append((self.step + 1, out.loss.detach().clone()))
                scale = batch.inputs.size(1) if c.loss_reduction == "sum_over_time" else 1
                if out.loss.requires_grad:
                    (out.loss * (scale / len(micro_batches))).backward()
            nll_sum, count = nll_sum + out.nll_sum.detach().double(), count + out.count
        if self.processes.several:  # the loop checks it before the next step: the same everywhere
            self.stop_requested = self.processes.any(self._interrupted)
        if c.clip > 0:
            clip_gradients(self.model.parameters(), c.clip)
        self.optimizer.step()
        return nll_sum, count

    def _run_step(self, step: Any, batch: Batch, state: Any, trains: bool) -> tuple[Any, Any]:
        """The step's loss and carried state: compiled (``train.compile``) for the batches of
        the first compiled batch's shape, else ``step`` eagerly (e.g. a stream's shorter last
        segment: nothing is recompiled). If compiling fails on the first step, one warning
        and the run continues eagerly."""
        c = self.config.train
        shape = (tuple(batch.inputs.shape), tuple(batch.targets.shape))
        if self.compiled is None or not trains or self.compiled_shape not in (None, shape):
            return step(batch, state, c.carry_state)
        compiling.new_step(c.compile)
        try:
            out, new_state = self.compiled(batch, compiling.dense(state), c.carry_state)
        except Exception as error:
            if self.compiled_shape is not None:
                raise
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            self.log(
                f"warning: train.compile = {c.compile!r} failed on the first step "
                f"({type(error).__name__}: {first[:200]}); training continues eagerly"
            )
            self.compiled = None
            return step(batch, state, c.carry_state)
        self.compiled_shape = shape
        if c.compile == "graphs":  # outputs of a CUDA graph: copied before its next replay
            out = dataclasses.replace(
                out, nll_sum=out.nll_sum.clone(), count=compiling.dense(out.count)
            )
            new_state = compiling.dense(new_state)
        return out, new_state

    def _check_finite(self) -> None:
        """Raise :class:`TrainingDiverged` naming the first step since the last check whose
        loss was NaN or infinite (one host sync for all of them); called before every record,
        validation and checkpoint, so a checkpoint never holds a diverged model."""
        if not self._unchecked_losses:
            return
        steps = [step for step, _ in self._unchecked_losses]
        losses = torch.stack([loss.float() for _, loss in self._unchecked_losses])
        self._unchecked_losses = []
        finite = torch.isfinite(losses)
        if bool(finite.all()):
            return
        first = int((~finite).nonzero()[0, 0])
        raise TrainingDiverged(
            f"loss is {float(losses[first])} at step {steps[first]} (epoch {self.epoch}); "
            f"training stopped: {self._kept()}"
        )

    def _scheduled_lr(self) -> float:
        """The learning rate of the next step. The schedule (warm-up, decay) runs over the steps
        after the heads-only warm-up, so a model with heads trains its body on the schedule a
        model without them follows; during the warm-up the heads train at a constant rate."""
        c = self.config.train
        if self.step < c.heads_only_steps:
            return c.lr
        return self.schedule.lr(self.step + 1 - c.heads_only_steps, self.epoch)

    def _autocast(self) -> Any:
        """bfloat16 autocast of the forward pass and loss (``train.precision = "bf16"``)."""
        enabled = self.config.train.precision == "bf16"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _freeze_body(self, frozen: bool) -> None:
        """Train only the N-gram heads (``frozen``) or everything (the heads-only warm-up).

        A model without heads trains nothing in those steps: it reads past their batches, so
        it then sees the batches a heads model sees after its warm-up (a like-for-like base).
        """
        if not self.config.train.heads_only_steps:
            return
        heads = (
            set() if self.model.heads is None else {id(p) for p in self.model.heads.parameters()}
        )
        for parameter in list(self.model.parameters()) + list(self.objective.parameters()):
            if id(parameter) not in heads:
                parameter.requires_grad_(not frozen)

    def _measure_diversity(self, inputs: torch.Tensor, targets: torch.Tensor, state: Any) -> None:
        """Log the gradient diversity of this step's batch (before the step; training unchanged)."""
        from targetlm.analysis.diversity import batch_gradient_diversity

        value = batch_gradient_diversity(
            self.model, self.objective, inputs.to(self.device), targets.to(self.device), state
        )
        self._write_metrics(
            {
                "kind": "diversity",
                "step": self.step + 1,
                "epoch": self.epoch,
                "gradient_diversity": value,
            }
        )

    def train(self) -> dict[str, Any]:
        """Run to the end of the budget; returns the final results (also written to the run
        dir), or those of a resumed run that had already finished (nothing is written).

        Raises:
            RunDirError: another process holds the run directory, or the disk is full (the
                last good checkpoint is kept).
            KeyboardInterrupt: a second Ctrl-C, or one before training started (its message
                says what is kept).
        """
        try:
            with self._hold_run_dir():
                if self.finished_results is not None:
                    self.log(f"{self.run_dir} is finished ({runs.RESULTS}); nothing to resume")
                    return self.finished_results
                return self._train()
        except OSError as error:
            code = disk_full(error)
            if not code:
                raise
            path = Path(error.filename or self.run_dir)
            reason = str(DiskFullError(code, path).strerror).replace(
                "the device", rundir.device_of(path)
            )
            raise RunDirError(f"{reason} writing {path}; {self._kept()}") from None
        except KeyboardInterrupt:
            second = "a second " if self.stop_requested else ""
            raise KeyboardInterrupt(f"stopped by {second}Ctrl-C: {self._kept()}") from None
        finally:
            self.processes.close()

    def _train(self) -> dict[str, Any]:
        self._setup()
        if self.restart:
            self._start_run_dir()
        else:
            self._restore()
        c = self.config.train
        previous = signal.signal(signal.SIGINT, self._on_interrupt) if _main_thread() else None
        try:
            self._loop()
            self._check_finite()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if self.stop_requested:
            self.log(
                f"interrupted: resumable checkpoint in {self.run_dir / runs.LAST} (use --resume)"
            )
            return {"interrupted": True, "step": self.step}
        if c.max_steps and self.step >= c.max_steps and not self._finished_epochs():
            self.log(
                f"stopped at max_steps={c.max_steps}; resumable checkpoint in {self.run_dir / runs.LAST}"
            )
        results = self.finish()
        # the other ranks wait for rank 0's evaluation, so every rank ends its process group
        # at once (a rank that ended it early was seen waiting on gloo after rank 0 had exited)
        self.processes.barrier()
        return results

    def _finished_epochs(self) -> bool:
        return self.epoch > self.config.train.epochs

    def _on_interrupt(self, signum, frame) -> None:
        if self.processes.several:
            # torchrun passes Ctrl-C on to every worker, which the terminal has already
            # signalled: a repeat is not a second Ctrl-C (torchrun kills the workers after 30 s)
            self._interrupted = True
            return
        if self.stop_requested:  # a second Ctrl-C: stop now (train() says what is kept)
            raise KeyboardInterrupt
        self.stop_requested = True

    def _loop(self) -> None:
        c = self.config.train
        # (this session's, for tok_s; a tensor on the device when a compiled step counts)
        log_start, timed_tokens = time.perf_counter(), cast(Any, 0)
        while self.epoch <= c.epochs:
            order = self._order()
            bar = tqdm(
                total=len(order),
                initial=self.batch_index,
                disable=not c.progress,
                desc=f"epoch {self.epoch}",
                leave=False,
                dynamic_ncols=True,
            )
            while self.batch_index < len(order):
                if (c.max_steps and self.step >= c.max_steps) or self.stop_requested:
                    bar.close()
                    self._checkpoint()
                    return
                lr = self._scheduled_lr()
                group = order[self.batch_index : self.batch_index + c.accumulate]
                batch = (
                    [self.batches[i] for i in group] if c.accumulate > 1 else self.batches[group[0]]
                )
                nll, count = self.train_step(batch, lr)
                self.step += 1
                self.batch_index += len(group)
                self.window_nll += nll
                self.window_count += count
                timed_tokens += count
                bar.update(len(group))
                if self.step % c.log_every == 0:
                    self._check_finite()
                    seconds = time.perf_counter() - log_start
                    self.window_count, timed_tokens = int(self.window_count), int(timed_tokens)
                    loss = float(self.window_nll) / self.window_count
                    record = {
                        "kind": "train",
                        "step": self.step,
                        "epoch": self.epoch,
                        "lr": lr,
                        "loss": loss,
                        "ppl": perplexity(loss),
                        "tok_s": timed_tokens / max(seconds, 1e-9),
                    }
                    self._write_metrics(record)
                    bar.set_postfix(
                        loss=f"{record['loss']:.3f}",
                        ppl=f"{record['ppl']:.1f}",
                        tok_s=f"{record['tok_s']:.0f}",
                        lr=f"{lr:.3g}",
                    )
                    self.window_nll, self.window_count = torch.zeros_like(self.window_nll), 0
                    log_start, timed_tokens = time.perf_counter(), 0
                if c.eval_every and self.step % c.eval_every == 0:
                    stop = self._evaluate_validation_split()
                    self._checkpoint()
                    if stop:
                        bar.close()
                        self._stop_early()
                        return
                elif c.checkpoint_every and self.step % c.checkpoint_every == 0:
                    self._checkpoint()
            bar.close()
            # end of an epoch: validate it, then move the position to the next one
            stop = False if c.eval_every else self._evaluate_validation_split()
            self.epoch, self.batch_index, self.state = self.epoch + 1, 0, None
            if not c.eval_every:
                self._checkpoint()
            if stop:
                self._stop_early()
                return

    def _stop_early(self) -> None:
        self.log(
            f"early stopping: no improvement in {self.config.train.early_stopping} validations"
        )
        self.epoch = self.config.train.epochs + 1

    @property
    def elapsed(self) -> float:
        """Training wall time so far, across resumed sessions."""
        return self._elapsed_before + time.perf_counter() - self._session_start

    def finish(self) -> dict[str, Any]:
        """Evaluate the best model on valid and test; write results.json and report.md (with
        several processes: rank 0; the others return ``{"rank", "steps"}`` at once)."""
        from targetlm.analysis.report import write_report

        if self.processes.sharded:  # every rank holds a share of the model: all evaluate
            if self.processes.broadcast((self.run_dir / runs.BEST).is_file()):
                best = load_checkpoint(self.run_dir / runs.BEST) if self.processes.is_main else {}
                distributed.load_full_model_state(
                    self.step_module, best.get("model", {}), self.processes
                )
            with self.processes.whole(self.step_module):
                results: dict[str, Any] = {
                    name: self._split_results(name) for name in ("valid", "test")
                }
        if not self.processes.is_main:
            return {"rank": self.processes.rank, "steps": self.step}

        wall_time = self.elapsed
        if not self.processes.sharded:
            if (self.run_dir / runs.BEST).is_file():
                best = load_checkpoint(self.run_dir / runs.BEST)
                self.model.load_state_dict(best["model"])
            results = {name: self._split_results(name) for name in ("valid", "test")}
        results.update(
            params=self.model.parameter_counts(),
            total_params=sum(self.model.parameter_counts().values()),
            wall_time_s=wall_time,
            steps=self.step,
            vocab_size=len(self.vocab),
        )
        atomic_write(self.run_dir / runs.RESULTS, json.dumps(results, indent=2) + "\n")
        write_report(self.run_dir, self.config, results)
        self.log(
            f"valid ppl {results['valid']['ppl']:.2f} | test ppl {results['test']['ppl']:.2f} "
            f"| {results['total_params']:,} parameters | {wall_time:.0f} s | report: {self.run_dir / runs.REPORT}"
        )
        return results


def _silent(message: str) -> None:
    pass


def _sharded_checkpoint(name: str) -> bool:
    """Whether ``name`` is a sharded checkpoint's directory (``last-step<N>.dcp``)."""
    return re.fullmatch(r"last-step\d+\.dcp", name) is not None


def _temporary(name: str) -> bool:
    """Whether ``name`` is an atomic write's temporary file (``.NAME.*.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


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
