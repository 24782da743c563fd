"""A pretrained Hugging Face causal LM as the model's backbone (``model.backbone.kind = "hf"``).

One ``transformers`` causal LM supplies three parts of the targetlm pipeline, so every head,
objective and combiner works on it unchanged::

    AutoModelForCausalLM
      get_input_embeddings()    -> HfEmbedding  (an EmbeddingTable: table() is E_in)
      base_model (the stack)    -> HfEncoder    (forward(x, state): inputs_embeds, KV cache)
      lm_head (tied or not)     -> HfOutput     (E_out = lm_head.weight, b = lm_head.bias)

The encoder's state is the model's own KV cache (a ``transformers`` Cache), so streams,
sliding-window evaluation and generation use the same contract as the other encoders.
``path`` names a local model directory (``save_pretrained``), or a known name such as
``smollm2-135m`` (:data:`targetlm.pretrained.PRETRAINED`: a GGUF file shipped in a PyPI
package, converted once to a float32 directory in the user cache). ``config`` builds a randomly initialised model from
a ``transformers`` config instead (tests, and training from scratch with an HF architecture).

``transformers`` is optional (``pip install -e '.[hf]'``); without it an ``hf`` config fails
with one line saying what to install.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from targetlm.modules.encoders import Encoder
from targetlm.modules.heads import NgramHeads
from targetlm.modules.outputs import OutputLayer
from targetlm.pretrained import require_transformers, resolve
from targetlm.registry import ConfigError, Registry, Size

BACKBONES: Registry[Any] = Registry("backbone", context=("vocab_size",))


class HfEmbedding(nn.Module):
    """The pretrained model's token embedding (its ``get_input_embeddings()``)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.size = embedding.embedding_dim

    def table(self) -> torch.Tensor:
        return self.embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding(tokens)


@dataclass
class HfState:
    """The carried state of :class:`HfEncoder`: the model's KV cache of the ``length`` tokens
    read so far in the window, and their inputs (B, ≤ max_context − 1, d, detached), from
    which the window is re-read when it slides. The cache is updated in place by the next
    read, so a state continues one stream once (as every caller reads it)."""

    cache: Any
    inputs: torch.Tensor
    length: int


