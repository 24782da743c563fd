"""Typed, frozen configuration: TOML in, dataclasses out, unknown keys are errors.

A config file has four tables::

    [data]       corpus, splits, batching          -> DataConfig
    [model.embedding] / [model.encoder] / [model.output] / [model.heads]
                 each ``kind = "..."`` plus that component's constructor options
    [objective]  ``kind = "..."`` plus options
    [task]       ``kind = "lm"`` (the registered tasks: where x̂ and the targets come from)
    [train]      optimiser, schedule, budget        -> TrainConfig
    [eval]       evaluation batching                -> EvalConfig

Configuration is plain data: this module imports no model code and checks values only.
Component options are checked against the registered constructor's signature by
:func:`targetlm.builders.validate` (the CLI and the trainer call it), so new components
bring their own options without touching this file.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from targetlm.registry import (
    MAX_COUNT,
    MAX_SEED,
    MAX_SIZE,
    MAX_VOCAB,
    ConfigError,
    Range,
    check_type,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class ComponentConfig:
    """A registered component: its ``kind`` and the options for its constructor."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.options}


@dataclass(frozen=True)
class SyntheticConfig:
    """The built-in toy language (``targetlm.data.synthetic``)."""

    seed: int = 1234
    train_sentences: int = 8000
    valid_sentences: int = 800
    test_sentences: int = 800
    nouns: int = 300
    verbs: int = 120
    adjectives: int = 60


@dataclass(frozen=True)
class DataConfig:
    name: str = "synthetic"  # a registered dataset, or "text": your own files in data.dir
    dir: str | None = None  # overrides $TARGETLM_DATA/<name> and the user cache
    # split names: file stems (Brown uses genre names); for "text", file names in data.dir
    # (NAME or NAME.txt, e.g. "train.en"); any of them sliced by line fractions: "news[:0.8]"
    train: str = "train"
    valid: str = "valid"
    test: str = "test"
    lowercase: bool = False
    # how lines become tokens (targetlm.data.tokenizers): whitespace | bpe | unigram | bytes
    tokenizer: str = "whitespace"
    # whitespace: keep at most max_size entries (with <unk>, <eos>), only words seen at least
    # min_count times (default 1); the other words are <unk>
    max_size: int | None = None
    min_count: int | None = None
    # bpe / unigram: symbols incl. <unk>, <eos> and the 256 byte symbols (default 8000), learnt
    # on the training split; or a saved tokenizer.json to use instead (finetuning sets it)
    vocab_size: int | None = None
    tokenizer_file: str | None = None
    train_tokens: int = (
        0  # keep only the first N training tokens (0: all), e.g. Inan et al.'s 20k-token analysis
    )
    batch_size: int = 20
    bptt: int = 35  # segment length: BPTT for recurrent encoders, block length for Transformers
    shuffle: bool = False  # shuffle the order of segments every epoch (Transformer blocks)
    # translation (task.kind = "translation"): a split NAME is the files NAME.<source_lang>
    # and NAME.<target_lang>; batches hold up to max_tokens source or target tokens
    # (0: batch_size sentence pairs), sentences bucketed by length
    source_lang: str | None = None
    target_lang: str | None = None
    max_tokens: int = 0
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


def _component(kind: str, **options: Any) -> Any:
    return field(default_factory=lambda: ComponentConfig(kind, dict(options)))


@dataclass(frozen=True)
class ModelConfig:
    embedding: ComponentConfig = _component("lookup", size=200)
    encoder: ComponentConfig = _component("lstm", hidden_size=200, num_layers=2)
    output: ComponentConfig = _component("tied")
    # N-gram prediction heads (Heo et al.): "simple" | "wdr"; "none" is plain next-word training
    heads: ComponentConfig = _component("none")
    # the embedding that reads a source sentence (translation, diffusion): "none" reads it with
    # [model.embedding], shared with the target side as the papers' recipes share one joint
    # vocabulary's table; an input-embedding kind gives the source its own table
    source_embedding: ComponentConfig = _component("none")
    # a pretrained model that supplies the embedding, encoder and output layer at once:
    # "hf" (a Hugging Face causal LM, targetlm.modules.hf); "none": the three components above
    backbone: ComponentConfig = _component("none")


