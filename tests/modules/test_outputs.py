"""The output-embedding family (bilinear, deep residual, adaptive, char-CNN, GroC) and the lexicon."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import CHAR_CNN, OUTPUT_OPTIONS, tiny_lexicon

import targetlm.lexicon
from targetlm import config as config_lib
from targetlm.cli import main
from targetlm.config import ComponentConfig, ConfigError
from targetlm.lexicon import Lexicon, LexiconError, encode_characters
from targetlm.lexicon import wordnet as wordnet_lib
from targetlm.modules import (
    AdaptiveOutput,
    BilinearOutput,
    CharCnn,
    CharCnnOutput,
    DeepResidualOutput,
    GrocEmbedding,
    GrocOutput,
    LookupEmbedding,
    ResidualNetwork,
    build_model,
)

WORDS = ["<unk>", "<eos>", "the", "dog", "dogs", "cat", "bank", "river", "money", "run", "ran"]
LEXICON = Lexicon(
    relations={"dog": ["puppy", "hound", "cur", "mutt"], "bank": ["depository"], "run": ["sprint"]},
    definitions={
        "dog": [
            "a",
            "member",
            "of",
            "the",
            "genus",
            "canis",
            "that",
            "has",
            "been",
            "domesticated",
            "by",
            "man",
            "since",
        ],
        "bank": ["sloping", "land", "beside", "a", "body", "of", "water"],
        "cat": ["feline", "mammal", "usually", "having", "thick", "soft", "fur"],
    },
)
SMALL = dict(depth=1, **CHAR_CNN)


def _groc(words=WORDS, lexicon=LEXICON, **options) -> GrocOutput:
    torch.manual_seed(0)
    return GrocOutput(words, hidden_size=12, lexicon=lexicon, **{**SMALL, **options})


def _embedding(size=10) -> LookupEmbedding:
    torch.manual_seed(0)
    return LookupEmbedding(len(WORDS), size)


# --- lookup-based layers ------------------------------------------------------------------
def test_bilinear_equals_input_embedding_times_w():
    embedding = _embedding()
    layer = BilinearOutput(len(WORDS), embedding, hidden_size=7)
    weight, bias = layer()
    torch.testing.assert_close(weight, embedding.weight @ layer.weight)
    assert weight.shape == (len(WORDS), 7) and bias.shape == (len(WORDS),)


def test_deep_residual_depth_zero_is_the_input_embedding_and_depth_k_the_recursion():
    embedding = _embedding()
    weight, _ = DeepResidualOutput(len(WORDS), embedding, depth=0)()
    assert torch.equal(weight, embedding.weight)
    layer = DeepResidualOutput(len(WORDS), embedding, depth=2, activation="selu").eval()
    expected = embedding.weight
    for linear in layer.network.layers:
        expected = F.selu(linear(expected)) + embedding.weight
    torch.testing.assert_close(layer()[0], expected)


def test_residual_dropout_is_variational_over_words():
    torch.manual_seed(0)
    network = ResidualNetwork(6, depth=1, dropout=0.5).train()
    network.layers[0].weight.data = torch.eye(6)
    network.layers[0].bias.data.zero_()
    network.activation = lambda x: x  # g(E) = drop(E): the mask shows directly
    rows = torch.ones(5, 6)
    dropped = network(rows) - rows  # (5, 6): the same dims dropped for every word
    assert torch.equal(dropped, dropped[:1].expand_as(dropped))
    assert set(dropped.unique().tolist()) <= {0.0, 2.0}


def test_adaptive_dropout_is_variational_over_words_and_off_in_eval():
    torch.manual_seed(0)
    layer = AdaptiveOutput(vocab_size=20, hidden_size=16, cutoffs=(4, 12), dropout=0.5).train()
    ratio = layer()[0] / layer.eval()()[0]  # (20, 16): the mask (0 or 2) scaled per dimension
    assert torch.allclose(ratio, ratio[:1].expand_as(ratio))
    assert set(ratio[0].round().unique().tolist()) <= {0.0, 2.0}
    with pytest.raises(ValueError, match="dropout"):
        AdaptiveOutput(vocab_size=20, hidden_size=16, dropout=1.0)


def test_every_output_layer_has_an_optional_bias(output_kind):
    """Inan et al. §4 (RE) sets the output bias to zero: every output layer can drop it."""
    from conftest import model_config

    from targetlm.modules import OUTPUT_LAYERS

    assert "bias" in OUTPUT_LAYERS.options(output_kind)
    config = model_config("lstm", output_kind)
    config = config.__class__(
        **{
            **config.__dict__,
            "output": ComponentConfig(output_kind, {**config.output.options, "bias": False}),
        }
    )
    torch.manual_seed(0)
    model = build_model(config, WORDS, lexicon=tiny_lexicon(WORDS))
    weight, bias = model.output()
    assert bias is None and weight.shape[0] == len(WORDS)
    assert not any(
        "bias" in name and "output" in name and p.numel() == len(WORDS)
        for name, p in model.named_parameters()
    )


def test_adaptive_bins_shapes_and_parameters():
    layer = AdaptiveOutput(vocab_size=20, hidden_size=16, cutoffs=(4, 12), factor=2.0)
    assert layer.bins == [(0, 4), (4, 12), (12, 20)]
    assert [t.shape for t in layer.tables] == [(4, 16), (8, 8), (8, 4)]
    weight, bias = layer()
    assert weight.shape == (20, 16) and bias.shape == (20,)
    expected = 4 * 16 + 8 * 8 + 8 * 4 + 8 * 16 + 4 * 16 + 20
    assert sum(p.numel() for p in layer.parameters()) == expected
    # cutoffs past the vocabulary are ignored: one bin, no projection
    small = AdaptiveOutput(vocab_size=3, hidden_size=16, cutoffs=(4, 12))
    assert small.bins == [(0, 3)] and small()[0].shape == (3, 16)
    with pytest.raises(ValueError, match="increasing"):
        AdaptiveOutput(vocab_size=20, hidden_size=16, cutoffs=(12, 4))


# --- compositional layers -----------------------------------------------------------------
def test_characters_have_markers_and_are_cut():
    ids, lengths = encode_characters(["ab", "é", "abcdefgh"], max_length=5, min_length=6)
    assert ids.shape == (3, 6) and lengths.tolist() == [4, 4, 5]
    assert ids[0, :4].tolist() == [1, ord("a") + 3, ord("b") + 3, 2] and ids[0, 4:].eq(0).all()
    assert ids[1, 1:3].tolist() == [b + 3 for b in "é".encode()]


@pytest.mark.parametrize("single_pass", [False, True])
def test_char_cnn_matches_one_conv1d_per_word(single_pass):
    """Both window layouts (length groups on CPU, one padded pass on GPUs) equal a plain
    per-word Conv1d over the word's max(length, K) characters, max over time, tanh, highway."""
    torch.manual_seed(0)
    cnn = CharCnn(char_size=5, widths=(1, 2, 4), channels_per_width=3, highway_layers=1)
    cnn.single_pass = single_pass
    words = ["a", "dog", "ab", "hippopotamus", "x-y", "hippo", "dogs", "ab"]  # unsorted
    chars, lengths = encode_characters(words, max_length=12, min_length=cnn.max_width)
    got = cnn(chars, lengths)
    rows = []
    for ids, length in zip(chars, lengths.tolist()):
        x = cnn.characters(ids[: max(length, cnn.max_width)]).t()[None]  # (1, C, n)
        pooled = [conv(x).amax(-1) for conv in cnn.convolutions]  # valid windows only
        rows.append(torch.cat(pooled, 1))
    expected = cnn.highway(torch.tanh(torch.cat(rows)))
    torch.testing.assert_close(got, expected)
    (grad,) = torch.autograd.grad(got.square().sum(), cnn.convolutions[2].weight)
    (expected_grad,) = torch.autograd.grad(expected.square().sum(), cnn.convolutions[2].weight)
    torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("kind", ["char_cnn", "groc"])