class HfEncoder(Encoder):
    """The pretrained decoder stack: ``forward(x, state)`` with ``x`` the embedded tokens.

    In evaluation and generation the state is the model's KV cache, so a segment attends to
    the cached keys and values of the tokens before it; positions count from the window's
    start. When a segment would pass ``max_context`` the window slides: the last
    ``max_context − T`` inputs are read again with positions from 0 (exactly what
    :class:`~targetlm.modules.encoders.CausalTransformer` does for every segment). Training
    reads independent blocks (``train.carry_state = false``): no cache is kept.
    """

    max_context: int  # bounded: the model's positions, or fewer
    pretrained: list[Any]  # the whole transformers model, set by HfBackbone (for export)

    def __init__(self, body: Any, max_context: int) -> None:
        """``body``: the transformers model's base model (an ``nn.Module``)."""
        super().__init__()
        self.body = body
        self.output_size = body.config.hidden_size
        self.max_context = max_context
        self.kv_cache = True  # False: every segment re-reads its window (benchmarks/generate.py)
        # the KV cache's keyword: `cache` in current transformers (which warn on the older
        # `past_key_values` on every call), `past_key_values` before it was renamed
        parameters = inspect.signature(body.forward).parameters
        self._cache_keyword = "cache" if "cache" in parameters else "past_key_values"

    def forward(self, x: torch.Tensor, state: HfState | None = None):
        segment = x.size(1)
        if segment > self.max_context:
            raise ValueError(f"segment of {segment} tokens exceeds max_context {self.max_context}")
        cache, past = (None, 0) if state is None else (state.cache, state.length)
        inputs = x if state is None else torch.cat([state.inputs, x.detach()], 1)
        if past + segment > self.max_context or (past and not self.kv_cache):
            # the window slides (or no cache is wanted): read it again from position 0
            x = inputs[:, max(inputs.size(1) - self.max_context, 0) :]
            cache, past = None, 0
        use_cache = not self.training
        positions = torch.arange(past, past + x.size(1), device=x.device).expand(x.size(0), -1)
        out = self.body(
            inputs_embeds=x,
            position_ids=positions,
            use_cache=use_cache,
            **{self._cache_keyword: cache},
        )
        hidden = out.last_hidden_state[:, -segment:]
        if not use_cache:
            return hidden, None
        window = (
            inputs[:, -(self.max_context - 1) :].detach() if self.max_context > 1 else inputs[:, :0]
        )
        new_cache = out.cache if self._cache_keyword == "cache" else out.past_key_values
        return hidden, HfState(new_cache, window, past + x.size(1))

    def rewind(self, state: HfState, n: int) -> HfState | None:
        """The state as if the last ``n`` tokens had not been read (the cache cropped in place).

        The cache is the model's own object, updated in place by every read, so an earlier
        state cannot be read again: a cache with sliding-window layers, which cannot give back
        what they dropped, is an error rather than None (re-reading from a saved state).
        """
        if n <= 0:
            return state
        if n > state.length:
            raise ValueError(f"cannot rewind {n} tokens of a window of {state.length}")
        if any(getattr(state.cache, "is_sliding", ())):
            raise ValueError("a KV cache with sliding-window layers cannot be rewound")
        state.cache.crop(-n)  # transformers >= 5: a negative count removes tokens
        inputs = state.inputs[:, : max(state.inputs.size(1) - n, 0)]
        return HfState(state.cache, inputs, state.length - n)

    def select_rows(self, state: HfState | None, rows: torch.Tensor) -> HfState | None:
        """The state of batch rows ``rows`` (B',) only, in that order (the cache is the
        model's own object: selected in place, so ``state`` is used up). Every row keeps the
        same length: the model's cache has one length for all rows, so speculative decoding
        advances an hf backbone's rows by the smallest accepted length among them."""
        if state is None:
            return None
        state.cache.batch_select_indices(rows)
        return HfState(state.cache, state.inputs[rows], state.length)


class HfOutput(OutputLayer):
    """The pretrained ``lm_head``: ``E_out`` is its weight (the input embedding when the model
    ties them), ``b`` its bias (None for most models)."""

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.head = head
        self.embedding_dim = head.in_features

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.head.weight, self.head.bias


@BACKBONES.register("hf")
class HfBackbone:
    """Builds the three parts from one ``transformers`` causal LM.

    Args:
        vocab_size: the run's vocabulary size (supplied by the builder): the model's tokenizer
            padded to its embedding rows (``data.tokenizer = "hf"``).
        path: a model directory or a name of :data:`~targetlm.pretrained.PRETRAINED` (e.g. ``"smollm2-135m"``).
        config: instead of ``path``, a ``transformers`` config as a table (``model_type`` and
            its fields): a randomly initialised model (seeded by ``train.seed``).
        max_context: the longest window (default: the model's ``max_position_embeddings``).

    On the meta device (``targetlm.builders.validate``) only the architecture is built.
    """

    def __init__(
        self,
        vocab_size: int,
        path: str | None = None,
        config: dict[str, Any] | None = None,
        max_context: Size | None = None,
    ) -> None:
        if (path is None) == (config is None):
            raise ValueError("set exactly one of path (a pretrained model) and config")
        transformers = require_transformers()
        meta = torch.empty(0).device.type == "meta"
        self.model: PretrainedModel
        if config is not None:
            model_config = _config_from_table(transformers, config)
            self.model = _from_config(transformers, model_config, "model.backbone.config")
        elif path is not None:
            directory = resolve(path)
            model_config = transformers.AutoConfig.from_pretrained(directory)
            if meta:
                self.model = _from_config(transformers, model_config, "model.backbone.path")
            else:
                self.model = _pretrained(transformers, directory)
        rows = self.model.get_input_embeddings().num_embeddings
        if not meta and vocab_size != rows:
            raise ConfigError(
                f"the run's vocabulary has {vocab_size:,} symbols but the backbone has {rows:,} "
                "embedding rows: read the text with the model's own tokenizer "
                "(data.tokenizer = 'hf', data.tokenizer_file = the backbone's path)"
            )
        limit = getattr(self.model.config, "max_position_embeddings", None)
        context = max_context or limit
        if context is None or context < 1:
            raise ValueError("max_context: the model has no max_position_embeddings; set it")
        if limit is not None and context > limit:
            raise ValueError(f"max_context {context} exceeds the model's {limit} positions")
        head = self.model.get_output_embeddings()
        if head is None:
            raise ConfigError("model.backbone: the model has no output embeddings (lm_head)")
        self.embedding = HfEmbedding(self.model.get_input_embeddings())
        self.encoder = HfEncoder(self.model.base_model, context)
        self.encoder.pretrained = [self.model]  # the whole model (not a submodule): export
        self.output = HfOutput(head)


