r"""A run's drafting heads in the formats a serving engine loads beside its verifier.

``targetlm export RUN --output DIR --format speculators`` (or ``medusa``) writes DIR with
``config.json`` and ``model.safetensors`` and nothing else; the verifier (the body the heads
draft for) is named in the config and served from its own directory or Hugging Face id.

``speculators`` (the format of the ``speculators`` package, which vLLM loads for speculative
decoding): the ``eagle`` heads (:class:`~targetlm.modules.eagle.EagleHead`) as its Eagle3
model, tensor for tensor::

    fc, layers.0.*, norm       the head's own (the same names)
    input_norm                 the body's final RMSNorm (norm_before_fc): the head reads
                               x̂ = RMSNorm(h_L), the body's last layer's state h_L (layer
                               id num_hidden_layers) normalised as the body normalises it
    embed_tokens               E_out, the word vectors the head reads (the body's output rows)
    lm_head                    E_out's rows of the draft vocabulary
    d2t, t2d                   the reduced draft vocabulary (FR-Spec), when the head has one

and the draft layer as a one-layer Llama config (``transformer_layer_config``). What the
format cannot say: the head's attention covers the last ``window`` columns of the text, the
Eagle3 model the whole prefix, so drafts agree wherever the text read is at most ``window``
tokens and differ after (drafts only: the verifier keeps the output exact).

``medusa``: the ``medusa`` heads in vLLM's Medusa layout (``blocks.{h}.layers.{l}`` with
biases, ``lm_heads.0`` the body's output layer shared by every head: ``original_lm_head``).

Not exported: the ``mtp`` heads. speculators' MTP model is one Qwen3 decoder layer (RMSNorm,
SwiGLU, rotary positions and q/k norms, full causal attention) applied at every step, while
the ``mtp`` kind has a block of its own per depth (LayerNorm, GELU, biases, no positions, a
window): no weights of that layer compute what the ``mtp`` blocks compute. The N-gram kinds
(``simple``, ``wdr``, ``gloeckle``) have no form there either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from targetlm.modules.eagle import EagleHead, EagleLayer
from targetlm.modules.heads import MedusaHeads, NgramHeads, ResBlock, SequentialMtpHeads
from targetlm.modules.hf import HfEncoder, write_export
from targetlm.registry import ConfigError

if TYPE_CHECKING:
    from targetlm.modules.model import LanguageModel

__all__ = ["SERVING_FORMATS", "draft_checkpoint", "export_drafter", "same_weights"]

SERVING_FORMATS = ("speculators", "medusa")
SPECULATORS_VERSION = "0.9.0"  # the release whose Eagle3 model the export is tested against


def _heads(model: LanguageModel, form: str) -> NgramHeads:
    heads = getattr(model, "heads", None)
    if not isinstance(heads, NgramHeads) or heads.num_predictions < 2:
        raise ConfigError(
            f"export --format {form}: the run has no drafting heads (model.heads.kind = 'none' "
            "or n = 1); train some with targetlm train-heads"
        )
    return heads


def _kind(heads: NgramHeads) -> str:
    from targetlm.modules.heads import HEADS

    for name in HEADS.names():
        if type(heads) is HEADS.get(name):
            return name
    return type(heads).__name__


def _body(model: LanguageModel, form: str) -> HfEncoder:
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, HfEncoder):
        raise ConfigError(
            f"export --format {form}: the run has no hf backbone (model.backbone.kind = 'hf'): "
            "a serving engine drafts for a Hugging Face verifier"
        )
    return encoder


def _output(model: LanguageModel, form: str) -> torch.Tensor:
    weight, bias = model.output()
    if bias is not None:
        raise ConfigError(
            f"export --format {form}: the body's output layer has a bias, which the format's "
            "lm_head has not"
        )
    return weight.detach()


def _final_norm(encoder: HfEncoder) -> torch.Tensor:
    """The body's final norm weight, when it is an RMSNorm (Llama-like bodies)."""
    norm = getattr(encoder.body, "norm", None)
    weight = getattr(norm, "weight", None)
    if (
        norm is None
        or not isinstance(weight, torch.Tensor)
        or getattr(norm, "bias", None) is not None
    ):
        raise ConfigError(
            "export --format speculators: the eagle heads read x̂ = RMSNorm(h_L), so the body's "
            "final norm must be an RMSNorm (a Llama-like body); this body's is "
            f"{type(norm).__name__}"
        )
    return weight.detach()


def _verifier_entry(verifier: str, architectures: list[str]) -> dict[str, Any]:
    return {"name_or_path": verifier, "architectures": architectures}


def _eagle_checkpoint(
    model: LanguageModel, heads: EagleHead, verifier: str, architectures: list[str]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    encoder = _body(model, "speculators")
    weight = _output(model, "speculators")
    vocab, d = weight.shape
    body_config = encoder.body.config
    layer = heads.layers[0]
    assert isinstance(layer, EagleLayer)
    attention = layer.self_attn
    ids = heads.draft_ids(vocab)  # an error when the draft vocabulary does not fit
    tensors = {
        name: value.detach()
        for name, value in heads.state_dict().items()
        if name != "d2t"  # written below, with t2d, only for a reduced vocabulary
    }
    tensors["input_norm.weight"] = _final_norm(encoder)
    tensors["embed_tokens.weight"] = weight
    tensors["lm_head.weight"] = weight if ids is None else weight[ids]
    if ids is not None:
        tensors["d2t"] = ids - torch.arange(ids.numel(), device=ids.device)
        tensors["t2d"] = heads.target_mask(vocab)
    layer_config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": d,
        "intermediate_size": layer.mlp.gate_proj.out_features,
        "num_hidden_layers": 1,
        "num_attention_heads": attention.heads,
        "num_key_value_heads": attention.kv_heads,
        "head_dim": attention.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": layer.input_layernorm.eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": heads.rope_theta},
        "rope_theta": heads.rope_theta,
        "max_position_embeddings": encoder.max_context + heads.num_predictions,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer_config,
        "draft_vocab_size": vocab if ids is None else int(ids.numel()),
        "norm_before_residual": False,
        "norm_before_fc": True,
        "fc_norm": False,
        "norm_output": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [int(body_config.num_hidden_layers)],
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": heads.num_predictions - 1}
            ],
            "default_proposal_method": "greedy",
            "verifier": _verifier_entry(verifier, architectures),
        },
        "dtype": "float32",
        "targetlm": {"heads": "eagle", "window": heads.window},
    }
    return config, tensors


