"""The run directory: what a training run leaves behind, and loading it back.

RUN_DIR/
  config.toml      the resolved config
  vocab.txt        "word<TAB>count" per id
  tokenizer.json   the BPE / unigram tokenizer (data.tokenizer), whose symbols are vocab.txt's words
  metrics.jsonl    one JSON object per logged step / validation
  last.pt          resumable checkpoint (model, optimiser, schedule, position, RNG, carried state)
  best.pt          the model with the best validation perplexity
  results.json     final valid/test perplexity, parameters, wall time
  report.md        the same as a report, with learning_curve.png
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from targetlm import builders
from targetlm import config as config_lib
from targetlm.checkpoint import CheckpointError, load
from targetlm.config import Config
from targetlm.data.tokenizers import TOKENIZER_FILE, load_tokenizer
from targetlm.data.vocab import Vocabulary
from targetlm.modules.model import LanguageModel, build_model
from targetlm.registry import ConfigError

CONFIG, VOCAB, METRICS, LAST, BEST, RESULTS, REPORT = (
    "config.toml",
    "vocab.txt",
    "metrics.jsonl",
    "last.pt",
    "best.pt",
    "results.json",
    "report.md",
)
TOKENIZER = TOKENIZER_FILE  # written beside vocab.txt by Vocabulary.save


def load_state_into(model: nn.Module, state: dict, vocab: Vocabulary, where: str) -> None:
    """Load a model state dict, with one clear error naming the first part that does not fit
    (another vocabulary, another backbone, heads of another size)."""
    own = model.state_dict()
    for key, value in state.items():
        if key in own and own[key].shape != value.shape:
            raise CheckpointError(
                f"{where}: the checkpoint does not fit this model: {key} is "
                f"{tuple(value.shape)} there and {tuple(own[key].shape)} here (vocabulary of "
                f"{len(vocab)} words; another backbone or heads of another size?)"
            )
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise CheckpointError(
            f"{where}: the checkpoint does not fit a model for this vocabulary of {len(vocab)} words "
            f"({str(error).splitlines()[0]})"
        ) from None


def read_best(run_dir: str | Path) -> tuple[dict, Vocabulary, Path]:
    """The best checkpoint of a run (or the last one, if none is best yet), its vocabulary and
    its path; the vocabulary must match the run's ``vocab.txt``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory not found: {run_dir}")
    if not any((run_dir / name).is_file() for name in (CONFIG, LAST, BEST)):
        raise CheckpointError(f"{run_dir} is not a run directory (no {CONFIG} / {LAST} / {BEST})")
    path = run_dir / BEST if (run_dir / BEST).is_file() else run_dir / LAST
    checkpoint = load(path, required=("model", "vocab", "config"))
    vocab = Vocabulary.from_state_dict(checkpoint["vocab"])
    if (run_dir / VOCAB).is_file() and Vocabulary.load(run_dir / VOCAB) != vocab:
        raise CheckpointError(
            f"{path}: its vocabulary ({len(vocab)} words) does not match {run_dir / VOCAB}"
        )
    return checkpoint, vocab, path


def load_run(
    run_dir: str | Path, overrides: Sequence[str] = (), streams: bool | None = True
) -> tuple[Config, Vocabulary, LanguageModel, dict]:
    """Rebuild the model of a run from its best checkpoint (or the last one, if none is best yet);
    ``run_dir`` may also be a config file (:func:`configured_model`: the model before training).

    ``overrides`` (``--set``) change data/eval settings, e.g. ``data.dir`` or ``eval.batch_size``.
    A run trained on a GPU loads on the CPU where no GPU is available (with a warning);
    the returned config's ``train.device`` is where the model is. The vocabulary's
    ``tokenizer`` is the run's (``tokenizer.json`` for BPE / unigram, checked against it).
    ``streams``: the runs the caller can read (:func:`check_task`: True, a language-model
    command cannot read a translation run; False, sentence pairs only; None: any).
    """
    if Path(run_dir).is_file():  # a config file: its model before any training
        return configured_model(Path(run_dir), overrides, streams)
    checkpoint, vocab, path = read_best(run_dir)
    config = _run_config(checkpoint, overrides)
    check_task(config, streams, str(run_dir), "run")
    vocab.tokenizer = load_tokenizer(config.data, Path(run_dir), vocab)
    device = torch.device(config.train.device)
    model = build_model(config.model, vocab.itos)
    load_state_into(model, checkpoint["model"], vocab, str(path))
    model.eval()
    return config, vocab, model.to(device), checkpoint


