"""The training step through ``torch.compile`` (``train.compile``).

The small models of the papers (a 2 × 200 LSTM, a 6 × d 256 Transformer) are launch-bound on a
GPU when run eagerly: the variational LSTM's recurrence is a Python loop of T steps × layers,
each a few tiny kernels, forward and backward. Compiling the step (the task's forward, the
output layer and the objective: :class:`~targetlm.training.step.TrainingStep`) lets inductor
fuse each time step's pointwise work into one kernel and derive a fused backward, and
``"graphs"`` replays the forward and the backward as CUDA graphs, so a step costs a few
launches instead of thousands.

What the compiled step computes is the eager step's function:

- dropout masks come from torch's own random generator (inductor's ``fallback_random``), so
  a compiled step draws the masks the eager step draws, a run resumed in the other mode
  continues the same random stream, and the two agree to float rounding
  (``tests/training/test_compile.py``);
- one shape is compiled: the training batches' usual (B, T). A batch of another shape (the
  shorter last segment of a BPTT stream) runs eagerly, so nothing is recompiled or padded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from targetlm import chunked

MODES = ("off", "default", "graphs")
# torch.compile's backend: inductor generates the fused kernels; the tests of the default run
# also use "aot_eager" (the same capture of forward and backward, eager kernels, no code
# generation), which is what decides whether the compiled step computes the eager one's function
BACKEND = "inductor"


def compile_step(step: nn.Module, mode: str) -> Callable[..., Any] | None:
    """``step`` compiled for ``train.compile = mode`` (None for ``"off"``). Nothing is
    compiled until its first call."""
    if mode not in MODES:
        raise ValueError(f"train.compile must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return None
    import torch._dynamo
    import torch._inductor.config

    # dropout's masks from torch's generator, as eagerly (a compiled run resumes eagerly)
    torch._inductor.config.fallback_random = True
    # an nn.LSTM holds the weights the variational recurrence reads (and runs without dropout)
    torch._dynamo.config.allow_rnn = True
    # the free memory that decides the logit path is read once, not traced
    torch.compiler.assume_constant_result(chunked._free_memory)
    if mode == "graphs":
        return torch.compile(step, mode="reduce-overhead", dynamic=False)
    return torch.compile(step, backend=BACKEND, dynamic=False)


def new_step(mode: str) -> None:
    """Mark the start of a training step: CUDA graphs may then reuse the memory of the last
    step's outputs (whatever of them is kept must have been copied: :func:`dense`)."""
    if mode == "graphs":
        torch.compiler.cudagraph_mark_step_begin()


def dense(value: Any) -> Any:
    """A copy of the tensors in ``value`` (nested in lists and tuples) in the standard
    row-major layout; anything else as it is. Given as the carried state, it keeps the compiled
    step from compiling again for each layout the state arrives in (a compiled step's (1, B, H)
    state can be a view with another stride on its size-1 dimension than the eager one's, and
    the compiled step's guards compare strides). Also what is kept of a CUDA graph's outputs:
    a copy outlives the graph's next replay."""
    if isinstance(value, torch.Tensor):
        return value.clone(memory_format=torch.contiguous_format)
    if isinstance(value, (list, tuple)):
        return type(value)(dense(v) for v in value)
    return value
