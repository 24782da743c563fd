"""Inan et al. (2017): augmented loss, its gradient (eq. 3.4), the subspace distance (App. B)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import OUTPUT_OPTIONS, tiny_config

from targetlm import functional
from targetlm.modules import OUTPUT_LAYERS
from targetlm.objectives import AugmentedLossObjective, CrossEntropyObjective
from targetlm.training import Trainer


def _inputs(n=6, v=9, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, v, generator=g),
        torch.randint(v, (n,), generator=g),
        torch.randn(v, d, generator=g),
    )


def test_alpha_zero_is_cross_entropy():
    logits, targets, embeddings = _inputs()
    torch.testing.assert_close(
        functional.augmented_loss(logits, targets, embeddings, tau=20.0, alpha=0.0),
        F.cross_entropy(logits, targets),
    )


def test_kl_is_non_negative_and_zero_when_prediction_matches_target():
    logits, targets, embeddings = _inputs(n=50)
    assert (functional.augmented_kl(logits, targets, embeddings, 3.0) >= -1e-6).all()
    matching = embeddings[targets] @ embeddings.t()  # logits equal to the similarity: ŷ = ỹ
    torch.testing.assert_close(
        functional.augmented_kl(matching, targets, embeddings, 3.0),
        torch.zeros(50),
        atol=1e-5,
        rtol=0,
    )


@pytest.mark.parametrize("tau,alpha", [(1.0, 0.5), (20.0, 10.0), (5.0, 2.0)])
def test_augmented_loss_equals_a_straightforward_computation(tau, alpha):
    logits, targets, embeddings = _inputs()
    expected = 0.0
    for i in range(len(targets)):
        y = int(targets[i])
        p = [math.exp(float(z)) for z in logits[i]]
        ce = -math.log(p[y] / sum(p))
        y_hat = [math.exp(float(z) / tau) for z in logits[i]]
        y_hat = [q / sum(y_hat) for q in y_hat]
        sim = [math.exp(float(embeddings[y] @ embeddings[v]) / tau) for v in range(len(embeddings))]
        y_tilde = [s / sum(sim) for s in sim]
        kl = sum(t * math.log(t / q) for t, q in zip(y_tilde, y_hat))
        expected += (ce + alpha * kl) / len(targets)
    got = functional.augmented_loss(logits, targets, embeddings, tau, alpha)
    assert math.isclose(float(got), expected, rel_tol=1e-5)


def test_kl_gradient_wrt_logits_is_paper_eq_3_4():
    logits, targets, embeddings = _inputs(n=3, v=5)
    logits = logits.double().requires_grad_()
    tau = 4.0
    kl = functional.augmented_kl(logits, targets, embeddings.double(), tau)
    kl.sum().backward()
    y_hat = torch.softmax(logits.detach() / tau, -1)
    y_tilde = torch.softmax(embeddings.double()[targets] @ embeddings.double().t() / tau, -1)
    torch.testing.assert_close(logits.grad, (y_hat - y_tilde) / tau)


def test_target_is_detached_by_default():
    logits, targets, embeddings = _inputs()
    logits.requires_grad_()
    embeddings.requires_grad_()
    functional.augmented_kl(logits, targets, embeddings, 2.0).sum().backward()
    assert embeddings.grad is None or torch.count_nonzero(embeddings.grad) == 0
    functional.augmented_kl(logits, targets, embeddings, 2.0, detach_target=False).sum().backward()
    assert torch.count_nonzero(embeddings.grad) > 0


def _reference_kl(logits, targets, embeddings, tau):
    """KL(ỹ ‖ ŷ) position by position with plain autograd (no dedup, no custom backward)."""
    rows = []
    for logit, target in zip(logits, targets):
        y_tilde = torch.softmax(embeddings @ embeddings[target] / tau, -1)
        rows.append((y_tilde * (y_tilde.log() - torch.log_softmax(logit / tau, -1))).sum())
    return torch.stack(rows)


@pytest.mark.parametrize("detach_target", [True, False])
def test_kl_with_repeated_targets_matches_reference_and_gradcheck(detach_target):
    logits, _, embeddings = _inputs(n=7, v=5, d=3)
    targets = torch.tensor([1, 3, 1, 1, 0, 3, 4])  # repeats: ỹ is computed once per distinct target
    logits = logits.double().requires_grad_()
    embeddings = embeddings.double().requires_grad_(not detach_target)
    got = functional.augmented_kl(logits, targets, embeddings, 1.5, detach_target)
    want = _reference_kl(logits, targets, embeddings, 1.5)
    torch.testing.assert_close(got, want)
    inputs = (logits,) if detach_target else (logits, embeddings)

    def kl(*args):
        weights = args[1] if len(args) > 1 else embeddings
        return functional.augmented_kl(args[0], targets, weights, 1.5, detach_target)

    assert torch.autograd.gradcheck(kl, inputs)


def test_objective_ignores_padding_like_an_unpadded_batch():
    torch.manual_seed(0)
    predicted, weight, bias = torch.randn(1, 6, 4), torch.randn(9, 4), torch.randn(9)
    targets = torch.tensor([[2, 5, 5, 1, -100, -100]])
    objective = AugmentedLossObjective(tau=2.0, alpha=0.7, target_source="output")
    padded = objective(predicted, targets, weight, bias)
    unpadded = objective(predicted[:, :4], targets[:, :4], weight, bias)
    torch.testing.assert_close(padded.loss, unpadded.loss)
    assert padded.count == unpadded.count == 4


def test_objective_forms():
    torch.manual_seed(0)
    predicted, targets, weight, bias = (
        torch.randn(2, 3, 4),
        torch.randint(9, (2, 3)),
        torch.randn(9, 4),
        torch.randn(9),
    )
    ce = CrossEntropyObjective()(predicted, targets, weight, bias)
    zero = AugmentedLossObjective(alpha=0.0, target_source="output")(
        predicted, targets, weight, bias
    )
    torch.testing.assert_close(zero.loss, ce.loss)
    torch.testing.assert_close(zero.nll_sum, ce.nll_sum)  # perplexity stays next-word NLL
    al = AugmentedLossObjective(tau=20.0, gamma=0.5, target_source="output")
    assert al.alpha == 10.0
    logits = F.linear(predicted.reshape(-1, 4), weight, bias)
    kl = functional.augmented_kl(logits, targets.reshape(-1), weight, 20.0).mean()
    torch.testing.assert_close(al(predicted, targets, weight, bias).loss, ce.loss + 10.0 * kl)
    beta = AugmentedLossObjective(tau=10.0, beta=0.25, target_source="output")(
        predicted, targets, weight, bias
    ).loss
    kl10 = functional.augmented_kl(logits, targets.reshape(-1), weight, 10.0).mean()
    torch.testing.assert_close(beta, 0.25 * 100 * 9 * kl10 + 0.75 * ce.loss)
    torch.testing.assert_close(
        AugmentedLossObjective(beta=0.0, target_source="output")(
            predicted, targets, weight, bias
        ).loss,
        ce.loss,
    )


def test_subspace_distance():
    torch.manual_seed(0)
    x = torch.randn(40, 6)
    mixed = x @ torch.randn(6, 6)  # an invertible recombination of the columns
    assert float(functional.subspace_distance(x, mixed)) < 1e-6
    q = torch.linalg.qr(torch.randn(40, 12)).Q
    assert math.isclose(float(functional.subspace_distance(q[:, :6], q[:, 6:])), 1.0, rel_tol=1e-9)
    y = torch.randn(40, 6)
    assert math.isclose(
        float(functional.subspace_distance(x, y)),
        float(functional.subspace_distance(y, x)),
        rel_tol=1e-9,
    )
    assert 0.0 < float(functional.subspace_distance(x, y)) < 1.0


@pytest.mark.parametrize(
    "output",  # every registered output layer; beyond tied and lookup in the slow set (CI runs it)
    [
        k if k in ("tied", "lookup") else pytest.param(k, marks=pytest.mark.slow)
        for k in OUTPUT_LAYERS.names()
    ],
)
def test_augmented_loss_trains_with_every_output_layer(tmp_path, output):
    options = {f"model.output.{k}": json.dumps(v) for k, v in OUTPUT_OPTIONS[output].items()}
    config = tiny_config(
        **{
            "objective": '{kind = "augmented", tau = 2.0, gamma = 0.5}',
            "model.output": f'{{kind = "{output}"}}',
            **options,  # the small test sizes of every kind (tests/conftest.py)
            "train.epochs": 3,
            "train.optimizer": '"adam"',
            "train.lr": 0.01,
        }
    )
    results = Trainer(config, tmp_path / "run", log=lambda m: None).train()
    assert math.isfinite(results["test"]["ppl"])
    assert (
        results["test"]["ppl"] < 0.75 * results["vocab_size"]
    )  # it learned: well below a uniform guess


def test_subspace_analysis_end_to_end(tmp_path, capsys):
    from targetlm.cli import main

    tiny = [
        "data.name=synthetic",
        "data.train_tokens=600",
        "data.batch_size=4",
        "data.bptt=10",
        "data.synthetic.train_sentences=100",
        "data.synthetic.valid_sentences=10",
        "data.synthetic.test_sentences=10",
        "model.embedding.size=8",
        "model.encoder.hidden_size=8",
        "train.epochs=1",
        "train.progress=false",
    ]
    args = [
        "analyze",
        "subspace",
        "--out",
        str(tmp_path / "sub"),
        "--betas",
        "0,1",
        "--taus",
        "2,10",
    ]
    assert main(args + [x for item in tiny for x in ("--set", item)]) == 0
    rows = json.loads((tmp_path / "sub" / "subspace.json").read_text())
    assert [(r["beta"], r["tau"]) for r in rows] == [(0.0, 10.0), (1.0, 10.0), (1.0, 2.0)]
    assert all(0.0 <= r["distance"] <= 1.0 for r in rows)
    assert (tmp_path / "sub" / "subspace.png").is_file()
    assert "| 0 | 10 |" in capsys.readouterr().out
    with open(tmp_path / "sub" / "beta0-tau10" / "config.toml") as handle:
        assert "unit_norm = true" in handle.read()


def test_word_probs_equal_a_direct_computation(tmp_path, capsys):
    from targetlm.cli import main
    from targetlm.data import with_context_token
    from targetlm.data.readers import read_split
    from targetlm.runs import load_run

    Trainer(tiny_config(**{"train.epochs": 1}), tmp_path / "run", log=lambda m: None).train()
    # batch 1: one row whose state is carried over segments, i.e. one long sequence
    args = ["analyze", "word-probs", str(tmp_path / "run"), "--words", "<eos>,the", "--json"]
    assert main([*args, "--set", "eval.batch_size=1"]) == 0
    got = json.loads(capsys.readouterr().out)[str(tmp_path / "run")]
    config, vocab, model, _ = load_run(tmp_path / "run")
    ids = with_context_token(vocab.encode(read_split(config.data, "test")), vocab.eos_id)
    with torch.no_grad():
        log_probs, _ = model.log_probs(ids[None, :-1])  # one long row: every position once
    for word in ("<eos>", "the"):
        expected = float(log_probs[0, :, vocab.stoi[word]].exp().mean())
        assert math.isclose(got[word], expected, rel_tol=1e-4)


def test_target_from_the_input_embedding():
    """target_source = 'input': ỹ = softmax(L · L[y]ᵀ / τ) from the input embedding, not E_out."""
    from targetlm.modules import LookupEmbedding

    torch.manual_seed(0)
    embedding = LookupEmbedding(vocab_size=9, size=4, unit_norm=True)
    objective = AugmentedLossObjective(
        tau=2.0, alpha=1.0, target_source="input", embedding=embedding
    )
    predicted, targets = torch.randn(2, 3, 4), torch.randint(9, (2, 3))
    weight, bias = torch.randn(9, 4), torch.randn(9)
    logits = F.linear(predicted.reshape(-1, 4), weight, bias)
    expected = (
        F.cross_entropy(logits, targets.reshape(-1))
        + functional.augmented_kl(logits, targets.reshape(-1), embedding.table(), 2.0).mean()
    )
    torch.testing.assert_close(objective(predicted, targets, weight, bias).loss, expected)
    assert list(objective.parameters()) == []  # the embedding stays the model's
    with pytest.raises(ValueError, match="input embedding"):
        AugmentedLossObjective(target_source="input")


def test_default_target_is_built_from_the_input_embedding():
    """Inan et al. eq. 3.6: ỹ from L by default, so an untied model's soft target ignores W."""
    from targetlm.modules import build_model
    from targetlm.modules.model import Prediction
    from targetlm.objectives import build_objective

    config = tiny_config(**{"model.output.kind": '"lookup"', "objective.kind": '"augmented"'})
    torch.manual_seed(0)
    model = build_model(config.model, 30)
    objective = build_objective(config.objective, model)
    predicted, targets = torch.randn(2, 3, 16), torch.randint(30, (2, 3))
    weight, bias = model.output()
    logits = F.linear(predicted.reshape(-1, 16), weight, bias)
    from_input = functional.augmented_kl(logits, targets.reshape(-1), model.embedding.table(), 20.0)
    expected = F.cross_entropy(logits, targets.reshape(-1)) + 10.0 * from_input.mean()
    # the training objective reads the model's Prediction (no heads here: the AL itself)
    prediction = Prediction(predicted, None, None)
    torch.testing.assert_close(objective(prediction, targets, weight, bias).loss, expected)
