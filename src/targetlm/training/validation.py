"""The run's evaluations: validation during training (best.pt, the schedule's plateau, early
stopping: :meth:`Validator.validate`) and the final figures at its end (results.json and
report.md: :meth:`Validator.finish`). The task computes the figures; the validator decides
what they mean for the run and where they go."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from targetlm import runs
from targetlm.checkpoint import load as load_checkpoint
from targetlm.config import Config
from targetlm.data import Vocabulary
from targetlm.files import atomic_write
from targetlm.tasks import Task
from targetlm.training import distributed
from targetlm.training.checkpointer import Checkpointer
from targetlm.training.guards import TrainingDiverged
from targetlm.training.metrics import MetricsLog
from targetlm.training.optim import LrSchedule
from targetlm.training.step import TrainingStep


@dataclass(eq=False)
class Validator:
    """Evaluates the model of a run in ``run_dir`` and keeps what the run learns from it: the
    best validation perplexity (``best_valid``, its model in best.pt) and the validations
    since it improved (``bad_evaluations``); last.pt keeps both.

    Args:
        config: the run's config (``train.early_stopping``).
        task: computes the figures of a split.
        model: the model trained; ``step_module``: its step (holds the shards when sharded).
        processes: the run's processes (rank 0 evaluates, or all of them when sharded).
        checkpointer: writes best.pt; says what is kept when validation diverges.
        metrics: where the validation records go.
        log: the run's log.
    """

    config: Config
    run_dir: Path
    task: Task[Any]
    model: Any
    step_module: TrainingStep
    processes: distributed.Processes
    checkpointer: Checkpointer
    metrics: MetricsLog
    log: Callable[[str], None]
    best_valid: float = field(default=math.inf, init=False)
    bad_evaluations: int = field(default=0, init=False)

    def evaluate(self, split: str) -> dict[str, Any]:
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

    def validate(self, step: int, epoch: int, schedule: LrSchedule, vocab: Vocabulary) -> bool:
        """Validate at ``step``, keep the best model (best.pt), step the ``schedule``; True
        when training should stop early.

        Raises:
            TrainingDiverged: the validation perplexity is not finite.
        """
        result = self.evaluate("valid")
        if not math.isfinite(result["ppl"]):  # a finite loss above 709 nats a word
            raise TrainingDiverged(
                f"valid perplexity is {result['ppl']} (loss {result['nll']:.4g}) at step "
                f"{step} (epoch {epoch}); training stopped: {self.checkpointer.kept()}"
            )
        schedule.on_validation(result["nll"])
        improved = result["ppl"] < self.best_valid
        if improved:
            self.best_valid, self.bad_evaluations = result["ppl"], 0
            self.checkpointer.save_best(self.step_module, vocab, result["ppl"], step)
        else:
            self.bad_evaluations += 1
        self.metrics.write({"kind": "valid", "step": step, "epoch": epoch, "ppl": result["ppl"]})
        self.log(
            f"epoch {epoch} step {step}: valid ppl {result['ppl']:.2f}"
            + (" (best)" if improved else f" (no improvement x{self.bad_evaluations})")
        )
        return self.stops_early()

    def stops_early(self) -> bool:
        """Whether ``train.early_stopping`` validations in a row have not improved."""
        stopping = self.config.train.early_stopping
        return bool(stopping) and self.bad_evaluations >= stopping

    def finish(self, steps: int, vocab: Vocabulary, elapsed: Callable[[], float]) -> dict[str, Any]:
        """Evaluate the best model on valid and test; write results.json and report.md (with
        several processes: rank 0; the others return ``{"rank", "steps"}`` at once).

        Args:
            steps: the run's steps; ``vocab``: its vocabulary.
            elapsed: the training wall time so far, read once the model is evaluated
                (sharded) or before (else).
        """
        from targetlm.analysis.report import write_report

        processes, run_dir = self.processes, self.run_dir
        if processes.sharded:  # every rank holds a share of the model: all evaluate
            if processes.broadcast((run_dir / runs.BEST).is_file()):
                best = load_checkpoint(run_dir / runs.BEST) if processes.is_main else {}
                distributed.load_full_model_state(
                    self.step_module, best.get("model", {}), processes
                )
            with processes.whole(self.step_module):
                results: dict[str, Any] = self.task.final_results(self.model)
        if not processes.is_main:
            return {"rank": processes.rank, "steps": steps}

        wall_time = elapsed()
        if not processes.sharded:
            if (run_dir / runs.BEST).is_file():
                best = load_checkpoint(run_dir / runs.BEST)
                self.model.load_state_dict(best["model"])
            results = self.task.final_results(self.model)
        results.update(
            params=self.model.parameter_counts(),
            total_params=sum(self.model.parameter_counts().values()),
            wall_time_s=wall_time,
            steps=steps,
            vocab_size=len(vocab),
        )
        atomic_write(run_dir / runs.RESULTS, json.dumps(results, indent=2) + "\n")
        write_report(run_dir, self.config, results)
        self.log(
            f"{self.task.headline(results)} | {results['total_params']:,} parameters "
            f"| {wall_time:.0f} s | report: {run_dir / runs.REPORT}"
        )
        return results
