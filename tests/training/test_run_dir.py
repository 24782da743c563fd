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

TESTS = Path(__file__).resolve().parents[1]  # conftest.py
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


@pytest.mark.slow  # child processes; CI runs it
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


# --- one process at a time -------------------------------------------------------------------
def test_a_second_process_is_refused_naming_the_holder_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    config = tiny_config(**SMALL)
    waiting = Trainer(config, run, log=_quiet)  # checked before the other process started
    holder = f"process {os.getpid()} on {socket.gethostname()}"
    with rundir.RunLock(run):  # another training process holds the directory
        with pytest.raises(RunDirError, match=f"in use by {holder}"):
            Trainer(config, run, log=_quiet)
        with pytest.raises(RunDirError, match=f"in use by {holder}"):
            waiting.train()
        assert sorted(p.name for p in run.iterdir()) == [".lock"]
    assert not run.exists()  # the lock made the directory; nothing else was written in it


def test_a_stale_lock_is_taken_over_with_a_warning_and_the_lock_goes_on_exit(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(f"999999999 {socket.gethostname()}\n")  # a killed process's
    logs: list[str] = []
    Trainer(tiny_config(**SMALL), run, log=logs.append).train()
    assert any("stale lock of process 999999999" in m for m in logs), logs
    assert not (run / ".lock").exists()


def test_the_lock_is_released_when_training_fails(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setattr(Trainer, "_load_data", lambda self: (_ for _ in ()).throw(DataError("x")))
    with pytest.raises(DataError):
        Trainer(tiny_config(**SMALL), run, log=_quiet).train()
    assert not run.exists()  # a failure before the first write leaves no directory


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path):
    config = tiny_config(**SMALL, **{"train.max_steps": 2})
    Trainer(config, tmp_path / "run", log=_quiet).train()
    other = config.replace(["train.lr=0.5"])  # a checkpoint that would load and continue
    Trainer(other, tmp_path / "other", log=_quiet).train()
    (tmp_path / "other" / "last.pt").replace(tmp_path / "run" / "last.pt")
    with pytest.raises(RunDirError, match="train.lr changed from its last.pt"):
        Trainer(config.replace(["train.max_steps=4"]), tmp_path / "run", resume=True).train()


def _older_layout(checkpoint: dict, entry: str) -> None:
    """``checkpoint`` as an earlier targetlm wrote it: without ``entry`` (``progress.KEY``: a
    key of its progress)."""
    if entry.startswith("progress."):
        del checkpoint["progress"][entry.removeprefix("progress.")]
    else:
        del checkpoint[entry]


@pytest.mark.parametrize(
    "entry", ["config", "caches", "progress.window", "progress.metrics_records"]
)
def test_a_checkpoint_of_an_earlier_layout_is_one_error_and_resume_changes_nothing(
    tmp_path, capsys, entry
):
    """Today's last.pt resumes; one written without an entry of today's layout is refused in
    one line naming the entry, before the run directory is touched."""
    config = tiny_config(**SMALL, **{"train.max_steps": 3})
    run = tmp_path / "run"
    Trainer(config, run, log=_quiet).train()
    checkpoint = load(run / "last.pt")
    _older_layout(checkpoint, entry)
    torch.save(checkpoint, run / "last.pt")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    rc = main(["train", "--resume", "--run-dir", str(run), "--set", "train.max_steps=6"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1, err
    assert f"a checkpoint of an earlier targetlm (no {entry})" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert _leftovers(run) == []  # no lock left behind


# --- metrics.jsonl ----------------------------------------------------------------------------
def test_a_bad_metrics_line_before_the_last_is_one_error_naming_it(tmp_path):
    config = tiny_config(**SMALL, **{"train.max_steps": 4})
    Trainer(config, tmp_path / "run", log=_quiet).train()
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], '{"kind": "train", "st', *lines[1:]]) + "\n")
    with pytest.raises(RunDirError, match=r"metrics.jsonl, line 2: not a metrics record"):
        Trainer(config.replace(["train.max_steps=6"]), tmp_path / "run", resume=True).train()


def test_resume_rewrites_metrics_whole_or_not_at_all(tmp_path, twin):
    """A write failing half way (here the file-size limit, as ``ulimit -f`` sets it) while
    resume rewrites metrics.jsonl leaves it as it was, and the run resumes once it can."""
    config = tiny_config(**SMALL, **{"train.log_every": 2})
    run = tmp_path / "run"
    Trainer(config.replace(["train.max_steps=7"]), run, log=_quiet).train()
    before = (run / "metrics.jsonl").read_bytes()
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) // 2, limits[1]))
    try:
        with pytest.raises(RunDirError, match="file size limit .* writing .*metrics.jsonl"):
            Trainer(config, run, resume=True, log=_quiet).train()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert (run / "metrics.jsonl").read_bytes() == before
    assert _leftovers(run) == []
    _assert_same_as_twin(run, Trainer(config, run, resume=True, log=_quiet).train(), twin)