def _run_config(checkpoint: dict, overrides: Sequence[str]) -> Config:
    """A checkpoint's config with ``overrides``, its ``train.device`` where the model will be
    (the CPU, with a warning, for a run trained on a GPU that is missing here)."""
    config = builders.config_from_dict(
        config_lib.apply_overrides(checkpoint["config"], list(overrides))
    )
    device = str(available_device(config.train.device))
    if device != config.train.device:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, device=device))
    return config


def wraps_model(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` is a run whose task wraps the language model (``Task.wraps_model``:
    a classifier), read from its config.toml; False where there is none to read (the caller's
    loading then says what is wrong)."""
    from targetlm.tasks import TASKS

    path = Path(run_dir) / CONFIG
    if not path.is_file():
        return False
    try:
        kind = config_lib.load(path).task.kind
        return bool(getattr(TASKS.get(kind), "wraps_model", False))
    except (ConfigError, OSError, ValueError):
        return False


def load_wrapped_run(
    run_dir: str | Path, overrides: Sequence[str] = ()
) -> tuple[Config, Any, nn.Module]:
    """A run whose task wraps the language model (a classifier), from its best checkpoint: its
    config, its task bound to its data (:meth:`~targetlm.tasks.Task.run_data`: read with the
    run's vocabulary) and device, and the wrapped model (eval mode, on ``train.device`` or the
    CPU where that is missing)."""
    from targetlm.tasks import build_task

    checkpoint, vocab, path = read_best(run_dir)
    config = _run_config(checkpoint, overrides)
    task = build_task(config)
    device = torch.device(config.train.device)
    task.setup(config, task.run_data(config, vocab, ("valid", "test")), device)
    model = task.model_to_train(build_model(config.model, vocab.itos))
    load_state_into(model, checkpoint["model"], vocab, str(path))
    model.eval()
    return config, task, model.to(device)


def check_task(config: Config, streams: bool | None, where: str, what: str) -> None:
    """Refuse a run (or config) whose task the command cannot read: ``streams`` True: a
    language-model command (a task that reads a token stream, ``Task.reads``), False: a
    sentence-pair one (``translate``), None: any; never a task whose model wraps the language
    model (``Task.wraps_model``: a classifier)."""
    from targetlm.tasks import build_task

    task = build_task(config)
    if task.wraps_model:
        raise ConfigError(
            f"{where} is a {config.task.kind!r} {what}: this command reads language models, not "
            "a model around one (`targetlm eval` gives a run's figures on valid and test)"
        )
    if streams is None:
        return
    if task.reads != ("stream" if streams else "pairs"):
        reads = "language-model (stream)" if streams else "sentence-pair"
        # a stream run given to translate: no hint; a masked LM's: eval reads it
        hint = {"pairs": " (use `targetlm translate` or `eval`)", "stream": ""}.get(
            task.reads, " (use `targetlm eval`)"
        )
        raise ConfigError(
            f"{where} is a {config.task.kind!r} {what}; this command reads {reads} runs{hint}"
        )


def configured_model(
    path: Path, overrides: Sequence[str] = (), streams: bool | None = True
) -> tuple[Config, Vocabulary, LanguageModel, dict]:
    """The model of a config file as built, before any training (a pretrained backbone as it
    was published; other models randomly initialised with ``train.seed``), with the
    vocabulary its task builds (``Task.vocabulary``; a stream task: its training split's):
    what ``targetlm eval CONFIG.toml`` scores."""
    from targetlm.tasks import build_task

    config = builders.load_config(path, list(overrides))
    check_task(config, streams, str(path), "config")
    vocab = build_task(config).vocabulary(config)
    device = available_device(config.train.device)
    torch.manual_seed(config.train.seed)
    model = build_model(config.model, vocab.itos).eval()
    return config, vocab, model.to(device), {}


def available_device(name: str) -> torch.device:
    """``name`` as a device, or the CPU (with a warning) when it names an absent GPU."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        warnings.warn(f"device {name!r} is not available here: using the CPU", stacklevel=3)
        return torch.device("cpu")
    return device