def test_compositional_layers_embed_unseen_strings_and_own_no_vocabulary_parameter(kind):
    options = OUTPUT_OPTIONS[kind]
    lexicons = {"char_cnn": {}, "groc": {"lexicon": LEXICON}}[kind]
    torch.manual_seed(0)
    small = (CharCnnOutput if kind == "char_cnn" else GrocOutput)(WORDS, 12, **lexicons, **options)
    torch.manual_seed(0)
    large = (CharCnnOutput if kind == "char_cnn" else GrocOutput)(
        WORDS + [f"word{i}" for i in range(50)], 12, **lexicons, **options
    )
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(small) == count(large)
    assert set(small.state_dict()) == set(large.state_dict())
    large.load_state_dict(small.state_dict())  # a checkpoint moves to another vocabulary
    small.eval(), large.eval()
    with torch.no_grad():
        torch.testing.assert_close(large()[0][: len(WORDS)], small()[0])
        weight, bias = small.embed_words(["zebra", "dog", "un-seen"])
        assert weight.shape == (3, 12) and bias.shape == (3,)
        torch.testing.assert_close(weight[1], small()[0][WORDS.index("dog")])


def test_char_cnn_correction_is_per_word_and_off_for_unseen_words():
    layer = CharCnnOutput(WORDS, 12, correction=4, **CHAR_CNN)
    assert layer.correction.weight.shape == (len(WORDS), 4)
    torch.nn.init.normal_(layer.correction_map.weight)
    plain = CharCnnOutput(WORDS, 12, **CHAR_CNN)
    plain.load_state_dict(layer.state_dict(), strict=False)
    layer.eval(), plain.eval()
    with torch.no_grad():
        weight, _ = layer.embed_words(["dog", "zebra"])
        reference, _ = plain.embed_words(["dog", "zebra"])
        torch.testing.assert_close(weight[1], reference[1])  # unseen: no correction
        assert not torch.allclose(weight[0], reference[0])
        torch.testing.assert_close(layer()[0][WORDS.index("dog")], weight[0])


