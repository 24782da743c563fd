"""Contracts every encoder and output layer satisfies, and the loss equations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import ENCODER_OPTIONS, model_config

from targetlm import functional
from targetlm.config import ComponentConfig
from targetlm.data.batching import IGNORE
from targetlm.modules import CausalTransformer, LockedDropout, LstmEncoder, build_model
from targetlm.objectives import CrossEntropyObjective
from targetlm.registry import ConfigError, Registry

V = 30


def _model(encoder: str, output: str, **options):
    torch.manual_seed(0)
    return build_model(model_config(encoder, output, **options), V).eval()


def test_shapes_finite_loss_and_normalised_log_probs(encoder_kind, output_kind):
    model = _model(encoder_kind, output_kind)
    tokens = torch.randint(V, (3, 7))
    predicted, _, _ = model(tokens)
    weight, bias = model.output()
    assert predicted.shape == (3, 7, model.output.embedding_dim)
    assert weight.shape == (V, model.output.embedding_dim)
    log_probs, _ = model.log_probs(tokens)
    assert log_probs.shape == (3, 7, V)
    torch.testing.assert_close(log_probs.logsumexp(-1), torch.zeros(3, 7), atol=1e-5, rtol=0)
    targets = torch.randint(V, (3, 7))
    out = CrossEntropyObjective()(predicted, targets, weight, bias)
    assert torch.isfinite(out.loss) and out.count == 21
    gathered = -log_probs.gather(-1, targets[..., None]).sum()
    torch.testing.assert_close(out.nll_sum, gathered, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out.loss, gathered / 21, atol=1e-5, rtol=1e-5)


def test_causality(encoder_kind, output_kind):
    """Changing token t+1.. leaves the outputs at positions <= t unchanged."""
    model = _model(encoder_kind, output_kind)
    tokens = torch.randint(V, (2, 12))
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % V
    a, _, _ = model(tokens)
    b, _, _ = model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_carried_state_equals_one_long_run(encoder_kind, output_kind):
    """Segments fed one after another with the returned state equal one long segment."""
    model = _model(encoder_kind, output_kind)
    tokens = torch.randint(V, (2, 30))
    whole, _, _ = model(tokens)
    state, parts = None, []
    for chunk in tokens.split(7, dim=1):
        out, _, state = model(chunk, state)
        parts.append(out)
    torch.testing.assert_close(torch.cat(parts, 1), whole, atol=1e-5, rtol=1e-5)


def test_transformer_sliding_window_matches_explicit_windows():
    """With max_context C, each token is encoded from (at most) the last C tokens."""
    torch.manual_seed(0)
    context = 8
    model = build_model(model_config("transformer", "tied", max_context=context), V).eval()
    tokens = torch.randint(V, (1, 20))
    state, outs = None, []
    for chunk in tokens.split(1, dim=1):  # segment 1: every token sees exactly min(t+1, C) tokens
        out, _, state = model(chunk, state)
        outs.append(out)
    streamed = torch.cat(outs, 1)
    for t in range(20):
        window = tokens[:, max(0, t - context + 1) : t + 1]
        direct, _, _ = model(window)
        torch.testing.assert_close(streamed[:, t], direct[:, -1], atol=1e-5, rtol=1e-5)


def test_the_transformer_is_a_causal_decoder_stack_registered_as_transformer():
    from targetlm.modules import ENCODERS, Encoder

    assert ENCODERS.get("transformer") is CausalTransformer
    encoder = CausalTransformer(input_size=8, num_layers=1, num_heads=2, ff_size=8, max_context=4)
    assert isinstance(encoder, Encoder) and encoder.max_context == 4
    assert LstmEncoder(input_size=8, hidden_size=8).max_context is None  # unbounded


def test_transformer_rejects_segments_longer_than_its_context():
    encoder = CausalTransformer(input_size=8, num_layers=1, num_heads=2, ff_size=8, max_context=4)
    with pytest.raises(ValueError, match="max_context"):
        encoder(torch.zeros(1, 5, 8))


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_transformer_block_equals_a_direct_computation(norm, activation):
    """pre: x + Attn(LN(x)), x + FF(LN(x)) and a final LN; post (Vaswani et al.): LN(x + Attn(x)),
    LN(x + FF(x)) and none; causal softmax attention written out with an explicit mask."""
    torch.manual_seed(0)
    encoder = CausalTransformer(
        input_size=8,
        num_layers=1,
        num_heads=2,
        ff_size=12,
        dropout=0.0,
        positions="sinusoidal",
        norm=norm,
        activation=activation,
    ).eval()
    block = encoder.blocks[0]
    x = torch.randn(2, 5, 8)
    act = F.relu if activation == "relu" else F.gelu

    def attend(h):
        q, k, v = block.qkv(h).view(2, 5, 3, 2, 4).unbind(2)  # (B, T, heads, d/heads)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 2.0
        scores = scores.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf"))
        mixed = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(2, 5, 8)
        return block.proj(mixed)

    def ff(h):
        return block.ff[2](act(block.ff[0](h)))

    h = x + encoder.positions[:5]
    if norm == "pre":
        h = h + attend(block.norm1(h))
        h = encoder.norm(h + ff(block.norm2(h)))
    else:
        h = block.norm1(h + attend(h))
        h = block.norm2(h + ff(h))
    got, _ = encoder(x)
    torch.testing.assert_close(got, h, atol=1e-5, rtol=1e-5)


def test_transformer_rejects_unknown_norm_and_activation():
    with pytest.raises(ValueError, match="norm"):
        CausalTransformer(input_size=8, num_heads=2, norm="sandwich")
    with pytest.raises(ValueError, match="activation"):
        CausalTransformer(input_size=8, num_heads=2, activation="swish")


def test_tied_output_shares_the_input_embedding_and_counts_it_once():
    model = _model("lstm", "tied")
    weight, _ = model.output()
    assert weight is model.embedding.weight
    counts = model.parameter_counts()
    projection = sum(p.numel() for p in model.projection.parameters())
    assert counts["output"] == V + projection  # the bias (and projection), not the shared matrix
    assert sum(counts.values()) == sum(p.numel() for p in model.parameters())


def test_projection_added_when_hidden_size_differs_from_embedding():
    tied = build_model(model_config("lstm", "tied", embedding_size=16, hidden_size=24), V)
    assert isinstance(tied.projection, torch.nn.Linear)
    assert tied(torch.randint(V, (1, 3)))[0].shape[-1] == 16
    untied = build_model(model_config("lstm", "lookup", embedding_size=16, hidden_size=24), V)
    assert isinstance(untied.projection, torch.nn.Identity)
    assert untied.output.embedding_dim == 24


def test_lstm_output_size_avoids_projection():
    model = build_model(
        model_config("lstm", "tied", embedding_size=16, hidden_size=24, output_size=16), V
    )
    assert isinstance(model.projection, torch.nn.Identity)


def test_locked_dropout_shares_mask_over_time():
    torch.manual_seed(0)
    drop = LockedDropout(0.5).train()
    out = drop(torch.ones(4, 9, 6))
    assert torch.equal(out, out[:, :1].expand_as(out))
    assert set(out.unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(drop.eval()(torch.ones(2, 3, 4)), torch.ones(2, 3, 4))


def test_weight_drop_resamples_in_training_and_keeps_gradients():
    torch.manual_seed(0)
    encoder = LstmEncoder(input_size=5, hidden_size=6, num_layers=2, weight_drop=0.5)
    x = torch.randn(2, 4, 5)
    before = [layer.weight_hh_l0.detach().clone() for layer in encoder.layers]
    encoder.train()
    a, _ = encoder(x)
    b, _ = encoder(x)
    assert not torch.allclose(a, b)
    a.sum().backward()
    assert all(layer.weight_hh_l0.grad is not None for layer in encoder.layers)
    assert all(torch.equal(layer.weight_hh_l0, w) for layer, w in zip(encoder.layers, before))
    encoder.eval()
    torch.testing.assert_close(encoder(x)[0], encoder(x)[0])
    plain = LstmEncoder(input_size=5, hidden_size=6, num_layers=2).eval()
    plain.load_state_dict(encoder.state_dict())
    torch.testing.assert_close(plain(x)[0], encoder(x)[0])


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_cross_entropy_matches_torch(smoothing):
    torch.manual_seed(0)
    logits = torch.randn(11, 7)
    targets = torch.randint(7, (11,))
    targets[3] = IGNORE
    loss, nll_sum, count = functional.cross_entropy(logits, targets, smoothing)
    expected = F.cross_entropy(logits, targets, ignore_index=IGNORE, label_smoothing=smoothing)
    torch.testing.assert_close(loss, expected)
    mask = targets != IGNORE
    nll = F.cross_entropy(logits[mask], targets[mask], reduction="sum")
    torch.testing.assert_close(nll_sum, nll)
    assert count == 10


def test_label_smoothing_zero_equals_nll_and_gradcheck():
    logits = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 3, 1, 2, 2])
    loss, nll_sum, _ = functional.cross_entropy(logits, targets, 0.0)
    torch.testing.assert_close(loss, nll_sum / 5)

    def smoothed(x):
        return functional.cross_entropy(x.double(), targets, 0.2)[0]

    # cross_entropy upcasts to float32 for the loss; check the formula in float64 by hand
    log_probs = torch.log_softmax(logits, -1)
    manual = (
        0.8 * -log_probs.gather(1, targets[:, None]).squeeze(1) + 0.2 * -log_probs.mean(1)
    ).mean()
    torch.testing.assert_close(smoothed(logits).double(), manual, atol=1e-6, rtol=1e-6)


def test_objective_ignores_padding_only_batches():
    out = CrossEntropyObjective()(
        torch.randn(1, 2, 3), torch.full((1, 2), IGNORE), torch.randn(4, 3), None
    )
    assert out.count == 0 and float(out.loss) == 0.0


def test_registry_errors():
    registry: Registry = Registry("thing")

    @registry.register("a")
    class A:
        def __init__(self, size: int = 1) -> None:
            self.size = size

    with pytest.raises(ValueError, match="duplicate"):
        registry.register("a")(A)
    with pytest.raises(ConfigError, match="available: a"):
        registry.get("b")
    with pytest.raises(ConfigError, match="x.sise"):
        registry.build("a", {"sise": 2}, "x")
    with pytest.raises(ConfigError, match="x.size"):
        registry.build("a", {"size": "big"}, "x")
    assert registry.build("a", {"size": 3}).size == 3


def test_invalid_component_value_names_the_component():
    with pytest.raises(ConfigError, match="model.encoder"):
        build_model(model_config("lstm", "tied", dropout_hidden=1.5), V)


def test_every_encoder_is_in_the_contract_tests():
    from conftest import (
        BIDIRECTIONAL_ENCODER_OPTIONS,
        CONDITIONAL_ENCODER_OPTIONS,
        DENOISER_ENCODER_OPTIONS,
    )

    from targetlm.modules import ENCODERS

    tables = (
        set(ENCODER_OPTIONS)
        | set(CONDITIONAL_ENCODER_OPTIONS)
        | set(DENOISER_ENCODER_OPTIONS)
        | set(BIDIRECTIONAL_ENCODER_OPTIONS)
    )
    assert set(ENCODERS.names()) == tables


def test_build_model_uses_component_configs():
    config = model_config("lstm", "lookup")
    config = type(config)(
        config.embedding,
        ComponentConfig("lstm", {"hidden_size": 8, "num_layers": 1}),
        config.output,
    )
    model = build_model(config, V)
    assert model.encoder.output_size == 8 and len(model.encoder.layers) == 1


def test_capabilities_are_declared_interfaces(output_kind):
    """Callers ask ``isinstance(module, Capability)``; the compositional layers embed any
    string, every layer built here ties to a lookup input that has a table."""
    from targetlm.modules import (
        EmbeddingTable,
        HasTrainingCache,
        OpenVocabularyEmbedding,
        OpenVocabularyOutput,
    )

    model = _model("lstm", output_kind)
    compositional = output_kind in ("char_cnn", "groc")
    assert isinstance(model.output, OpenVocabularyOutput) == compositional
    assert isinstance(model.output, HasTrainingCache) == compositional
    assert isinstance(model.embedding, EmbeddingTable)
    assert not isinstance(model.embedding, OpenVocabularyEmbedding)  # a lookup table
