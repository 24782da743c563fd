"""A training run's directory: whether a run may start, restart or resume in it, and holding it
while it trains.

A new run needs an empty directory; a resumed one needs its ``config.toml`` and ``last.pt``,
and the same config (beyond :data:`RESUMABLE_CHANGES`); a run that stopped before its first
``last.pt`` starts again from step 0. Reads only, until :meth:`RunDirectory.start` writes the
files a run starts with.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from targetlm import config as config_lib
from targetlm import rundir, runs
from targetlm.checkpoint import load as load_checkpoint
from targetlm.config import Config, TrainConfig
from targetlm.data import Vocabulary
from targetlm.files import atomic_write
from targetlm.rundir import RunDirError
from targetlm.training.distributed import Processes

# keys a resumed run may change: the budget and cosmetics, never the model or the data
RESUMABLE_CHANGES = {
    "train.epochs",
    "train.max_steps",
    "train.progress",
    "train.threads",
    "train.log_every",
    "train.compile",  # the same function (training/compile.py): a run resumes in either mode
}

# what a run that stopped before its first last.pt leaves (it can be started again)
BEFORE_FIRST_CHECKPOINT = {runs.CONFIG, runs.VOCAB, runs.TOKENIZER, runs.METRICS, runs.BEST}
# what every last.pt holds (its weights: "model" and "optimizer", or "sharded": their directory)
RESUME_KEYS = ("vocab", "schedule", "progress", "state", "rng")


def changed_keys(saved: dict, current: dict) -> set[str]:
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


def check_same_config(run_dir: Path, where: str, saved: Config | dict, config: Config) -> None:
    """Refuse to resume ``run_dir`` when its ``where`` (config.toml, last.pt) holds another
    config than ``config`` (beyond RESUMABLE_CHANGES)."""
    saved = saved.to_dict() if isinstance(saved, Config) else saved
    if changed_keys(saved, config.to_dict()):
        raise RunDirError(
            f"cannot resume {run_dir} with a different config: "
            f"{_changes(saved, config)} changed from its {where} "
            f"(only {', '.join(sorted(RESUMABLE_CHANGES))} may change)"
        )


def _changes(saved: Config | dict, config: Config) -> str:
    saved = saved.to_dict() if isinstance(saved, Config) else saved
    return ", ".join(sorted(changed_keys(saved, config.to_dict())))


def reached_budget(train: TrainConfig, progress: dict[str, Any]) -> bool:
    """Whether a run at ``progress`` (last.pt's) has nothing left to train."""
    return (
        progress["epoch"] > train.epochs
        or bool(train.max_steps and progress["step"] >= train.max_steps)
        or bool(train.early_stopping and progress["bad_evaluations"] >= train.early_stopping)
    )


def is_sharded_checkpoint(name: str) -> bool:
    """Whether ``name`` is a sharded checkpoint's directory (``last-step<N>.dcp``)."""
    return re.fullmatch(r"last-step\d+\.dcp", name) is not None


def _temporary(name: str) -> bool:
    """Whether ``name`` is an atomic write's temporary file (``.NAME.*.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


@dataclass(eq=False)
class RunDirectory:
    """The directory ``path`` of a run of ``config``: new and empty, or resumed (``resume``).

    :meth:`check` refuses one that cannot be used as asked and says how the run begins
    (``restart``, ``finished_results``); :meth:`hold` locks it while training (under
    ``torchrun``, rank 0 alone); :meth:`start` writes what a run starts with.
    """

    path: Path
    config: Config
    resume: bool
    processes: Processes
    log: Callable[[str], None]
    restart: bool = field(init=False)
    finished_results: dict[str, Any] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.restart = not self.resume

    def check(self) -> None:
        """Refuse a run directory that cannot be used as asked (reads only). Sets
        ``restart``: no last.pt yet, training starts at step 0 (a new run, or one that
        stopped before its first checkpoint); ``finished_results``: a resumed run that
        has already finished (its results.json)."""
        self.restart, self.finished_results = not self.resume, None
        files = {p.name for p in self.path.iterdir()} if self.path.is_dir() else set()
        files = {f for f in files if f != rundir.LOCK and not _temporary(f)}
        if runs.LAST not in files:  # a sharded checkpoint no last.pt names: its write was cut
            files = {f for f in files if not is_sharded_checkpoint(f)}  # (the next one replaces it)
        stuck = runs.CONFIG in files and runs.LAST not in files
        stuck = stuck and files <= BEFORE_FIRST_CHECKPOINT
        if self.resume:
            if runs.CONFIG not in files:
                raise RunDirError(f"nothing to resume: {self.path / runs.CONFIG} does not exist")
            self.check_same_config(runs.CONFIG, config_lib.load(self.path / runs.CONFIG))
            if runs.LAST not in files:
                if not stuck:
                    raise RunDirError(f"nothing to resume: {self.path / runs.LAST} does not exist")
                self.restart = True
            elif runs.RESULTS in files and reached_budget(
                self.config.train,
                load_checkpoint(self.path / runs.LAST, RESUME_KEYS)["progress"],
            ):
                self.finished_results = json.loads((self.path / runs.RESULTS).read_text())
        elif stuck:  # the same run again, from step 0
            saved = config_lib.load(self.path / runs.CONFIG)
            if changed_keys(saved.to_dict(), self.config.to_dict()):
                raise RunDirError(
                    f"run directory {self.path} holds a run that stopped before its first "
                    f"checkpoint, with another config ({_changes(saved, self.config)} differ); "
                    f"restart it with `targetlm train --resume --run-dir {self.path}` or choose "
                    "another --run-dir"
                )
        elif files:
            raise RunDirError(
                f"run directory {self.path} exists and is not empty; "
                "pass --resume to continue it or choose another --run-dir"
            )

    def check_same_config(self, where: str, saved: Config | dict) -> None:
        """Refuse a run whose ``where`` (config.toml, last.pt) holds another config."""
        check_same_config(self.path, where, saved, self.config)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the run directory's lock while training: checked again under it, stale
        temporary files removed. (Under ``torchrun`` rank 0 alone holds it.)"""
        if not self.processes.is_main:
            yield
            return
        with rundir.RunLock(self.path, self.log):
            self.check()
            for path in rundir.remove_stale_temporaries(self.path):
                self.log(f"removed {path.name}, left by an interrupted write")
            yield

    def start(self, vocab: Vocabulary) -> None:
        """Write what a run starts with: its config, vocabulary and an empty metrics log
        (rank 0)."""
        if not self.processes.is_main:
            return
        if self.resume:
            self.log(f"{self.path}: no checkpoint yet: starting from step 0")
        elif (self.path / runs.CONFIG).is_file():
            self.log(f"{self.path}: no checkpoint yet: starting the run again from step 0")
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path / runs.CONFIG, config_lib.dumps(self.config))
        vocab.save(self.path / runs.VOCAB)
        atomic_write(self.path / runs.METRICS, "")
