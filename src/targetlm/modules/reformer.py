"""The Reformer (Kitaev et al. 2020) as an encoder kind, through ``reformer-pytorch``.

Heo et al. (2024) trained their Reformer baselines with Phil Wang's ``reformer-pytorch``
(``lucidrains/reformer-pytorch``); this module wraps that package's ``Reformer`` stack (LSH
self-attention with shared queries and keys, reversible residual layers, chunked
feed-forward, rotary positions as ``ReformerLM`` applies them by default) to the
:class:`~targetlm.modules.encoders.Encoder` contract, so heads, objectives, output layers
and combiners work on it unchanged. The package is an optional extra
(``pip install -e ".[reformer]"``, or ``scripts/setup.sh --reformer``).

What the wrapper adds to the package:

* The state: like :class:`~targetlm.modules.encoders.CausalTransformer`, the last
  ``max_context - 1`` inputs (detached); each segment is encoded with that window before it.
* Lengths: LSH attention needs a window of a multiple of ``2 * bucket_size`` positions; the
  window is padded after its last position (causal masking keeps every real position from
  attending to the padding) and the padding's outputs are dropped.
* Evaluation: LSH attention draws fresh random rotations at every call and the positions a
  query may attend to depend on how the whole window (later positions included) falls into
  buckets, so with LSH an output is neither repeatable nor a function of its prefix alone.
  In eval mode (``eval_attention = "full"``, the default) every query attends to all earlier
  positions with the same shared-QK attention (normalised keys, rotary positions, a query
  attends to itself only when nothing else is there): the exact attention LSH approximates
  (Kitaev et al. §3), so evaluation, scoring and generation are deterministic and causal.
  ``eval_attention = "lsh"`` keeps the package's own LSH attention in eval mode as well.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.modules.encoders import ENCODERS, WindowEncoder
from targetlm.registry import ConfigError, Fraction, Size

INSTALL = (
    'pip install -e ".[reformer]" (reformer-pytorch 1.4.4 and its small dependencies; '
    "scripts/setup.sh --reformer installs them without touching torch)"
)


def require_reformer():
    """The ``reformer_pytorch.reformer_pytorch`` module, or one ConfigError saying what to
    install."""
    try:
        from reformer_pytorch import reformer_pytorch
    except ImportError as error:
        raise ConfigError(
            f"model.encoder.kind = 'reformer' needs reformer-pytorch ({error}): {INSTALL}"
        ) from None
    return reformer_pytorch


def missing() -> str | None:
    """Why ``model.encoder.kind = 'reformer'`` cannot be built here (the ConfigError of
    :func:`require_reformer`); None: reformer-pytorch imports."""
    try:
        require_reformer()
    except ConfigError as error:
        return str(error)
    return None


class CausalSharedQkAttention(nn.Module):
    """Full causal shared-QK attention, the limit of the package's LSH attention.

    Takes the arguments the package's ``LSHAttention`` takes: ``qk`` and ``v``
    (B·heads, L, head_size), ``query_len`` and the rotary ``pos_emb`` (1, L, head_size).
    Queries are the rotated ``qk``, keys the same vectors normalised (as LSH attention forms
    them); the scores are scaled by head_size^-1/2; position i attends to positions ≤ i, to
    itself only with the package's self-attention score (-5e4), used when nothing else is
    visible. Returns (output (B·heads, query_len, head_size), weights, an empty tensor).
    """

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, qk, v, query_len=None, pos_emb=None, **_ignored):
        module = require_reformer()
        if pos_emb is not None:
            qk = module.apply_rotary_pos_emb(qk, pos_emb)
        length = qk.size(1)
        query_len = length if query_len is None else query_len
        queries = qk[:, :query_len]
        keys = F.normalize(qk, p=2, dim=-1).type_as(queries)
        scores = torch.einsum("bie,bje->bij", queries, keys) * qk.size(-1) ** -0.5
        rows = torch.arange(query_len, device=qk.device)[:, None]
        columns = torch.arange(length, device=qk.device)
        scores = scores.masked_fill(rows == columns, module.TOKEN_SELF_ATTN_VALUE)
        scores = scores.masked_fill(columns > rows, -torch.finfo(scores.dtype).max)
        weights = self.dropout(scores.softmax(-1))
        return torch.einsum("bij,bje->bie", weights, v), weights, torch.empty(0)


@ENCODERS.register("reformer")
class ReformerEncoder(WindowEncoder):
    """Causal Reformer stack of ``reformer-pytorch`` (LSH attention, reversible layers).

    The defaults are the package's enwik8 example, which Heo et al. (2024) trained with their
    Table 5 changes: width 512, 6 layers sharing one set of weights (``share_layers``; the
    package's ``weight_tie``), 8 heads of 64, buckets of 64, 4 hashing rounds, LSH dropout 0.1.

    Args:
        input_size: embedding size (supplied by the builder); a linear map to
            ``model_size`` is added when they differ (the package's ``to_model_dim``).
        model_size: width of the residual stream (each reversible half).
        num_layers / num_heads / head_size: depth, heads, width of a head.
        bucket_size / num_hashes: LSH bucket size and hashing rounds.
        ff_multiplier: feed-forward width as a multiple of model_size.
        ff_chunks: the feed-forward runs over this many chunks of positions (memory only).
        share_layers: every layer uses the same attention and feed-forward weights.
        lsh_dropout: dropout on the attention weights; ff_dropout: inside the feed-forward;
        layer_dropout: drop whole layers in training (the package's LayerDrop).
        max_context: the longest window (a segment may not be longer).
        eval_attention: ``full`` (exact causal attention in eval mode) or ``lsh``.
    """

    def __init__(
        self,
        input_size: int,
        model_size: Size = 512,
        num_layers: Size = 6,
        num_heads: Size = 8,
        head_size: Size = 64,
        bucket_size: Size = 64,
        num_hashes: Size = 4,
        ff_multiplier: Size = 4,
        ff_chunks: Size = 10,
        share_layers: bool = True,
        lsh_dropout: Fraction = 0.1,
        ff_dropout: Fraction = 0.0,
        layer_dropout: Fraction = 0.0,
        max_context: Size = 4096,
        eval_attention: Literal["full", "lsh"] = "full",
    ) -> None:
        super().__init__()
        if eval_attention not in ("full", "lsh"):
            raise ValueError(f"eval_attention must be 'full' or 'lsh', got {eval_attention!r}")
        if head_size % 2:
            raise ValueError(f"head_size must be even (rotary positions), got {head_size}")
        module = require_reformer()
        self.output_size = model_size
        self.max_context = max_context
        self.bucket_size = bucket_size
        self.eval_attention = eval_attention
        self.input_map = (
            nn.Linear(input_size, model_size) if input_size != model_size else nn.Identity()
        )
        self.positions = module.FixedPositionalEmbedding(head_size)  # rotary, per head
        self.reformer = module.Reformer(
            model_size,
            num_layers,
            heads=num_heads,
            dim_head=head_size,
            bucket_size=bucket_size,
            n_hashes=num_hashes,
            ff_chunks=ff_chunks,
            causal=True,
            weight_tie=share_layers,
            lsh_dropout=lsh_dropout,
            ff_dropout=ff_dropout,
            ff_mult=ff_multiplier,
            layer_dropout=layer_dropout,
        )
        self.norm = nn.LayerNorm(model_size)
        self._attentions = [
            m for m in self.reformer.modules() if isinstance(m, module.LSHSelfAttention)
        ]
        for attention in self._attentions:  # used only when use_full_attn is set (eval mode)
            attention.full_attn = CausalSharedQkAttention(lsh_dropout)

    def _encode(self, window: torch.Tensor, segment: int) -> torch.Tensor:
        """window (B, L, input_size) -> hidden (B, segment, model_size) of its last positions."""
        length = window.size(1)
        full = not self.training and self.eval_attention == "full"
        for attention in self._attentions:
            attention.use_full_attn = full
        h = self.input_map(window)  # (B, L, model_size)
        pad = 0 if full else -length % (2 * self.bucket_size)
        h = F.pad(h, (0, 0, 0, pad))
        h = self.reformer(h, pos_emb=self.positions(h))
        return self.norm(h[:, length - segment : length])
