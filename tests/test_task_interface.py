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
    nothing = torch.zeros((), requires_grad=True)
    empty = LossSums(((1.0, nothing * 3),), None, 0)  # no scored position: 0, with a graph
    assert float(empty.loss.detach()) == 0.0 and empty.loss.requires_grad
    with pytest.raises(ValueError, match="at least one term"):
        LossSums((), None, 0)


def test_divisors_equal_to_the_counts_give_the_one_process_loss():
    """The distributed path divides each head's loss by its global count over K; with the
    local counts as divisors it is the single-process loss, full and chunked alike."""
    config = dataclasses.replace(
        model_config("lstm", "tied"), heads=ComponentConfig("wdr", {"n": 3})
    )
    model = build_model(config, V)
    inputs, targets = torch.randint(V, (2, 5)), torch.randint(V, (2, 7))
    targets[1, 4:] = -100
    prediction = model(inputs)
    weight, bias = model.output()
    for impl in ("full", "chunked"):
        objective = build_objective(ComponentConfig("cross_entropy", {}), model, impl)
        alone = objective(prediction, targets, weight, bias)
        seen = []

        def divisors(counts, seen=seen):
            seen.append(counts)
            return [float(c) for c in counts]

        shared = objective(prediction, targets, weight, bias, count_divisors=divisors)
        assert seen == [[9, 8, 7]]  # the scored positions of L0, L1, L2
        torch.testing.assert_close(shared.loss, alone.loss)

        def twice(counts):  # twice the rows
            return [2.0 * c for c in counts]

        torch.testing.assert_close(
            objective(prediction, targets, weight, bias, count_divisors=twice).loss,
            alone.loss / 2,
        )


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