def _config_from_table(transformers: Any, table: dict[str, Any]) -> Any:
    options = dict(table)
    model_type = options.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ConfigError("model.backbone.config: needs model_type (e.g. 'llama', 'gpt_neo')")
    try:
        return transformers.AutoConfig.for_model(model_type, **options)
    except (ValueError, KeyError) as error:
        raise ConfigError(f"model.backbone.config: {error}") from None


# A transformers model is typed Any: transformers is an optional dependency, imported lazily
PretrainedModel = Any


def _from_config(transformers: Any, config: Any, key: str) -> PretrainedModel:
    try:
        return transformers.AutoModelForCausalLM.from_config(config)
    except ValueError:
        raise ConfigError(
            f"{key}: a {config.model_type!r} model is not a causal language model"
        ) from None


SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def _pretrained(transformers: Any, directory: Path) -> PretrainedModel:
    """The model of a ``save_pretrained`` directory, from safetensors weights only: a pickled
    ``pytorch_model.bin`` (which can run code when loaded) is refused before it is opened."""
    if not any((directory / name).is_file() for name in SAFETENSORS_WEIGHTS):
        pickled = [name for name in PICKLED_WEIGHTS if (directory / name).is_file()]
        found = (
            f"; {pickled[0]} is a pickle and is never loaded" if pickled else ": none found there"
        )
        raise ConfigError(
            f"{directory}: only safetensors weights are read (model.safetensors){found}"
        )
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32, use_safetensors=True
        )
    except ValueError as error:
        reason = (str(error).splitlines() or ["unreadable"])[0]
        raise ConfigError(
            f"model.backbone.path: {directory} is not a causal language model ({reason})"
        ) from None


def export(
    model: nn.Module, tokenizer_dir: Path | None, target: Path, replace: bool = False
) -> None:
    """Write the backbone as a plain Hugging Face directory (``save_pretrained``) with its
    tokenizer, and the N-gram heads beside it (``heads.safetensors``), atomically: built in a
    temporary directory beside ``target`` and renamed into place. ``replace``: an existing
    non-empty ``target`` is replaced (else refused). The directory gets the mode ``mkdir``
    would give it (``0o777`` less the umask), not ``mkdtemp``'s ``0o700``."""
    from safetensors.torch import save_file

    if not isinstance(model.encoder, HfEncoder):
        raise ConfigError("export: the run has no hf backbone (model.backbone.kind = 'hf')")
    pretrained = model.encoder.pretrained[0]
    target = Path(target)
    if target.exists() and any(target.iterdir()) and not replace:
        raise ConfigError(f"export: {target} exists and is not empty")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
        staging = Path(tmp) / "export"
        staging.mkdir()  # the umask's mode
        pretrained.save_pretrained(staging)
        if tokenizer_dir is not None:
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                if (tokenizer_dir / name).is_file():
                    shutil.copyfile(tokenizer_dir / name, staging / name)
        if isinstance(model.heads, NgramHeads):
            heads = {k: v.contiguous() for k, v in model.heads.state_dict().items()}
            metadata = {"kind": type(model.heads).__name__, "n": str(model.heads.num_predictions)}
            save_file(heads, str(staging / "heads.safetensors"), metadata=metadata)
        if (
            target.exists()
        ):  # empty, or replaced: moved into the temporary directory, removed with it
            target.rename(Path(tmp) / "replaced")
        staging.rename(target)
