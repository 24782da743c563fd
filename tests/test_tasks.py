"""Tasks: a registry of how a corpus becomes typed batches and how the model reads them."""

from __future__ import annotations

import pytest
import torch
from conftest import model_config, tiny_config

from targetlm.config import ComponentConfig
from targetlm.data.batching import IGNORE, StreamBatches
from targetlm.modules import build_model
from targetlm.registry import ConfigError
from targetlm.tasks import TASKS, Batch, LanguageModelingTask, StreamTask, Task

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
