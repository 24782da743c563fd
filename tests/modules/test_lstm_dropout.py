"""Recurrent (variational) dropout of LstmEncoder: the per-step loop against nn.LSTM and a
hand-written reference, the mask's sharing over time, the carried state, validation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from targetlm.modules import LstmEncoder, encoders
from targetlm.modules.encoders import lstm_recurrence

B, T, D, H = 3, 7, 5, 6


def _encoder(**options) -> LstmEncoder:
    torch.manual_seed(0)
    return LstmEncoder(input_size=D, hidden_size=H, num_layers=2, **options)


def _weights(layer: nn.LSTM) -> tuple[torch.Tensor, ...]:
    return layer.weight_ih_l0, layer.weight_hh_l0, layer.bias_ih_l0, layer.bias_hh_l0


def reference_lstm(x, weight_ih, weight_hh, bias_ih, bias_hh, h, c, mask):
    """The LSTM equations written out gate by gate, one step at a time.

    x: (B, T, D); h, c: (B, H); mask: (B, H) on h_{t-1}. Returns (B, T, H), h, c.
    """
    w_ii, w_if, w_ig, w_io = weight_ih.chunk(4)
    w_hi, w_hf, w_hg, w_ho = weight_hh.chunk(4)
    b_i, b_f, b_g, b_o = (bias_ih + bias_hh).chunk(4)
    outputs = []
    for t in range(x.size(1)):
        x_t, r = x[:, t], h * mask
        i = torch.sigmoid(x_t @ w_ii.T + r @ w_hi.T + b_i)
        f = torch.sigmoid(x_t @ w_if.T + r @ w_hf.T + b_f)
        g = torch.tanh(x_t @ w_ig.T + r @ w_hg.T + b_g)
        o = torch.sigmoid(x_t @ w_io.T + r @ w_ho.T + b_o)
        c = f * c + i * g
        h = o * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, 1), h, c


def test_eval_mode_and_zero_probability_keep_the_fused_path(monkeypatch):
    x = torch.randn(B, T, D)
    fused = _encoder().eval()
    dropped = _encoder(dropout_recurrent=0.5).eval()
    assert list(dropped.state_dict()) == list(fused.state_dict())  # checkpoints still load
    state = [(torch.randn(1, B, H), torch.randn(1, B, H)) for _ in range(2)]

    def no_loop(*args, **kwargs):
        raise AssertionError("the per-step loop ran")

    monkeypatch.setattr(encoders, "lstm_recurrence", no_loop)
    out, new_state = dropped(x, state)
    expected, expected_state = fused(x, state)
    assert torch.equal(out, expected)
    for (h, c), (h_ref, c_ref) in zip(new_state, expected_state):
        assert torch.equal(h, h_ref) and torch.equal(c, c_ref)
    zero = _encoder(dropout_recurrent=0.0, weight_drop=0.3).train()
    plain = _encoder(weight_drop=0.3).train()
    torch.manual_seed(1)
    out = zero(x)[0]
    torch.manual_seed(1)
    assert torch.equal(out, plain(x)[0])


@pytest.mark.parametrize("with_state", [False, True])
def test_loop_with_an_all_ones_mask_equals_nn_lstm(with_state):
    torch.manual_seed(0)
    layer = nn.LSTM(D, H, batch_first=True)
    x = torch.randn(B, T, D, requires_grad=True)
    hx = (torch.randn(1, B, H, requires_grad=True), torch.randn(1, B, H, requires_grad=True))
    hx = hx if with_state else None
    out, (h, c) = lstm_recurrence(x, *_weights(layer), hx, torch.ones(B, H))
    expected, (h_ref, c_ref) = layer(x, hx)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(h, h_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(c, c_ref, atol=1e-5, rtol=0)
    leaves = [x, *layer.parameters()] + (list(hx) if with_state else [])
    cotangent = torch.randn_like(out), torch.randn_like(h), torch.randn_like(c)

    def gradients(outputs):
        return torch.autograd.grad(outputs, leaves, cotangent, retain_graph=True)

    for grad, grad_ref in zip(gradients((out, h, c)), gradients((expected, h_ref, c_ref))):
        torch.testing.assert_close(grad, grad_ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("weight_drop", [0.0, 0.4])
def test_training_forward_matches_a_hand_written_reference(weight_drop):
    p = 0.5
    encoder = _encoder(dropout_recurrent=p, weight_drop=weight_drop).train()
    x = torch.randn(B, T, D)
    state = [(torch.randn(1, B, H), torch.randn(1, B, H)) for _ in range(2)]
    torch.manual_seed(5)
    out, new_state = encoder(x, state)
    torch.manual_seed(5)  # the same draws, in the documented order: weight_drop, then the mask
    inputs, masks = x, []
    for layer, (h, c), (h_out, c_out) in zip(encoder.layers, state, new_state):
        weight_ih, weight_hh, bias_ih, bias_hh = _weights(layer)
        if weight_drop:
            weight_hh = F.dropout(weight_hh, weight_drop, True)
        mask = torch.empty(B, H).bernoulli_(1 - p) / (1 - p)
        masks.append(mask)
        inputs, h, c = reference_lstm(
            inputs, weight_ih, weight_hh, bias_ih, bias_hh, h[0], c[0], mask
        )
        torch.testing.assert_close(h_out[0], h, atol=1e-6, rtol=0)
        torch.testing.assert_close(c_out[0], c, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, inputs, atol=1e-6, rtol=0)
    mask = torch.stack(masks)
    assert set(mask.unique().tolist()) == {0.0, 1 / (1 - p)}
    assert not torch.equal(mask[:, 0], mask[:, 1])  # one mask per row (and per layer)
    # the parameters themselves are never replaced, and all get gradients
    out.sum().backward()
    assert all(parameter.grad is not None for parameter in encoder.parameters())


def test_a_dropped_unit_never_feeds_the_recurrence():
    """One mask for the whole sequence: a unit dropped for row b gives no gradient to its
    column of W_hh (nor to its h_0) from row b at any step; per-step masks would give one
    to every column (all T = 40 steps dropped has probability 2^-40)."""
    encoder = LstmEncoder(input_size=D, hidden_size=16, num_layers=1, dropout_recurrent=0.5)
    x = torch.randn(2, 40, D)
    h0 = torch.randn(1, 2, 16, requires_grad=True)
    torch.manual_seed(3)
    out, _ = encoder.train()(x, [(h0, torch.zeros(1, 2, 16))])
    weight_hh = encoder.layers[0].weight_hh_l0
    dropped_units = []
    for row in range(2):
        grad_w, grad_h0 = torch.autograd.grad(out[row].sum(), [weight_hh, h0], retain_graph=True)
        dropped = grad_w.abs().sum(0) == 0  # (H,): columns that never received a gradient
        assert 0 < dropped.sum() < 16
        assert torch.equal(grad_h0[0, row] == 0, dropped)
        dropped_units.append(dropped)
    assert not torch.equal(dropped_units[0], dropped_units[1])
    torch.manual_seed(3)  # the mask the encoder drew
    mask = torch.empty(2, 16).bernoulli_(0.5)
    assert torch.equal(torch.stack(dropped_units), mask == 0)
    # without dropout every column gets a gradient
    grad_w = torch.autograd.grad(encoder.eval()(x)[0][0].sum(), weight_hh)[0]
    assert (grad_w.abs().sum(0) > 0).all()


def test_state_carries_over_segments():
    x = torch.randn(B, 2 * T, D)
    torch.manual_seed(0)
    layer = nn.LSTM(D, H, batch_first=True)
    mask = torch.empty(B, H).bernoulli_(0.5) * 2
    whole, (h, c) = lstm_recurrence(x, *_weights(layer), None, mask)
    first, state = lstm_recurrence(x[:, :T], *_weights(layer), None, mask)
    second, (h2, c2) = lstm_recurrence(x[:, T:], *_weights(layer), state, mask)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, atol=1e-6, rtol=0)
    torch.testing.assert_close((h2, c2), (h, c), atol=1e-6, rtol=0)

    encoder = _encoder(dropout_recurrent=0.5).eval()
    whole, _ = encoder(x)
    first, state = encoder(x[:, :T])
    second, _ = encoder(x[:, T:], state)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, atol=1e-6, rtol=0)


def test_state_format_in_training_is_the_fused_one():
    encoder = _encoder(dropout_recurrent=0.5).train()
    x = torch.randn(B, T, D)
    _, state = encoder(x)
    assert [(h.shape, c.shape) for h, c in state] == [((1, B, H), (1, B, H))] * 2
    out, _ = encoder(x, state)  # a carried state goes back in
    assert out.shape == (B, T, H)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_invalid_recurrent_dropout_raises(p):
    with pytest.raises(ValueError, match="dropout_recurrent"):
        LstmEncoder(input_size=D, dropout_recurrent=p)


def test_tied_mask_drops_state_and_output_with_the_same_mask():
    """Inan et al. App. A: a layer's recurrent mask also drops what it passes on (the next
    layer's input, the encoder's output): reference with the masks drawn in the same order."""
    encoder = _encoder(
        dropout_hidden=0.5, dropout_output=0.5, dropout_recurrent=0.5, tie_recurrent_mask=True
    ).train()
    x = torch.randn(B, T, D)
    torch.manual_seed(3)
    got, state = encoder(x)
    torch.manual_seed(3)
    expected = x
    for layer in encoder.layers:
        mask = encoders.dropout_mask(x, (B, H), 0.5)
        h0 = torch.zeros(B, H)
        outputs, h, c = reference_lstm(expected, *_weights(layer), h0, h0, mask)
        expected = outputs * mask[:, None]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state[-1][0][0], h, atol=1e-5, rtol=1e-5)  # the state: unmasked
    assert (got == 0).any()


def test_tied_mask_needs_one_probability():
    with pytest.raises(ValueError, match="tie_recurrent_mask"):
        _encoder(
            dropout_hidden=0.5, dropout_output=0.3, dropout_recurrent=0.5, tie_recurrent_mask=True
        )
