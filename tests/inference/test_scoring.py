"""Open-vocabulary scoring, unigram and neural caches, frequency bins (Pappas et al. 2020)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from conftest import CHAR_CNN, OUTPUT_OPTIONS, model_config, tiny_lexicon

from targetlm.analysis.frequency import frequency_bin_table
from targetlm.config import ComponentConfig, ModelConfig
from targetlm.data.batching import IGNORE
from targetlm.data.vocab import EOS, Vocabulary, tokens_from_text
from targetlm.inference import evaluate_stream
from targetlm.inference.caches import NeuralCache, UnigramCache
from targetlm.inference.scoring import Combiners, TokenScores, score_text
from targetlm.modules import GrocEmbedding, LanguageModel, build_model

TRAIN = "the cat sat on the mat\nthe dog sat on the log\na cat saw a dog\n" * 3
TEST = "the cat saw the zebra\na zebra sat on a sofa\nthe dog saw the cat on the sofa\n"


def _setup(output: str = "tied"):
    vocab = Vocabulary.build(tokens_from_text(TRAIN))
    torch.manual_seed(0)
    model = build_model(model_config("lstm", output), vocab.itos).eval()
    return vocab, model, tokens_from_text(TEST)


def test_closed_scoring_equals_evaluate_stream():
    vocab, model, tokens = _setup()
    scores = score_text(model, vocab, tokens, batch_size=2, segment=4)
    ids = vocab.encode([EOS, *tokens])
    expected = evaluate_stream(model, ids, batch_size=2, segment=4)
    assert math.isclose(scores.summary()["ppl"], expected["ppl"], rel_tol=1e-5)
    assert scores.summary()["new_tokens"] == sum(t not in vocab for t in tokens) > 0


@pytest.mark.parametrize(
    "combiners",
    [
        Combiners(),
        Combiners(unigram_cache=0.3),
        Combiners(neural_cache=0.2, neural_window=5, neural_theta=0.7),
        Combiners(uniform_weight=0.05, new_word_weight=0.5, unigram_cache=0.1, neural_cache=0.1),
    ],
)
def test_every_combiner_is_independent_of_the_segment_length(combiners):
    vocab, model, tokens = _setup()
    short = score_text(model, vocab, tokens, open_vocabulary=True, combiners=combiners, segment=3)
    long = score_text(model, vocab, tokens, open_vocabulary=True, combiners=combiners, segment=50)
    torch.testing.assert_close(short.log_probs, long.log_probs)
    assert torch.isfinite(short.log_probs).all()


def test_closed_layer_in_open_vocabulary_is_mixed_with_uniform():
    vocab, model, tokens = _setup()
    mu = 0.05
    closed = score_text(model, vocab, tokens, segment=50, batch_size=1)
    opened = score_text(
        model, vocab, tokens, open_vocabulary=True, segment=50, batch_size=1,
        combiners=Combiners(uniform_weight=mu),
    )  # fmt: skip
    eval_size = len(vocab) + len({t for t in tokens if t not in vocab})
    new = opened.is_new
    torch.testing.assert_close(
        opened.log_probs[new], torch.full((int(new.sum()),), math.log(mu / eval_size))
    )
    expected_known = ((1 - mu) * closed.log_probs[~new].exp() + mu / eval_size).log()
    torch.testing.assert_close(opened.log_probs[~new], expected_known)


def test_compositional_layer_scores_new_words_itself_and_normalises():
    vocab, model, tokens = _setup("char_cnn")  # a lookup input embedding: new inputs are <unk>
    scores = score_text(model, vocab, tokens, open_vocabulary=True, batch_size=1, segment=50)
    eval_words = list(vocab.itos) + sorted({t for t in tokens if t not in vocab}, key=tokens.index)
    weight, bias = model.output.embed_words(eval_words)
    hidden, _, _ = model(vocab.encode([EOS, *tokens[:-1]])[None])
    log_probs = torch.log_softmax(hidden @ weight.t() + bias, -1)[0]  # (N, V_eval)
    expected = log_probs.gather(1, torch.tensor([eval_words.index(t) for t in tokens])[:, None])
    torch.testing.assert_close(scores.log_probs, expected.squeeze(1), rtol=1e-4, atol=1e-5)
    assert scores.is_new.any()


def _new_words(vocab: Vocabulary, tokens: list[str]) -> list[str]:
    return sorted({t for t in tokens if t not in vocab}, key=tokens.index)


def test_groc_input_embeds_the_new_words_themselves():
    """Pappas et al. §3.1: "any word's input embedding can be calculated compositionally":
    in open vocabulary a GroC input embedding reads a new word as itself, not as <unk>."""
    vocab = Vocabulary.build(tokens_from_text(TRAIN))
    torch.manual_seed(0)
    groc = {"size": 12, **CHAR_CNN}
    model = build_model(
        ModelConfig(
            embedding=ComponentConfig("groc", groc),
            encoder=ComponentConfig("lstm", {"hidden_size": 12, "num_layers": 1}),
            output=ComponentConfig("groc", dict(OUTPUT_OPTIONS["groc"])),
        ),
        vocab.itos,
    ).eval()
    tokens = tokens_from_text(TEST)
    eval_words = list(vocab.itos) + _new_words(vocab, tokens)
    lexicon = tiny_lexicon(eval_words)
    scores = score_text(
        model, vocab, tokens, open_vocabulary=True, batch_size=1, segment=50, lexicon=lexicon
    )
    assert model.output.encoder is model.embedding.encoder  # the paper's E_out = g(E_in)
    assert model.embedding.index.word.numel() == len(vocab)  # the model is left as it was
    # lexicon None: each side's own lexicon merged with (the stand-in) WordNet's new entries
    grounded = score_text(model, vocab, tokens, open_vocabulary=True, batch_size=1, segment=50)
    assert torch.isfinite(grounded.log_probs).all()
    # directly: the input embedding built for V_eval (same parameters), the output's E_out(V_eval)
    direct = GrocEmbedding(eval_words, lexicon, **groc)
    direct.load_state_dict(model.embedding.state_dict())
    weight, bias = model.output.embed_words(eval_words, lexicon)
    targets = torch.tensor([eval_words.index(t) for t in tokens])
    inputs = {
        "own": torch.tensor([eval_words.index(t) for t in [EOS, *tokens[:-1]]]),
        "unk": vocab.encode([EOS, *tokens[:-1]]),  # what a lookup input embedding reads
    }
    expected = {}
    with torch.no_grad():
        for name, ids in inputs.items():
            embedding = direct if name == "own" else model.embedding
            hidden, _, _ = LanguageModel(embedding, model.encoder, model.output)(ids[None])
            log_probs = torch.log_softmax(hidden @ weight.t() + bias, -1)[0]  # (N, V_eval)
            expected[name] = log_probs.gather(1, targets[:, None]).squeeze(1)
    torch.testing.assert_close(scores.log_probs, expected["own"], rtol=1e-4, atol=1e-5)
    after_new = torch.tensor([t not in vocab for t in [EOS, *tokens[:-1]]])  # its input is new
    assert after_new.any()
    assert not torch.allclose(scores.log_probs[after_new], expected["unk"][after_new])
    torch.testing.assert_close(scores.log_probs[:2], expected["unk"][:2])  # before any new word


def test_new_word_down_weighting_keeps_a_distribution():
    vocab, model, tokens = _setup("char_cnn")
    plain = score_text(model, vocab, tokens, open_vocabulary=True, batch_size=1, segment=50)
    omega = 0.25
    weighted = score_text(
        model, vocab, tokens, open_vocabulary=True, batch_size=1, segment=50,
        combiners=Combiners(new_word_weight=omega),
    )  # fmt: skip
    eval_words = list(vocab.itos) + sorted({t for t in tokens if t not in vocab}, key=tokens.index)
    weight, bias = model.output.embed_words(eval_words)
    hidden, _, _ = model(vocab.encode([EOS, *tokens[:-1]])[None])
    probs = torch.softmax(hidden @ weight.t() + bias, -1)[0]  # (N, V_eval)
    scale = torch.ones(len(eval_words))
    scale[len(vocab) :] = omega
    adjusted = probs * scale / (probs * scale).sum(-1, keepdim=True)
    expected = adjusted.gather(1, torch.tensor([eval_words.index(t) for t in tokens])[:, None])
    torch.testing.assert_close(weighted.log_probs, expected.squeeze(1).log(), rtol=1e-4, atol=1e-5)
    assert (weighted.log_probs[plain.is_new] < plain.log_probs[plain.is_new]).all()


def _naive_unigram(row: list[int]) -> list[float | None]:
    out = []
    for t, target in enumerate(row):
        history = row[:t]
        out.append(history.count(target) / len(history) if history else None)
    return out


def test_unigram_cache_counts_each_rows_history_across_segments():
    rows = torch.tensor([[3, 1, 3, 3, 2, 1, 4], [0, 0, 2, 0, 5, 5, IGNORE]])
    cache = UnigramCache(batch_size=2, vocab_size=6)
    probs, available = zip(*(cache(rows[:, i : i + 3]) for i in range(0, 7, 3)))
    probs, available = torch.cat(probs, 1), torch.cat(available, 1)
    for b in range(2):
        row = [int(t) for t in rows[b] if t != IGNORE]
        for t, expected in enumerate(_naive_unigram(row)):
            assert bool(available[b, t]) == (expected is not None)
            if expected is not None:
                assert math.isclose(float(probs[b, t]), expected, rel_tol=1e-6)


def test_neural_cache_equals_grave_et_al_by_hand():
    torch.manual_seed(0)
    hidden, targets = torch.randn(2, 7, 4), torch.randint(5, (2, 7))
    window, theta = 3, 0.8
    cache = NeuralCache(window, theta)
    probs, available = zip(
        *(cache(hidden[:, i : i + 2], targets[:, i : i + 2]) for i in range(0, 7, 2))
    )
    probs, available = torch.cat(probs, 1), torch.cat(available, 1)
    for b in range(2):
        for t in range(7):
            previous = range(max(0, t - window), t)
            if not previous:
                assert not available[b, t]
                continue
            scores = torch.stack([theta * hidden[b, t] @ hidden[b, i] for i in previous])
            weights = torch.softmax(scores, 0)
            expected = sum(w for w, i in zip(weights, previous) if targets[b, i] == targets[b, t])
            assert math.isclose(float(probs[b, t]), float(expected), abs_tol=1e-6)


def test_cache_interpolation_weight():
    vocab, model, tokens = _setup()
    base = score_text(model, vocab, tokens, batch_size=1, segment=50)
    lam = 0.4
    cached = score_text(
        model, vocab, tokens, batch_size=1, segment=50, combiners=Combiners(unigram_cache=lam)
    )
    ids = vocab.encode(tokens).tolist()
    for t, history_prob in enumerate(_naive_unigram(ids)):
        p = float(base.log_probs[t].exp())
        expected = p if history_prob is None else (1 - lam) * p + lam * history_prob
        assert math.isclose(float(cached.log_probs[t].exp()), expected, rel_tol=1e-5)


def test_frequency_bin_table_medians():
    words = ["a", "b", "c", "zz", "a"]
    first = TokenScores(
        torch.log(torch.tensor([0.5, 0.1, 0.2, 0.01, 0.5], dtype=torch.float64)), None, words
    )
    second = TokenScores(
        torch.log(torch.tensor([0.25, 0.1, 0.4, 0.02, 0.5], dtype=torch.float64)), None, words
    )
    rows = frequency_bin_table(first, second, {"a": 500, "b": 5, "c": 50}, edges=(0, 1, 10, 100))
    by_bin = {r["bin"]: r for r in rows}
    assert by_bin["new (0)"]["tokens"] == 1
    assert math.isclose(by_bin["new (0)"]["median_loss_difference"], math.log(2))
    assert math.isclose(by_bin["100-inf"]["median_loss_difference"], -math.log(2) / 2)
    assert by_bin["1-9"]["median_loss_difference"] == 0.0
    with pytest.raises(ValueError):
        frequency_bin_table(first, TokenScores(second.log_probs, None, words[::-1]), {})


@pytest.mark.parametrize("kind", ["unigram", "neural"])
def test_cache_distributions_are_normalised(kind):
    """Σ_w p_cache(w) = 1 at a position whose cache is not empty (queried word by word)."""
    torch.manual_seed(0)
    vocab_size, hidden = 7, torch.randn(2, 6, 5)
    history = torch.randint(vocab_size, (2, 6))
    total = torch.zeros(2)
    for word in range(vocab_size):
        targets = history.clone()
        targets[:, -1] = word  # only the queried word changes; the history stays the same
        if kind == "unigram":
            probs, available = UnigramCache(2, vocab_size)(targets)
        else:
            probs, available = NeuralCache(window=4, theta=0.5)(hidden, targets)
        assert available[:, -1].all()
        total += probs[:, -1]
    torch.testing.assert_close(total, torch.ones(2))


def test_cross_domain_uses_the_papers_cache_settings():
    """App. C.4: λ = 0.966 on the model (cache 0.034), θ = 0.5, a cache of 10,000; §5.1: ω = 0.1
    for GroC. They are the defaults of ``experiments/cross_domain.py`` (and θ, window of
    :class:`Combiners`, so of ``targetlm eval --neural-cache``)."""
    path = Path(__file__).resolve().parents[2] / "experiments" / "cross_domain.py"
    spec = importlib.util.spec_from_file_location("cross_domain", path)
    cross_domain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cross_domain)
    assert (Combiners().neural_theta, Combiners().neural_window) == (0.5, 10_000)
    groc, tied = cross_domain.paper_combiners(True), cross_domain.paper_combiners(False)
    assert groc["unigram_cache"] == Combiners(new_word_weight=0.1, unigram_cache=0.034)
    assert groc["neural_cache"] == Combiners(
        new_word_weight=0.1, neural_cache=0.034, neural_theta=0.5, neural_window=10_000
    )
    assert tied["neural_cache"].new_word_weight == 1.0  # closed layers: not down-weighted
    grid = cross_domain.grid_combiners(True)
    assert len(grid["unigram_cache"]) == 5 and len(grid["neural_cache"]) == 25
    assert groc["neural_cache"] in grid["neural_cache"]
