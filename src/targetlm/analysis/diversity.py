"""Gradient diversity during training (Yin et al. 2018; Heo et al. 2025, eq. 14).

Heo et al. argue that N-gram and WDR targets make the gradients of different examples
point in more different directions. Here an example is one row of a BPTT batch (its own
stream, continued from the carried state), with the training objective's loss over its
positions; ``Σ_i ‖g_i‖² / ‖Σ_i g_i‖²`` is accumulated row by row, so no (B, P) matrix of
per-example gradients is ever held.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from targetlm.modules.model import LanguageModel


def batch_gradient_diversity(
    model: LanguageModel,
    objective: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    state: Any = None,
) -> float:
    """Gradient diversity of one batch over all trainable parameters (B backward passes).

    objective: the loss the step minimises (an :class:`~targetlm.objectives.NgramLoss`, or the
    task's loss around one), called as an objective: (prediction, targets, E_out, b) ->
    LossOutput. inputs (B, T), targets (B, T [+ lookahead]) as the trainer passes them. Leaves the
    parameters' ``.grad`` and the random number generators untouched (dropout masks drawn
    here are forgotten), so a measured run trains exactly as an unmeasured one.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    devices = [inputs.device] if inputs.device.type == "cuda" else []
    squares = torch.zeros((), dtype=torch.float64, device=inputs.device)
    total: list[torch.Tensor] | None = None
    with torch.random.fork_rng(devices=devices):
        prediction = model(inputs, state)
        weight, bias = model.output()
        for row in range(inputs.size(0)):
            rows = slice(row, row + 1)
            out = objective(prediction.rows(rows), targets[rows], weight, bias)
            if out.count == 0:
                continue
            found = torch.autograd.grad(out.loss, params, retain_graph=True, allow_unused=True)
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, found)]
            squares += sum(g.double().pow(2).sum() for g in grads)
            total = grads if total is None else [a + g for a, g in zip(total, grads)]
    if total is None:
        return float("nan")
    return float(squares / sum(g.double().pow(2).sum() for g in total))
