"""Training loop: exact resume, interruption, schedules, atomic checkpoints, run directories."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from targetlm.checkpoint import CheckpointError, load
from targetlm.config import TrainConfig
from targetlm.runs import load_run
from targetlm.training import LrSchedule, RunDirError, Trainer, TrainingDiverged, save_atomic


def _train_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if json.loads(line)["kind"] == "train"]


def _quiet(message: str) -> None:
    pass


# dropout and weight drop make the RNG part of the state to restore
REGULARISED = {
    "model.encoder.dropout_input": 0.2,
    "model.encoder.dropout_hidden": 0.2,
    "model.encoder.weight_drop": 0.2,
    "model.embedding.dropout": 0.1,
}


@pytest.mark.parametrize(
    "overrides",
    [
        REGULARISED,
        {
            "train.optimizer": '"adam"',
            "train.lr": 0.01,
            "train.schedule": '"plateau"',
            "train.eval_every": 7,
        },
        {  # a Transformer on shuffled blocks without carried state
            "model.encoder": '{kind = "transformer", num_layers = 1, num_heads = 2, ff_size = 16, max_context = 16, dropout = 0.1}',
            "data.shuffle": "true",
            "train.carry_state": "false",
            "train.optimizer": '"adamw"',
            "train.lr": 0.01,
            "train.schedule": '"inverse_sqrt"',
            "train.warmup_steps": 5,
        },
        {  # GroC's sparse output updates: the reused E_out and the draws must resume exactly
            "model.output": '{kind = "groc", relations = false, definitions = false, depth = 1, '
            "update_prob = 0.5, char_size = 8, widths = [1, 2], channels_per_width = 4}",
        },
    ],
    ids=[
        "lstm-dropout-sgd",
        "lstm-adam-plateau-midepoch-eval",
        "transformer-shuffled",
        "groc-sparse-updates",
    ],
)
def test_interrupted_and_resumed_run_equals_uninterrupted(tmp_path, overrides):
    # half the usual corpus: an epoch of 14 steps, two of them
    config = tiny_config(**overrides, **{"data.synthetic.train_sentences": 60})
    full = Trainer(config, tmp_path / "full", log=_quiet).train()

    stopped = config.replace(["train.max_steps=9"])  # stops mid-epoch
    Trainer(stopped, tmp_path / "resumed", log=_quiet).train()
    assert len(_train_losses(tmp_path / "resumed")) == 9
    resumed = Trainer(config, tmp_path / "resumed", resume=True, log=_quiet).train()

    assert len(_train_losses(tmp_path / "full")) == full["steps"] > 18  # 9 is in epoch 1
    assert _train_losses(tmp_path / "resumed") == _train_losses(tmp_path / "full")
    assert resumed["test"]["ppl"] == full["test"]["ppl"]
    assert resumed["valid"]["ppl"] == full["valid"]["ppl"]


def test_ctrl_c_leaves_a_resumable_checkpoint(tmp_path, monkeypatch):
    config = tiny_config(**REGULARISED)
    Trainer(config, tmp_path / "full", log=_quiet).train()

    trainer = Trainer(config, tmp_path / "run", log=_quiet)
    original = Trainer.train_step

    def step_then_interrupt(self, *args):
        result = original(self, *args)
        if self.step == 4:  # the 5th step receives SIGINT (the handler only sets a flag)
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(Trainer, "train_step", step_then_interrupt)
    assert trainer.train() == {"interrupted": True, "step": 5}
    monkeypatch.undo()
    assert load(tmp_path / "run" / "last.pt")["progress"]["step"] == 5
    Trainer(config, tmp_path / "run", resume=True, log=_quiet).train()
    assert _train_losses(tmp_path / "run") == _train_losses(tmp_path / "full")


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    config = tiny_config(**{"train.eval_every": 3})
    trainer = Trainer(config, tmp_path / "run", log=_quiet)
    original = Trainer.train_step

    def poisoned(self, batch, lr):
        if self.step == 5:
            with torch.no_grad():
                self.model.embedding.weight.fill_(float("nan"))
        return original(self, batch, lr)

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    with pytest.raises(TrainingDiverged, match="loss is nan at step 6"):
        trainer.train()
    checkpoint = load(tmp_path / "run" / "last.pt")
    assert checkpoint["progress"]["step"] == 3
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())


def test_refuses_to_clobber_a_run_and_to_resume_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("precious")
    with pytest.raises(RunDirError, match="not empty"):
        Trainer(tiny_config(), run)
    assert (run / "notes.txt").read_text() == "precious"
    with pytest.raises(RunDirError, match="nothing to resume"):
        Trainer(tiny_config(), tmp_path / "empty", resume=True)


def test_resume_rejects_a_changed_model(tmp_path):
    config = tiny_config(**{"train.max_steps": 2})
    Trainer(config, tmp_path / "run", log=_quiet).train()
    with pytest.raises(RunDirError, match="model.encoder.hidden_size"):
        Trainer(tiny_config(**{"model.encoder.hidden_size": 8}), tmp_path / "run", resume=True)


def test_resume_rejects_a_different_vocabulary(tmp_path):
    config = tiny_config(**{"train.max_steps": 2})
    Trainer(config, tmp_path / "run", log=_quiet).train()
    other = config.replace(["data.lowercase=true", "data.synthetic.seed=7"])
    # a changed data config is refused before any vocabulary is built ...
    with pytest.raises(RunDirError, match="data.synthetic.seed"):
        Trainer(other, tmp_path / "run", resume=True)
    # ... and a checkpoint whose vocabulary differs from the data is refused too
    checkpoint = load(tmp_path / "run" / "last.pt")
    checkpoint["vocab"]["words"][5] = "not-a-word"
    save_atomic(checkpoint, tmp_path / "run" / "last.pt")
    longer = config.replace(["train.max_steps=4"])  # (at max_steps 2 the run is finished)
    with pytest.raises(CheckpointError, match="vocabulary"):
        Trainer(longer, tmp_path / "run", resume=True, log=_quiet).train()


def test_early_stopping(tmp_path):
    # an lr too small to change any weight: validation never improves after the first evaluation
    config = tiny_config(**{"train.epochs": 20, "train.early_stopping": 2, "train.lr": 1e-30})
    logs: list[str] = []
    Trainer(config, tmp_path / "run", log=logs.append).train()
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([m for m in metrics if m["kind"] == "valid"]) == 3
    assert any("early stopping" in m for m in logs)


def test_schedules():
    epoch_decay = LrSchedule(
        TrainConfig(lr=1.0, schedule="epoch_decay", decay_factor=0.5, decay_start=4)
    )
    assert [epoch_decay.lr(0, e) for e in (1, 4, 5, 6, 13)] == [1.0, 1.0, 0.5, 0.25, 0.5**9]
    # a paper's epochs kept in steps: epochs of 10 steps, the first decayed step is 41
    in_steps = LrSchedule(
        TrainConfig(
            lr=1.0, schedule="epoch_decay", decay_factor=0.5, decay_start=4, decay_epoch_steps=10
        )
    )
    assert [in_steps.lr(s, 1) for s in (1, 40, 41, 50, 51, 130)] == [1, 1, 0.5, 0.5, 0.25, 0.5**9]
    warm = LrSchedule(TrainConfig(lr=1.0, schedule="inverse_sqrt", warmup_steps=4))
    assert [warm.lr(s, 1) for s in (1, 2, 4, 16)] == [0.25, 0.5, 1.0, 0.5]
    # cosine over 12 steps after 2 warm-up steps: half-way (step 8) at lr/2, 0 at the last
    cosine = LrSchedule(TrainConfig(lr=1.0, schedule="cosine", warmup_steps=2), total_steps=14)
    rates = [cosine.lr(s, 1) for s in (1, 2, 5, 8, 14, 20)]
    assert rates == pytest.approx([0.5, 1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, 0.0, 0.0])
    plateau = LrSchedule(TrainConfig(lr=1.0, schedule="plateau", decay_factor=0.1, patience=1))
    for loss in (3.0, 2.0, 2.5, 2.5, 2.6, 2.7):  # bad evaluations: 1, 2 -> reduce, 1, 2 -> reduce
        plateau.on_validation(loss)
    assert math.isclose(plateau.lr(0, 1), 0.01)
    restored = LrSchedule(plateau.config)
    restored.load_state_dict(plateau.state_dict())
    assert restored.lr(0, 1) == plateau.lr(0, 1)


def test_save_atomic_never_leaves_half_a_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_atomic({"x": torch.ones(2)}, path)

    def broken_save(obj, handle):
        handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        save_atomic({"x": torch.zeros(2)}, path)
    monkeypatch.undo()
    assert torch.equal(load(path)["x"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_checkpoints_load_with_weights_only(tmp_path):
    Trainer(tiny_config(**{"train.epochs": 1}), tmp_path / "run", log=_quiet).train()
    _, _, model, _ = load_run(tmp_path / "run")  # the run's model, rebuilt from its config
    expected = model.state_dict()
    for name in ("last.pt", "best.pt"):
        checkpoint = torch.load(tmp_path / "run" / name, weights_only=True)
        assert checkpoint["model"].keys() == expected.keys(), name
        for key, value in expected.items():
            assert checkpoint["model"][key].shape == value.shape, (name, key)


def test_training_on_an_absent_gpu_is_one_clear_error(tmp_path):
    from targetlm.registry import ConfigError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="no CUDA GPU is available"):
        Trainer(tiny_config(**{"train.device": '"cuda"'}), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_no_progress_bar_is_written_into_a_log_file(tmp_path, capsys):
    """Where stderr is no terminal (a log file; here pytest's capture), training writes no
    progress bar into it, even with train.progress = true."""
    from targetlm import builders
    from targetlm.training import train

    config = builders.load_config(
        Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml",
        ["train.max_steps=3", "train.progress=true", "train.threads=1"],
    )
    threads = torch.get_num_threads()
    try:
        train(config, tmp_path / "run", log=print)
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    assert "it/s" not in captured.err and "\r" not in captured.err
    assert "test ppl" in captured.out