@dataclass(frozen=True)
class TrainConfig:
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = 1.0
    momentum: float = 0.0
    betas: tuple[float, ...] = (0.9, 0.999)
    weight_decay: float = 0.0
    # constant | epoch_decay: lr * decay_factor ** max(epoch - decay_start, 0) (epochs count from 1)
    # | plateau: lr *= decay_factor when validation does not improve for `patience` evaluations
    # | inverse_sqrt: linear warmup for warmup_steps, then lr * sqrt(warmup_steps / step)
    # | linear: linear warmup for warmup_steps, then linear decay to 0 at the last step
    # | cosine: linear warmup, then lr * (1 + cos(pi * fraction of the rest done)) / 2, 0 at the end
    schedule: Literal["constant", "epoch_decay", "plateau", "inverse_sqrt", "linear", "cosine"] = (
        "constant"
    )
    decay_factor: float = 0.5
    decay_start: int = 4
    # epoch_decay counts epochs of this many optimiser steps instead of passes over the data
    # (0): a paper's schedule kept in steps when the corpus (and so an epoch) is smaller
    decay_epoch_steps: int = 0
    patience: int = 0
    warmup_steps: int = 0
    clip: float = 0.0  # max gradient norm; 0 disables
    # optimiser steps that train only the N-gram heads (the rest frozen) before everything
    # trains (Medusa's warm-up of heads on a pretrained body; Heo et al. 2025 App. A.3.1), at
    # a constant rate; the schedule then runs over the remaining steps (max_steps counts both);
    # a model without heads trains nothing in them (it skips their batches: a like-for-like base)
    heads_only_steps: int = 0
    heads_lr: float = 0.0  # the heads' learning rate (scheduled like lr); 0: lr
    accumulate: int = 1  # batches whose gradients add up to one optimiser step
    # fp32 | bf16: forward and loss under bfloat16 autocast (weights and optimiser stay fp32)
    precision: Literal["fp32", "bf16"] = "fp32"
    # mean: loss averaged over all target tokens; sum_over_time: summed over the T steps of a
    # segment and averaged over the batch rows (Zaremba et al.'s TensorFlow code, whose lr = 1
    # and clip = 5 assume it): T times the gradient of "mean"
    loss_reduction: Literal["mean", "sum_over_time"] = "mean"
    # the logit layer + loss (targetlm.chunked): "full" builds the (tokens x V) logits, "chunked"
    # goes through tiles of loss_chunk_tokens x loss_chunk_vocab (memory O(tokens + V + a tile);
    # every objective that can), "auto": chunked from targetlm.chunked.AUTO_CHUNK_ELEMENTS logits
    # per step (tokens x heads x V); the tile's defaults are chunked's CHUNK_TOKENS x CHUNK_VOCAB
    loss_impl: Literal["full", "chunked", "auto"] = "auto"
    loss_chunk_tokens: int = 256
    loss_chunk_vocab: int = 65536  # >= V: a tile spans whole rows (fastest on a CPU)
    epochs: int = 1
    max_steps: int = 0  # 0: no limit besides epochs
    early_stopping: int = 0  # stop after this many evaluations without improvement; 0 disables
    carry_state: bool = True  # carry (detached) encoder state across training segments
    seed: int = 1
    log_every: int = 50
    eval_every: int = 0  # steps between validations; 0: once per epoch
    # steps between gradient-diversity measurements (Heo et al. eq. 14; B extra backward
    # passes each) written to metrics.jsonl as kind "diversity"; 0 disables
    gradient_diversity_every: int = 0
    checkpoint_every: int = 0  # steps between resumable checkpoints; 0: at each validation
    threads: int = 0  # torch intra-op threads; 0: torch's default
    # finetuning (`targetlm finetune`): start from this run's best weights, its vocabulary
    # extended with the training split's new words; "" trains from scratch
    init_from: str = ""
    device: str = "cpu"
    # the training step (forward, loss, backward) through torch.compile (targetlm.training.compile):
    # "off": eager, as written; "default": compiled (inductor); "graphs": compiled and replayed
    # as CUDA graphs (a GPU only). The eager step is the reference; a compiled one matches it
    # within float rounding (tests/training/test_compile.py)
    compile: Literal["off", "default", "graphs"] = "off"
    progress: bool = True  # tqdm progress bar
    # several processes (torchrun): "ddp" replicates the model in each (DistributedDataParallel);
    # "fsdp" shards an hf backbone's parameters, gradients and optimiser state over them, per
    # decoder layer (FSDP2), with sharded checkpoints (torch.distributed.checkpoint)
    parallel: Literal["ddp", "fsdp"] = "ddp"


@dataclass(frozen=True)
class EvalConfig:
    batch_size: int = 10
    segment: int = 0  # tokens scored per step; 0: data.bptt (a Transformer sees max_context - segment + 1 or more)
    beam: int = 5  # translation: beam size of the BLEU at the end of training and of `eval`


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ComponentConfig = _component("cross_entropy")
    task: ComponentConfig = _component("lm")
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    def replace(self, overrides: list[str]) -> Config:
        return from_dict(apply_overrides(self.to_dict(), overrides))


