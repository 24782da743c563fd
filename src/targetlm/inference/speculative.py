r"""Greedy self-speculative decoding with the model's own N-gram heads (Stern et al. 2018's
blockwise parallel decoding, with the heads of Heo et al. 2024/2025 as the proposers).

One step, from the prediction at the last read column t (``targetlm.modules.heads`` has the
index picture)::

    draft    d_0 = argmax logits(x̂_t)                       the main head: greedy's own token
             d_n = argmax logits(x̂_{t+n}),  n = 1..N−1       head n's raw output at column t,
                   x̂_{t+n} = reconstruct(MLP^n(h_t), x_t..x_{t+n−1})   made a target vector as in
                   the head ensemble: WDR heads add the conjugate of the words before y_{t+n},
                   the drafted d_0..d_{n−1} standing in for the unknown ones
    verify   one forward of d_0..d_{N−1}: g_i = argmax logits(x̂ after d_i)
    accept   d_1..d_k while d_{i+1} = g_i (k ≤ N−1 drafted tokens); emit d_0..d_k, and g_k is
             the next step's d_0

Every emitted token is the one greedy decoding would pick after the same prefix, so the output
is greedy decoding's. Batch rows advance together by the smallest accepted length among the
rows still generating. The state is then the one after d_0..d_k: the verification's own when
all were accepted, else the encoder's :meth:`~targetlm.modules.interfaces.RewindableEncoder.rewind`
of it, or (an encoder that cannot rewind, e.g. the LSTM) the saved state before the
verification with d_0..d_k read again (one more short forward).
"""

from __future__ import annotations

import torch

from targetlm import functional
from targetlm.modules.interfaces import RewindableEncoder
from targetlm.modules.model import LanguageModel, Prediction

__all__ = ["draft", "speculative_step"]


def draft(
    model: LanguageModel,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    predicted: torch.Tensor,
    raw: torch.Tensor,
) -> torch.Tensor:
    """Greedy drafts d_0..d_{N−1} (B, N) from one column: its main x̂ (B, d) and the heads' raw
    outputs there (N−1, B, d). ``weight`` (V, d) and ``bias`` (V,): the output layer's."""
    heads = model.heads
    if heads is None:
        raise ValueError("speculative decoding drafts with the N-gram heads: the model has none")
    batch, d = predicted.shape
    n_predictions = heads.num_predictions
    tokens = [functional.logits(predicted, weight, bias).argmax(-1)]  # (B,)
    # x_t..x_{t+N−1} = E_out of the drafted words, zeros where not drafted yet: head n's
    # conjugate reads x_t..x_{t+n−1} only (drafted by then), and reconstruct defines column t
    # only where x_{t+n} exists, hence n + 1 columns for heads 1..n
    embeddings = predicted.new_zeros(batch, n_predictions, d)
    outputs = raw[:, :, None]  # (N−1, B, 1, d): the heads at column t
    for n in range(1, n_predictions):
        embeddings[:, n - 1] = weight[tokens[-1]]
        # heads 1..n (reconstruct numbers them from 1), of which head n's x̂_{t+n} (B, d)
        vector = heads.reconstruct(outputs[:n], embeddings[:, : n + 1])[-1, :, 0]
        tokens.append(functional.logits(vector, weight, bias).argmax(-1))
    return torch.stack(tokens, 1)


def speculative_step(
    model: LanguageModel,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    prediction: Prediction,
    active: torch.Tensor,
) -> tuple[torch.Tensor, Prediction, int]:
    """One draft–verify step after ``prediction`` (its last column, heads included, and the
    state after it).

    active: (B,) bool, the rows still generating (the others do not limit acceptance).
    Returns the emitted tokens (B, k + 1): greedy's next k + 1 tokens, the same for every row
    count; the prediction at the last of them (main and heads, one column) with the state
    after them; and k, the drafted tokens accepted.
    """
    drafted = draft(model, weight, bias, prediction.main[:, -1], prediction.heads[:, :, -1])
    n_predictions = drafted.size(1)
    verified = model(drafted, prediction.state, run_heads=False)  # the heads: below, one column
    greedy = functional.logits(verified.main, weight, bias).argmax(-1)  # (B, N): after each d_i
    agree = (greedy[:, :-1] == drafted[:, 1:]).long().cumprod(1).sum(1)  # (B,) accepted per row
    accepted = int(agree[active].min()) if bool(active.any()) else n_predictions - 1
    keep = accepted + 1
    state = verified.state
    if keep < n_predictions:
        state = _rewound(model, prediction.state, state, drafted[:, :keep], n_predictions - keep)
    predicted = verified.main[:, keep - 1 : keep]  # (B, 1, d) at the last kept token
    next_prediction = Prediction(predicted, model.heads(predicted), state)
    return drafted[:, :keep], next_prediction, accepted


def _rewound(model: LanguageModel, before, after, kept: torch.Tensor, dropped: int):
    """The state after reading ``kept`` (B, k) from ``before``: ``after`` (which read ``dropped``
    more tokens) rewound when the encoder can, else ``kept`` read again from ``before``."""
    if isinstance(model.encoder, RewindableEncoder):
        state = model.encoder.rewind(after, dropped)
        if state is not None:
            return state
    return model(kept, before, run_heads=False).state