def test_a_full_disk_during_a_metrics_append_loses_nothing(tmp_path, monkeypatch, twin):
    config = tiny_config(**SMALL, **{"train.log_every": 2})
    run = tmp_path / "run"
    trainer = Trainer(config, run, log=_quiet)

    class FullDisk:  # writes half the line, then the device is full
        def __init__(self, handle):
            self.handle = handle

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            if trainer.step == 8:
                self.handle.write(data[: len(data) // 2])
                self.handle.flush()
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.handle.write(data)

    real_open = open
    monkeypatch.setattr(rundir, "open", lambda *a, **k: FullDisk(real_open(*a, **k)), False)
    with pytest.raises(
        RunDirError,
        match="no space left on .* writing .*metrics.jsonl; the "
        "last good checkpoint \\(step 6\\) is kept",
    ):
        trainer.train()
    monkeypatch.undo()
    for line in (run / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # whole lines only
    _assert_same_as_twin(run, Trainer(config, run, resume=True, log=_quiet).train(), twin)


def test_the_train_loss_window_after_a_resume_covers_the_steps_of_an_uninterrupted_run(
    tmp_path, twin
):
    config = tiny_config(**SMALL, **{"train.log_every": 2})
    run = tmp_path / "run"
    Trainer(config.replace(["train.max_steps=5"]), run, log=_quiet).train()  # mid-window
    (run / ".last.pt.a1b2c3.tmp").write_bytes(b"half a checkpoint")  # left by a kill
    logs: list[str] = []
    results = Trainer(config, run, resume=True, log=logs.append).train()
    assert _records(run) == _records(twin[0])  # the record of step 6 averages steps 5 and 6
    assert any("removed .last.pt.a1b2c3.tmp" in m for m in logs), logs
    _assert_same_as_twin(run, results, twin)


# --- a run that stopped before its first checkpoint; a full disk ------------------------------
def test_a_run_without_a_checkpoint_yet_restarts_and_messages_say_so(tmp_path, monkeypatch, twin):
    config = tiny_config(**SMALL, **{"train.log_every": 2})
    run = tmp_path / "run"
    trainer = Trainer(config, run, log=_quiet)
    _fail_save_at(monkeypatch, 3, trainer)  # the first checkpoint finds the disk full
    with pytest.raises(RunDirError) as failure:
        trainer.train()
    message = str(failure.value)
    assert "no space left on " in message and f"writing {run / 'last.pt'}" in message
    assert "no checkpoint was written" in message and "--resume" in message
    assert "\n" not in message
    assert _leftovers(run) == [] and not (run / "last.pt").exists()
    monkeypatch.undo()

    # a fresh run into it with another config is refused, saying how to restart it
    with pytest.raises(RunDirError, match="before its first checkpoint.*--resume"):
        Trainer(config.replace(["model.encoder.hidden_size=8"]), run, log=_quiet)
    # the same config starts it again; so does --resume (from step 0)
    logs: list[str] = []
    results = Trainer(config, run, resume=True, log=logs.append).train()
    assert any("no checkpoint yet: starting from step 0" in m for m in logs), logs
    _assert_same_as_twin(run, results, twin)


def test_a_sharded_checkpoint_cut_before_the_first_last_pt_restarts_the_run(tmp_path, twin):
    """A kill during the first sharded save leaves ``last-stepN.dcp/.metadata.tmp`` and no
    last.pt: the directory is a run that stopped before its first checkpoint (train restarts it,
    --resume starts it from step 0), and the partial directory goes with the next checkpoint."""
    config = tiny_config(**SMALL, **{"train.log_every": 2})
    run = tmp_path / "run"
    trainer = Trainer(config, run, log=_quiet)
    trainer._setup()
    trainer._start_run_dir()  # config.toml, vocab.txt, metrics.jsonl: then the kill
    (run / "last-step3.dcp").mkdir()
    (run / "last-step3.dcp" / ".metadata.tmp").write_bytes(b"half a metadata file")
    assert Trainer(config, run, log=_quiet).restart  # not "exists and is not empty"
    logs: list[str] = []
    results = Trainer(config, run, resume=True, log=logs.append).train()
    assert any("no checkpoint yet: starting from step 0" in m for m in logs), logs
    assert not (run / "last-step3.dcp").exists()
    _assert_same_as_twin(run, results, twin)


def test_a_full_disk_at_a_later_checkpoint_keeps_the_last_good_one(tmp_path, monkeypatch, twin):
    config = tiny_config(**SMALL, **{"train.log_every": 2})
    run = tmp_path / "run"
    trainer = Trainer(config, run, log=_quiet)
    _fail_save_at(monkeypatch, 6, trainer)
    with pytest.raises(RunDirError, match=r"writing .*last.pt; the last good checkpoint \(step 3"):
        trainer.train()
    assert load(run / "last.pt")["progress"]["step"] == 3
    assert _leftovers(run) == []
    monkeypatch.undo()
    _assert_same_as_twin(run, Trainer(config, run, resume=True, log=_quiet).train(), twin)


def test_divergence_says_whether_a_checkpoint_is_kept(tmp_path, monkeypatch):
    original = Trainer.train_step

    def poisoned(self, batch, lr):
        if self.step == self.poison_at:
            with torch.no_grad():
                self.model.embedding.weight.fill_(float("nan"))
        return original(self, batch, lr)

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    for poison_at, kept in [
        (1, "no checkpoint was written; the run directory can be restarted with"),
        (4, "the last good checkpoint (step 3) is kept in"),
    ]:
        trainer = Trainer(tiny_config(**SMALL), tmp_path / str(poison_at), log=_quiet)
        trainer.poison_at = poison_at
        with pytest.raises(TrainingDiverged) as failure:
            trainer.train()
        assert kept in str(failure.value)
        assert not (tmp_path / str(poison_at) / ".lock").exists()
    Trainer(tiny_config(**SMALL), tmp_path / "1", resume=True, log=_quiet)  # restartable


# --- messages -------------------------------------------------------------------------------
def test_an_empty_or_foreign_checkpoint_is_one_line(tmp_path):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty.pt is empty \(0 bytes\)"):
        load(empty)

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    foreign, garbage = tmp_path / "foreign.pt", tmp_path / "garbage.pt"
    torch.save({"model": Payload()}, foreign)  # what a crafted checkpoint holds
    garbage.write_bytes(pickle.dumps({"model": "not torch's format"}, protocol=4))
    for path, cause in [(foreign, "GLOBAL posix.system"), (garbage, "Unsupported operand")]:
        with pytest.raises(CheckpointError) as failure:
            load(path)
        message = str(failure.value)
        assert "\n" not in message and "weights_only" not in message, message
        assert message.startswith(f"{path}: unreadable checkpoint") and cause in message


@pytest.mark.slow  # child processes; CI runs it
def test_a_second_ctrl_c_exits_130_in_one_line(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(config_lib.dumps(tiny_config(**SMALL)))
    script = """
import os, signal, sys
from targetlm.cli import main
from targetlm.training import Trainer
original = Trainer.train_step
def step(self, *args):
    if self.step == 4:  # Ctrl-C twice: the second while the first waits for the step's end
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    return original(self, *args)
Trainer.train_step = step
sys.exit(main(["train", sys.argv[1], "--run-dir", sys.argv[2]]))
"""
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", script, str(config), str(run)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == [
        f"targetlm: stopped by a second Ctrl-C: the last good checkpoint (step 3) is kept in "
        f"{run / 'last.pt'}"
    ]
    assert _leftovers(run) == []


# --- targetlm train --resume --run-dir R ------------------------------------------------------
def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_resume_needs_no_config_and_a_finished_run_stays_as_it_is(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(config_lib.dumps(tiny_config(**SMALL)))
    run = tmp_path / "run"
    sets = ["--set", "train.max_steps=4", "--set", "data.synthetic.seed=3"]
    assert main(["train", str(config), *sets, "--run-dir", str(run)]) == 0
    finished = _snapshot(run)
    capsys.readouterr()

    assert main(["train", "--resume", "--run-dir", str(run)]) == 0  # its own config: finished
    out, err = capsys.readouterr()
    assert f"{run} is finished (results.json); nothing to resume" in out and not err
    assert _snapshot(run) == finished

    # --set changes only the budget; anything else is refused in one line
    assert main(["train", "--resume", "--run-dir", str(run), "--set", "train.lr=0.5"]) == 2
    assert "train.lr changed" in capsys.readouterr().err
    assert main(["train", "--resume", "--run-dir", str(run), "--set", "train.max_steps=6"]) == 0
    assert f"resumed {run} at epoch 1, step 4" in capsys.readouterr().out
    assert load(run / "last.pt")["progress"]["step"] == 6

    assert main(["train", "--run-dir", str(run)]) == 2  # neither a config nor --resume
    assert "give a config file" in capsys.readouterr().err
