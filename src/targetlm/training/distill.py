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

Heads that ``distill_text`` (the EAGLE-style ``eagle`` kind) learn as EAGLE does instead: they
read the text's own next tokens as their words, and step n at column s learns the body's whole
distribution at column s + n (soft cross entropy), both restricted to the head's draft
vocabulary (FR-Spec) where it has one; the drafts are read over that vocabulary, mapped back
to target ids.
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
    "distillation_loss",
    "draft_acceptance",
    "head_logits",
    "reads_text",
    "train_drafting_heads",
]

BYTES_PER_VALUE = 4  # the cache holds float32 x̂ and int64 ids (g and the text's tokens)


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
    """How many segments of ``segment`` columns a cache of ``max_bytes`` holds (x̂, g and the
    text's tokens)."""
    return max_bytes // (segment * (d * BYTES_PER_VALUE + 16))


@dataclass
class HiddenCache:
    """The body's states over a corpus, computed once: x̂ (R, T, d) and g (R, T), with the
    segments' tokens (R, T) they read."""

    hidden: torch.Tensor
    greedy: torch.Tensor
    tokens: torch.Tensor

    @classmethod
    def build(cls, model: LanguageModel, segments: torch.Tensor, batch_size: int = 8):
        return cls(*body_states(model, segments, batch_size), segments)

    @property
    def bytes(self) -> int:
        ids = self.greedy.numel() * 8 + self.tokens.numel() * 8
        return self.hidden.numel() * self.hidden.element_size() + ids

    def __len__(self) -> int:
        return self.hidden.size(0)