def _naive_groc(layer: GrocOutput, words, lexicon) -> torch.Tensor:
    """E_out one word at a time, each string encoded on its own (no dedup, no bags)."""
    encoder, max_length = layer.encoder, layer.max_word_length

    def surface(strings):
        chars, lengths = encode_characters(strings, max_length, encoder.cnn.max_width)
        return encoder.cnn(chars, lengths)

    rows = []
    for word in words:
        parts = [surface([word])[0]]
        for bag in (lexicon.relations(word), lexicon.definition(word)):
            encodings = [surface([s])[0] for s in bag]
            parts.append(
                torch.stack(encodings).mean(0) if encodings else torch.zeros_like(parts[0])
            )
        rows.append(encoder.projection(torch.cat(parts)))
    return layer.network(torch.stack(rows))


def test_groc_unique_string_batching_equals_the_naive_computation():
    layer = _groc().eval()
    expected_lexicon = LEXICON.truncated(3, 10)
    with torch.no_grad():
        weight, bias = layer()
        naive = _naive_groc(layer, WORDS, expected_lexicon)
        torch.testing.assert_close(weight, naive, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(bias, torch.tanh(layer.bias_layer(naive)).squeeze(-1))
        # a subset of rows (what the input embedding does) gives the same rows
        rows = torch.tensor([6, 3, 3, 0])
        torch.testing.assert_close(layer.network(layer.encoder(layer.index, rows)), naive[rows])
    # each string is indexed once: the word "dog" also appears in cat's gloss... as a string
    strings = layer.index.chars.size(0)
    distinct = set(WORDS)
    for word in WORDS:
        distinct |= set(expected_lexicon.relations(word)) | set(expected_lexicon.definition(word))
    assert strings == len(distinct)


def test_groc_bias_is_eq_5_with_tanh():
    """b_v = tanh(w · e_v + a) (eq. 5: "σ is the activation function"; tanh in the authors'
    code); the activation is no option, so a config that names one is one error."""
    with torch.no_grad():
        layer = _groc().eval()
        weight, bias = layer()
        w, a = layer.bias_layer.weight[0], layer.bias_layer.bias[0]
        torch.testing.assert_close(bias, torch.tanh(weight @ w + a))
    assert bias.min() < 0  # tanh's range, not the sigmoid's
    with pytest.raises(ConfigError, match="unknown key model.output.bias_activation for output"):
        build_model(
            config_lib.ModelConfig(
                encoder=ComponentConfig("lstm", {"hidden_size": 12, "num_layers": 1}),
                output=ComponentConfig(
                    "groc", {**OUTPUT_OPTIONS["groc"], "bias_activation": "sigmoid"}
                ),
            ),
            WORDS,
            lexicon=LEXICON,
        )


def test_groc_projection_is_3d_squared_without_bias():
    """§3.4: "3d² parameters for projection": [c; r; d] (3d) -> d, when the char-CNN gives d."""
    torch.manual_seed(0)
    d = 12
    layer = GrocOutput(WORDS, d, LEXICON, char_size=4, widths=(1, 2, 3), channels_per_width=4)
    assert layer.encoder.cnn.output_size == d
    assert layer.encoder.projection.bias is None
    assert sum(p.numel() for p in layer.encoder.projection.parameters()) == 3 * d * d


def test_groc_ablations_and_missing_parts_are_zero():
    full = _groc()
    assert full.encoder.projection.in_features == 3 * full.encoder.cnn.output_size
    no_rel = _groc(relations=False)
    assert no_rel.encoder.projection.in_features == 2 * no_rel.encoder.cnn.output_size
    plain = _groc(relations=False, definitions=False, lexicon=None, depth=0)
    assert plain.encoder.projection.in_features == plain.encoder.cnn.output_size
    assert len(plain.network.layers) == 0 and plain.lexicon is None
    with pytest.raises(ValueError, match="lexicon"):
        GrocOutput(WORDS, 12, lexicon=None)


def test_groc_input_embedding_equals_its_table():
    torch.manual_seed(0)
    embedding = GrocEmbedding(WORDS, LEXICON, size=10, **CHAR_CNN)
    tokens = torch.tensor([[3, 4, 3], [0, 10, 6]])
    with torch.no_grad():
        torch.testing.assert_close(embedding(tokens), embedding.table()[tokens])
    model = build_model(
        config_lib.ModelConfig(
            embedding=ComponentConfig("groc", {"size": 10, **CHAR_CNN}),
            encoder=ComponentConfig("lstm", {"hidden_size": 12, "num_layers": 1}),
            output=ComponentConfig("groc", dict(OUTPUT_OPTIONS["groc"])),
        ),
        WORDS,
        lexicon=LEXICON,
    )
    loss = model.log_probs(tokens)[0].sum()
    loss.backward()
    assert model.embedding.encoder.projection.weight.grad is not None


def test_tied_output_ties_to_the_composed_groc_input_table():
    torch.manual_seed(0)
    model = build_model(
        config_lib.ModelConfig(
            embedding=ComponentConfig("groc", {"size": 10, **CHAR_CNN}),
            encoder=ComponentConfig("lstm", {"hidden_size": 12, "num_layers": 1}),
            output=ComponentConfig("tied"),
        ),
        WORDS,
        lexicon=LEXICON,
    )
    weight, bias = model.output()
    torch.testing.assert_close(weight, model.embedding.table())
    assert bias.shape == (len(WORDS),)
    model.log_probs(torch.tensor([[3, 4, 3]]))[0].sum().backward()
    assert model.embedding.encoder.projection.weight.grad is not None


def _groc_both_sides(
    share: bool | str | None,
    embedding_size: int = 12,
    embedding_kind: str = "groc",
    embedding_options: dict | None = None,
    **output,
) -> torch.nn.Module:
    """A GroC output over an input embedding; ``share`` None leaves share_encoder unset."""
    torch.manual_seed(0)
    embedding = {"size": embedding_size, **(CHAR_CNN if embedding_kind == "groc" else {})}
    sharing = {} if share is None else {"share_encoder": share}
    return build_model(
        config_lib.ModelConfig(
            embedding=ComponentConfig(embedding_kind, {**embedding, **(embedding_options or {})}),
            encoder=ComponentConfig("lstm", {"hidden_size": 12, "num_layers": 1}),
            output=ComponentConfig("groc", {**OUTPUT_OPTIONS["groc"], **sharing, **output}),
        ),
        WORDS,
        lexicon=LEXICON,
    )


def test_groc_output_can_share_the_input_encoder():
    shared, separate = _groc_both_sides(True), _groc_both_sides(False)
    assert shared.output.encoder is shared.embedding.encoder
    encoder_params = sum(p.numel() for p in separate.output.encoder.parameters())
    total = lambda m: sum(m.parameter_counts().values())  # noqa: E731
    assert total(shared) == total(separate) - encoder_params
    assert (
        shared.parameter_counts()["input_embedding"]
        == separate.parameter_counts()["input_embedding"]
    )
    # the output embeddings are the shared encodings through the output network
    with torch.no_grad():
        expected = shared.output.network(shared.embedding.table())
        torch.testing.assert_close(shared.output()[0], expected)
    # both sides send gradients into the one encoder
    shared.log_probs(torch.tensor([[3, 4]]))[0][0, -1, 5].backward()
    grad_both = shared.embedding.encoder.projection.weight.grad.clone()
    shared.zero_grad()
    shared.output()[0].sum().backward()
    assert shared.embedding.encoder.projection.weight.grad.abs().sum() > 0
    assert not torch.allclose(grad_both, shared.embedding.encoder.projection.weight.grad)


def test_groc_output_shares_a_fitting_groc_input_encoder_by_default():
    """The paper's GroC: E_out = g(E_in) (§3.2) unless the input embedding cannot give it."""
    for share in (None, "auto"):
        model = _groc_both_sides(share)
        assert model.output.encoder is model.embedding.encoder
        model = _groc_both_sides(  # an ablation on both sides
            share, relations=False, embedding_options={"relations": False}
        )
        assert model.output.encoder is model.embedding.encoder
    for unfit in (
        _groc_both_sides(None, embedding_kind="lookup"),
        _groc_both_sides(None, embedding_size=10),
        _groc_both_sides(None, definitions=False),  # the output alone: another encoder
        _groc_both_sides(False),
    ):
        encoders = [m for m in unfit.modules() if type(m).__name__ == "GroundedEncoder"]
        assert unfit.output.encoder is not getattr(unfit.embedding, "encoder", None)
        assert len(encoders) == (2 if hasattr(unfit.embedding, "encoder") else 1)


@pytest.mark.parametrize(
    "change, message",
    [({"embedding_size": 10}, "size"), ({"relations": False}, "relations/definitions")],
)
def test_sharing_the_encoder_needs_a_matching_groc_input(change, message):
    with pytest.raises(ConfigError, match=message):
        _groc_both_sides(True, **change)
    with pytest.raises(ConfigError, match="groc input embedding"):
        build_model(
            config_lib.ModelConfig(
                encoder=ComponentConfig("lstm", {"hidden_size": 12, "num_layers": 1}),
                output=ComponentConfig("groc", {**OUTPUT_OPTIONS["groc"], "share_encoder": True}),
            ),
            WORDS,
            lexicon=LEXICON,
        )


def test_groc_dropout_at_depth_zero_is_variational_on_the_output_embeddings():
    """Table 8's r with k = 0: one mask over d for every word's E_out, in training only."""
    layer = _groc(depth=0, dropout=0.5)
    with torch.no_grad():
        clean = layer.encoder(layer.index)  # E^(0)
        layer.train()
        torch.manual_seed(1)
        dropped, bias = layer()
        kept = dropped != 0
        assert torch.equal(kept, kept[:1].expand_as(kept)) and 0 < kept[0].sum() < 12
        torch.testing.assert_close(dropped[kept], 2 * clean[kept])
        torch.testing.assert_close(bias, layer.compositional_bias(dropped))
        layer.eval()
        torch.testing.assert_close(layer()[0], clean)
    assert _groc(depth=1, dropout=0.5).embedding_dropout == 0  # between the layers instead


def test_groc_input_embedding_embeds_other_words_with_the_same_encoder():
    torch.manual_seed(0)
    embedding = GrocEmbedding(WORDS, LEXICON, size=10, **CHAR_CNN).eval()
    words = [*WORDS, "zebra", "dog-like"]
    lexicon = LEXICON.merged(Lexicon({"zebra": ["equine"]}, {"zebra": ["striped", "horse"]}))
    extended = embedding.for_words(words, lexicon)
    assert extended.encoder is embedding.encoder and not extended.training
    torch.manual_seed(0)
    direct = GrocEmbedding(words, lexicon, size=10, **CHAR_CNN)
    direct.load_state_dict(embedding.state_dict())
    tokens = torch.tensor([[11, 3, 12], [0, 11, 2]])
    with torch.no_grad():
        torch.testing.assert_close(extended(tokens), direct(tokens))
        torch.testing.assert_close(extended.table()[: len(WORDS)], embedding.table())
        assert embedding.index.word.numel() == len(WORDS)  # the original is unchanged
        own = embedding.for_words(words)  # its own lexicon: no entries for the new words
        assert not torch.allclose(own(tokens[:, :1]), extended(tokens[:, :1]))


def test_sparse_updates_reuse_the_cached_output_embeddings():
    torch.manual_seed(0)
    never = _groc(update_prob=0.0).train()
    first, _ = never()
    assert first.requires_grad  # no cache yet: computed with gradients
    weight, bias = never()
    assert not weight.requires_grad and torch.equal(weight, first)
    (weight.sum() + bias.sum()).backward()
    assert all(p.grad is None for p in never.encoder.parameters())
    assert never.bias_layer.weight.grad is not None  # the bias still learns
    always = _groc(update_prob=1.0).train()
    a, _ = always()
    b, _ = always()
    assert a.requires_grad and b.requires_grad and a is not b
    a.sum().backward()
    assert all(p.grad is not None for p in always.encoder.cnn.convolutions.parameters())


def test_sparse_updates_recompute_with_probability_p():
    torch.manual_seed(0)
    layer = _groc(update_prob=0.3).train()
    recomputed = sum(layer()[0].requires_grad for _ in range(200))
    assert 40 <= recomputed <= 80  # 1 + Binomial(199, 0.3)


def test_eval_cache_is_reused_until_a_parameter_changes_or_train():
    layer = _groc().eval()
    with torch.no_grad():
        first = layer()
        assert layer() is first
    assert layer()[0].requires_grad  # with gradients enabled: computed, not cached
    with torch.no_grad():
        layer.encoder.projection.weight.add_(0.1)
        second = layer()
    assert second is not first and not torch.equal(second[0], first[0])
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer.train()
    layer()[0].sum().backward()
    optimizer.step()
    layer.eval()
    with torch.no_grad():
        third = layer()
        assert third is not second and layer() is third
    layer.train().eval()
    with torch.no_grad():
        assert layer() is not third


def test_every_output_kind_trains(output_kind, tmp_path):
    from targetlm.training import Trainer

    data = dict(config_lib.Config().to_dict())
    config = config_lib.from_dict(
        {
            **data,
            "data": {
                "batch_size": 4,
                "bptt": 8,
                "synthetic": {"train_sentences": 30, "valid_sentences": 5, "test_sentences": 5},
            },
            "model": {
                "embedding": {"kind": "lookup", "size": 12},
                "encoder": {"kind": "lstm", "hidden_size": 12, "num_layers": 1},
                "output": {"kind": output_kind, **OUTPUT_OPTIONS[output_kind]},
            },
            "train": {"lr": 0.5, "max_steps": 3, "progress": False, "log_every": 1},
            "eval": {"batch_size": 2},
        }
    )
    results = Trainer(config, tmp_path / "run", log=lambda m: None).train()
    assert results["test"]["ppl"] < float("inf")


# --- configuration: validation needs no WordNet ---------------------------------------
def test_validation_and_describe_read_no_lexicon(monkeypatch, capsys):
    def no_wordnet(*args, **kwargs):
        raise LexiconError("WordNet 3.0 for NLTK: not found")

    monkeypatch.setattr(targetlm.lexicon, "load_lexicon", no_wordnet)
    config = config_lib.load("configs/groc-ptb.toml", ["data.name=synthetic"])
    assert config.model.output.kind == "groc"
    assert main(["describe", "configs/groc-ptb.toml", "--set", "data.name=synthetic"]) == 0
    with pytest.raises(LexiconError, match="not found"):
        build_model(config.model, WORDS)


GROC_CONFIGS = sorted(Path("configs").glob("outputs-ptb-*.toml"))


def test_output_presets_share_prefix_and_budget():
    assert len(GROC_CONFIGS) == 10
    configs = {p.stem: config_lib.load(p) for p in GROC_CONFIGS}
    reference = configs["outputs-ptb-tied"]
    for name, config in configs.items():
        assert config.model.encoder == reference.model.encoder, name
        assert config.train == reference.train and config.data == reference.data, name
        groc = config.model.output.kind == "groc"  # the paper's GroC: its own input embedding
        assert config.model.embedding.kind == ("groc" if groc else "lookup"), name
    kinds = {name.removeprefix("outputs-ptb-"): c.model.output.kind for name, c in configs.items()}
    assert kinds["groc-noreldef"] == "groc" and kinds["charcnn"] == "char_cnn"
    groc = config_lib.load("configs/groc-ptb.toml")
    assert groc.model == configs["outputs-ptb-groc"].model
    assert groc.train == reference.train


# Pappas et al. Table 8, penn: (r, k) of GroC and its ablations
TABLE_8 = {
    "groc": (0.2, 0),
    "groc-norel": (0.3, 0),
    "groc-nodef": (0.2, 0),
    "groc-noreldef": (0.3, 0),
}


@pytest.mark.parametrize("name", sorted(TABLE_8))
def test_groc_presets_build_the_papers_model(name):
    """E_out = g(E_in) with one encoder (§3.2), Table 8's depth and dropout, a 3d² projection."""
    config = config_lib.load(f"configs/outputs-ptb-{name}.toml", ["data.name=synthetic"])
    model = build_model(config.model, WORDS, lexicon=Lexicon())
    output, embedding = model.output, model.embedding
    assert output.encoder is embedding.encoder
    dropout, depth = TABLE_8[name]
    assert len(output.network.layers) == depth and output.embedding_dropout == dropout
    d = output.embedding_dim
    assert embedding.encoder.cnn.output_size == d
    parts = 1 + embedding.encoder.relations + embedding.encoder.definitions
    assert embedding.encoder.projection.weight.numel() == parts * d * d
    assert (parts == 3) == (name == "groc")


REAL_DATA = os.environ.get("TARGETLM_DATA", "")
real_data = pytest.mark.skipif(
    not (REAL_DATA and all((Path(REAL_DATA) / n).is_dir() for n in ("ptb", "wikitext-2"))),
    reason="real corpora not available: set TARGETLM_DATA to a directory with ptb/ and wikitext-2/",
)


@pytest.mark.slow  # builds the presets on real data; CI runs it
@real_data
def test_groc_presets_have_fewer_parameters_than_tied(capsys):
    """Issue 10: GroC's preset has fewer parameters than the tied model with the same prefix."""
    totals = {}
    for name in ("groc-ptb", "outputs-ptb-tied", *(f"outputs-ptb-{n}" for n in TABLE_8)):
        assert main(["describe", f"configs/{name}.toml", "--json"]) == 0
        totals[name] = json.loads(capsys.readouterr().out)["total_params"]
    for name, total in totals.items():
        assert name == "outputs-ptb-tied" or total < totals["outputs-ptb-tied"], totals


@pytest.mark.slow  # builds the presets on real data; CI runs it
@real_data
def test_groc_parameters_do_not_depend_on_the_corpus_vocabulary(capsys):
    totals = []
    for extra in ([], ["--set", "data.name=wikitext-2"]):
        assert main(["describe", "configs/groc-ptb.toml", "--json", *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        totals.append((out["total_params"], out["vocab_size"]))
    (ptb_total, ptb_vocab), (wt2_total, wt2_vocab) = totals
    assert ptb_total == wt2_total and ptb_vocab != wt2_vocab


# --- lexicon ------------------------------------------------------------------------------
def test_lexicon_truncates_to_3_relatives_and_10_gloss_words(tmp_path):
    lexicon = Lexicon(
        {"a": [f"r{i}" for i in range(7)]}, {"a": [f"g{i}" for i in range(15)], "b": ["x"]}
    )
    assert lexicon.relations("a") == ["r0", "r1", "r2"]
    assert lexicon.definition("a") == [f"g{i}" for i in range(10)]
    assert lexicon.relations("missing") == [] and lexicon.definition("b") == ["x"]
    short = lexicon.truncated(1, 2)
    assert short.relations("a") == ["r0"] and short.definition("a") == ["g0", "g1"]
    lexicon.save(tmp_path / "lexicon.json")
    assert Lexicon.load(tmp_path / "lexicon.json") == lexicon
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(LexiconError, match="bad.json"):
        Lexicon.load(tmp_path / "bad.json")


def test_lexicon_drop_removes_a_seeded_fraction():
    words = [f"w{i}" for i in range(200)]
    lexicon = tiny_lexicon(words)
    kept = lexicon.without(0.25, seed=1)
    assert len(kept) == len(lexicon) - round(0.25 * len(lexicon))
    assert kept == lexicon.without(0.25, seed=1) and kept != lexicon.without(0.25, seed=2)
    assert len(lexicon.without(1.0)) == 0 and lexicon.without(0.0) == lexicon
    coverage = lexicon.coverage(words)
    assert coverage["words"] == 200 and 0 < coverage["relations"] < 1
    layer = _groc(words=words, lexicon=lexicon, lexicon_drop=0.5, lexicon_seed=3)
    assert layer.lexicon == lexicon.without(0.5, 3)


def test_missing_wordnet_is_one_clear_line(monkeypatch, tmp_path):
    nltk = pytest.importorskip("nltk")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(LexiconError) as error:
        wordnet_lib.load_lexicon(["dog"], cache_dir=tmp_path)
    message = str(error.value)
    assert "\n" not in message and "WordNet" in message
    assert "install_wordnet.sh" in message and "nltk.downloader wordnet" in message
    monkeypatch.setitem(sys.modules, "nltk", None)
    with pytest.raises(LexiconError, match="pip install nltk"):
        wordnet_lib.open_wordnet()


needs_wordnet = pytest.mark.skipif(
    not wordnet_lib.wordnet_available(),
    reason="WordNet 3.0 not installed: bash scripts/install_wordnet.sh $TARGETLM_DATA",
)


@pytest.mark.slow  # NLTK reads WordNet for 5 s; CI runs it with this file's slow cases
@needs_wordnet
def test_wordnet_entries_and_cached_lexicon(tmp_path):
    wordnet = wordnet_lib.open_wordnet()
    related, gloss = wordnet_lib.wordnet_entry(wordnet, "dog")
    assert related == ["domestic_dog", "Canis_familiaris", "frump"]
    assert gloss[:5] == ["a", "member", "of", "the", "genus"] and len(gloss) == 10
    assert wordnet_lib.wordnet_entry(wordnet, "<unk>") == ([], [])
    words = ["<unk>", "<eos>", "dog", "dogs", "the", "bank"]
    lexicon = wordnet_lib.load_lexicon(words, cache_dir=tmp_path)
    (cached,) = tmp_path.glob("*.json")
    assert Lexicon.load(cached) == lexicon
    assert lexicon.relations("dogs")[0] == "dog"  # morphy: the lemma of an inflected form
    assert lexicon.coverage(words) == {"words": 6, "relations": 0.5, "definitions": 0.5}


def test_cli_lexicon_stats(capsys):
    # the autouse fake_wordnet fixture stands in for WordNet (tiny_lexicon)
    assert main(["lexicon", "stats", "--data", "synthetic", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["data"] == "synthetic" and stats["words"] > 100
    assert 0.5 < stats["relations"] < 0.8 and 0.6 < stats["definitions"] < 0.9
    assert main(["lexicon", "stats", "--data", "synthetic", "--drop", "1.0"]) == 0
    assert "relations 0.0%, definitions 0.0%" in capsys.readouterr().out