def _medusa_checkpoint(
    model: LanguageModel, heads: MedusaHeads, verifier: str, architectures: list[str]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    _body(model, "medusa")
    weight = _output(model, "medusa")
    vocab, d = weight.shape
    tensors: dict[str, torch.Tensor] = {"lm_heads.0.weight": weight}
    layers = 0
    for h, blocks in enumerate(heads.mlps):
        assert isinstance(blocks, nn.Sequential)
        layers = len(blocks)
        for index, block in enumerate(blocks):
            assert isinstance(block, ResBlock)
            linear = block.linear
            tensors[f"blocks.{h}.layers.{index}.weight"] = linear.weight.detach()
            tensors[f"blocks.{h}.layers.{index}.bias"] = linear.bias.detach()
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": d,
        "vocab_size": vocab,
        "num_heads": heads.num_predictions - 1,
        "num_hidden_layers": layers,
        "truncated_vocab_size": vocab,
        "medusa_fc_bias": True,
        "original_lm_head": True,
        "max_paths": 64,
        "topk": 10,
        "verifier": _verifier_entry(verifier, architectures),
        "dtype": "float32",
    }
    return config, tensors


def draft_checkpoint(
    model: LanguageModel, form: str, verifier: str, architectures: list[str]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``config.json`` (a dict) and the tensors of ``model.safetensors`` for the heads of
    ``model`` (a :class:`~targetlm.modules.model.LanguageModel` with an hf backbone) in the
    serving format ``form``; ``verifier``: the verifier's Hugging Face id or directory, and
    ``architectures`` its ``config.json``'s. A ConfigError (one line) when the run's heads
    have no form there."""
    if form not in SERVING_FORMATS:
        raise ConfigError(
            f"export: unknown --format {form!r} (known: hf, {', '.join(SERVING_FORMATS)})"
        )
    _body(model, form)
    heads = _heads(model, form)
    kind = _kind(heads)
    if form == "medusa":
        if not isinstance(heads, MedusaHeads):
            raise ConfigError(
                f"export --format medusa: the run's heads are {kind!r}; vLLM's Medusa layout "
                "holds medusa heads (eagle heads: --format speculators)"
            )
        return _medusa_checkpoint(model, heads, verifier, architectures)
    if isinstance(heads, EagleHead):
        return _eagle_checkpoint(model, heads, verifier, architectures)
    if isinstance(heads, SequentialMtpHeads):
        raise ConfigError(
            "export --format speculators: the mtp heads have no exact form there: speculators' "
            "MTP model is one Qwen3 decoder layer (RMSNorm, SwiGLU, rotary positions) reused at "
            "every step, the mtp kind one LayerNorm/GELU block per depth without positions; "
            "train eagle heads (model.heads.kind = 'eagle') to serve them"
        )
    hint = " (medusa heads: --format medusa)" if isinstance(heads, MedusaHeads) else ""
    raise ConfigError(
        f"export --format speculators: the run's heads are {kind!r}, which speculators has no "
        f"model for; it loads eagle heads{hint}"
    )


def same_weights(model: LanguageModel, directory: Path) -> bool:
    """Whether the safetensors weights in ``directory`` (a ``save_pretrained`` model) are the
    run's backbone's, tensor for tensor (a tied output layer saved once)."""
    from safetensors import safe_open

    # model.safetensors or its shards (not heads.safetensors beside a targetlm export)
    files = sorted(Path(directory).glob("model*.safetensors"))
    if not files:
        return False
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, HfEncoder):
        return False
    state = encoder.pretrained[0].state_dict()
    seen = 0
    for file in files:
        with safe_open(str(file), framework="pt") as stored:
            for key in stored.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                ours = state.get(key)
                theirs = stored.get_tensor(key)
                if ours is None or ours.shape != theirs.shape:
                    return False
                if not torch.equal(ours.detach().cpu().to(theirs.dtype), theirs):
                    return False
                seen += 1
    return seen > 0


def export_drafter(
    model: LanguageModel,
    form: str,
    verifier: str,
    architectures: list[str],
    target: Path,
    replace: bool = False,
) -> dict[str, Any]:
    """Write the heads of ``model`` in ``form`` to ``target`` (``config.json`` and
    ``model.safetensors``), atomically; returns the config written. Every check runs before
    anything is written."""
    from safetensors.torch import save_file

    config, tensors = draft_checkpoint(model, form, verifier, architectures)
    # one copy each: safetensors refuses tensors that share memory (embed_tokens and lm_head)
    contiguous = {name: value.detach().cpu().clone() for name, value in tensors.items()}

    def write(staging: Path) -> None:
        save_file(contiguous, str(staging / "model.safetensors"), metadata={"format": "pt"})
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        (staging / "config.json").write_text(text, encoding="utf-8")

    write_export(Path(target), replace, write)
    return config
