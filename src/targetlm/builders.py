"""Builders: the one place that reads a config and wires components from the registries.

``targetlm.config`` is plain data (it imports no model code) and checks only values; the
checks that need a component built (its options against its constructor, the tokenizer, the
task, a Transformer's context) live here and run before any work starts: the CLI and the
trainer call :func:`validate` (or load through :func:`load_config` / :func:`config_from_dict`).
Every mistake is one :class:`~targetlm.registry.ConfigError` naming the key.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from targetlm import config as config_lib
from targetlm.config import Config, DataConfig, ModelConfig
from targetlm.data.synthetic import NUM_CLASSES
from targetlm.data.tokenizers import build_tokenizer
from targetlm.lexicon.lexicon import Lexicon
from targetlm.modules.encoders import Encoder
from targetlm.modules.model import LanguageModel, build_model
from targetlm.objectives import build_objective
from targetlm.registry import ConfigError
from targetlm.tasks import build_task

__all__ = ["build_model", "build_objective", "config_from_dict", "load_config", "validate"]


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Read a TOML config, apply ``--set`` overrides, and check values and components."""
    config = config_lib.load(path, overrides)
    validate(config)
    return config


def config_from_dict(data: dict[str, Any]) -> Config:
    """A checked :class:`Config` from a TOML-shaped dict (e.g. a checkpoint's ``config``)."""
    config = config_lib.from_dict(data)
    validate(config)
    return config


def validate(config: Config) -> None:
    """Check every component's options (and the values of ``config``) before any work starts.

    The model and objective are built once on the meta device (no memory, no compute), so
    every option's name, type and value is checked by the constructors themselves. An empty
    lexicon: GroC's options are checked without WordNet, read only when really built.
    """
    config_lib.validate(config)
    with torch.device("meta"):
        model: LanguageModel = build_model(config.model, 8, lexicon=Lexicon())
        build_objective(config.objective, model)
    task = build_task(config)
    task.check_model(config.task.kind, config.model.encoder.kind, model)
    context = model.encoder.max_context if isinstance(model.encoder, Encoder) else None
    if context is not None:
        for key, value in (("data.bptt", config.data.bptt), ("eval.segment", config.eval.segment)):
            if value > context:
                raise ConfigError(f"{key}: {value} exceeds model.encoder.max_context = {context}")
    _check_data_options(config.data)
    _validate_backbone(config)


def _validate_backbone(config: Config) -> None:
    """A pretrained backbone supplies the embedding, encoder and output layer, reads text with
    its own tokenizer, and trains on independent blocks (its state is a KV cache)."""
    if config.model.backbone.kind == "none":
        return
    defaults = ModelConfig()
    for part in ("embedding", "encoder", "output"):
        if getattr(config.model, part) != getattr(defaults, part):
            raise ConfigError(
                f"model.{part}: model.backbone = {config.model.backbone.kind!r} supplies the "
                f"embedding, encoder and output layer; remove the model.{part} table"
            )
    if config.data.tokenizer != "hf":
        raise ConfigError(
            "data.tokenizer: an hf backbone reads text with its own tokenizer: set "
            "data.tokenizer = 'hf' and data.tokenizer_file = the backbone's path"
        )
    if config.train.carry_state:
        raise ConfigError(
            "train.carry_state: an hf backbone trains on independent blocks (its state is a "
            "KV cache); set train.carry_state = false"
        )


def check_device(config: Config) -> None:
    """``train.device`` names a device this machine has (training; a finished run trained on a
    GPU still loads on the CPU: ``targetlm.runs.load_run``)."""
    if torch.device(config.train.device).type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"train.device = {config.train.device!r}, but no CUDA GPU is available here "
            "(--set train.device='\"cpu\"')"
        )
    _check_compile(config.train.compile, torch.device(config.train.device))


def _check_compile(mode: str, device: torch.device) -> None:
    """``train.compile`` can run on ``device``: CUDA graphs need a GPU, inductor a C++
    compiler on the CPU and Triton on a GPU (one error naming what is missing)."""
    if mode == "off":
        return
    if mode == "graphs" and device.type != "cuda":
        raise ConfigError(
            f"train.compile = 'graphs' replays the step as CUDA graphs, which need a GPU; "
            f"train.device is {str(device)!r} (use train.compile = 'default' on the CPU)"
        )
    if device.type == "cpu":
        compiler = os.environ.get("CXX") or next(
            (c for c in ("g++", "c++", "clang++") if shutil.which(c)), None
        )
        if compiler is None or not shutil.which(compiler):
            raise ConfigError(
                "train.compile on the CPU needs a C++ compiler (g++ or clang++) for torch's "
                "inductor, and none was found (apt-get install g++, or train.compile = 'off')"
            )
    elif importlib.util.find_spec("triton") is None:
        raise ConfigError(
            "train.compile on a GPU needs the triton package for torch's inductor "
            "(pip install triton matching this torch, or train.compile = 'off')"
        )


def _check_data_options(data: DataConfig) -> None:
    """The tokenizer (built, untrained) and the synthetic language's sizes."""
    build_tokenizer(data)
    for key in ("nouns", "verbs", "adjectives"):
        if getattr(data.synthetic, key) < NUM_CLASSES:
            raise ConfigError(
                f"data.synthetic.{key}: must be >= {NUM_CLASSES} (one per semantic class)"
            )
