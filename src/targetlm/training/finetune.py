"""Cross-domain finetuning (Pappas et al. 2020, §5.3): a trained run continues on new data
with its vocabulary extended by the new training words.

The source run's words keep their ids and the new words are appended
(:meth:`~targetlm.data.vocab.Vocabulary.extend`), so every vocabulary-dependent tensor of
the new model is the old one with rows added at the end::

    old model   embedding.weight (V, d)        output.bias (V,)      encoder.* ...
    new model   embedding.weight (V + n, d)    output.bias (V + n,)  encoder.* ...
                └─ rows 0..V−1 copied, rows V..V+n−1 freshly initialised   └─ copied

Compositional layers (char-CNN, GroC) have no such tensor: they embed the new words with
the weights they already have. A symbol tokenizer (bytes, BPE, unigram) has a fixed
inventory: the new text is read with the source run's tokenizer and adds no rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from targetlm import runs  # a module reference: runs imports targetlm.training too
from targetlm.checkpoint import CheckpointError
from targetlm.data.tokenizers import TOKENIZERS
from targetlm.data.vocab import Tokenizer, Vocabulary
from targetlm.modules.model import LanguageModel
from targetlm.registry import ConfigError


def source_of(run_dir: str) -> tuple[dict[str, torch.Tensor], Vocabulary, str]:
    """The model state and vocabulary of the run to finetune (its best checkpoint), and the
    checkpoint's path for messages."""
    checkpoint, vocab, path = runs.read_best(run_dir)
    return checkpoint["model"], vocab, str(path)


def reuse_tokenizer(source: dict[str, Any], config: dict[str, Any], source_dir: Path) -> None:
    """Make a finetuning config (TOML-shaped, changed in place) read its text with the source
    run's tokenizer: the same ``data.tokenizer`` and, for BPE / unigram, the source run's
    ``tokenizer.json`` as ``data.tokenizer_file``; for a pretrained model's (``hf``), the model
    it names."""
    kind = source.get("data", {}).get("tokenizer", "whitespace")
    data = config.setdefault("data", {})
    if data.get("tokenizer", kind) != kind:
        raise ConfigError(
            f"data.tokenizer: finetuning reads the new text with the source run's tokenizer "
            f"({kind!r}), not {data['tokenizer']!r}"
        )
    if kind == "hf":  # a pretrained model's own: read from the model (the backbone's path)
        data["tokenizer_file"] = source.get("data", {}).get("tokenizer_file")
        return
    entry = TOKENIZERS.get(kind)  # a Tokenizer class: its ``file`` is what a run keeps of it
    file = entry.file if isinstance(entry, type) and issubclass(entry, Tokenizer) else None
    if file is not None:
        data["tokenizer_file"] = str(Path(source_dir) / file)


@torch.no_grad()
def transfer_weights(
    model: LanguageModel, state: dict[str, torch.Tensor], added_words: int, where: str
) -> dict[str, str]:
    """Copy a source model's ``state`` into ``model``, built for the source vocabulary plus
    ``added_words`` words appended at the end.

    A tensor of the same shape is copied; one whose first dimension grew by exactly
    ``added_words`` (the rest equal) is vocabulary-dependent: its old rows are copied and
    the new rows keep the model's fresh initialisation. Anything else is an error.
    Returns ``{name: "copied" | "extended"}``.
    """
    target = model.state_dict()  # tensors that share storage with the model's
    missing, unexpected = target.keys() - state.keys(), state.keys() - target.keys()
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: the new model's tensors differ from the source run's "
            f"(missing: {', '.join(sorted(missing)) or '-'}; "
            f"unexpected: {', '.join(sorted(unexpected)) or '-'}); finetuning may change the "
            "data and training settings, not the model, and new words may only add rows"
        )
    done = {}
    for name, tensor in target.items():
        old = state[name]
        if old.shape == tensor.shape:
            tensor.copy_(old)
            done[name] = "copied"
        elif (
            added_words
            and old.dim() >= 1
            and old.shape[1:] == tensor.shape[1:]
            and tensor.size(0) - old.size(0) == added_words
        ):
            tensor[: old.size(0)].copy_(old)  # the new words' rows stay freshly initialised
            done[name] = "extended"
        else:
            raise CheckpointError(
                f"{where}: {name} has shape {tuple(old.shape)} in the source run and "
                f"{tuple(tensor.shape)} here, which is not the source's with "
                f"{added_words} new words' rows appended"
            )
    return done
