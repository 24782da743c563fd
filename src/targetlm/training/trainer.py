"""The training loop: one loop for every encoder, output layer and objective, in one
process or as one rank of a ``torchrun`` job (:mod:`targetlm.training.distributed`).

The trainer only trains: it builds a :class:`~targetlm.training.run_directory.RunDirectory`
(may the run start, restart or resume here; its lock) and a
:class:`~targetlm.training.checkpointer.Checkpointer` (last.pt for exact resume, best.pt),
and calls them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from tqdm import tqdm

from targetlm import builders, rundir, runs
from targetlm.checkpoint import load as load_checkpoint
from targetlm.config import Config
from targetlm.data import Vocabulary
from targetlm.files import DiskFullError, atomic_write, disk_full
from targetlm.inference.evaluate import perplexity
from targetlm.modules.model import build_model, detach_state
from targetlm.objectives import build_objective
from targetlm.registry import ConfigError
from targetlm.rundir import RunDirError
from targetlm.tasks import Batch, Task, TaskData, build_task
from targetlm.training import compile as compiling
from targetlm.training import distributed, finetune
from targetlm.training.checkpointer import Checkpointer
from targetlm.training.optim import LrSchedule, build_optimizer, clip_gradients, set_lr
from targetlm.training.run_directory import RunDirectory
from targetlm.training.step import TrainingStep


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


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
        self.metrics_records = 0  # records in metrics.jsonl (last.pt keeps their count)
        # the losses not yet checked for NaN, with their steps (:meth:`_check_finite`)
        self._unchecked_losses: list[tuple[int, torch.Tensor]] = []
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
        if c.train.threads:
            torch.set_num_threads(c.train.threads)
        torch.manual_seed(c.train.seed)
        random.seed(c.train.seed)
        self.device = (
            self.processes.device if self.processes.several else torch.device(c.train.device)
        )
        self.task: Task[Any] = build_task(c)
        source = self._load_data()
        self.task.setup(c, self.data, self.device, self.log)
        model = build_model(c.model, self.vocab.itos).to(self.device)
        if source is not None:
            state, base, where = source
            finetune.transfer_weights(model, state, len(self.vocab) - len(base), where)
        # what is trained: the language model, or the task's module around it (a classifier)
        self.model: Any = self.task.model_to_train(model).to(self.device)
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
        self.task.prepare(self.model)
        self.batches = self._training_batches()
        if self.device.type == "cuda":  # on the GPU once: a step copies nothing from the host
            self.batches = [self.batches[i].to(self.device) for i in range(len(self.batches))]
        # the step's loss, one module, which divides it by the counts (with several
        # processes the whole batch's): under DDP with several processes (which broadcasts
        # rank 0's initial weights), itself alone; evaluation reads self.objective (rank 0
        # alone: nothing all-reduced)
        self.step_module = TrainingStep(
            self.task, self.model, self.objective, self.processes, c.train.loss_reduction
        )
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
        batches = self.task.training_batches(self.lookahead)
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
                return self.task.evaluate(self.model, split)
        result = None
        if self.processes.is_main:
            result = self.task.evaluate(self.model, split)
        return self.processes.broadcast(result)

    def _start_run_dir(self) -> None:
        self.run_directory.start(self.vocab)

    def _restore(self) -> None:
        progress, self.state = self.checkpointer.restore(
            model=self.model,
            step_module=self.step_module,
            optimizer=self.optimizer,
            schedule=self.schedule,
            vocab=self.vocab,
            device=self.device,
            freeze_body=self._freeze_body,
        )
        p = progress
        self.epoch, self.batch_index, self.step = p["epoch"], p["batch_index"], p["step"]
        self.best_valid, self.bad_evaluations = p["best_valid"], p["bad_evaluations"]
        self._elapsed_before, self._session_start = p["elapsed"], time.perf_counter()
        window_nll, self.window_count = p["window"]
        self.window_nll = torch.tensor(window_nll, dtype=torch.float64, device=self.device)
        stopping = self.config.train.early_stopping
        if stopping and self.bad_evaluations >= stopping:  # stopped early, then killed
            self.epoch = self.config.train.epochs + 1
        if self.state is not None and self.processes.several:  # this rank's rows of the batch
            self.state = distributed.shard_state(
                self.state, self._state_rows(), self.processes.rank, self.processes.world_size
            )
        self.metrics_records = self.checkpointer.forget_later_metrics(
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
            model=self.model,
            step_module=self.step_module,
            optimizer=self.optimizer,
            schedule=self.schedule,
            vocab=self.vocab,
            progress={
                "epoch": self.epoch,
                "batch_index": self.batch_index,
                "step": self.step,
                "best_valid": self.best_valid,
                "bad_evaluations": self.bad_evaluations,
                "elapsed": self.elapsed,
                "window": (float(self.window_nll), int(self.window_count)),
                "metrics_records": self.metrics_records,
            },
            state=state,
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
                f"{self.step} (epoch {self.epoch}); training stopped: {self.checkpointer.kept()}"
            )
        self.schedule.on_validation(result["nll"])
        improved = result["ppl"] < self.best_valid
        if improved:
            self.best_valid, self.bad_evaluations = result["ppl"], 0
            self.checkpointer.save_best(self.step_module, self.vocab, result["ppl"], self.step)
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
                if out.loss.requires_grad:  # the micro-batches' mean
                    (out.loss * (1 / len(micro_batches))).backward()
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
            f"training stopped: {self.checkpointer.kept()}"
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
            with self.run_directory.hold():
                finished = self.run_directory.finished_results
                if finished is not None:
                    self.log(f"{self.run_dir} is finished ({runs.RESULTS}); nothing to resume")
                    return finished
                return self._train()
        except OSError as error:
            code = disk_full(error)
            if not code:
                raise
            path = Path(error.filename or self.run_dir)
            reason = str(DiskFullError(code, path).strerror).replace(
                "the device", rundir.device_of(path)
            )
            raise RunDirError(f"{reason} writing {path}; {self.checkpointer.kept()}") from None
        except KeyboardInterrupt:
            second = "a second " if self.stop_requested else ""
            raise KeyboardInterrupt(
                f"stopped by {second}Ctrl-C: {self.checkpointer.kept()}"
            ) from None
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
                # (None: tqdm's own rule, no bar where stderr is no terminal: a log file)
                disable=None if c.progress else True,
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
                results: dict[str, Any] = self.task.final_results(self.model)
        if not self.processes.is_main:
            return {"rank": self.processes.rank, "steps": self.step}

        wall_time = self.elapsed
        if not self.processes.sharded:
            if (self.run_dir / runs.BEST).is_file():
                best = load_checkpoint(self.run_dir / runs.BEST)
                self.model.load_state_dict(best["model"])
            results = self.task.final_results(self.model)
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
            f"{self.task.headline(results)} "
            f"| {results['total_params']:,} parameters | {wall_time:.0f} s | report: {self.run_dir / runs.REPORT}"
        )
        return results


def _silent(message: str) -> None:
    pass


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
