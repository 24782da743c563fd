"""Optimisers and learning-rate schedules.

Schedules are small objects with a ``state_dict`` so a resumed run continues with
exactly the learning rate (and plateau bookkeeping) it stopped with.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from targetlm.config import TrainConfig


def build_optimizer(
    config: TrainConfig, parameters, heads=(), fused: bool = False
) -> torch.optim.Optimizer:
    """The configured optimiser over ``parameters`` and, in a group of their own at
    ``train.heads_lr`` (when set), the N-gram heads' ``heads``. Each group's ``lr_scale`` is
    what :func:`set_lr` multiplies the scheduled learning rate by. ``fused``: torch's fused
    implementation (one kernel for every parameter; GPU parameters), else torch's default
    (``foreach`` on a GPU, the per-parameter loop on the CPU)."""
    heads = [p for p in heads if p.requires_grad]
    seen = {id(p) for p in heads}
    parameters = [p for p in parameters if p.requires_grad and id(p) not in seen]
    scale = config.heads_lr / config.lr if config.heads_lr else 1.0
    groups = [{"params": parameters, "lr_scale": 1.0}]
    if heads:
        groups.append({"params": heads, "lr_scale": scale})
    options = {"fused": True} if fused else {}
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            groups,
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            **options,
        )
    kind = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    beta1, beta2 = config.betas  # two values: targetlm.config.validate refuses others
    return kind(
        groups, lr=config.lr, betas=(beta1, beta2), weight_decay=config.weight_decay, **options
    )


class LrSchedule:
    """The learning rate as a function of (step, epoch) and validation history.

    - ``constant``: lr.
    - ``epoch_decay``: lr · factor^max(epoch − decay_start, 0), epochs counted from 1
      (Zaremba et al.: factor 0.5 after epoch 4; Inan et al.: 0.9); with
      ``decay_epoch_steps`` = E > 0 the epoch of step s (from 1) is ⌊(s − 1)/E⌋ + 1, so a
      schedule stated in a paper's epochs keeps its length in steps on a smaller corpus.
    - ``plateau``: lr · factor^k, k = number of validations that did not improve
      on the best for ``patience`` consecutive evaluations (GroC: ×0.1).
    - ``inverse_sqrt``: lr · step/warmup during warm-up, then lr · sqrt(warmup/step).
    - ``linear``: lr · step/warmup during warm-up, then down to 0 at ``total_steps``
      (Hugging Face's linear schedule).
    - ``cosine``: lr · step/warmup during warm-up, then lr · (1 + cos(π·p))/2 with p the
      fraction of the steps after warm-up done, 0 at ``total_steps`` (``CosineAnnealingLR``
      with eta_min 0, as the Tensorized Transformer's released code trains).
    """

    def __init__(self, config: TrainConfig, total_steps: int = 0) -> None:
        self.config = config
        self.total_steps = total_steps  # the budget's last step (``linear``, ``cosine``)
        self.reductions = 0
        self.best = math.inf
        self.bad_evaluations = 0

    def lr(self, step: int, epoch: int) -> float:
        c = self.config
        if c.schedule == "epoch_decay":
            if c.decay_epoch_steps:
                epoch = (max(step, 1) - 1) // c.decay_epoch_steps + 1
            return c.lr * c.decay_factor ** max(epoch - c.decay_start, 0)
        if c.schedule == "plateau":
            return c.lr * c.decay_factor**self.reductions
        if c.schedule == "inverse_sqrt":
            step = max(step, 1)
            return c.lr * min(step / c.warmup_steps, math.sqrt(c.warmup_steps / step))
        if c.schedule == "linear":
            if step < c.warmup_steps:
                return c.lr * step / c.warmup_steps
            left = max(self.total_steps - step, 0) / max(self.total_steps - c.warmup_steps, 1)
            return c.lr * left
        if c.schedule == "cosine":
            if step < c.warmup_steps:
                return c.lr * step / c.warmup_steps
            done = min(step - c.warmup_steps, self.total_steps - c.warmup_steps)
            fraction = done / max(self.total_steps - c.warmup_steps, 1)
            return c.lr * (1 + math.cos(math.pi * fraction)) / 2
        return c.lr

    def on_validation(self, loss: float) -> None:
        if loss < self.best:
            self.best, self.bad_evaluations = loss, 0
            return
        self.bad_evaluations += 1
        if self.config.schedule == "plateau" and self.bad_evaluations > self.config.patience:
            self.reductions += 1
            self.bad_evaluations = 0

    def state_dict(self) -> dict[str, float]:
        return {
            "reductions": self.reductions,
            "best": self.best,
            "bad_evaluations": self.bad_evaluations,
        }

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.reductions = int(state["reductions"])
        self.best = float(state["best"])
        self.bad_evaluations = int(state["bad_evaluations"])


def clip_gradients(parameters, max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` that only rescales when the norm exceeds ``max_norm``.

    The result is identical (the clamped coefficient is exactly 1 otherwise); skipping the
    multiply saves a pass over every gradient on most steps on the CPU. On a GPU the
    gradients are always multiplied by the clamped coefficient: reading the norm on the host
    would make every step wait for the device.
    """
    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    if isinstance(norm, DTensor):  # sharded gradients (FSDP): the norm over every shard
        norm = norm.full_tensor()
    if norm.device.type != "cpu" or norm > max_norm:
        # each gradient rescaled once: a compiled backward may give two parameters one tensor
        # (equal gradients, e.g. an LSTM layer's two biases)
        unique = {(p.grad.data_ptr(), p.grad.shape): p for p in parameters}
        torch.nn.utils.clip_grads_with_norm_(list(unique.values()), max_norm, norm)
    return norm


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's learning rate: ``lr`` times the group's ``lr_scale`` (default 1)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