def _to_dict(obj: Any) -> Any:
    if isinstance(obj, ComponentConfig):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return list(obj)
    return obj


def _from_dict(cls: type, data: Any, prefix: str) -> Any:
    if cls is ComponentConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"{prefix}: expected a table with a 'kind', got {data!r}")
        if "kind" not in data or not isinstance(data["kind"], str):
            raise ConfigError(f"{prefix}.kind: missing or not a string")
        options = {k: v for k, v in data.items() if k != "kind"}
        return ComponentConfig(data["kind"], options)
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a table, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            raise ConfigError(f"unknown key {name}; allowed: {', '.join(fields)}")
        hint = hints[key]
        if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or hint is ComponentConfig):
            values[key] = _from_dict(hint, value, name)
        else:
            values[key] = check_type(name, value, hint)
    return cls(**values)


def from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a :class:`Config` from a plain (TOML-shaped) dict."""
    config = _from_dict(Config, upgrade(data), "")
    validate(config)
    return config


# The release that drops upgrade()'s move of model.heads.alpha (then the key is an unknown
# option, one ConfigError); a test fails once the package's version reaches it.
HEADS_ALPHA_REMOVED_IN = "0.2.0"


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Move keys of older configs (e.g. a run directory's ``config.toml``) to their place now.

    ``model.heads.alpha`` (an older key) is the N-gram loss's α: ``objective.ngram_alpha``,
    moved until targetlm :data:`HEADS_ALPHA_REMOVED_IN`.
    Returns a new dict when something moved (with a ``DeprecationWarning``), else ``data``.
    """
    heads = data.get("model", {}).get("heads") if isinstance(data.get("model"), dict) else None
    if not isinstance(heads, dict) or "alpha" not in heads:
        return data
    import warnings

    data = json.loads(json.dumps(data))
    alpha = data["model"]["heads"].pop("alpha")
    objective = data.setdefault("objective", {"kind": "cross_entropy"})
    if isinstance(objective, dict):
        if "ngram_alpha" in objective and objective["ngram_alpha"] != alpha:
            raise ConfigError(
                f"model.heads.alpha = {alpha} (an older key) and objective.ngram_alpha = "
                f"{objective['ngram_alpha']} disagree; keep objective.ngram_alpha only"
            )
        objective["ngram_alpha"] = alpha
    warnings.warn(
        f"model.heads.alpha is deprecated and removed in targetlm {HEADS_ALPHA_REMOVED_IN}: "
        "it is the N-gram loss's α, now objective.ngram_alpha (moved there for this load; "
        "write it there in the config)",
        DeprecationWarning,
        stacklevel=3,
    )
    return data


MAX_THREADS = 1024  # torch threads: more than any machine's cores (each thread costs memory)
MAX_BEAM = 1024

# the valid values of every numeric option of the dataclass configs (a tuple's items each);
# NaN and ±inf are in none of them. Component options declare theirs in their constructors.
RANGES: dict[str, Range] = {
    "data.synthetic.seed": Range(0, MAX_SEED),
    "data.synthetic.train_sentences": Range(1, MAX_SIZE),
    "data.synthetic.valid_sentences": Range(1, MAX_SIZE),
    "data.synthetic.test_sentences": Range(1, MAX_SIZE),
    "data.synthetic.nouns": Range(1, MAX_SIZE),
    "data.synthetic.verbs": Range(1, MAX_SIZE),
    "data.synthetic.adjectives": Range(1, MAX_SIZE),
    "data.max_size": Range(1, MAX_VOCAB),
    "data.min_count": Range(1, MAX_COUNT),
    "data.vocab_size": Range(1, MAX_VOCAB),
    "data.train_tokens": Range(0, MAX_COUNT, note="0: the whole split"),
    "data.batch_size": Range(1, MAX_SIZE),
    "data.bptt": Range(1, MAX_SIZE),
    "data.max_tokens": Range(0, MAX_VOCAB, note="0: data.batch_size sentence pairs"),
    "train.lr": Range(0, low_open=True),
    "train.momentum": Range(0, 1, high_open=True),
    "train.betas": Range(0, 1, high_open=True),
    "train.weight_decay": Range(0),
    "train.decay_factor": Range(0, 1, low_open=True),
    "train.decay_start": Range(0, MAX_COUNT),
    "train.decay_epoch_steps": Range(0, MAX_COUNT, note="0: passes over the data"),
    "train.patience": Range(0, MAX_COUNT),
    "train.warmup_steps": Range(0, MAX_COUNT),
    "train.clip": Range(0, note="0: no clipping"),
    "train.heads_only_steps": Range(0, MAX_COUNT),
    "train.heads_lr": Range(0, note="0: train.lr"),
    "train.accumulate": Range(1, MAX_SIZE),
    "train.loss_chunk_tokens": Range(1, MAX_VOCAB),
    "train.loss_chunk_vocab": Range(1, MAX_VOCAB),
    "train.epochs": Range(1, MAX_SIZE),
    "train.max_steps": Range(0, MAX_COUNT, note="0: no limit besides epochs"),
    "train.early_stopping": Range(0, MAX_COUNT, note="0: off"),
    "train.seed": Range(0, MAX_SEED),
    "train.log_every": Range(1, MAX_COUNT),
    "train.eval_every": Range(0, MAX_COUNT, note="0: once per epoch"),
    "train.gradient_diversity_every": Range(0, MAX_COUNT, note="0: off"),
    "train.checkpoint_every": Range(0, MAX_COUNT, note="0: at each validation"),
    "train.threads": Range(0, MAX_THREADS, note="0: torch's default"),
    "eval.batch_size": Range(1, MAX_SIZE),
    "eval.segment": Range(0, MAX_SIZE, note="0: data.bptt"),
    "eval.beam": Range(1, MAX_BEAM, note="1: greedy decoding"),
}


