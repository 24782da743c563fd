"""Keeping a run directory whole: one writer at a time, a metrics log that survives a kill.

- :class:`RunLock`: ``RUN_DIR/.lock`` names the training process that holds the directory
  (``pid host``) and carries an ``fcntl.flock``, which the kernel drops when that process
  ends however it ends; a second process is refused in one line naming the holder, and a lock
  file left by a killed process is taken over with a warning.
- :func:`append_metrics` / :func:`read_metrics`: ``metrics.jsonl`` grows by whole lines; a line
  torn by a kill is dropped (with a warning) when the run is resumed, and a bad line anywhere
  else is one error naming it.
- :func:`remove_stale_temporaries`: the ``.NAME.*.tmp`` files a killed
  :func:`~targetlm.files.atomic_write` leaves behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from targetlm.files import DiskFullError, disk_full, file_in_the_way

LOCK = ".lock"


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (it would clobber a run, another process holds
    it, or there is nothing to resume)."""


def check_outside_runs(run_dir: str | Path) -> None:
    """Refuse a new run directory inside another run's (a directory holding a ``config.toml``
    beside a ``metrics.jsonl``): tools that read that run would find a second one in it; and
    one under a file."""
    blocking = file_in_the_way(run_dir)
    if blocking is not None:
        raise RunDirError(f"{run_dir}: {blocking} is a file, not a directory to write into")
    for parent in Path(run_dir).resolve().parents:
        if (parent / "config.toml").is_file() and (parent / "metrics.jsonl").is_file():
            raise RunDirError(
                f"{run_dir} is inside the run directory {parent}: choose a --run-dir outside it"
            )


def _holder(path: Path) -> str:
    """``process PID on HOST`` as the lock file ``path`` names it (or what is known)."""
    try:
        pid, _, host = path.read_text(encoding="utf-8").strip().partition(" ")
    except OSError:
        return "another process"
    return f"process {pid} on {host}" if pid.isdigit() and host else "another process"


def _in_use(run_dir: Path) -> RunDirError:
    return RunDirError(
        f"{run_dir} is in use by {_holder(run_dir / LOCK)} ({run_dir / LOCK}); wait for it to "
        "end or choose another --run-dir"
    )


def check_unlocked(run_dir: str | Path) -> None:
    """Raise :class:`RunDirError` naming the holder when a process holds ``run_dir``'s lock
    (reads only: creates and changes nothing)."""
    run_dir = Path(run_dir)
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:  # no lock file (or no directory): free
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(run_dir) from None
    finally:
        os.close(fd)  # (closing drops a lock this probe took)


class RunLock:
    """Hold ``run_dir`` for this process (``with RunLock(run_dir, log): ...``), creating the
    directory if needed; on release the lock file goes, and so does the directory when this
    lock created it and nothing was written into it.

    Raises :class:`RunDirError` (one line: the holder's pid and host) when another process
    holds it. A lock file whose process is gone (killed) is taken over with a warning (``log``).
    """

    def __init__(self, run_dir: str | Path, log: Callable[[str], None] = print) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self.log = log
        self.fd: int | None = None
        self.created: list[Path] = []

    def __enter__(self) -> RunLock:
        missing = [p for p in [self.run_dir, *self.run_dir.parents] if not p.exists()]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.created = missing  # deepest first
        try:
            self._acquire()
        except BaseException:
            self._remove_created()
            raise
        return self

    def _acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise _in_use(self.run_dir) from None
            try:  # the holder before us may have removed the file while we waited for it
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = os.read(fd, 256)
        if previous.strip():
            self.log(
                f"warning: taking over the stale lock of {_holder(self.path)} in {self.path} "
                "(that process no longer holds it)"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self.fd = fd

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # before closing: no one else holds it yet
            os.close(self.fd)
            self.fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for directory in self.created:
            try:
                directory.rmdir()  # only if empty
            except OSError:
                break
        self.created = []


def remove_stale_temporaries(run_dir: str | Path) -> list[Path]:
    """Delete the temporary files (``.NAME.*.tmp``) a killed atomic write left in ``run_dir``;
    returns them. Call it holding the lock (no write of this run is under way)."""
    stale = sorted(Path(run_dir).glob(".*.tmp"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def append_metrics(path: str | Path, record: dict[str, Any]) -> None:
    """Append ``record`` to ``path`` as one JSON line, whole or not at all: a write that fails
    (a full disk) is cut back to the file's previous end and raises
    :class:`~targetlm.files.DiskFullError` (or the original ``OSError``)."""
    line = (json.dumps(record) + "\n").encode("utf-8")
    with open(path, "ab") as handle:
        end = handle.seek(0, os.SEEK_END)
        try:
            handle.write(line)
            handle.flush()
        except OSError as error:
            with contextlib.suppress(OSError):  # (a torn last line is dropped by read_metrics)
                handle.truncate(end)
            code = disk_full(error)
            if code:
                raise DiskFullError(code, path) from None
            raise


def read_results(path: str | Path) -> dict[str, Any]:
    """A finished run's ``results.json`` at ``path``: a JSON object, else :class:`RunDirError`
    naming the file (not JSON, not UTF-8, nested too deeply, or not an object)."""
    hint = "remove it and resume again to evaluate the run anew"
    try:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise RunDirError(f"{path}: not valid JSON ({reason.splitlines()[0]}); {hint}") from None
    if not isinstance(results, dict):
        raise RunDirError(f"{path}: not a run's results (a JSON object); {hint}")
    return results


def read_metrics(path: str | Path, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` at ``path``. A last line that is not a whole record (a
    kill or a full disk in the middle of an append) is dropped with a warning (``log``); a bad
    line before it raises :class:`RunDirError` naming the file and the line."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a metrics record")
        except RecursionError:
            raise RunDirError(
                f"{path}, line {number}: not a metrics record (nested too deeply)"
            ) from None
        except ValueError as error:
            if number == len(lines):
                log(f"warning: {path}, line {number}: dropped a torn last line ({line[:40]!r})")
                break
            message = str(error).splitlines()[0]
            raise RunDirError(f"{path}, line {number}: not a metrics record ({message})") from None
        records.append(record)
    return records


def device_of(path: str | Path) -> str:
    """The device holding ``path``, for a message: ``SOURCE (mounted on MOUNT)`` from
    ``/proc/mounts``, or the mount point alone."""
    path = Path(path).resolve()
    if not path.exists():
        path = path.parent
    device, mount = os.stat(path).st_dev, path
    while mount.parent != mount and os.stat(mount.parent).st_dev == device:
        mount = mount.parent
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            source, point = line.split()[:2]
            if point == str(mount):
                return f"{source} (mounted on {mount})"
    except OSError:
        pass
    return str(mount)
