"""Builders: the one place that reads a config and wires components from the registries.

``targetlm.config`` is plain data (it imports no model code) and checks only values; the
checks that need a component built (its options against its constructor, the tokenizer, the
task, a Transformer's context) live here and run before any work starts: the CLI and the
trainer call :func:`validate` (or load through :func:`load_config` / :func:`config_from_dict`).
Every mistake is one :class:`~targetlm.registry.ConfigError` naming the key.
"""

from __future__ import annotations

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
from targetlm.tasks import TASKS

__all__ = ["build_model", "build_objective", "config_from_dict", "load_config", "validate"]


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
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
    task = TASKS.build(config.task.kind, config.task.options, "task")
    _validate_task(config, task, model)
    context = model.encoder.max_context if isinstance(model.encoder, Encoder) else None
    if context is not None:
        for key, value in (("data.bptt", config.data.bptt), ("eval.segment", config.eval.segment)):
            if value > context:
                raise ConfigError(f"{key}: {value} exceeds model.encoder.max_context = {context}")
    _validate_data(config.data)
    _validate_backbone(config)


def _validate_task(config: Config, task: Any, model: LanguageModel) -> None:
    """The task and the encoder fit: a task that reads a source (translation, diffusion) needs
    an encoder that reads one and a stream task one that does not; the diffusion task and the
    diffusion denoiser only go together; the diffusion task's default length beam fits the
    denoiser's length classes."""
    encoder, kind = model.encoder, config.task.kind
    encoder_kind = f"model.encoder.kind = {config.model.encoder.kind!r}"
    denoiser = bool(getattr(encoder, "denoiser", False))
    if denoiser != (kind == "diffusion"):
        raise ConfigError(
            f"task.kind = 'diffusion' needs model.encoder.kind = 'diffusion_denoiser', not "
            f"{config.model.encoder.kind!r}"
            if kind == "diffusion"
            else f"{encoder_kind} is a diffusion denoiser: it trains with task.kind = 'diffusion', "
            f"not {kind!r}"
        )
    if bool(getattr(encoder, "conditional", False)) != task.conditional:
        raise ConfigError(
            f"task.kind = {kind!r} reads a source sentence: {encoder_kind} does not "
            "(use 'transformer_seq2seq')"
            if task.conditional
            else f"{encoder_kind} reads a source sentence: use task.kind = 'translation', not {kind!r}"
        )
    if isinstance(encoder, Encoder) and encoder.causal != task.causal:
        raise ConfigError(
            f"task.kind = {kind!r} predicts from the past only: {encoder_kind} reads the whole "
            "sequence (a bidirectional encoder would see the words it predicts)"
            if task.causal
            else f"task.kind = {kind!r} reads the whole sequence: {encoder_kind} is causal "
            "(use a bidirectional encoder, e.g. 'crammed_bert')"
        )
    if kind == "diffusion":
        beam, classes = task.decode["length_beam"], encoder.num_length_classes
        if beam > classes:
            raise ConfigError(
                f"task.length_beam = {beam} exceeds the denoiser's {classes} length classes "
                "(2·model.encoder.max_length_difference + 1)"
            )


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
    try:
        device = torch.device(config.train.device)
    except RuntimeError:
        raise ConfigError(f"train.device: not a device: {config.train.device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"train.device = {config.train.device!r}, but no CUDA GPU is available here "
            "(--set train.device='\"cpu\"')"
        )


def _validate_data(data: DataConfig) -> None:
    """The tokenizer (built, untrained) and the synthetic language's sizes."""
    build_tokenizer(data)
    for key in ("nouns", "verbs", "adjectives"):
        if getattr(data.synthetic, key) < NUM_CLASSES:
            raise ConfigError(
                f"data.synthetic.{key}: must be >= {NUM_CLASSES} (one per semantic class)"
            )
