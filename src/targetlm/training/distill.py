r"""Drafting heads trained for drafting (Medusa-1's recipe, Cai et al. 2024): self-distillation
on a frozen body.

The heads learn the body's *own* greedy choices: over a corpus read with teacher forcing, the
body's argmax at column s, ``g_s = argmax logits(x̂_s)`` (its prediction of y_s), is the target
of head n at column s − n, and the words the heads read (WDR's conjugate, MTP's next-token
embeddings) are g too, as in drafting, where d_0 = g_t. The body never changes, so its main x̂
and g are computed once (:class:`HiddenCache`, in memory, bounded by ``max_bytes``) and the
heads train on them for as many epochs as the steps make. Agreement: per head, how often its
top-1 token equals the body's g on held-out text (what drafting needs: an accepted draft is
one that greedy would have emitted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from targetlm import functional
from targetlm.modules.heads import NgramHeads
from targetlm.modules.model import LanguageModel, evaluating

__all__ = [
    "HiddenCache",
    "body_states",
    "cache_rows",
    "head_agreement",
    "head_logits",
    "train_drafting_heads",
]

BYTES_PER_VALUE = 4  # the cache holds float32 x̂ and int64 ids


@torch.no_grad()
def body_states(
    model: LanguageModel, segments: torch.Tensor, batch_size: int = 8
) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen body over ``segments`` (R, T) of token ids, each read from a fresh state:
    its main x̂ (R, T, d) (float32) and greedy tokens g (R, T), g[:, s] = argmax logits(x̂_s).
    """
    with evaluating(model):
        weight, bias = model.output()
        hidden, greedy = [], []
        for start in range(0, segments.size(0), batch_size):
            predicted = model(segments[start : start + batch_size], None, run_heads=False).main
            hidden.append(predicted.float())
            greedy.append(functional.logits(predicted, weight, bias).argmax(-1))
    return torch.cat(hidden), torch.cat(greedy)


def cache_rows(max_bytes: int, segment: int, d: int) -> int:
    """How many segments of ``segment`` columns a cache of ``max_bytes`` holds (x̂ and g)."""
    return max_bytes // (segment * (d * BYTES_PER_VALUE + 8))


@dataclass
class HiddenCache:
    """The body's states over a corpus, computed once: x̂ (R, T, d) and g (R, T)."""

    hidden: torch.Tensor
    greedy: torch.Tensor

    @classmethod
    def build(cls, model: LanguageModel, segments: torch.Tensor, batch_size: int = 8):
        return cls(*body_states(model, segments, batch_size))

    @property
    def bytes(self) -> int:
        return self.hidden.numel() * self.hidden.element_size() + self.greedy.numel() * 8

    def __len__(self) -> int:
        return self.hidden.size(0)


def head_logits(
    heads: NgramHeads,
    hidden: torch.Tensor,
    greedy: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> list[torch.Tensor]:
    """Head n's logits at columns 0..T−n−1 (B, T − n, V), n = 1..N−1, from x̂ (B, T, d), the
    heads reading the words g (B, T) (their targets are g[:, n:])."""
    heads_count = heads.num_predictions - 1
    raw = heads(hidden)  # (N−1, B, T, d)
    words = weight.detach()[greedy]  # x_s = E_out[g_s]
    words = F.pad(words, (0, 0, 0, heads_count))  # no word past the segment (no target there)
    vectors = heads.reconstruct(raw, words)
    T = hidden.size(1)
    return [
        functional.logits(vectors[n - 1, :, : T - n], weight, bias)
        for n in range(1, heads_count + 1)
    ]


@torch.no_grad()
def head_agreement(
    heads: NgramHeads,
    cache: HiddenCache,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    batch_size: int = 8,
) -> list[float]:
    """Per head n, the fraction of columns whose top-1 token is the body's g at column + n."""
    with evaluating(heads):
        agree = [0] * (heads.num_predictions - 1)
        total = [0] * len(agree)
        for start in range(0, len(cache), batch_size):
            hidden = cache.hidden[start : start + batch_size]
            greedy = cache.greedy[start : start + batch_size]
            for n, logits in enumerate(head_logits(heads, hidden, greedy, weight, bias), 1):
                agree[n - 1] += int((logits.argmax(-1) == greedy[:, n:]).sum())
                total[n - 1] += greedy[:, n:].numel()
    return [a / t if t else math.nan for a, t in zip(agree, total)]


def train_drafting_heads(
    model: LanguageModel,
    train: HiddenCache,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 8,
    seed: int = 0,
    log: Callable[[int, float], None] | None = None,
    log_every: int = 50,
) -> float:
    """Train ``model.heads`` only (the body frozen: only the heads' parameters are optimised,
    AdamW) for ``steps`` steps of ``batch_size`` cached segments drawn at random (epoch after
    epoch), on the mean over heads of the cross entropy with the body's g. Returns the last
    step's loss; ``log(step, loss)`` every ``log_every`` steps."""
    heads = model.heads
    if heads is None or model.num_heads < 1:
        raise ValueError("the model has no heads to train")
    with torch.no_grad():  # the body's output layer, frozen
        weight, bias = model.output()
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    heads.train()
    loss = torch.tensor(math.nan)
    order = torch.randperm(len(train), generator=generator)
    position = 0
    for step in range(1, steps + 1):
        if position + batch_size > len(order):  # next epoch
            order, position = torch.randperm(len(train), generator=generator), 0
        rows = order[position : position + batch_size]
        position += batch_size
        hidden, greedy = train.hidden[rows], train.greedy[rows]
        losses = [
            F.cross_entropy(logits.reshape(-1, logits.size(-1)), greedy[:, n:].reshape(-1))
            for n, logits in enumerate(head_logits(heads, hidden, greedy, weight, bias), 1)
        ]
        loss = torch.stack(losses).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if log is not None and (step % log_every == 0 or step == steps):
            log(step, float(loss.detach()))
    heads.eval()
    return float(loss.detach())