def _draft_rows(
    heads: NgramHeads, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """The heads' draft vocabulary (K,) ids, or None, and the output layer's rows of it."""
    draft_ids = getattr(heads, "draft_ids", None)
    ids = None if draft_ids is None else draft_ids(weight.size(0))
    if ids is None:
        return None, weight, bias
    return ids, weight[ids], None if bias is None else bias[ids]


def reads_text(heads: NgramHeads) -> bool:
    """Whether the heads learn as EAGLE does (the text's tokens as words, soft targets)."""
    return bool(getattr(heads, "distill_text", False))


def head_logits(
    heads: NgramHeads,
    hidden: torch.Tensor,
    greedy: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tokens: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Head n's logits at columns 0..T−n−1 (B, T − n, V), n = 1..N−1, from x̂ (B, T, d), the
    heads reading the words g (B, T) (their targets are g[:, n:]). Heads that
    :func:`reads_text` read the next tokens of ``tokens`` (B, T), the segments read, instead,
    and give logits over their draft vocabulary (B, T − n, K)."""
    heads_count = heads.num_predictions - 1
    raw = heads(hidden)  # (N−1, B, T, d)
    T = hidden.size(1)
    if reads_text(heads):
        if tokens is None:
            raise ValueError("these heads read the text's tokens: pass the cache's tokens")
        following = F.pad(tokens[:, 1:], (0, 1))  # y_s: the token read after column s
        vectors = heads.reconstruct(raw, weight.detach()[following])
        _, rows, row_bias = _draft_rows(heads, weight, bias)
        return [
            F.linear(vectors[n - 1, :, : T - n], rows, row_bias) for n in range(1, heads_count + 1)
        ]
    words = weight.detach()[greedy]  # x_s = E_out[g_s]
    words = F.pad(words, (0, 0, 0, heads_count))  # no word past the segment (no target there)
    vectors = heads.reconstruct(raw, words)
    return [
        functional.logits(vectors[n - 1, :, : T - n], weight, bias)
        for n in range(1, heads_count + 1)
    ]


def _predicted_ids(heads: NgramHeads, logits: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The top-1 target ids of ``logits`` (over the draft vocabulary of heads that have one)."""
    top = logits.argmax(-1)
    if reads_text(heads):
        ids, _, _ = _draft_rows(heads, weight, None)
        if ids is not None:
            return ids[top]
    return top


@torch.no_grad()
def draft_acceptance(
    heads: NgramHeads,
    cache: HiddenCache,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    batch_size: int = 8,
) -> tuple[list[float], float]:
    """Per head n, the fraction of columns whose top-1 token is the body's g at column + n
    (heads that read the text: given the text's tokens before it, the acceptance of draft n
    when the text is what greedy would emit), and the mean accepted length: per column with
    every head's target in the segment, how many heads in a row from the first agree."""
    with evaluating(heads):
        count = heads.num_predictions - 1
        agree, total = [0] * count, [0] * count
        accepted, columns = 0, 0
        for start in range(0, len(cache), batch_size):
            rows = slice(start, start + batch_size)
            hidden, greedy, tokens = cache.hidden[rows], cache.greedy[rows], cache.tokens[rows]
            logits = head_logits(heads, hidden, greedy, weight, bias, tokens)
            hits = []
            for n, head in enumerate(logits, 1):
                hit = _predicted_ids(heads, head, weight) == greedy[:, n:]
                agree[n - 1] += int(hit.sum())
                total[n - 1] += hit.numel()
                hits.append(hit[:, : greedy.size(1) - count])
            if hits and hits[0].size(1) > 0:
                chain = torch.stack(hits, -1).long().cumprod(-1).sum(-1)
                accepted += int(chain.sum())
                columns += chain.numel()
    rates = [a / t if t else math.nan for a, t in zip(agree, total)]
    return rates, accepted / columns if columns else math.nan


def distillation_loss(
    heads: NgramHeads,
    hidden: torch.Tensor,
    greedy: torch.Tensor,
    tokens: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The mean over heads of each head's loss on a batch of cached segments: the cross
    entropy with the body's g n columns later, or for heads that :func:`reads_text` the soft
    cross entropy with the body's distribution there (over the draft vocabulary, renormalised:
    EAGLE's and FR-Spec's)."""
    logits = head_logits(heads, hidden, greedy, weight, bias, tokens)
    if not reads_text(heads):
        losses = [
            F.cross_entropy(head.reshape(-1, head.size(-1)), greedy[:, n:].reshape(-1))
            for n, head in enumerate(logits, 1)
        ]
        return torch.stack(losses).mean()
    _, rows, row_bias = _draft_rows(heads, weight, bias)
    with torch.no_grad():  # the body's distribution at every column, over the draft vocabulary
        target = torch.softmax(F.linear(hidden, rows, row_bias).float(), -1)
    losses = []
    for n, head in enumerate(logits, 1):
        log_q = torch.log_softmax(head.float(), -1)
        losses.append(-(target[:, n:] * log_q).sum(-1).mean())
    return torch.stack(losses).mean()


def train_drafting_heads(
    model: LanguageModel,
    train: HiddenCache,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 8,
    seed: int = 0,
    log: Callable[[int, float], None] | None = None,
    log_every: int = 50,
    stop: Callable[[], bool] | None = None,
) -> tuple[float, int]:
    """Train ``model.heads`` only (the body frozen: only the heads' parameters are optimised,
    AdamW) for ``steps`` steps of ``batch_size`` cached segments drawn at random (epoch after
    epoch), on :func:`distillation_loss`, or until ``stop()`` says so before a step (a time
    budget). Returns the last step's loss and the steps run; ``log(step, loss)`` every
    ``log_every`` steps and after the last."""
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
    done = 0
    for step in range(1, steps + 1):
        if stop is not None and stop():
            break
        if position + batch_size > len(order):  # next epoch
            order, position = torch.randperm(len(train), generator=generator), 0
        rows = order[position : position + batch_size]
        position += batch_size
        hidden, greedy, tokens = train.hidden[rows], train.greedy[rows], train.tokens[rows]
        loss = distillation_loss(heads, hidden, greedy, tokens, weight, bias)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        done = step
        if log is not None and (step % log_every == 0 or step == steps):
            log(step, float(loss.detach()))
    if log is not None and done % log_every and done < steps:  # stopped early
        log(done, float(loss.detach()))
    heads.eval()
    return float(loss.detach()), done
