r"""An EAGLE-style drafting head (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking
Feature Uncertainty", arXiv:2401.15077; EAGLE-3, arXiv:2503.01840) with a reduced draft
vocabulary (FR-Spec, Zhao et al. 2025, arXiv:2502.14856).

One small Llama decoder layer reads the body's main x̂ at column t and the embedding of the
token just chosen, and drafts autoregressively, feeding its own output state back::

    z_t         = fc(x̂_t)                                                        (d -> d)
    step 1:  h¹_t = Layer([input_layernorm(E[y_t]) ; hidden_norm(z_t)], residual z_t)
    step k:  h^k_t = Layer([input_layernorm(E[y_{t+k−1}]) ; hidden_norm(h^{k−1}_t)], residual h^{k−1}_t)
    x̂_{t+k} = norm(h^k_t), read by the model's output layer over the draft vocabulary

The layer is a Llama decoder layer whose q/k/v projections take the 2d concatenation (RoPE,
grouped-query attention, SiLU-gated MLP, RMSNorms). Its attention follows EAGLE-3's
training-time test: step 1's query at column t attends to step 1's keys of the columns
t − window + 1..t (the text read, each column with the word after it), step k's query to
those and to steps 2..k's keys at column t alone (the tokens drafted so far), the RoPE
position of step k at column t being t + k (the word it reads). Drafting keeps step 1's keys
and values of the last columns per row (:class:`EagleDrafter`), so a drafted token costs one
layer over one column.

The parameters and their names follow the ``speculators`` package's Eagle3 model (vLLM's
format): ``fc``, ``layers.0.{input_layernorm, hidden_norm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj}``, ``norm`` and the ``d2t`` buffer
(target id = draft index + d2t[index]). Where it differs:

- it reads the body's main x̂ (after the body's final norm; ``fc`` is d -> d), where EAGLE-3
  concatenates three layers' states before its final norm (3d -> d). With a Llama body x̂ is
  ``RMSNorm(h_last)``, i.e. speculators' ``norm_before_fc`` over the last layer's state with
  the body's final norm weight.
- the words are the target-side vectors every head kind reads, ``E_out[y]`` (the body's output
  rows; the input embedding of a tied body such as SmolLM2).
- ``lm_head`` is the body's output layer restricted to the draft vocabulary (rows ``E_out[d2t
  ids]``, held frozen as in EAGLE-1/2 and FR-Spec; EAGLE-3 trains its own): the head's vectors
  are read by the model's output layer like every head kind's, so the N-gram loss, the
  ensemble and drafting see one distribution. An export writes ``lm_head.weight`` as those
  rows and ``t2d`` from ``d2t`` (:meth:`EagleHead.target_mask`).
- attention covers the last ``window`` columns (EAGLE: the whole prefix), so drafting caches a
  bounded number of keys per row.

``o_proj`` and ``down_proj`` start at zero and ``fc`` at the identity, so an untrained head
passes its input through the layer (like the other kinds, which start as the identity).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.modules.drafting import DraftStart, Verified
from targetlm.modules.heads import HEADS, HeadCount, NgramHeads
from targetlm.registry import ConfigError, Positive, Size

__all__ = ["EagleDrafter", "EagleHead", "EagleLayer", "draft_vocabulary", "rope"]


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotary embedding of x (B, heads, T, head_dim) at ``positions`` (T,) or (B, T):
    the two halves of each head rotated by position · theta^(−2i/head_dim)."""
    half = x.size(-1) // 2
    exponent = torch.arange(0, half, device=x.device, dtype=torch.float32) * 2 / x.size(-1)
    inverse = 1.0 / (theta**exponent)
    angles = positions.to(torch.float32)[..., None] * inverse  # (…, T, half)
    angles = torch.cat([angles, angles], -1)
    if angles.dim() == 3:  # per row: (B, 1, T, head_dim)
        angles = angles[:, None]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def draft_vocabulary(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent ids by ``counts`` (V,) (ties: the smaller id; ids never seen
    fill up in id order), sorted: the draft vocabulary's target ids (FR-Spec)."""
    vocab = counts.numel()
    if not 1 <= size <= vocab:
        raise ConfigError(
            f"model.heads.draft_vocab = {size}: must be >= 1 and at most the vocabulary's "
            f"{vocab} tokens"
        )
    # stable sort on −count: equal counts keep id order
    order = torch.sort(-counts.to(torch.long), stable=True).indices
    return torch.sort(order[:size]).values


class EagleAttention(nn.Module):
    """Llama's attention with q/k/v over the 2d concatenation (no biases)."""

    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(2 * d, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * d, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * d, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, d, bias=False)


class EagleMlp(nn.Module):
    """Llama's SiLU-gated feed-forward: down(silu(gate(x)) · up(x))."""

    def __init__(self, d: int, ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    """EAGLE-3's first decoder layer (speculators' ``layers.0``): the word's embedding and the
    hidden state normalised apart, concatenated into q/k/v; the residual is the hidden state."""

    def __init__(
        self, d: int, heads: int, kv_heads: int, head_dim: int, ff: int, eps: float
    ) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.hidden_norm = nn.RMSNorm(d, eps=eps)
        self.self_attn = EagleAttention(d, heads, kv_heads, head_dim)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.mlp = EagleMlp(d, ff)

    def project(
        self, words: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Word vectors and hidden states (B, T, d) -> queries (B, heads, T, hd) and keys and
        values (B, kv_heads, T, hd), before RoPE."""
        joined = torch.cat([self.input_layernorm(words), self.hidden_norm(hidden)], -1)
        a = self.self_attn
        B, T, _ = joined.shape
        q = a.q_proj(joined).view(B, T, a.heads, a.head_dim).transpose(1, 2)
        k = a.k_proj(joined).view(B, T, a.kv_heads, a.head_dim).transpose(1, 2)
        v = a.v_proj(joined).view(B, T, a.kv_heads, a.head_dim).transpose(1, 2)
        return q, k, v

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual ``hidden`` (B, T, d) and the attention output (B, heads, T, hd) -> the
        layer's output (B, T, d)."""
        B, _, T, _ = attended.shape
        x = hidden + self.self_attn.o_proj(attended.transpose(1, 2).reshape(B, T, -1))
        return x + self.mlp(self.post_attention_layernorm(x))


def _repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """(B, kv_heads, T, hd) -> (B, kv_heads · times, T, hd), each kv head serving ``times``
    query heads in a row (Llama's ``repeat_kv``)."""
    return x if times == 1 else x.repeat_interleave(times, dim=1)


@HEADS.register("eagle")
class EagleHead(NgramHeads):
    """An EAGLE-style drafting head: one Llama decoder layer over the body's x̂ and the next
    word's embedding, drafting N − 1 tokens autoregressively (see the module's docstring).

    Depth k = 1..N−1 at column t reads y_{t+k−1} (the true word in training, the drafted one in
    decoding), so the head ``reads_words`` and runs in ``reconstruct``; ``forward`` only hands
    x̂ on. Its vectors are read by the model's output layer; drafting reads only the rows of
    the draft vocabulary.

    The defaults are small; ``targetlm train-heads`` takes the attention shape, the MLP width,
    RoPE's theta and the norms' eps of a Llama-like Hugging Face body unless set.

    Args:
        embedding_dim: d (supplied by the builder).
        n: N, the number of predicted positions including the main one (N − 1 drafting steps
            trained; drafting may run more).
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (grouped-query attention; default: as many as
            the query heads; must divide them).
        head_dim: width of a head (default d / num_attention_heads; even, for RoPE).
        ff_size: the MLP's hidden width (default 4d).
        window: the columns of the text each query attends to (itself included).
        rope_theta: RoPE's base.
        rms_norm_eps: the RMSNorms' eps.
        draft_vocab: K, the draft vocabulary's size (FR-Spec): drafting reads the output
            layer's rows of K tokens only (``d2t``: set by ``train-heads`` to the K most
            frequent tokens of its text; the first K ids until then). None: every token.
    """

    fc: nn.Linear
    norm: nn.RMSNorm
    reads_words = True
    distill_text = True  # train-heads: the text's tokens as words, the body's distribution

    def __init__(
        self,
        embedding_dim: int,
        n: HeadCount = 2,
        num_attention_heads: Size = 4,
        num_key_value_heads: Size | None = None,
        head_dim: Size | None = None,
        ff_size: Size | None = None,
        window: Size = 16,
        rope_theta: Positive = 10000.0,
        rms_norm_eps: Positive = 1e-6,
        draft_vocab: Size | None = None,
    ) -> None:
        self._begin(n, residual=False)
        d = embedding_dim
        kv_heads = num_key_value_heads or num_attention_heads
        if num_attention_heads % kv_heads:
            raise ConfigError(
                f"model.heads.num_key_value_heads {kv_heads} does not divide "
                f"num_attention_heads {num_attention_heads}"
            )
        if head_dim is None:
            if d % num_attention_heads:
                raise ConfigError(
                    f"model.heads: embedding_dim {d} is not divisible by num_attention_heads "
                    f"{num_attention_heads} (or set head_dim)"
                )
            head_dim = d // num_attention_heads
        if head_dim % 2:
            raise ConfigError(f"model.heads.head_dim must be even (RoPE), got {head_dim}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.rope_theta = float(rope_theta)
        self.layers = nn.ModuleList()
        if n > 1:  # (N = 1: no parameters, no random draws: plain next-word training)
            # fc starts at the identity: no random draw for it
            self.fc = nn.Linear(d, d, bias=False, device="meta")
            self.fc.weight = nn.Parameter(torch.eye(d))
            ff = ff_size or 4 * d
            layer = EagleLayer(d, num_attention_heads, kv_heads, head_dim, ff, rms_norm_eps)
            self.layers.append(layer)
            self.norm = nn.RMSNorm(d, eps=rms_norm_eps)
            with torch.no_grad():  # an untrained head passes x̂ through
                nn.init.zeros_(layer.self_attn.o_proj.weight)
                nn.init.zeros_(layer.mlp.down_proj.weight)
        self.draft_vocab = draft_vocab
        if draft_vocab is not None:
            self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))

    @property
    def context(self) -> int:
        """Columns up to t that drafting at t reads: step 1's keys over the window."""
        return self.window

    # --- the draft vocabulary ------------------------------------------------------------

    def draft_ids(self, vocab_size: int) -> torch.Tensor | None:
        """The draft vocabulary's target ids (K,) sorted, or None (every token); an error if
        one is not below ``vocab_size``."""
        if self.draft_vocab is None:
            return None
        d2t: torch.Tensor = self.d2t  # type: ignore[assignment]
        ids = torch.arange(self.draft_vocab, device=d2t.device) + d2t
        if self.draft_vocab > vocab_size or int(ids.max()) >= vocab_size or int(ids.min()) < 0:
            raise ConfigError(
                f"model.heads.draft_vocab = {self.draft_vocab}: the draft vocabulary does not fit "
                f"the body's {vocab_size} tokens"
            )
        return ids

    def set_draft_vocabulary(self, ids: torch.Tensor) -> None:
        """Draft with the target ids ``ids`` (K,) (sorted, distinct): ``d2t = ids − arange(K)``."""
        if self.draft_vocab is None or ids.shape != (self.draft_vocab,):
            raise ValueError(f"expected {self.draft_vocab} draft ids, got {tuple(ids.shape)}")
        if bool((ids[1:] <= ids[:-1]).any()):
            raise ValueError("draft ids must be sorted and distinct")
        d2t: torch.Tensor = self.d2t  # type: ignore[assignment]
        d2t.copy_(ids.to(d2t.device) - torch.arange(self.draft_vocab, device=d2t.device))

    def target_mask(self, vocab_size: int) -> torch.Tensor:
        """speculators' ``t2d``: (V,) bool, True at the draft vocabulary's ids."""
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        ids = self.draft_ids(vocab_size)
        mask[slice(None) if ids is None else ids.cpu()] = True
        return mask

    # --- training-time forward -----------------------------------------------------------

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """x̂ (B, T, d) -> x̂ for each depth, (N−1, B, T, d) (an expanded view)."""
        return hidden.unsqueeze(0).expand(self.num_predictions - 1, *hidden.shape)

    def reconstruct(self, outputs: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """``outputs`` (K, B, T, d): x̂ (its first entry; K ≤ N−1 steps are run) -> x̂_{t+k} of
        steps 1..K (K, B, T, d). embeddings (B, L, d): x_s = E_out[y_s] of the words from the
        same first column; step k at column t reads x_{t+k−1} (zeros past L)."""
        depths, _, columns, _ = outputs.shape
        if depths == 0:
            return outputs
        needed = columns + depths - 1
        if embeddings.size(1) < needed:
            embeddings = F.pad(embeddings, (0, 0, 0, needed - embeddings.size(1)))
        layer = self.layers[0]
        assert isinstance(layer, EagleLayer)
        a = layer.self_attn
        times = a.heads // a.kv_heads
        hidden = self.fc(outputs[0])
        position = torch.arange(columns, device=hidden.device)
        distance = position[:, None] - position[None, :]
        band = (distance >= 0) & (distance < self.window)  # (T, T): step 1's keys per query
        scale = 1 / math.sqrt(a.head_dim)
        keys1 = values1 = None
        diagonal_keys: list[torch.Tensor] = []
        diagonal_values: list[torch.Tensor] = []
        predicted = []
        for k in range(1, depths + 1):
            words = embeddings[:, k - 1 : k - 1 + columns].to(hidden.dtype)
            q, key, value = layer.project(words, hidden)
            q = rope(q, position + k, self.rope_theta)
            key = rope(key, position + k, self.rope_theta)
            if keys1 is None:
                keys1, values1 = _repeat_kv(key, times), _repeat_kv(value, times)
            else:
                diagonal_keys.append(_repeat_kv(key, times))
                diagonal_values.append(_repeat_kv(value, times))
            assert values1 is not None
            scores = (q @ keys1.transpose(-1, -2)) * scale  # (B, H, T, T)
            scores = scores.masked_fill(~band, float("-inf"))
            diagonal = [(q * dk).sum(-1, keepdim=True) * scale for dk in diagonal_keys]
            weights = torch.softmax(torch.cat([scores, *diagonal], -1), -1)
            attended = weights[..., :columns] @ values1
            for j, dv in enumerate(diagonal_values):
                attended = attended + weights[..., columns + j : columns + j + 1] * dv
            hidden = layer.finish(hidden, attended)
            predicted.append(self.norm(hidden))
        return torch.stack(predicted)

    def drafter(self, start: DraftStart) -> EagleDrafter:
        """The incremental drafter of these heads (:class:`EagleDrafter`)."""
        return EagleDrafter(self, start)


def _shift(
    buffer: torch.Tensor, new: torch.Tensor, keep: torch.Tensor, equal: int | None
) -> torch.Tensor:
    """``buffer`` (B, H, L, hd), right-aligned, after row b appended the first ``keep[b]``
    columns of ``new`` (B, H, S, hd): each row's last L."""
    width = buffer.size(2)
    joined = torch.cat([buffer, new], 2)
    if equal is not None:
        return joined[:, :, equal : equal + width]
    index = keep[:, None] + torch.arange(width, device=keep.device)  # (B, L)
    index = index[:, None, :, None].expand(-1, joined.size(1), -1, joined.size(3))
    return joined.gather(2, index)


class EagleDrafter:
    """Drafting with an :class:`EagleHead`: step 1's keys and values of each row's last
    ``window − 1`` columns (right-aligned, rotated at their positions) and the x̂ of its last
    column t; a proposal runs the layer over column t once per drafted token.

    Drafts are argmaxes over the draft vocabulary's rows of the output layer, mapped back to
    target ids. They are those of :meth:`EagleHead.reconstruct` over the row's text (the
    drafted words after column t) up to floating-point rounding of the attention sums.
    """

    def __init__(self, head: EagleHead, start: DraftStart) -> None:
        self.head = head
        layer = head.layers[0]
        assert isinstance(layer, EagleLayer)
        self.layer = layer
        self.weight, self.bias = start.weight, start.bias
        ids = head.draft_ids(start.weight.size(0))
        self.ids = ids
        self.draft_weight = start.weight if ids is None else start.weight[ids]
        self.draft_bias = start.bias if start.bias is None or ids is None else start.bias[ids]
        requested = start.length if start.length is not None else head.num_predictions - 1
        self.length = max(0, requested)
        self.cached = head.window - 1
        a = layer.self_attn
        self.times = a.heads // a.kv_heads
        self.scale = 1 / math.sqrt(a.head_dim)
        columns = start.columns
        device = columns.device
        batch, read, _ = columns.shape
        # columns read per row (a row that read fewer than P has zeros before its first)
        self.seen = torch.tensor([len(t) for t in start.texts], dtype=torch.long)
        self.position = (self.seen - 1).to(device)  # column t of each row
        known = read - 1
        words = torch.tensor(
            [
                [0] * max(known - len(t), 0) + (list(t[-known:]) if known else [])
                for t in start.texts
            ],
            dtype=torch.long,
            device=device,
        ).view(batch, known)
        # step 1's keys/values of the columns before t: column s at position s + 1
        previous = columns[:, :known]
        offsets = torch.arange(known, device=device) - known  # column t − known + i
        positions = self.position[:, None] + offsets + 1
        key, value = self._keys(previous, words, positions)
        missing = (0, 0, max(self.cached - known, 0), 0)  # zeros before, masked out
        self.keys = F.pad(key, missing)[:, :, key.size(2) + missing[2] - self.cached :]
        self.values = F.pad(value, missing)[:, :, value.size(2) + missing[2] - self.cached :]
        self.last = columns[:, -1]  # x̂_t (B, d)
        self.step1: tuple[torch.Tensor, torch.Tensor] | None = None

    def _keys(
        self, columns: torch.Tensor, words: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 1's keys (rotated at ``positions`` (B, T)) and values of columns x̂ (B, T, d)
        with the words read after them (B, T)."""
        hidden = self.head.fc(columns)
        _, key, value = self.layer.project(self.weight[words].to(hidden.dtype), hidden)
        return rope(key, positions, self.head.rope_theta), value

    def _mask(self) -> torch.Tensor | None:
        """(B, 1, 1, L) bool: the cached positions a row has read (None: every row all)."""
        if int(self.seen.min()) - 1 >= self.cached:
            return None
        slots = torch.arange(self.cached)
        valid = slots >= self.cached - (self.seen[:, None] - 1)
        return valid[:, None, None].to(self.last.device)

    @torch.no_grad()
    def propose(self, first: torch.Tensor) -> torch.Tensor:
        """Drafts (B, 1 + length): d_0 = ``first``, then one layer step per drafted token."""
        layer, head = self.layer, self.head
        hidden = head.fc(self.last[:, None])  # (B, 1, d)
        mask = self._mask()
        word = first
        drafted = [first]
        extra_keys: list[torch.Tensor] = []
        extra_values: list[torch.Tensor] = []
        cached_keys = _repeat_kv(self.keys, self.times)
        cached_values = _repeat_kv(self.values, self.times)
        self.step1 = None
        for k in range(1, self.length + 1):
            q, key, value = layer.project(self.weight[word][:, None].to(hidden.dtype), hidden)
            position = (self.position + k)[:, None]
            q = rope(q, position, head.rope_theta)
            key = rope(key, position, head.rope_theta)
            if k == 1:
                self.step1 = (key, value)
            extra_keys.append(_repeat_kv(key, self.times))
            extra_values.append(_repeat_kv(value, self.times))
            scores = (q @ cached_keys.transpose(-1, -2)) * self.scale  # (B, H, 1, L)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            extra = [(q * ek).sum(-1, keepdim=True) * self.scale for ek in extra_keys]
            weights = torch.softmax(torch.cat([scores, *extra], -1), -1)
            attended = weights[..., : self.cached] @ cached_values
            for j, ev in enumerate(extra_values):
                attended = attended + weights[..., self.cached + j : self.cached + j + 1] * ev
            hidden = layer.finish(hidden, attended)
            logits = F.linear(head.norm(hidden[:, 0]), self.draft_weight, self.draft_bias)
            token = logits.argmax(-1)
            word = token if self.ids is None else self.ids[token]
            drafted.append(word)
        return torch.stack(drafted, 1)

    @torch.no_grad()
    def accept(self, verified: Verified) -> None:
        """Row b read its first ``kept[b]`` verified tokens: column t (its word d_0) and the
        columns after it with accepted words join the cached keys; column t moves on."""
        drafted = verified.drafted
        width = drafted.size(1)
        if self.step1 is None or self.step1[0].size(0) != drafted.size(0):
            positions = (self.position + 1)[:, None]
            self.step1 = self._keys(self.last[:, None], drafted[:, :1], positions)
        keys, values = [self.step1[0]], [self.step1[1]]
        if width > 1:  # columns t+1..t+k: x̂ after d_0..d_{k−1}, words d_1..d_k
            offsets = torch.arange(1, width, device=drafted.device)
            positions = self.position[:, None] + offsets + 1
            key, value = self._keys(verified.main[:, : width - 1], drafted[:, 1:], positions)
            keys.append(key)
            values.append(value)
        new_keys, new_values = torch.cat(keys, 2), torch.cat(values, 2)
        kept = verified.kept
        equal = kept[0] if all(k == kept[0] for k in kept) else None
        if self.cached:
            self.keys = _shift(self.keys, new_keys, verified.keep, equal)
            self.values = _shift(self.values, new_values, verified.keep, equal)
        self.last = verified.predicted
        counts = torch.tensor(kept, dtype=torch.long)
        self.seen = self.seen + counts
        self.position = self.position + counts.to(self.position.device)
        self.step1 = None

    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows only, in this order."""
        self.keys, self.values, self.last = self.keys[rows], self.values[rows], self.last[rows]
        self.position = self.position[rows]
        self.seen = self.seen[rows.cpu()]
        self.step1 = None
