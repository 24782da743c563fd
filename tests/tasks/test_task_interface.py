"""The task interface the one Trainer drives, the losses' one head path, and the loop's
deferred NaN check."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import model_config, tiny_config

from targetlm import builders
from targetlm.checkpoint import load
from targetlm.config import ComponentConfig
from targetlm.modules import build_model
from targetlm.modules.model import Prediction, evaluating
from targetlm.objectives import build_objective
from targetlm.registry import ConfigError
from targetlm.tasks import TASKS, SentencePairTask, StreamTask, Task
from targetlm.training import Trainer, TrainingDiverged

V = 30


def test_every_registered_task_implements_the_whole_interface():
    for kind in TASKS.names():
        task = TASKS.build(kind, {}, "task")
        assert isinstance(task, Task)
        assert not getattr(type(task), "__abstractmethods__", None), kind
        # a task reads one stream (the language-model commands), sentence pairs (translate),
        # or data of its own (masked blocks, labelled sentences): never two of them
        assert not (isinstance(task, StreamTask) and isinstance(task, SentencePairTask)), kind
        for flag in ("conditional", "denoising", "finetunable", "causal"):
            assert isinstance(getattr(task, flag), bool), (kind, flag)
    # only the stream tasks are read by the language-model commands
    streams = [k for k in TASKS.names() if isinstance(TASKS.build(k, {}, "task"), StreamTask)]
    assert streams == ["lm"]


def test_a_task_refuses_an_encoder_it_cannot_train():
    lm, translation = TASKS.build("lm", {}, "task"), TASKS.build("translation", {}, "task")
    stream_model = build_model(model_config("lstm"), V)
    lm.check_model("lm", "lstm", stream_model)
    with pytest.raises(ConfigError, match="reads a source sentence: model.encoder.kind = 'lstm'"):
        translation.check_model("translation", "lstm", stream_model)
    diffusion = TASKS.build("diffusion", {}, "task")
    with pytest.raises(ConfigError, match="needs model.encoder.kind = 'diffusion_denoiser'"):
        diffusion.check_model("diffusion", "lstm", stream_model)


def test_evaluating_restores_the_mode_even_after_an_error():
    model = build_model(model_config("lstm"), V).train()
    with pytest.raises(RuntimeError), evaluating(model):
        assert not model.training
        raise RuntimeError("boom")
    assert model.training
    with evaluating(model.eval()):
        pass
    assert not model.training


def test_prediction_unpacks_as_main_heads_state_and_keeps_extras_by_name():
    main = torch.zeros(1, 2, 3)
    prediction = Prediction(main, None, "state", extras={"time": 1})
    first, heads, state = prediction
    assert first is main and heads is None and state == "state" and prediction[2] == "state"
    assert prediction.extras == {"time": 1} and prediction.rows(slice(0, 1)).state is None


def test_loss_sums_divide_each_term_once_as_its_mean_was():
    from targetlm.objectives import LossSums

    torch.manual_seed(0)
    ce, kl = torch.rand(7), torch.rand(7)
    record = LossSums(((1.0, ce.sum()), (0.7, kl.sum())), ce.sum(), 7)
    assert torch.equal(record.loss, ce.mean() + 0.7 * kl.mean())  # the same bits
    torch.testing.assert_close(record.normalised(14.0), record.loss / 2)
    # the whole batch's count over the processes, a float64 tensor on the device: the same
    # bits as the Python number, and a float32 loss stays float32
    for divisor in (7, 3.5, 7 / 3):
        on_device = record.normalised(torch.tensor(divisor, dtype=torch.float64))
        assert on_device.dtype == torch.float32
        assert torch.equal(on_device, record.normalised(divisor))
    # a compiled step's count (an int64 tensor) divides as the int does
    assert torch.equal(record.normalised(torch.tensor(7)), record.loss)
    nothing = torch.zeros((), requires_grad=True)
    empty = LossSums(((1.0, nothing * 3),), None, 0)  # no scored position: 0, with a graph
    assert float(empty.loss.detach()) == 0.0 and empty.loss.requires_grad
    assert float(empty.normalised(torch.tensor(0.0, dtype=torch.float64))) == 0.0
    with pytest.raises(ValueError, match="at least one term"):
        LossSums((), None, 0)


def test_the_training_objective_returns_each_heads_sums_and_counts_undivided():
    """The N-gram loss returns one part per head (its scored positions as ``counts``), and
    only the divisors the step gives divide them: the counts themselves give the loss of
    these rows alone, twice the counts half of it, full and chunked alike, Python numbers
    and float64 tensors (the processes' all-reduced counts) the same bits."""
    config = dataclasses.replace(
        model_config("lstm", "tied"), heads=ComponentConfig("wdr", {"n": 3})
    )
    model = build_model(config, V)
    inputs, targets = torch.randint(V, (2, 5)), torch.randint(V, (2, 7))
    targets[1, 4:] = -100
    prediction = model(inputs)
    weight, bias = model.output()
    losses = {}
    for impl in ("full", "chunked"):
        objective = build_objective(ComponentConfig("cross_entropy", {}), model, impl)
        parts = objective(prediction, targets, weight, bias)
        assert parts.counts == (9, 8, 7) and parts.count == 9  # L0, L1, L2's scored positions
        alone = parts.alone
        # each head's sum over its own count, by the formula (½·L0 + α/(2N−2)·(L1 + L2))
        means = [r.loss for r in objective.head_losses(prediction, targets, weight, bias)]
        expected = 0.5 * means[0] + 1.0 / 4 * (means[1] + means[2])
        torch.testing.assert_close(alone.loss, expected)
        counts = [float(c) for c in parts.counts]
        assert torch.equal(parts.divided(counts).loss, alone.loss)
        torch.testing.assert_close(parts.divided([2 * c for c in counts]).loss, alone.loss / 2)
        on_device = [torch.tensor(c / 3, dtype=torch.float64) for c in counts]
        assert torch.equal(
            parts.divided(on_device).loss, parts.divided([c / 3 for c in counts]).loss
        )
        with pytest.raises(ValueError, match="3 parts, 2 divisors"):
            parts.divided(counts[:2])
        losses[impl] = alone
    torch.testing.assert_close(losses["chunked"].loss, losses["full"].loss)
    torch.testing.assert_close(losses["chunked"].nll_sum, losses["full"].nll_sum)


def test_a_diverged_step_between_records_is_named_and_never_checkpointed(tmp_path, monkeypatch):
    """The NaN check runs at the records, validations and checkpoints (no per-step sync),
    yet it names the first diverged step and leaves the last good checkpoint."""
    config = tiny_config(**{"train.log_every": 4, "train.checkpoint_every": 2})
    original = Trainer.train_step

    def poisoned(self, batch, lr):
        if self.step == 2:
            with torch.no_grad():
                self.model.embedding.weight.fill_(float("nan"))
        return original(self, batch, lr)

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 3 .*step 2\) is kept"):
        Trainer(config, tmp_path / "run", log=lambda message: None).train()
    assert load(tmp_path / "run" / "last.pt")["progress"]["step"] == 2


def test_a_config_names_its_task_problems_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="reads a source sentence"):
        builders.config_from_dict({**tiny_config().to_dict(), "task": {"kind": "translation"}})
