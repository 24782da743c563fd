"""The training loop: one loop for every encoder, output layer and objective, in one
process or as one rank of a ``torchrun`` job (:mod:`targetlm.training.distributed`).

The trainer only sets up, loops and steps. It builds what it runs and then calls it: the run's
parts (:mod:`targetlm.training.build`: model, objective, batches, step, optimiser, schedule), a
:class:`~targetlm.training.run_directory.RunDirectory` (may the run start, restart or resume
here; its lock), a :class:`~targetlm.training.checkpointer.Checkpointer` (last.pt for exact
resume, best.pt), a :class:`~targetlm.training.validation.Validator` (validation, early
stopping, the final results and report), the metrics log and loss window
(:mod:`targetlm.training.metrics`), the heads-only warm-up (:mod:`targetlm.training.warmup`)
and the guards against a diverged loss, Ctrl-C and a full disk
(:mod:`targetlm.training.guards`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from targetlm import builders, rundir, runs
from targetlm.config import Config
from targetlm.data import Vocabulary
from targetlm.modules.model import detach_state
from targetlm.rundir import RunDirError
from targetlm.tasks import Batch, Task, TaskData, build_task
from targetlm.training import build, distributed, metrics, warmup
from targetlm.training import compile as compiling
from targetlm.training.checkpointer import Checkpointer
from targetlm.training.guards import Interrupts, LossWatch, TrainingDiverged, explained_stops
from targetlm.training.optim import clip_gradients, set_lr
from targetlm.training.run_directory import RunDirectory
from targetlm.training.validation import Validator

__all__ = ["RunDirError", "Trainer", "TrainingDiverged"]


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
        self.interrupts = Interrupts(self.processes)
        self.metrics = metrics.MetricsLog(self.run_dir / runs.METRICS, self.processes)
        self.losses = LossWatch()  # the losses not yet checked for NaN (:meth:`_check_finite`)
        self._state_dims: list[int] | None = None  # the carried state's row dimensions
        self.run_directory = RunDirectory(self.run_dir, config, resume, self.processes, log)
        self.checkpointer = Checkpointer(self.run_dir, config, self.processes, log)
        try:
            rundir.check_unlocked(self.run_dir)
            rundir.check_outside_runs(self.run_dir)
            self.run_directory.check()
        except Exception:
            self.processes.close()
            raise
        self.processes.barrier()  # every rank has checked the run directory before rank 0 writes

    @property
    def restart(self) -> bool:
        """No last.pt yet: training starts at step 0 (a new run, or one that stopped before
        its first checkpoint)."""
        return self.run_directory.restart

    # --- setup ------------------------------------------------------------------------
    def _setup(self) -> None:
        c = self.config
        self.device = build.seed_and_device(c, self.processes)
        self.task: Task[Any] = build_task(c)
        source = self._load_data()
        self.task.setup(c, self.data, self.device, self.log)
        self.parts = parts = build.build_parts(
            c, self.task, self.vocab, source, self.device, self.processes
        )
        self.model, self.objective, self.lookahead = parts.model, parts.objective, parts.lookahead
        self.batches, self.step_module = parts.batches, parts.step_module
        self.trainable, self.compiled = parts.trainable, parts.compiled
        self.compiled_shape: tuple | None = None  # the one batch shape the compiled step runs
        self.optimizer, self.schedule = parts.optimizer, parts.schedule
        self.validator = Validator(
            c,
            self.run_dir,
            self.task,
            self.model,
            self.step_module,
            self.processes,
            self.checkpointer,
            self.metrics,
            self.log,
        )
        self.epoch, self.batch_index, self.step = 1, 0, 0
        self._elapsed_before, self._session_start = 0.0, time.perf_counter()
        self.state: Any = None
        self.window = metrics.TrainWindow(self.device)  # the train records' loss window
        self.losses = LossWatch()

    def _load_data(self) -> Any:
        """Read the task's corpus (``self.data``, ``self.vocab``); returns the finetuning
        source (state, vocabulary, where) or None."""
        self.data: TaskData
        self.data, source = build.load_data(
            self.config, self.task, self.run_dir, self.restart, self.log
        )
        self.vocab: Vocabulary = self.data.vocab
        return source

    def _start_run_dir(self) -> None:
        self.run_directory.start(self.vocab)

    def _restore(self) -> None:
        p, self.state = self.checkpointer.restore(
            self.parts, self.vocab, self.device, self._freeze_body
        )
        self.epoch, self.batch_index, self.step = p["epoch"], p["batch_index"], p["step"]
        self.validator.best_valid = p["best_valid"]
        self.validator.bad_evaluations = p["bad_evaluations"]
        self._elapsed_before, self._session_start = p["elapsed"], time.perf_counter()
        self.window.restore(p["window"])
        if self.validator.stops_early():  # stopped early, then killed
            self.epoch = self.config.train.epochs + 1
        if self.state is not None and self.processes.several:  # this rank's rows of the batch
            self.state = distributed.shard_state(
                self.state, self._state_rows(), self.processes.rank, self.processes.world_size
            )
        self.metrics.records = self.checkpointer.forget_later_metrics(
            p["metrics_records"], self.step
        )
        self.log(f"resumed {self.run_dir} at epoch {self.epoch}, step {self.step}")

    def _state_rows(self) -> list[int]:
        if self._state_dims is None:
            self._state_dims = distributed.state_batch_dims(self.model, self.device)
        return self._state_dims

    def _checkpoint(self) -> None:
        """Write last.pt at this step (a diverged loss is never saved)."""
        self._check_finite()
        state = self.state
        if self.processes.several and state is not None:  # the whole batch's (every rank)
            state = distributed.gather_state(state, self._state_rows(), self.processes)
        self.checkpointer.save_last(
            self.parts,
            self.vocab,
            progress={
                "epoch": self.epoch,
                "batch_index": self.batch_index,
                "step": self.step,
                "best_valid": self.validator.best_valid,
                "bad_evaluations": self.validator.bad_evaluations,
                "elapsed": self.elapsed,
                "window": self.window.saved(),
                "metrics_records": self.metrics.records,
            },
            state=state,
        )

    # --- the loop ---------------------------------------------------------------------
    def _order(self) -> list[int]:
        if not self.config.data.shuffle:
            return list(range(len(self.batches)))
        generator = torch.Generator().manual_seed(self.config.train.seed * 100003 + self.epoch)
        return torch.randperm(len(self.batches), generator=generator).tolist()

    def _evaluate_validation_split(self) -> bool:
        """Validate, keep the best model, step the schedule; True when training should stop early."""
        self._check_finite()
        return self.validator.validate(self.step, self.epoch, self.schedule, self.vocab)

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
                self.metrics.write(
                    metrics.diversity_record(
                        self.model, self.objective, batch, state, self.step + 1, self.epoch
                    )
                )
            # gradients are averaged over the processes after the last micro-batch only
            with self.processes.accumulating(step, final=index == len(micro_batches) - 1):
                with self._autocast():
                    out, self.state = self._run_step(step, batch, state, trains)
                # checked for NaN at the next record, validation or checkpoint (no host sync)
                # (a copy: a CUDA graph's next replay reuses the loss's memory)
                self.losses.add(self.step + 1, out.loss.detach().clone())
                if out.loss.requires_grad:  # the micro-batches' mean
                    (out.loss * (1 / len(micro_batches))).backward()
            nll_sum, count = nll_sum + out.nll_sum.detach().double(), count + out.count
        self.interrupts.agree()  # the loop checks it before the next step: the same everywhere
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
        loss was NaN or infinite (:class:`~targetlm.training.guards.LossWatch`)."""
        self.losses.check(self.epoch, self.checkpointer.kept)

    def _scheduled_lr(self) -> float:
        """The learning rate of the next step (:func:`~targetlm.training.warmup.scheduled_lr`)."""
        return warmup.scheduled_lr(self.config.train, self.schedule, self.step, self.epoch)

    def _autocast(self) -> Any:
        """bfloat16 autocast of the forward pass and loss (``train.precision = "bf16"``)."""
        enabled = self.config.train.precision == "bf16"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _freeze_body(self, frozen: bool) -> None:
        """Train only the N-gram heads or everything (:func:`~targetlm.training.warmup.freeze_body`)."""
        warmup.freeze_body(self.config.train, self.model, self.objective, frozen)

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
            kept = self.checkpointer.kept
            with explained_stops(self.run_dir, kept, self.interrupts), self.run_directory.hold():
                finished = self.run_directory.finished_results
                if finished is not None:
                    self.log(f"{self.run_dir} is finished ({runs.RESULTS}); nothing to resume")
                    return finished
                return self._train()
        finally:
            self.processes.close()

    def _train(self) -> dict[str, Any]:
        self._setup()
        if self.restart:
            self._start_run_dir()
        else:
            self._restore()
        c = self.config.train
        with self.interrupts.handling():
            self._loop()
            self._check_finite()
        if self.interrupts.stop_requested:
            self.log(
                f"interrupted: resumable checkpoint in {self.run_dir / runs.LAST} (use --resume)"
            )
            return {"interrupted": True, "step": self.step}
        if c.max_steps and self.step >= c.max_steps and not self.epoch > c.epochs:
            self.log(
                f"stopped at max_steps={c.max_steps}; resumable checkpoint in {self.run_dir / runs.LAST}"
            )
        results = self.finish()
        # the other ranks wait for rank 0's evaluation, so every rank ends its process group
        # at once (a rank that ended it early was seen waiting on gloo after rank 0 had exited)
        self.processes.barrier()
        return results

    def _loop(self) -> None:
        c = self.config.train
        self.window.start_clock()  # this session's tokens a second
        while self.epoch <= c.epochs:
            order = self._order()
            bar = tqdm(
                total=len(order),
                initial=self.batch_index,
                # (None: tqdm's own rule, no bar where stderr is no terminal: a log file)
                disable=None if c.progress else True,
                desc=f"epoch {self.epoch}",
                leave=False,
                dynamic_ncols=True,
            )
            while self.batch_index < len(order):
                if (c.max_steps and self.step >= c.max_steps) or self.interrupts.stop_requested:
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
                self.window.add(nll, count)
                bar.update(len(group))
                if self.step % c.log_every == 0:
                    self._check_finite()
                    record = self.window.record(self.step, self.epoch, lr)
                    self.metrics.write(record)
                    bar.set_postfix(
                        loss=f"{record['loss']:.3f}",
                        ppl=f"{record['ppl']:.1f}",
                        tok_s=f"{record['tok_s']:.0f}",
                        lr=f"{lr:.3g}",
                    )
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
        return self.validator.finish(self.step, self.vocab, lambda: self.elapsed)


def _silent(message: str) -> None:
    pass
