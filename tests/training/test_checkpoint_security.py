"""No file of a run directory runs code on ``train --resume``: a sharded checkpoint (torch
distributed checkpoint, ``train.parallel = "fsdp"``) is read without unpickling anything but
plain values and torch's checkpoint metadata, and only from ``last-step<N>.dcp`` directly
inside the run directory.

Each crafted file carries a payload that leaves a trace (a file created by ``os.system``) if
it runs: the test asserts that the trace is absent after the refusal, and, where torch's own
reader is the one that would run it, that the payload is live (torch's reader leaves the trace).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shlex
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import tiny_config
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo

from targetlm.checkpoint import CheckpointError
from targetlm.cli import main
from targetlm.training import Trainer, distributed

# a one-process sharded run (train.parallel = "fsdp" writes last-step<N>.dcp with any number
# of processes); Adam, so that the optimiser holds state and param groups of every kind
SHARDED = {"train.parallel": '"fsdp"', "train.optimizer": '"adam"', "train.lr": 0.01}
LR = "optimizer.param_groups.0.lr"  # a byte item: a plain float, torch.save'd


def _quiet(message: str) -> None:
    pass


class Payload:
    """Creates ``trace`` when unpickled."""

    def __init__(self, trace: Path) -> None:
        self.trace = trace

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.trace))}",))


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run stopped at step 3 with its model and optimiser in last-step3.dcp."""
    run = tmp_path_factory.mktemp("sharded") / "run"
    Trainer(tiny_config(**SHARDED, **{"train.max_steps": 3}), run, log=_quiet).train()
    assert sorted(p.name for p in run.glob("*.dcp")) == ["last-step3.dcp"]
    return run


@pytest.fixture
def run(stopped_run, tmp_path) -> Path:
    """A copy of ``stopped_run`` this test may alter."""
    return Path(shutil.copytree(stopped_run, tmp_path / "run", symlinks=True))


def _resume(run: Path) -> dict:
    return Trainer(
        tiny_config(**SHARDED, **{"train.max_steps": 5}), run, resume=True, log=_quiet
    ).train()


def _refused(run: Path, *fragments: str) -> str:
    """The one-line CheckpointError that resuming ``run`` raises, holding every fragment."""
    with pytest.raises(CheckpointError) as failure:
        _resume(run)
    message = str(failure.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def _set_sharded(run: Path, entry: object) -> None:
    """Make ``run``'s last.pt name ``entry`` as its sharded checkpoint."""
    checkpoint = torch.load(run / "last.pt", weights_only=True)
    checkpoint["sharded"] = entry
    torch.save(checkpoint, run / "last.pt")


def _genuine_metadata(directory: Path):
    with (directory / ".metadata").open("rb") as handle:  # a file this test wrote itself
        return pickle.load(handle)


def _craft_byte_item(directory: Path, trace: Path) -> Path:
    """Point the lr's byte item of the checkpoint ``directory`` at a pickled payload appended
    to its data file (the file's other items and the metadata stay genuine); that file."""
    metadata = _genuine_metadata(directory)
    index = next(i for i in metadata.storage_data if i.fqn == LR)
    data_file = directory / metadata.storage_data[index].relative_path
    payload = io.BytesIO()
    torch.save(Payload(trace), payload)
    offset = data_file.stat().st_size
    with data_file.open("ab") as handle:
        handle.write(payload.getvalue())
    metadata.storage_data[index] = _StorageInfo(data_file.name, offset, len(payload.getvalue()))
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))
    return data_file


def test_a_genuine_sharded_checkpoint_resumes_exactly(stopped_run, run, tmp_path):
    whole = Trainer(
        tiny_config(**SHARDED, **{"train.max_steps": 5}), tmp_path / "whole", log=_quiet
    )
    uninterrupted = whole.train()
    resumed = _resume(run)
    assert resumed["test"]["ppl"] == pytest.approx(uninterrupted["test"]["ppl"], rel=1e-6)
    assert sorted(p.name for p in run.glob("*.dcp")) == ["last-step5.dcp"]


@pytest.mark.parametrize("where", ["whole file", "inside genuine metadata"])
def test_crafted_metadata_is_refused_without_running(run, tmp_path, where):
    trace = tmp_path / "PWNED"
    metadata_file = run / "last-step3.dcp" / ".metadata"
    if where == "whole file":
        crafted = Payload(trace)
    else:  # a genuine checkpoint's metadata with the payload in a field torch never reads
        crafted = _genuine_metadata(run / "last-step3.dcp")
        crafted.storage_meta.save_id = Payload(trace)
    metadata_file.write_bytes(pickle.dumps(crafted))

    _refused(run, str(metadata_file), "unreadable sharded checkpoint metadata", "posix.system")
    assert not trace.exists()

    with contextlib.suppress(AttributeError):  # (the whole file: os.system's status, an int)
        FileSystemReader(run / "last-step3.dcp").read_metadata()  # torch's reader runs it
    assert trace.exists()


def test_a_crafted_byte_item_is_refused_without_running(run, tmp_path):
    trace = tmp_path / "PWNED"
    directory = run / "last-step3.dcp"
    data_file = _craft_byte_item(directory, trace)

    _refused(run, str(data_file), repr(LR), "not a plain state dict", "posix.system")
    assert not trace.exists()

    dcp.load({"optimizer": {"param_groups": [{"lr": 0.0}]}}, checkpoint_id=directory)
    assert trace.exists()  # torch's planner runs it