def option_value(config: Config, key: str) -> Any:
    """The value of a dotted key of the dataclass configs (``"train.lr"``)."""
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def validate(config: Config) -> None:
    """Check the values of ``config`` (plain data: no component is built here).

    Every numeric value against its :data:`RANGES` entry, then the values that depend on each
    other. The checks that need a component built (its options, the tokenizer, the task, a
    Transformer's context) are :func:`targetlm.builders.validate`, which calls this first.
    """
    betas = config.train.betas
    if len(betas) != 2:
        raise ConfigError(
            f"train.betas: {list(betas)} is not two values (β1, β2), each in "
            f"{RANGES['train.betas']}"
        )
    for key, valid in RANGES.items():
        value = option_value(config, key)
        if isinstance(value, tuple):
            for i, item in enumerate(value):
                valid.check(f"{key}[{i}]", item)
        elif value is not None:
            valid.check(key, value)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", config.train.device):
        raise ConfigError(
            f"train.device: {config.train.device!r} is not a device targetlm runs on "
            "('cpu', 'cuda' or 'cuda:N')"
        )
    if config.train.schedule == "inverse_sqrt" and config.train.warmup_steps < 1:
        raise ConfigError("train.warmup_steps: the inverse_sqrt schedule needs warmup_steps >= 1")
    if config.data.name == "text" and not config.data.dir:
        raise ConfigError(
            "data.dir: data.name = 'text' reads your own files; set data.dir to their directory"
        )


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML literal (``3``, ``0.5``, ``true``, ``"x"``, ``[1, 2]``) or a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise ConfigError(f"--set value {text[:40]!r}...: nested too deeply") from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a nested dict (returns a new dict)."""
    data = json.loads(json.dumps(data))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. train.lr=0.5")
        *parents, leaf = key.strip().split(".")
        node = data
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part} is not a table")
            node = child
        node[leaf] = parse_value(text.strip())
    return data


def load_table(path: str | Path) -> dict[str, Any]:
    """A TOML file as a dict (not checked against the config's keys: a partial config)."""
    path = Path(path)
    if path.is_dir():
        hint = (
            f" (the run's config: {path / 'config.toml'})"
            if (path / "config.toml").is_file()
            else ""
        )
        raise ConfigError(f"{path} is a directory, not a config file{hint}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a config: its values are nested too deeply") from None


def load(path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Read a TOML config file, apply ``--set`` overrides, and validate."""
    return from_dict(apply_overrides(load_table(path), list(overrides)))


def dumps(config: Config) -> str:
    """The config as TOML (the resolved config written into every run directory)."""
    return _dump_table(config.to_dict(), [])


def _dump_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # TOML has no surrogate-pair escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_dump_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def _dump_table(table: dict[str, Any], path: list[str]) -> str:
    lines, subtables = [], []
    for key, value in table.items():
        if value is None:
            continue
        if isinstance(value, dict):
            subtables.append((key, value))
        else:
            lines.append(f"{key} = {_dump_value(value)}")
    text = ""
    if path and (lines or not subtables):
        text += f"[{'.'.join(path)}]\n"
    if lines:
        text += "\n".join(lines) + "\n"
    for key, value in subtables:
        text += ("\n" if text else "") + _dump_table(value, [*path, key])
    return text
