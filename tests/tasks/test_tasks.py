"""Tasks: a registry of how a corpus becomes typed batches and how the model reads them."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import model_config, tiny_config

from targetlm.config import ComponentConfig
from targetlm.data.batching import IGNORE, StreamBatches
from targetlm.modules import build_model
from targetlm.registry import ConfigError
from targetlm.tasks import (
    TASKS,
    Batch,
    LanguageModelingTask,
    SentencePairTask,
    StreamTask,
    Task,
    build_task,
)

V = 20


def test_the_tasks_are_registered_and_configurable():
    assert TASKS.names() == ["classification", "diffusion", "lm", "mlm", "translation"]
    assert tiny_config().task == ComponentConfig("lm")
    with pytest.raises(
        ConfigError, match="available: classification, diffusion, lm, mlm, translation"
    ):
        tiny_config(task='{kind = "parsing"}')


STREAM_TASKS = [n for n in TASKS.names() if issubclass(TASKS.get(n), StreamTask)]


@pytest.mark.parametrize("name", STREAM_TASKS)
def test_evaluation_batches_score_every_target_once(name):
    task = TASKS.build(name, {})
    assert isinstance(task, Task)
    ids = torch.randint(V, (23,), generator=torch.Generator().manual_seed(0))
    batches = task.batches(ids, 3, 4, train=False, positions=True)
    positions = torch.cat([b.positions[b.positions != IGNORE] for b in batches])
    assert sorted(positions.tolist()) == list(range(1, len(ids)))
    for batch in batches:
        assert isinstance(batch, Batch)
        real = batch.positions != IGNORE
        assert torch.equal(batch.targets[real], ids[batch.positions[real]])  # target = ids[pos]
    model = build_model(model_config("lstm", "tied"), V).eval()
    prediction = task.predict(model, batches[0])
    assert prediction.main.shape == (*batches[0].inputs.shape, model.output.embedding_dim)


def test_lm_batches_are_the_stream_batches():
    ids = torch.arange(30) % V
    batches = LanguageModelingTask().batches(ids, 2, 5, train=True, lookahead=2)
    stream = StreamBatches(ids, 2, 5, pad=False, lookahead=2)
    assert len(batches) == len(stream)
    for batch, (inputs, targets) in zip(batches, stream):
        assert torch.equal(batch.inputs, inputs) and torch.equal(batch.targets, targets)
        assert batch.positions is None


def test_the_declared_capabilities_say_what_each_task_is():
    """The commands ask a task what it reads (``Task.reads``) instead of testing its class:
    for every registered task the declaration agrees with the class, and only a task that
    decodes sentence pairs says whether it decodes at given lengths."""
    for kind in TASKS.names():
        task = TASKS.build(kind, {}, "task")
        assert task.reads in ("stream", "pairs", "own"), kind
        assert (task.reads == "stream") == isinstance(task, StreamTask), kind
        assert (task.reads == "pairs") == isinstance(task, SentencePairTask), kind
        if isinstance(task, SentencePairTask):
            assert task.decodes_at_lengths == (kind == "diffusion"), kind
    with pytest.raises(ConfigError, match="--oracle-length is for diffusion runs"):
        TASKS.build("translation", {}, "task").translate_texts(
            None, None, [], None, batch_size=1, device="cpu", target_lengths=[3]
        )


def test_a_bound_task_evaluates_a_split_by_its_name():
    """Bound once to its config, data and device (``Task.setup``), a task evaluates a model
    on a split named by its role, and its final figures are valid's and test's: the
    stream's NLL is one pass of the model over the whole split, computed here directly."""
    config = tiny_config(**{"eval.batch_size": 1})
    task = build_task(config)
    data = task.load_data(config, None, lambda message: None)
    task.setup(config, data, "cpu")
    torch.manual_seed(0)
    model = build_model(config.model, data.vocab.itos).eval()
    ids = data.splits["valid"]
    with torch.no_grad():
        log_probs, _ = model.log_probs(ids[None, :-1])
    nll = -float(log_probs[0].gather(-1, ids[1:, None]).mean())
    result = task.evaluate(model, "valid")
    assert result["tokens"] == len(ids) - 1
    assert math.isclose(result["nll"], nll, rel_tol=1e-5)
    final = task.final_results(model)
    assert list(final) == ["valid", "test"] and final["valid"]["ppl"] == result["ppl"]
    test_tokens = data.corpus.splits[config.data.test]
    assert final["test"]["oov_rate"] == data.vocab.oov_rate(test_tokens)
    assert final["test"]["tokens"] == len(data.splits["test"]) - 1
