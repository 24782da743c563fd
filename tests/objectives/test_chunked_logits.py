"""The chunked logit layer + loss (targetlm.chunked): equal to the full computation, never (M, V).

Contracts: every term (label smoothing, z-loss, AL's KL, per-row weights, padding) equals the
plain formula on the full logits, for tiles that do not divide M or V, M = 1 and whole-row
tiles; float64 gradcheck through both backward paths (fused and recomputing); every
registered objective × head kind × output layer gives the same loss and gradients full and
chunked; a short training run gives the same losses; bad input is one clear error.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from conftest import OUTPUT_OPTIONS, model_config, tiny_config

from targetlm import chunked, functional
from targetlm import config as config_lib
from targetlm.chunked import IGNORE, LogitTerms, chunked_logit_loss
from targetlm.config import ComponentConfig
from targetlm.data import batching
from targetlm.modules import build_model
from targetlm.modules.heads import HEADS
from targetlm.objectives import OBJECTIVES, build_objective
from targetlm.registry import ConfigError
from targetlm.training import Trainer

V = 30

# option sets per registered objective (a new kind without an entry fails the coverage test)
OBJECTIVE_OPTIONS = {
    "cross_entropy": [{}, {"label_smoothing": 0.1, "z_loss": 0.01}],
    "augmented": [
        {"tau": 2.0, "alpha": 0.7, "label_smoothing": 0.1},
        {"tau": 3.0, "beta": 0.4, "target_source": "output", "z_loss": 0.02},
    ],
}
TILES = [(1, 1), (3, 7), (5, 64), (64, 64)]  # (tokens, vocabulary): not dividing, whole rows


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _inputs(M=13, V=29, d=5, dtype=torch.float32, seed=0, padding=(3, 7)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, d, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(V, d, generator=g, dtype=dtype).requires_grad_()
    bias = torch.randn(V, generator=g, dtype=dtype).requires_grad_()
    targets = torch.randint(V, (M,), generator=g)
    targets[[i for i in padding if i < M]] = IGNORE
    table = torch.randn(V, 4, generator=g, dtype=dtype)
    return x, weight, bias, targets, table


def _reference(x, weight, bias, targets, terms, row_weights=None):
    """The per-row loss from the full (M, V) logits with the existing functional equations."""
    logits = functional.logits(x, weight, bias)
    mask = targets != IGNORE
    rows = torch.zeros(x.size(0), dtype=logits.dtype)
    log_probs = torch.log_softmax(logits, -1)
    safe = targets.clamp(min=0)
    nll = -log_probs.gather(1, safe[:, None]).squeeze(1)
    eps = terms.label_smoothing
    rows = terms.ce_weight * ((1 - eps) * nll + eps * -log_probs.mean(1))
    rows = rows + terms.z_loss * torch.logsumexp(logits, -1).square()
    if terms.kl_weight:
        kl = functional.augmented_kl(logits, safe, terms.soft_table, terms.tau)
        rows = rows + terms.kl_weight * kl
    rows = torch.where(mask, rows, 0.0)
    return rows if row_weights is None else rows * row_weights


TERMS = {
    "ce": {},
    "smoothed": {"label_smoothing": 0.1},
    "z_loss": {"z_loss": 0.05, "ce_weight": 0.5},
    "al": {"kl_weight": 0.7, "tau": 2.0},
    "al_smoothed_z": {"kl_weight": 3.0, "tau": 0.5, "label_smoothing": 0.2, "z_loss": 0.01},
}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("name", sorted(TERMS))
def test_chunked_equals_full(name, tile, reduction):
    x, weight, bias, targets, table = _inputs()
    options = TERMS[name]
    terms = LogitTerms(**options, soft_table=table if "kl_weight" in options else None)
    row_weights = torch.rand(x.size(0), generator=torch.Generator().manual_seed(1))
    out = chunked_logit_loss(x, weight, bias, targets, terms, row_weights, reduction, *tile)
    rows = _reference(x, weight, bias, targets, terms, row_weights)
    count = int((targets != IGNORE).sum())
    expected = {"none": rows, "sum": rows.sum(), "mean": rows.sum() / count}[reduction]
    torch.testing.assert_close(out.loss, expected)
    probe = torch.linspace(0.5, 1.5, x.size(0)) if reduction == "none" else torch.tensor(1.0)
    got = torch.autograd.grad((out.loss * probe).sum(), (x, weight, bias))
    want = torch.autograd.grad((expected * probe).sum(), (x, weight, bias))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    logits = functional.logits(x, weight, bias).detach()
    mask = targets != IGNORE
    torch.testing.assert_close(out.log_norm, torch.logsumexp(logits, -1))
    torch.testing.assert_close(
        out.target_logits[mask], logits[mask].gather(1, targets[mask, None]).squeeze(1)
    )


@pytest.mark.parametrize("tile", [(1, 1), (4, 3), (64, 64)])
def test_one_row_no_bias_and_all_padding(tile):
    x, weight, _, targets, table = _inputs(M=1, padding=())
    terms = LogitTerms(label_smoothing=0.1, kl_weight=0.5, soft_table=table)
    out = chunked_logit_loss(x, weight, None, targets, terms, None, "mean", *tile)
    expected = _reference(x, weight, None, targets, terms).sum()
    torch.testing.assert_close(out.loss, expected)
    got = torch.autograd.grad(out.loss, (x, weight))
    for a, b in zip(got, torch.autograd.grad(expected, (x, weight))):
        torch.testing.assert_close(a, b)
    padded = chunked_logit_loss(x, weight, None, torch.full((1,), IGNORE), terms, None, "mean")
    assert padded.loss.item() == 0.0
    assert torch.autograd.grad(padded.loss, x)[0].abs().sum() == 0


@pytest.mark.parametrize("reduction", ["sum", "none"])  # fused backward / recomputing backward
@pytest.mark.parametrize("tile", [(2, 3), (64, 64)])
def test_gradcheck_float64(reduction, tile):
    x, weight, bias, targets, table = _inputs(M=5, V=7, d=3, dtype=torch.float64, padding=(2,))
    terms = LogitTerms(label_smoothing=0.1, z_loss=0.05, kl_weight=0.8, tau=1.5, soft_table=table)
    row_weights = torch.rand(5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def loss(x, weight, bias):
        out = chunked_logit_loss(x, weight, bias, targets, terms, row_weights, reduction, *tile)
        return out.loss

    assert torch.autograd.gradcheck(loss, (x, weight, bias))


def test_same_result_twice():
    x, weight, bias, targets, table = _inputs(M=40, V=50)
    terms = LogitTerms(label_smoothing=0.1, kl_weight=0.5, soft_table=table)
    runs = []
    for _ in range(2):
        out = chunked_logit_loss(x, weight, bias, targets, terms, None, "mean", 7, 11)
        runs.append((out.loss.detach(), *torch.autograd.grad(out.loss, (x, weight, bias))))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_bad_input_is_one_clear_error():
    x, weight, bias, targets, _ = _inputs()
    targets[0] = V + 5
    with pytest.raises(ValueError, match="outside the vocabulary of 29 words"):
        chunked_logit_loss(x, weight, bias, targets)
    targets[0] = -3
    with pytest.raises(ValueError, match="target id -3"):
        chunked_logit_loss(x, weight, bias, targets)
    with pytest.raises(ValueError, match="tile sizes must be >= 1"):
        chunked_logit_loss(x, weight, bias, targets.clamp(min=0), chunk_tokens=0)
    with pytest.raises(ValueError, match="needs the soft_table"):
        LogitTerms(kl_weight=1.0)
    for key in ("loss_chunk_tokens", "loss_chunk_vocab"):
        with pytest.raises(ConfigError, match=rf"train.{key}: 0 is not in \[1, "):
            tiny_config(**{f"train.{key}": 0})
    with pytest.raises(ConfigError, match="train.loss_impl"):
        tiny_config(**{"train.loss_impl": '"tiled"'})


def test_ignore_is_the_data_padding_id():
    assert IGNORE == batching.IGNORE == functional.IGNORE


# --- every objective × head kind × output layer, full and chunked ------------------------
def test_every_objective_has_options_here():
    assert sorted(OBJECTIVE_OPTIONS) == OBJECTIVES.names()


def _objective_cases():
    return [
        (kind, i) for kind in sorted(OBJECTIVE_OPTIONS) for i in range(len(OBJECTIVE_OPTIONS[kind]))
    ]


def _loss_and_grads(objective, model, inputs, targets):
    model.zero_grad(set_to_none=True)
    prediction = model(inputs)
    weight, bias = model.output()
    out = objective(prediction, targets, weight, bias)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def _objective_head_output_cases():
    """Every head kind (and none) with every output layer, the objective case turning with
    them, so that every pair of the three (objective case × head, objective case × output,
    head × output) is covered: 8 × 7 runs instead of the 4 × 8 × 7 of the whole product."""
    objectives = _objective_cases()
    heads = ["none", *HEADS.names()]
    outputs = sorted(OUTPUT_OPTIONS)
    assert len(objectives) <= min(len(heads), len(outputs))  # else some pair is missed
    return [
        (*objectives[(i + j) % len(objectives)], head, output)
        for i, head in enumerate(heads)
        for j, output in enumerate(outputs)
    ]


@pytest.mark.parametrize(
    ("objective_kind", "case", "heads", "output"), _objective_head_output_cases()
)
def test_objectives_heads_and_outputs_equal_full_and_chunked(objective_kind, case, heads, output):
    torch.manual_seed(0)
    config = model_config("lstm", output)
    if heads != "none":
        config = dataclasses.replace(config, heads=ComponentConfig(heads, {"n": 3}))
    model = build_model(config, V).eval()
    options = {**OBJECTIVE_OPTIONS[objective_kind][case]}
    if heads != "none":
        options["ngram_alpha"] = 0.6
    spec = ComponentConfig(objective_kind, options)
    g = torch.Generator().manual_seed(3)
    inputs = torch.randint(V, (3, 7), generator=g)
    targets = torch.randint(V, (3, 9), generator=g)
    targets[1, 5:] = IGNORE  # a row that ends early
    records = {}
    for impl, tile in (("full", (256, 65536)), ("chunked", (4, 7))):
        objective = build_objective(spec, model, impl, *tile)
        records[impl] = _loss_and_grads(objective, model, inputs, targets)
    (full, full_grads), (chunked, chunked_grads) = records["full"], records["chunked"]
    torch.testing.assert_close(chunked.loss, full.loss)
    torch.testing.assert_close(chunked.nll_sum, full.nll_sum)
    assert chunked.count == full.count
    assert chunked_grads.keys() == full_grads.keys()
    for name, grad in full_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_one_threshold_decides_auto_chunking_and_the_config_repeats_the_tile(monkeypatch):
    """``auto`` chunks from ``AUTO_CHUNK_ELEMENTS`` logits, read where it is defined (training's
    N-gram loss asks the same function as evaluation); ``train.loss_chunk_*`` default to the
    tile of ``targetlm.chunked``."""
    assert chunked.auto_chunks(chunked.AUTO_CHUNK_ELEMENTS // 32, 32)
    assert not chunked.auto_chunks(chunked.AUTO_CHUNK_ELEMENTS // 32 - 1, 32)
    objective = build_objective(ComponentConfig("cross_entropy"), build_model(model_config(), V))
    assert not objective.uses_chunked(1000, V)
    monkeypatch.setattr(chunked, "AUTO_CHUNK_ELEMENTS", 1000 * V)
    assert objective.uses_chunked(1000, V) and not objective.uses_chunked(999, V)
    train = config_lib.TrainConfig()
    assert (train.loss_chunk_tokens, train.loss_chunk_vocab) == (
        chunked.CHUNK_TOKENS,
        chunked.CHUNK_VOCAB,
    )


def test_auto_switches_by_size_and_falls_back_where_chunked_cannot():
    model = build_model(model_config("lstm", "tied"), V)
    objective = build_objective(ComponentConfig("cross_entropy"), model)  # auto by default
    assert objective.loss_impl == "auto"
    assert not objective.uses_chunked(1000, V)
    assert objective.uses_chunked(2**20, 2**5)
    exact = ComponentConfig("augmented", {"detach_target": False})
    assert not build_objective(exact, model, "auto").uses_chunked(2**20, 2**5)
    with pytest.raises(ConfigError, match="train.loss_impl = .chunked.: .*detach_target"):
        build_objective(exact, model, "chunked")


def test_target_outside_the_vocabulary_is_one_error_on_both_paths():
    model = build_model(model_config("lstm", "tied"), V)
    prediction = model(torch.zeros(2, 4, dtype=torch.long), None)
    targets = torch.zeros(2, 4, dtype=torch.long)
    targets[1, 2] = V
    for impl in ("full", "chunked"):
        objective = build_objective(ComponentConfig("cross_entropy"), model, impl)
        with pytest.raises(ValueError, match=f"target id {V} is outside the vocabulary"):
            objective(prediction, targets, *model.output())


# --- training ----------------------------------------------------------------------------
def _train_losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines if json.loads(x)["kind"] == "train"]


def test_short_training_run_full_and_chunked_give_the_same_losses(tmp_path):
    overrides = {
        "train.epochs": 1,
        "train.max_steps": 5,
        "train.optimizer": '"adam"',
        "train.lr": 0.01,
        "data.synthetic.train_sentences": 40,
        "objective.kind": '"augmented"',
        "objective.tau": 2.0,
        "objective.label_smoothing": 0.1,
        "objective.ngram_alpha": 0.5,
        "model.heads.kind": '"wdr"',
        "model.heads.n": 3,
    }
    results = {}
    for impl in ("full", "chunked"):
        data = tiny_config(**overrides, **{"train.loss_impl": f'"{impl}"'}).to_dict()
        data["train"]["loss_chunk_tokens"] = 16
        data["train"]["loss_chunk_vocab"] = 50  # several vocabulary tiles
        config = config_lib.from_dict(data)
        results[impl] = Trainer(config, tmp_path / impl, log=lambda m: None).train()
    full, chunked = _train_losses(tmp_path / "full"), _train_losses(tmp_path / "chunked")
    assert len(full) == 5
    for a, b in zip(full, chunked):
        assert math.isclose(a, b, rel_tol=1e-4)
    assert math.isclose(
        results["full"]["test"]["ppl"], results["chunked"]["test"]["ppl"], rel_tol=1e-3
    )


def test_chunked_training_resumes_exactly(tmp_path):
    overrides = {
        "train.epochs": 1,
        "train.optimizer": '"adam"',
        "train.lr": 0.01,
        "train.loss_impl": '"chunked"',
        "train.loss_chunk_tokens": 8,
        "data.synthetic.train_sentences": 40,
        "model.heads.kind": '"simple"',
        "model.heads.n": 2,
    }
    config = tiny_config(**overrides)
    Trainer(config.replace(["train.max_steps=4"]), tmp_path / "whole", log=lambda m: None).train()
    Trainer(config.replace(["train.max_steps=2"]), tmp_path / "resumed", log=lambda m: None).train()
    Trainer(
        config.replace(["train.max_steps=4"]), tmp_path / "resumed", resume=True, log=lambda m: None
    ).train()
    losses = _train_losses(tmp_path / "whole")
    assert len(losses) == 4 and _train_losses(tmp_path / "resumed") == losses
