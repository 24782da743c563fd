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
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
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
    """The carried state of :class:`HfEncoder`: the model's KV cache of the ``length`` columns
    read so far in the window, and their inputs (B, length, d, detached), from which the
    window is re-read when it slides. The cache is updated in place by the next read, so a
    state continues one stream once (as every caller reads it).

    Rows of their own lengths (after :meth:`HfEncoder.rewind_rows`, e.g. speculative decoding
    or prompts of different lengths): ``mask`` (B, length) says which cached columns each row
    reads (a row's dropped tokens stay in the cache as masked holes) and ``positions`` (B,)
    each row's next position. None for both: every row reads every column (one length).
    """

    cache: Any
    inputs: torch.Tensor
    length: int
    mask: torch.Tensor | None = None
    positions: torch.Tensor | None = None


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
        self._check_length(segment)
        if state is not None and state.mask is not None:
            return self._forward_ragged(x, state)
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
        window = inputs[:, -self.max_context :].detach()
        new_cache = out.cache if self._cache_keyword == "cache" else out.past_key_values
        return hidden, HfState(new_cache, window, past + x.size(1))

    def _forward_ragged(self, x: torch.Tensor, state: HfState):
        """Read ``x`` (B, T, d) after rows of their own lengths: each row attends to its own
        cached columns (``state.mask``) and the new ones, at its own positions."""
        assert state.mask is not None and state.positions is not None
        segment = x.size(1)
        if state.length + segment > self.max_context or not self.kv_cache:
            state = self._compact(state)  # the holes go first
        if state.length + segment > self.max_context or not self.kv_cache:
            return self._reread(x, state)
        assert state.mask is not None and state.positions is not None
        new = torch.ones(x.size(0), segment, dtype=torch.bool, device=x.device)
        mask = torch.cat([state.mask, new], 1)
        positions = state.positions[:, None] + torch.arange(segment, device=x.device)
        hidden, cache = self._read_masked(x, positions, mask, state.cache)
        inputs = torch.cat([state.inputs, x.detach()], 1)
        return hidden, HfState(cache, inputs, state.length + segment, mask, positions[:, -1] + 1)

    def _read_masked(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache):
        """The body over ``x`` (B, T, d) at ``positions`` (B, T), each row attending to the
        columns ``mask`` (B, cached + T) marks, after ``cache``: (hidden, the updated cache)."""
        out = self.body(
            inputs_embeds=x,
            position_ids=positions,
            attention_mask=mask.long(),
            use_cache=True,
            **{self._cache_keyword: cache},
        )
        cache = out.cache if self._cache_keyword == "cache" else out.past_key_values
        return out.last_hidden_state, cache

    def _compact(self, state: HfState) -> HfState:
        """``state`` without the columns no row reads: each row's columns moved to the front,
        in order, the shorter rows' ends masked (the keys carry their positions already)."""
        assert state.mask is not None
        counts = state.mask.sum(1)  # (B,)
        width = int(counts.max())
        if width == state.length:
            return state
        # each row's read columns first (a stable sort of the masked-out ones to the back)
        order = torch.argsort((~state.mask).to(torch.uint8), dim=1, stable=True)[:, :width]
        for layer in state.cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.size(1), -1, layer.keys.size(3))
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        inputs = state.inputs.gather(1, order[..., None].expand(-1, -1, state.inputs.size(2)))
        mask = torch.arange(width, device=counts.device) < counts[:, None]
        return HfState(state.cache, inputs, width, mask, state.positions)

    def _reread(self, x: torch.Tensor, state: HfState):
        """The sliding window of rows of their own lengths: each row's last ``max_context − T``
        tokens (of those it reads) read again from position 0, the shorter rows' ends masked."""
        assert state.mask is not None
        segment = x.size(1)
        keep = self.max_context - segment
        rows = [state.inputs[b, state.mask[b]][-keep:] if keep else x[b, :0] for b in range(len(x))]
        width = max(len(r) for r in rows)
        history = torch.stack([F.pad(r, (0, 0, 0, width - len(r))) for r in rows])
        counts = torch.tensor([len(r) for r in rows], device=x.device)
        columns = torch.arange(width, device=x.device)
        mask = torch.cat([columns < counts[:, None], x.new_ones(x.shape[:2], dtype=torch.bool)], 1)
        after = counts[:, None] + torch.arange(segment, device=x.device)
        positions = torch.cat(
            [torch.minimum(columns, counts[:, None] - 1).clamp(min=0).expand(len(x), -1), after], 1
        )
        inputs = torch.cat([history, x.detach()], 1)
        hidden, cache = self._read_masked(inputs, positions, mask, None)
        hidden = hidden[:, -segment:]
        return hidden, HfState(cache, inputs, inputs.size(1), mask, after[:, -1] + 1)

    def rewind(self, state: HfState, n: int) -> HfState | None:
        """The state as if the last ``n`` tokens had not been read (the cache cropped in place).

        The cache is the model's own object, updated in place by every read, so an earlier
        state cannot be read again: a cache with sliding-window layers, which cannot give back
        what they dropped, is an error rather than None (re-reading from a saved state).
        """
        if n <= 0:
            return state
        if state.mask is not None:
            counts = torch.full((state.inputs.size(0),), n, device=state.inputs.device)
            return self.rewind_rows(state, counts)
        if n > state.length:
            raise ValueError(f"cannot rewind {n} tokens of a window of {state.length}")
        self._check_croppable(state)
        state.cache.crop(-n)  # transformers >= 5: a negative count removes tokens
        return HfState(state.cache, state.inputs[:, : state.length - n], state.length - n)

    def rewind_rows(self, state: HfState | None, counts: torch.Tensor) -> HfState | None:
        """The state as if row b had not read its last ``counts[b]`` tokens ((B,) long), or
        None where a row would keep none. The tokens all rows drop are cropped from the
        cache; the others stay in it as holes that their row no longer reads."""
        if state is None:
            return None
        counts = counts.to(device=state.inputs.device, dtype=torch.long)
        if state.mask is None:
            if bool((counts == counts[0]).all()):
                return self.rewind(state, int(counts[0])) if int(counts[0]) < state.length else None
            ones = torch.ones(state.inputs.shape[:2], dtype=torch.bool, device=counts.device)
            state = HfState(
                state.cache, state.inputs, state.length, ones, torch.full_like(counts, state.length)
            )
        assert state.mask is not None and state.positions is not None
        positions = state.positions - counts
        if bool((positions < 1).any()):
            return None
        self._check_croppable(state)
        common = int(counts.min())  # the last columns no row reads any more
        if common:
            state.cache.crop(-common)
        width = state.length - common
        mask = state.mask[:, :width].clone()
        # a row's last counts[b] − common read columns: those with at most that many after them
        after = mask.flip(1).cumsum(1).flip(1)  # read columns from each column to the end
        mask &= after > (counts - common)[:, None]
        return HfState(state.cache, state.inputs[:, :width], width, mask, positions)

    @staticmethod
    def _check_croppable(state: HfState) -> None:
        if any(getattr(state.cache, "is_sliding", ())):
            raise ValueError("a KV cache with sliding-window layers cannot be rewound")

    def select_rows(self, state: HfState | None, rows: torch.Tensor) -> HfState | None:
        """The state of batch rows ``rows`` (B',) only, in that order (the cache is the
        model's own object: selected in place, so ``state`` is used up)."""
        if state is None:
            return None
        state.cache.batch_select_indices(rows)
        return HfState(
            state.cache,
            state.inputs[rows],
            state.length,
            None if state.mask is None else state.mask[rows],
            None if state.positions is None else state.positions[rows],
        )


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