def test_an_item_in_a_file_outside_the_checkpoint_is_refused(run, tmp_path):
    directory = run / "last-step3.dcp"
    metadata = _genuine_metadata(directory)
    index = next(i for i in metadata.storage_data if i.fqn == LR)
    where = metadata.storage_data[index]
    outside = shutil.copy(directory / where.relative_path, tmp_path / "elsewhere.distcp")
    for name in [str(outside), "../../elsewhere.distcp"]:
        metadata.storage_data[index] = _StorageInfo(name, where.offset, where.length)
        (directory / ".metadata").write_bytes(pickle.dumps(metadata))
        _refused(run, str(directory / ".metadata"), repr(LR), "not a file of this directory")

    # a data file that is a symbolic link out of the checkpoint's directory
    metadata.storage_data[index] = _StorageInfo("linked.distcp", where.offset, where.length)
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))
    (directory / "linked.distcp").symlink_to(outside)
    _refused(run, str(directory / "linked.distcp"), "not a file of the sharded checkpoint")


def test_a_sharded_entry_outside_the_run_is_refused_without_reading_it(run, tmp_path):
    trace = tmp_path / "PWNED"
    elsewhere = Path(shutil.copytree(run / "last-step3.dcp", tmp_path / "other" / "last-step3.dcp"))
    (elsewhere / ".metadata").write_bytes(pickle.dumps(Payload(trace)))  # read: would run
    for entry in [str(elsewhere), "../other/last-step3.dcp", "last-step3.dcp/../../other"]:
        _set_sharded(run, entry)
        _refused(run, str(run / "last.pt"), repr(entry), "is not the name of a directory")
    for entry in [3, "last-step3", "last-step.dcp", "last-step\u0663.dcp"]:  # (an Arabic 3)
        _set_sharded(run, entry)
        _refused(run, "is not the name of a directory")

    # last.pt names a directory of the run, but it is a symbolic link to another
    _set_sharded(run, "last-step3.dcp")
    shutil.rmtree(run / "last-step3.dcp")
    (run / "last-step3.dcp").symlink_to(elsewhere, target_is_directory=True)
    _refused(run, str(run / "last-step3.dcp"), "not a sharded checkpoint directory", "refused")
    assert not trace.exists()


def test_load_sharded_itself_reads_only_a_checkpoint_directly_in_the_run(tmp_path):
    def step_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        step = torch.nn.Linear(3, 2)
        optimizer = torch.optim.Adam(step.parameters(), lr=0.1 * seed)
        step(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        return step, optimizer

    run, saved = tmp_path / "run", step_and_optimizer(1)
    distributed.save_sharded(*saved, run / "last-step1.dcp")
    elsewhere = Path(shutil.copytree(run / "last-step1.dcp", tmp_path / "other" / "last-step1.dcp"))
    loaded = step_and_optimizer(2)
    refused = [
        (elsewhere, run),  # another directory than the run's
        (run / ".." / "other" / "last-step1.dcp", None),  # climbs out of the run
        (tmp_path / "other", tmp_path),  # not named last-step<N>.dcp
        (run / "last-step1.dcp", tmp_path),  # not in the run directory given
    ]
    for directory, run_dir in refused:
        with pytest.raises(CheckpointError, match="not a sharded checkpoint directory") as failure:
            distributed.load_sharded(*loaded, directory, run_dir)
        assert str(directory) in str(failure.value) and "\n" not in str(failure.value)
    with pytest.raises(CheckpointError, match="sharded checkpoint not found"):
        distributed.load_sharded(*loaded, run / "last-step9.dcp")
    assert not torch.equal(loaded[0].weight, saved[0].weight)  # nothing was read

    # the genuine one, with the run directory given or taken from the path
    for run_dir in [run, None]:
        loaded = step_and_optimizer(2)
        distributed.load_sharded(*loaded, run / "last-step1.dcp", run_dir)
        assert torch.equal(loaded[0].weight, saved[0].weight)
        state, saved_state = loaded[1].state_dict(), saved[1].state_dict()
        assert state["param_groups"] == saved_state["param_groups"]  # the byte items: lr 0.1
        for name, value in saved_state["state"][0].items():
            assert torch.equal(state["state"][0][name], value)


def test_the_cli_refuses_in_one_line_and_exits_2(run, tmp_path, capsys):
    trace = tmp_path / "PWNED"
    (run / "last-step3.dcp" / ".metadata").write_bytes(pickle.dumps(Payload(trace)))
    sets = ["--set", "train.max_steps=5"]
    assert main(["train", "--resume", "--run-dir", str(run), *sets]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("targetlm: error: "), errors
    assert ".metadata: unreadable sharded checkpoint metadata" in errors[0]
    assert not trace.exists()


@pytest.mark.slow  # torchrun processes: about a minute; CI runs the slow set
def test_two_sharded_processes_refuse_a_crafted_byte_item_without_running(tmp_path):
    pytest.importorskip("transformers")  # an hf backbone: FSDP shards its decoder layers
    from test_distributed import _torchrun, _write
    from test_hf import write_config, write_model

    from targetlm import builders

    model_dir = write_model(tmp_path / "llama", "llama")
    config = builders.load_config(
        write_config(tmp_path / "c.toml", model_dir), ["train.parallel=fsdp", "train.eval_every=3"]
    )
    config_path = _write(config, tmp_path / "config.toml")
    run = tmp_path / "run"
    stopped = _torchrun(config_path, run, "--set", "train.max_steps=3")
    assert stopped.returncode == 0, stopped.stderr
    directory = run / "last-step3.dcp"
    assert directory.is_dir()

    trace = tmp_path / "PWNED"
    data_file = _craft_byte_item(directory, trace)

    resumed = _torchrun(config_path, run, "--resume", "--set", "train.max_steps=6")
    assert resumed.returncode != 0
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("targetlm: error")]
    assert len(errors) == 2, resumed.stderr  # one line from each rank
    assert all(f"{data_file}: item {LR!r} is unreadable" in line for line in errors), errors
    assert not trace.exists()
