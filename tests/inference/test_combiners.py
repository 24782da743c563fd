"""Combiners compose in one evaluation loop: every subset against a direct per-token computation.

The direct computation below is written from the equations (Heo et al. 2025 eq. 13 for the head
ensemble with WDR conjugates; Pappas et al. 2020 for the uniform mixture and the new-word weight;
the unigram cache; Grave et al. 2017 eq. 2 for the neural cache), position by position on each
row read as one long sequence, without the loop's segments, carried state or batching.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from conftest import model_config, tiny_config

from targetlm.cli import main
from targetlm.config import ComponentConfig
from targetlm.data.vocab import EOS, Vocabulary, tokens_from_text
from targetlm.inference import COMBINERS, CombinerError, Combiners
from targetlm.inference.scoring import score_streams
from targetlm.modules import build_model
from targetlm.training import Trainer

TRAIN = "the cat sat on the mat\nthe dog sat on the log\na cat saw a dog\n" * 3
TEST = "the cat saw the zebra\na zebra sat on a sofa\nthe dog saw the cat on the sofa\n"
LAMBDAS = (0.0, 0.4, 1.0)
UNIGRAM, NEURAL, THETA, WINDOW, OMEGA = 0.2, 0.15, 0.7, 4, 0.5
# every registered combiner is one switch of the compositions below
SWITCHES = {
    "head_ensemble": "ensemble",
    "uniform": "open",
    "new_word_weight": "new_word",
    "unigram_cache": "unigram",
    "neural_cache": "neural",
}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_registered_combiner_is_composed_below():
    assert set(COMBINERS.names()) == set(SWITCHES)


def _compositions() -> list[dict[str, bool]]:
    out = []
    for ensemble, open_, new_word, unigram, neural in itertools.product([False, True], repeat=5):
        if new_word and not open_:  # a closed vocabulary has no new words
            continue
        out.append(
            {
                "ensemble": ensemble,
                "open": open_,
                "new_word": new_word,
                "unigram": unigram,
                "neural": neural,
            }
        )
    return out


@pytest.fixture(scope="module", params=["tied", "char_cnn"])
def setup(request):
    """A tiny LSTM with WDR heads (N = 3): a closed output layer (tied) and a compositional one
    (char-CNN, which scores new words itself in open vocabulary)."""
    vocab = Vocabulary.build(tokens_from_text(TRAIN))
    torch.manual_seed(0)
    config = model_config("lstm", request.param)
    config = type(config)(
        embedding=config.embedding,
        encoder=config.encoder,
        output=config.output,
        heads=ComponentConfig("wdr", {"n": 3}),
    )
    model = build_model(config, vocab.itos).eval()
    return request.param, vocab, model, tokens_from_text(TEST)


def _direct(model, vocab, tokens, switches, batch_size):
    """Per-token log-probabilities [main, λ...] (text order), computed position by position."""
    text = [EOS, *tokens]
    eval_words = list(vocab.itos)
    if switches["open"]:
        eval_words += sorted({t for t in tokens if t not in vocab}, key=tokens.index)
    known, size = len(vocab), len(eval_words)
    unk = vocab.unk_id
    target = [eval_words.index(w) if w in eval_words else unk for w in text]
    inputs = [t if t < known else unk for t in target]  # a lookup input embedding
    compositional = switches["open"] and hasattr(model.output, "embed_words")
    if compositional:
        weight, bias = model.output.embed_words(eval_words, None)
    else:
        weight, bias = model.output()
    mu = 0.01 if switches["open"] and not compositional and size > known else 0.0
    lambdas = LAMBDAS if switches["ensemble"] else ()
    n_targets = len(text) - 1
    length = math.ceil(n_targets / batch_size)
    out = [torch.empty(n_targets) for _ in range(1 + len(lambdas))]
    for row in range(batch_size):
        start, stop = row * length, min(row * length + length, n_targets)
        if stop <= start:
            break
        x = torch.tensor(inputs[start:stop])[None]
        y = target[start + 1 : stop + 1]  # targets of columns 0..T−1
        main_, raw, _ = model(x)
        main_, raw = main_[0], raw[:, 0]  # (T, d), (N−1, T, d)
        E = weight.detach()
        emb = [E[t] if t < E.size(0) else E[unk] for t in y]  # x_s = E_out[y_s]
        for t in range(len(y)):
            estimates = []
            for n in (1, 2):
                c = t - n
                if c < 0:
                    continue
                conjugate = -sum(math.comb(n, i) * (-1) ** i * emb[t - i] for i in range(1, n + 1))
                estimates.append(raw[n - 1, c] + conjugate)
            vectors = [main_[t]]
            for lam in lambdas:
                if lam == 0 or not estimates:
                    vectors.append(main_[t])
                else:
                    vectors.append((1 - lam) * main_[t] + lam * torch.stack(estimates).mean(0))
            for s, vector in enumerate(vectors):
                probs = torch.softmax(vector @ weight.t() + bias, -1)  # (V_scored,)
                p = probs[y[t]] if y[t] < probs.numel() else torch.tensor(0.0)
                if mu:
                    p = (1 - mu) * p + mu / size
                if switches["new_word"] and size > known:
                    p_new = probs[known:].sum() if compositional else mu * (size - known) / size
                    p = p * (OMEGA if y[t] >= known else 1.0) / (1 - (1 - OMEGA) * p_new)
                if switches["unigram"] and t > 0:
                    p = (1 - UNIGRAM) * p + UNIGRAM * sum(y[i] == y[t] for i in range(t)) / t
                previous = [i for i in range(t) if t - i <= WINDOW]
                if switches["neural"] and previous:
                    scores = torch.stack([THETA * (main_[t] @ main_[i]) for i in previous])
                    attention = torch.softmax(scores, 0)
                    cache = sum(a for a, i in zip(attention, previous) if y[i] == y[t])
                    p = (1 - NEURAL) * p + NEURAL * cache
                out[s][start + t] = torch.log(torch.as_tensor(p))
    return out


@pytest.mark.parametrize(
    "switches", _compositions(), ids=lambda s: "+".join(k for k, v in s.items() if v) or "none"
)
def test_every_composition_equals_the_direct_computation(setup, switches):
    output, vocab, model, tokens = setup
    combiners = Combiners(
        ensemble_lambdas=LAMBDAS if switches["ensemble"] else (),
        new_word_weight=OMEGA if switches["new_word"] else 1.0,
        unigram_cache=UNIGRAM if switches["unigram"] else 0.0,
        neural_cache=NEURAL if switches["neural"] else 0.0,
        neural_theta=THETA,
        neural_window=WINDOW,
    )
    with torch.no_grad():
        got = score_streams(
            model,
            vocab,
            tokens,
            open_vocabulary=switches["open"],
            combiners=combiners,
            batch_size=2,
            segment=3,  # rows carried across segments; the last row padded
        )
        expected = _direct(model, vocab, tokens, switches, batch_size=2)
    assert len(got) == len(expected) == 1 + (len(LAMBDAS) if switches["ensemble"] else 0)
    for scores, direct in zip(got, expected):
        assert torch.isfinite(scores.log_probs).all()
        torch.testing.assert_close(scores.log_probs, direct, rtol=1e-4, atol=1e-5)
    if switches["ensemble"]:  # λ = 0 is the main head exactly
        assert torch.equal(got[1].log_probs, got[0].log_probs)


def test_a_combiner_that_cannot_apply_is_one_error():
    vocab = Vocabulary.build(tokens_from_text(TRAIN))
    model = build_model(model_config("lstm", "tied"), vocab.itos).eval()
    with pytest.raises(CombinerError, match="N-gram heads"):
        score_streams(
            model, vocab, tokens_from_text(TEST), combiners=Combiners(ensemble_lambdas=(0.5,))
        )
    with pytest.raises(ValueError, match="λ must be in"):
        Combiners(ensemble_lambdas=(1.5,))


def test_a_newly_registered_combiner_is_built_from_the_registry_alone(monkeypatch):
    """`build_combiners` names no combiner: one registered with its `requested` options is
    built, in its order, and applied by the evaluation loop."""
    from targetlm.inference.combiners import ProbabilityCombiner

    class Scale(ProbabilityCombiner):
        order = 5  # after the caches

        def __init__(self, factor: float, uniform_weight: float = 0.0) -> None:
            self.factor, self.uniform_weight = factor, uniform_weight

        @classmethod
        def requested(cls, combiners, uniform):
            return {"factor": 0.5} if combiners.unigram_cache else None

        def combine(self, probs, stream, segment):
            return probs * self.factor

    vocab = Vocabulary.build(tokens_from_text(TRAIN))
    torch.manual_seed(0)
    model = build_model(model_config("lstm", "tied"), vocab.itos).eval()
    tokens = tokens_from_text(TEST)
    with torch.no_grad():
        cached = score_streams(model, vocab, tokens, combiners=Combiners(unigram_cache=UNIGRAM))
        monkeypatch.setitem(COMBINERS._entries, "scale", Scale)
        scaled = score_streams(model, vocab, tokens, combiners=Combiners(unigram_cache=UNIGRAM))
        plain = score_streams(model, vocab, tokens, combiners=Combiners())
        monkeypatch.delitem(COMBINERS._entries, "scale")
        unscaled = score_streams(model, vocab, tokens, combiners=Combiners())
    expected = cached[0].log_probs + math.log(0.5)
    torch.testing.assert_close(scaled[0].log_probs, expected, rtol=0, atol=1e-6)
    assert torch.equal(plain[0].log_probs, unscaled[0].log_probs)  # not requested: not built


def test_cli_composes_the_ensemble_with_caches_and_open_vocabulary(tmp_path, capsys):
    """``targetlm eval RUN --ensemble-lambda 0,0.4 --neural-cache 0.1 --open-vocab --json``."""
    config = tiny_config(
        **{"model.heads": '{kind = "wdr", n = 3}', "train.epochs": 1, "train.max_steps": 4}
    )
    Trainer(config, tmp_path / "run", log=lambda m: None).train()
    run = str(tmp_path / "run")
    args = ["eval", run, "--ensemble-lambda", "0,0.4", "--neural-cache", "0.1", "--open-vocab"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [row["lambda"] for row in out["ensemble"]] == [0.0, 0.4]
    assert out["ensemble"][0]["ppl"] == out["ppl"]  # λ = 0: the main head, same combiners
    assert out["neural_cache"] == 0.1 and out["ensemble_lambdas"] == [0.0, 0.4]
    assert all(math.isfinite(row["ppl"]) and row["word_ppl"] > 0 for row in out["ensemble"])
    # the same as evaluating each part on its own: the cache alone, and λ alone
    assert main(["eval", run, "--neural-cache", "0.1", "--open-vocab", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert math.isclose(alone["ppl"], out["ppl"], rel_tol=1e-9)
    assert main(args) == 0
    assert "λ = 0.4" in capsys.readouterr().out

    plain = tiny_config(**{"train.epochs": 1, "train.max_steps": 2})
    Trainer(plain, tmp_path / "plain", log=lambda m: None).train()
    rc = main(
        ["eval", str(tmp_path / "plain"), "--ensemble-lambda", "0.5", "--neural-cache", "0.1"]
    )
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and "no N-gram heads" in err[0]