# written beside the exported weights: what plain transformers must do to see what targetlm saw
EXPORT_NOTE = """# Exported by targetlm

`AutoModelForCausalLM.from_pretrained(this_directory)` loads the fine-tuned backbone.

targetlm reads every text as lines, each ended by a line end, and conditions the first token on
a line end before it: to get the next-token distributions targetlm trained and evaluated, start
each prompt with a line end ("\\n" + prompt) when you tokenize it for plain transformers. Without
it the model continues from a different context and generates different text.

`heads.safetensors` holds the N-gram heads (metadata: their kind and N), read by targetlm.
"""


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

    def write(staging: Path) -> None:
        pretrained.save_pretrained(staging)
        if tokenizer_dir is not None:
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                if (tokenizer_dir / name).is_file():
                    shutil.copyfile(tokenizer_dir / name, staging / name)
        (staging / "TARGETLM.md").write_text(EXPORT_NOTE, encoding="utf-8")
        if isinstance(model.heads, NgramHeads):
            heads = {k: v.contiguous() for k, v in model.heads.state_dict().items()}
            kind, n = type(model.heads).__name__, str(model.heads.num_predictions)
            save_file(heads, str(staging / "heads.safetensors"), metadata={"kind": kind, "n": n})

    write_export(Path(target), replace, write)


def write_export(target: Path, replace: bool, write: Callable[[Path], None]) -> None:
    """``write(staging)`` into a temporary directory beside ``target``, then renamed into
    place: a failed or killed export leaves ``target`` as it was. ``replace``: an existing
    non-empty ``target`` is replaced (else refused). The directory gets the mode ``mkdir``
    would give it (``0o777`` less the umask), not ``mkdtemp``'s ``0o700``."""
    recover_export(target)
    if target.exists() and any(target.iterdir()) and not replace:
        raise ConfigError(f"export: {target} exists and is not empty")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
        staging = Path(tmp) / "export"
        staging.mkdir()  # the umask's mode
        try:
            write(staging)
        except Exception as error:  # a full disk: OSError, or safetensors' own error
            reason = _disk_full_reason(error)
            if reason is None:
                raise
            raise ConfigError(f"export: {reason} writing {target}; nothing was replaced") from None
        # the old directory moves aside (into the temporary one, removed with it), then the new
        # one into place: a kill between the two renames leaves both here, and the next export
        # to the same output finishes the replacement first (recover_export)
        if target.exists():
            target.rename(Path(tmp) / "replaced")
        staging.rename(target)


def recover_export(target: Path) -> None:
    """Finish or clear what an export to ``target`` cut short left beside it (its
    ``.NAME-*`` temporary directories): a replacement killed between its two renames (the old
    export moved aside, the new one complete and not yet in place) is completed; anything
    else (a copy cut while it was written, a replaced directory not yet removed) is removed."""
    target = Path(target)
    for leftover in sorted(target.parent.glob(f".{target.name}-*")):
        if not leftover.is_dir() or leftover.is_symlink():
            continue
        staged, replaced = leftover / "export", leftover / "replaced"
        if not target.exists() and replaced.is_dir() and staged.is_dir():
            staged.rename(target)  # written whole before the old one was moved aside
        shutil.rmtree(leftover, ignore_errors=True)


def _disk_full_reason(error: BaseException) -> str | None:
    """What a full disk or quota reads as in ``error`` (an OSError, or safetensors' error that
    carries the OS error number in its message), or None when it is something else."""
    from targetlm.files import DiskFullError, disk_full

    code = disk_full(error) if isinstance(error, OSError) else None
    if code is None:
        match = re.search(r"os error (\d+)", str(error))
        code = disk_full(OSError(int(match.group(1)), str(error))) if match else None
    return str(DiskFullError(code, "").strerror) if code else None
