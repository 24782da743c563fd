"""The run directory under faults: one process at a time, a kill or a full disk at any write,
torn metrics, a run that stopped before its first checkpoint, a finished run, Ctrl-C twice;
each leaves a directory that resumes to the uninterrupted run's results."""

from __future__ import annotations

import errno
import json
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from targetlm import checkpoint as checkpoint_module
from targetlm import config as config_lib
from targetlm import rundir
from targetlm.checkpoint import CheckpointError, load
from targetlm.cli import main
from targetlm.data import DataError
from targetlm.training import RunDirError, Trainer, TrainingDiverged

TESTS = Path(__file__).resolve().parent
# one epoch of 10 steps, a checkpoint every 3 and a validation at the end
SMALL = {
    "train.epochs": 1,
    "train.checkpoint_every": 3,
    "data.synthetic.train_sentences": 40,
    "data.synthetic.valid_sentences": 8,
    "data.synthetic.test_sentences": 8,
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _quiet(message: str) -> None:
    pass


def _records(run_dir: Path) -> list[dict]:
    """metrics.jsonl without its timing (tokens per second)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "tok_s"} for line in lines]


def _leftovers(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.glob(".*"))


@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> tuple[Path, dict]:
    """The uninterrupted run of SMALL (log_every 2), its directory and results."""
    run = tmp_path_factory.mktemp("twin") / "run"
    results = Trainer(tiny_config(**SMALL, **{"train.log_every": 2}), run, log=_quiet).train()
    return run, results


def _assert_same_as_twin(run: Path, results: dict, twin: tuple[Path, dict]) -> None:
    assert _records(run) == _records(twin[0])
    assert results["test"]["ppl"] == twin[1]["test"]["ppl"]
    assert results["valid"]["ppl"] == twin[1]["valid"]["ppl"]
    assert _leftovers(run) == []  # no lock, no temporary file


def _fail_save_at(monkeypatch, step: int, trainer: Trainer) -> None:
    """torch.save of last.pt at ``step`` fails as on a full disk (after writing some bytes)."""
    real = torch.save

    def save(obj, handle, *args, **kwargs):
        if "optimizer" in obj and trainer.step == step:
            handle.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, handle, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "save", save)


# --- the fault injection: kill -9 during a checkpoint write and during a metrics append ------
CHILD = """
import io, json, os, signal, sys
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from conftest import tiny_config
from targetlm import rundir
from targetlm.training import Trainer

where, step, run, overrides, resume = sys.argv[2], int(sys.argv[3]), *sys.argv[4:6], sys.argv[6]
trainer = Trainer(tiny_config(**json.loads(overrides)), run, resume=resume == "1", log=print)

def half_then_kill(handle, data):
    handle.write(data[: len(data) // 2])
    handle.flush()
    os.kill(os.getpid(), signal.SIGKILL)

real_save, real_append = torch.save, rundir.append_metrics
def save(obj, handle):
    if "optimizer" in obj and trainer.step == step:
        buffer = io.BytesIO()
        real_save(obj, buffer)
        half_then_kill(handle, buffer.getvalue())
    real_save(obj, handle)
def append(path, record):
    if record["step"] == step:
        with open(path, "ab") as handle:
            half_then_kill(handle, (json.dumps(record) + "\\n").encode())
    real_append(path, record)
if where == "checkpoint":
    torch.save = save
else:
    rundir.append_metrics = append
trainer.train()
"""


def _killed_child(where: str, step: int, run: Path, resume: bool) -> subprocess.CompletedProcess:
    overrides = json.dumps({**SMALL, "train.log_every": 2})
    command = [sys.executable, "-c", CHILD, str(TESTS), where, str(step), str(run), overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*command, "1" if resume else "0"], capture_output=True, text=True, env=env, timeout=120
    )


def test_killed_during_a_checkpoint_write_and_a_metrics_append_resumes_exactly(tmp_path, twin):
    run = tmp_path / "run"
    killed = _killed_child("checkpoint", 6, run, resume=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert load(run / "last.pt")["progress"]["step"] == 3  # the write at step 6 never landed
    assert len(list(run.glob(".last.pt.*.tmp"))) == 1  # half of it, under a temporary name
    assert (run / ".lock").is_file()  # the killed process could not remove its lock

    killed = _killed_child("metrics", 8, run, resume=True)  # resumed at 3, killed in step 8's line
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "stale lock" in killed.stdout  # the first child's lock, taken over
    assert "resumed" in killed.stdout
    assert not list(run.glob(".last.pt.*.tmp"))  # the first child's half checkpoint is gone
    last_line = (run / "metrics.jsonl").read_text().splitlines()[-1]
    with pytest.raises(json.JSONDecodeError):
        json.loads(last_line)  # torn by the kill

    logs: list[str] = []
    results = Trainer(
        tiny_config(**SMALL, **{"train.log_every": 2}), run, resume=True, log=logs.append
    ).train()
    assert any("dropped a torn last line" in m and "line" in m for m in logs), logs
    assert any("resumed" in m and "step 6" in m for m in logs), logs
    _assert_same_as_twin(run, results, twin)
