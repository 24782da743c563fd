"""What stops a run, and what it says then: a diverged loss (:class:`LossWatch`), Ctrl-C
(:class:`Interrupts`), a full disk (:func:`explained_stops`)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from targetlm import rundir
from targetlm.files import DiskFullError, disk_full
from targetlm.rundir import RunDirError

if TYPE_CHECKING:  # (imported for the annotation only: torch.distributed costs a second)
    from targetlm.training import distributed


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class LossWatch:
    """The steps' losses not yet checked for NaN, with their steps: a step only keeps its
    loss (on the device, no host sync); :meth:`check` reads them all at once."""

    def __init__(self) -> None:
        self.unchecked: list[tuple[int, torch.Tensor]] = []

    def add(self, step: int, loss: torch.Tensor) -> None:
        """Keep ``loss`` (a detached copy) of ``step`` for the next :meth:`check`."""
        self.unchecked.append((step, loss))

    def check(self, epoch: int, kept: Callable[[], str]) -> None:
        """Raise :class:`TrainingDiverged` naming the first step since the last check whose
        loss was NaN or infinite (one host sync for all of them); ``kept`` says what the run
        directory keeps. Called before every record, validation and checkpoint, so a checkpoint
        never holds a diverged model."""
        if not self.unchecked:
            return
        steps = [step for step, _ in self.unchecked]
        losses = torch.stack([loss.float() for _, loss in self.unchecked])
        self.unchecked = []
        finite = torch.isfinite(losses)
        if bool(finite.all()):
            return
        first = int((~finite).nonzero()[0, 0])
        raise TrainingDiverged(
            f"loss is {float(losses[first])} at step {steps[first]} (epoch {epoch}); "
            f"training stopped: {kept()}"
        )


class Interrupts:
    """Ctrl-C while training: the first asks the loop to stop (``stop_requested``: it writes
    a checkpoint and returns), a second stops at once (:class:`KeyboardInterrupt`).

    With several processes, torchrun passes Ctrl-C on to every worker, which the terminal has
    already signalled: a repeat is not a second Ctrl-C (torchrun kills the workers after
    30 s). Each rank only notes it (``seen``); :meth:`agree` makes every rank stop at the
    same step.
    """

    def __init__(self, processes: distributed.Processes) -> None:
        self.processes = processes
        self.stop_requested = False
        self.seen = False  # Ctrl-C seen by this rank (several processes)

    def __call__(self, signum: int, frame: Any) -> None:
        if self.processes.several:
            self.seen = True
            return
        if self.stop_requested:  # a second Ctrl-C: stop now (explained_stops says what is kept)
            raise KeyboardInterrupt
        self.stop_requested = True

    def agree(self) -> None:
        """With several processes: stop when any rank has seen Ctrl-C (a collective)."""
        if self.processes.several:
            self.stop_requested = self.processes.any(self.seen)

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
        """Handle SIGINT inside the block (in the main thread: elsewhere signals cannot be
        handled), the previous handler after it."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, self) if main else None
        try:
            yield
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def explained_stops(
    run_dir: Path, kept: Callable[[], str], interrupts: Interrupts
) -> Iterator[None]:
    """A full disk inside the block becomes :class:`~targetlm.rundir.RunDirError` and Ctrl-C a
    :class:`KeyboardInterrupt`, each saying what the run directory keeps (``kept``)."""
    try:
        yield
    except OSError as error:
        code = disk_full(error)
        if not code:
            raise
        path = Path(error.filename or run_dir)
        reason = str(DiskFullError(code, path).strerror).replace(
            "the device", rundir.device_of(path)
        )
        raise RunDirError(f"{reason} writing {path}; {kept()}") from None
    except KeyboardInterrupt:
        second = "a second " if interrupts.stop_requested else ""
        raise KeyboardInterrupt(f"stopped by {second}Ctrl-C: {kept()}") from None
