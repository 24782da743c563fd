"""Evaluation through the chunked logit layer: the same scores as the full logits.

``evaluate_ids`` runs chunked (``loss_impl = "auto"`` above ``AUTO_CHUNK_ELEMENTS``, forced
here by lowering the threshold) for perplexity, the head ensemble, the caches and the
open-vocabulary mixture (the new-word mass in tiles); each composition of combiners equals
the direct computation of tests/inference/test_combiners.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import model_config
from test_combiners import (  # the compositions and their direct computation
    LAMBDAS,
    NEURAL,
    OMEGA,
    THETA,
    UNIGRAM,
    WINDOW,
    _compositions,
    _direct,
    setup,  # noqa: F401 (a fixture)
)

import targetlm.chunked as chunked_module
import targetlm.inference.evaluate as evaluate_module
from targetlm.chunked import IGNORE, logit_statistics
from targetlm.inference import Combiners, evaluate_stream
from targetlm.inference.scoring import score_streams
from targetlm.modules import build_model


@pytest.fixture
def always_chunked(monkeypatch):
    """``auto`` chunks every segment; the test fails unless the chunked routine ran."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return logit_statistics(*args, **kwargs)

    monkeypatch.setattr(chunked_module, "AUTO_CHUNK_ELEMENTS", 0)
    monkeypatch.setattr(evaluate_module, "logit_statistics", counted)
    yield
    assert calls, "the chunked path did not run"


def test_logit_statistics_are_log_norm_and_target_logits():
    g = torch.Generator().manual_seed(0)
    x, weight, bias = torch.randn(2, 3, 4, generator=g), torch.randn(9, 4, generator=g), None
    targets = torch.randint(9, (2, 3), generator=g)
    targets[1, 2] = IGNORE
    log_norm, target = logit_statistics(x, weight, bias, targets, 2, 4)
    logits = x @ weight.t()
    torch.testing.assert_close(log_norm, torch.logsumexp(logits, -1))
    expected = logits.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    torch.testing.assert_close(target, torch.where(targets != IGNORE, expected, 0.0))


@pytest.mark.parametrize("output", ["tied", "adaptive"])
def test_perplexity_chunked_equals_full(output, request):
    torch.manual_seed(0)
    model = build_model(model_config("lstm", output), 40).eval()
    ids = torch.randint(40, (97,), generator=torch.Generator().manual_seed(1))
    full = evaluate_stream(model, ids, batch_size=3, segment=7)
    request.getfixturevalue("always_chunked")
    chunked = evaluate_stream(model, ids, batch_size=3, segment=7)
    assert chunked["tokens"] == full["tokens"]
    assert chunked["nll"] == pytest.approx(full["nll"], rel=1e-5)


def test_inspect_with_forced_chunking_is_refused_and_auto_gives_it_the_logits():
    torch.manual_seed(0)
    model = build_model(model_config("lstm", "tied"), 40).eval()
    ids = torch.randint(40, (30,), generator=torch.Generator().manual_seed(1))
    seen = []

    def inspect(logits, targets):
        seen.append((logits.shape, targets.shape))

    with pytest.raises(ValueError, match="loss_impl = 'chunked' never builds"):
        evaluate_module.evaluate_ids(
            model, ids, batch_size=2, segment=5, inspect=inspect, loss_impl="chunked"
        )
    assert not seen
    evaluate_module.evaluate_ids(model, ids, batch_size=2, segment=5, inspect=inspect)
    assert seen and all(logits[-1] == 40 and logits[:-1] == targets for logits, targets in seen)


@pytest.mark.parametrize(
    "switches", _compositions(), ids=lambda s: "+".join(k for k, v in s.items() if v) or "none"
)
def test_every_composition_chunked_equals_the_direct_computation(
    setup,  # noqa: F811
    switches,
    always_chunked,
):
    _, vocab, model, tokens = setup
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
            segment=3,
        )
        expected = _direct(model, vocab, tokens, switches, batch_size=2)
    for scores, direct in zip(got, expected, strict=True):
        torch.testing.assert_close(scores.log_probs, direct, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_bias", [True, False])
def test_the_reused_logit_buffers_give_cross_entropys_sum_on_segments_of_any_size(with_bias):
    # the fast path of perplexity: one buffer pair for every segment, a larger one first,
    # then a shorter one (the stream's last) and one with padded targets
    torch.manual_seed(0)
    weight = torch.randn(50, 8)
    bias = torch.randn(50) if with_bias else None
    buffers = evaluate_module._LogitBuffers()
    for rows, cols in ((4, 6), (3, 2), (4, 6)):
        vectors = torch.randn(rows, cols, 8)
        targets = torch.randint(0, 50, (rows, cols))
        targets[0, :1] = IGNORE
        logits = vectors @ weight.T + (bias if bias is not None else 0)
        expected = torch.nn.functional.cross_entropy(
            logits.reshape(-1, 50), targets.reshape(-1), ignore_index=IGNORE, reduction="sum"
        )
        assert buffers.nll_sum(vectors, weight, bias, targets) == pytest.approx(
            float(expected), rel=1e-6
        )
    assert buffers.logits.shape == (24, 50), "the first, larger buffer is kept"
