from __future__ import annotations

import pytest
import torch

from targetlm import config as config_lib
from targetlm.config import ComponentConfig, ModelConfig
from targetlm.modules import ENCODERS, OUTPUT_LAYERS

torch.set_num_threads(min(2, torch.get_num_threads()))

# small options for every registered component, so contract tests cover each one;
# a newly registered kind without an entry here fails test_every_kind_has_test_options
ENCODER_OPTIONS = {
    "lstm": {"hidden_size": 24, "num_layers": 2},
    "transformer": {
        "num_layers": 2,
        "num_heads": 2,
        "ff_size": 32,
        "max_context": 64,
        "dropout": 0.0,
    },
}
OUTPUT_OPTIONS = {"lookup": {}, "tied": {}}


def model_config(
    encoder: str = "lstm", output: str = "tied", embedding_size: int = 16, **encoder_options
) -> ModelConfig:
    return ModelConfig(
        embedding=ComponentConfig("lookup", {"size": embedding_size}),
        encoder=ComponentConfig(encoder, {**ENCODER_OPTIONS[encoder], **encoder_options}),
        output=ComponentConfig(output, dict(OUTPUT_OPTIONS[output])),
    )


def tiny_config(**overrides) -> config_lib.Config:
    """A seconds-long training config on a small synthetic corpus; ``overrides`` are ``--set`` pairs."""
    base = {
        "data": {
            "name": "synthetic",
            "batch_size": 4,
            "bptt": 10,
            "synthetic": {"train_sentences": 120, "valid_sentences": 20, "test_sentences": 20},
        },
        "model": {
            "embedding": {"kind": "lookup", "size": 16},
            "encoder": {"kind": "lstm", "hidden_size": 16, "num_layers": 2},
            "output": {"kind": "tied"},
        },
        "train": {
            "optimizer": "sgd",
            "lr": 1.0,
            "epochs": 2,
            "log_every": 1,
            "progress": False,
            "clip": 1.0,
        },
        "eval": {"batch_size": 2},
    }
    return config_lib.from_dict(
        config_lib.apply_overrides(base, [f"{k}={v}" for k, v in overrides.items()])
    )


@pytest.fixture(params=sorted(ENCODER_OPTIONS))
def encoder_kind(request) -> str:
    return request.param


@pytest.fixture(params=sorted(OUTPUT_OPTIONS))
def output_kind(request) -> str:
    return request.param


def test_every_kind_has_test_options():
    assert set(ENCODER_OPTIONS) == set(ENCODERS.names())
    assert set(OUTPUT_OPTIONS) == set(OUTPUT_LAYERS.names())
