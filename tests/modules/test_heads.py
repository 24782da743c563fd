"""Heo, Rim & Choi (2024, 2025): WDR, N-gram heads and their loss, the head ensemble."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import OUTPUT_OPTIONS, model_config, tiny_config

import targetlm
from targetlm import config as config_lib
from targetlm import functional
from targetlm.cli import main
from targetlm.config import ComponentConfig
from targetlm.data import StreamBatches
from targetlm.inference import evaluate_ensemble, evaluate_stream, head_top1
from targetlm.inference.ensemble import ensemble_predictions
from targetlm.modules import HEADS, build_model
from targetlm.modules.model import Prediction
from targetlm.objectives import CrossEntropyObjective, NgramLoss, build_objective
from targetlm.registry import ConfigError
from targetlm.training import Trainer

V = 30
KINDS = sorted(HEADS.names())  # every registered head kind


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(encoder="lstm", output="tied", heads="wdr", n=3, **heads_options):
    torch.manual_seed(0)
    config = model_config(encoder, output)
    kind = ComponentConfig(heads, {"n": n, **heads_options} if heads != "none" else {})
    return build_model(dataclasses.replace(config, heads=kind), V).eval()


def _ids(length, seed=0):
    return torch.randint(V, (length,), generator=torch.Generator().manual_seed(seed))


# --- functional -----------------------------------------------------------------------
def _recursion(x, n):
    """Eqs. 7-8 per position: Δ_n x_t = Δ_{n−1} x_{t+1} − Δ_{n−1} x_t for t < T, Δ_n x_T = x_T."""
    levels = [list(x.unbind(1))]
    for _ in range(n):
        previous = levels[-1]
        levels.append([a - b for a, b in zip(previous[1:], previous[:-1])] + [levels[0][-1]])
    return torch.stack(levels[-1], 1)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_wdr_is_the_recursion_and_the_binomial_sum(n):
    x = torch.randn(2, 9, 3, dtype=torch.float64)
    got = functional.wdr(x, n)
    torch.testing.assert_close(got, _recursion(x, n))
    T = x.size(1)
    for t in range(T - n):  # eq. 9 where x_{t+n} exists
        binomial = sum(math.comb(n, i) * (-1) ** i * x[:, t + n - i] for i in range(n + 1))
        torch.testing.assert_close(got[:, t], binomial)
    torch.testing.assert_close(got[:, -1], x[:, -1])  # eq. 8: Δ_n x_T = x_T


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_wdr_plus_conjugate_reconstructs_the_word(n):
    x = torch.randn(2, 9, 3, dtype=torch.float64, requires_grad=True)
    conjugate = functional.wdr_conjugate(x, n)
    assert not conjugate.requires_grad  # detached even when its input needs a gradient
    T = x.size(1)
    torch.testing.assert_close(
        functional.wdr(x, n)[:, : T - n] + conjugate[:, : T - n], x[:, n:].detach()
    )
    assert torch.count_nonzero(conjugate[:, T - n :]) == 0
    expected = -sum(math.comb(n, i) * (-1) ** i * x[:, n - i : T - i] for i in range(1, n + 1))
    torch.testing.assert_close(conjugate[:, : T - n], expected.detach())


def test_ngram_loss():
    losses = [torch.tensor(2.0), torch.tensor(3.0), torch.tensor(5.0)]
    assert functional.ngram_loss(losses[:1], alpha=0.3) is losses[0]
    torch.testing.assert_close(functional.ngram_loss(losses), torch.tensor(0.5 * 2 + 8 / 4))
    torch.testing.assert_close(
        functional.ngram_loss(losses, alpha=0.5), torch.tensor(0.5 * 2 + 0.5 * 8 / 4)
    )


def test_ensemble_and_its_start_of_stream_rule():
    main_, heads = torch.randn(2, 4, 3), torch.randn(2, 2, 4, 3)
    assert functional.ensemble(main_, heads, 0.0) is main_
    torch.testing.assert_close(
        functional.ensemble(main_, heads, 0.4), 0.6 * main_ + 0.4 * heads.mean(0)
    )
    available = torch.tensor([[False, True, True, True], [False, False, True, True]])
    got = functional.ensemble(main_, heads, 0.4, available)
    torch.testing.assert_close(got[:, 0], main_[:, 0])  # no head yet: the main head
    torch.testing.assert_close(got[:, 1], 0.6 * main_[:, 1] + 0.4 * heads[0, :, 1])
    torch.testing.assert_close(got[:, 3], 0.6 * main_[:, 3] + 0.4 * heads[:, :, 3].mean(0))


def test_gradient_diversity():
    g = torch.randn(1, 7)
    assert math.isclose(float(functional.gradient_diversity(g.repeat(4, 1))), 0.25)
    assert math.isclose(float(functional.gradient_diversity(torch.eye(5) * 3)), 1.0)
    assert float(functional.gradient_diversity(torch.cat([g, -0.9 * g]))) > 10


# --- heads and the N-gram loss ----------------------------------------------------------
def test_parameter_counts_include_the_heads():
    model = _model(n=3, hidden_size=8)
    d = model.output.embedding_dim
    counts = model.parameter_counts()
    assert counts["heads"] == 2 * (d * 8 + 8 + 8 * d + d)
    assert sum(counts.values()) == sum(p.numel() for p in model.parameters())
    assert _model(heads="none").parameter_counts()["heads"] == 0


def test_heads_config_errors():
    with pytest.raises(ConfigError, match="model.heads.size"):
        tiny_config(**{"model.heads": '{kind = "simple", size = 3}'})
    with pytest.raises(ConfigError, match="takes no options"):
        tiny_config(**{"model.heads": '{kind = "none", n = 3}'})
    with pytest.raises(ConfigError, match=r"model.heads.n: 0 is not in \[1, 64\]"):
        tiny_config(**{"model.heads": '{kind = "wdr", n = 0}'})
    with pytest.raises(ConfigError, match="available: eagle, gloeckle, medusa, mtp, simple, wdr"):
        tiny_config(**{"model.heads": '{kind = "wrd"}'})


def test_alpha_is_the_objectives_and_the_old_heads_key_moves_there(tmp_path, capsys):
    """α is ``objective.ngram_alpha``; a config (or a run directory's) with the older
    ``model.heads.alpha`` loads with a DeprecationWarning that names the release removing it,
    and the key moved."""
    config = tiny_config(
        **{
            "model.heads": '{kind = "simple", n = 3}',
            "objective": '{kind = "cross_entropy", ngram_alpha = 0.4}',
        }
    )
    objective = build_objective(config.objective, build_model(config.model, V))
    assert objective.alpha == 0.4 and objective.objective.label_smoothing == 0.0
    with pytest.raises(ConfigError, match="objective.ngram_alpha.*no heads"):
        tiny_config(objective='{kind = "cross_entropy", ngram_alpha = 0.5}')
    with pytest.raises(ConfigError, match=r"ngram_alpha: -1.0 is not in \[0, inf\)"):
        tiny_config(
            **{"model.heads": '{kind = "wdr", n = 2}'},
            objective='{kind = "cross_entropy", ngram_alpha = -1}',
        )
    with pytest.raises(ConfigError, match="model.heads.alpha"):  # not a heads option any more
        build_model(
            dataclasses.replace(config.model, heads=ComponentConfig("simple", {"alpha": 0.6})), V
        )
    old = tiny_config(**{"train.epochs": 1, "train.max_steps": 2}).to_dict()
    old["model"]["heads"] = {"kind": "wdr", "n": 2, "alpha": 0.6}
    removed_in = rf"removed in targetlm {config_lib.HEADS_ALPHA_REMOVED_IN}"
    with pytest.warns(DeprecationWarning, match=rf"{removed_in}.*objective.ngram_alpha"):
        moved = config_lib.from_dict(old)
    assert moved.model.heads.options == {"n": 2}
    assert moved.objective.options == {"ngram_alpha": 0.6}
    # an old run directory: its checkpoints and config.toml carry the old key
    Trainer(moved, tmp_path / "run", log=lambda m: None).train()
    for path in (tmp_path / "run").glob("*.pt"):
        checkpoint = torch.load(path, weights_only=True)
        checkpoint["config"] = old
        torch.save(checkpoint, path)
    with pytest.warns(DeprecationWarning):
        assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["ppl"])


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def test_the_heads_alpha_upgrade_goes_by_its_removal_version():
    """The ``model.heads.alpha`` move ships only in releases before the one its warning names:
    bumping the version to it fails here until ``config.upgrade`` drops the move (and the
    README's note)."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    packaged = config_lib.tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    for version in (targetlm.__version__, packaged["version"]):
        assert _release(version) < _release(config_lib.HEADS_ALPHA_REMOVED_IN), version
    assert _release("0.10.0") > _release("0.2.0")


@pytest.mark.parametrize("kind", KINDS)
def test_n1_equals_plain_training(output_kind, kind):
    tokens, targets = torch.randint(V, (2, 7)), torch.randint(V, (2, 7))
    losses, grads = [], []
    for heads in ("none", kind):
        model = _model("lstm", output_kind, heads, n=1).train()
        objective = build_objective(
            ComponentConfig("cross_entropy", {"label_smoothing": 0.1}), model
        )
        out = objective(model(tokens), targets, *model.output())
        out.loss.backward()
        losses.append((out.loss, out.nll_sum, out.count))
        grads.append([p.grad for p in model.parameters()])
    assert losses[0][0].item() == losses[1][0].item() and losses[0][2] == losses[1][2]
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_loss_is_the_weighted_sum_of_head_losses_and_nll_is_the_main_heads():
    model = _model(heads="simple", n=3)
    objective = build_objective(ComponentConfig("cross_entropy", {"ngram_alpha": 0.6}), model)
    prediction = model(torch.randint(V, (2, 6)))
    predicted = prediction.main
    targets = torch.randint(V, (2, 8))  # T + N − 1 columns
    weight, bias = model.output()
    records = objective.head_losses(prediction, targets, weight, bias)
    plain = CrossEntropyObjective()(predicted, targets[:, :6], weight, bias)
    assert records[0].nll_sum == plain.nll_sum and records[0].count == 12
    assert [r.count for r in records] == [12, 12, 12]
    expected = 0.5 * records[0].loss + 0.6 / 4 * (records[1].loss + records[2].loss)
    out = objective(prediction, targets, weight, bias)
    torch.testing.assert_close(out.loss, expected)
    assert out.nll_sum == plain.nll_sum and out.count == 12
    # head 2 at t predicts y_{t+2}: MLP²(h_t) against targets[:, t + 2]
    second = prediction.heads[1]  # the model ran the heads: MLP²(h)
    torch.testing.assert_close(second, model.heads.mlps[1](predicted))
    torch.testing.assert_close(
        records[2].loss,
        F.cross_entropy(F.linear(second, weight, bias).flatten(0, 1), targets[:, 2:].flatten()),
    )
    # without lookahead the last n positions of head n are not scored
    short = objective.head_losses(prediction, targets[:, :6], weight, bias)
    assert [r.count for r in short] == [12, 10, 8]


@pytest.mark.parametrize("loss_impl", ["full", "chunked"])
def test_main_weight_and_heads_label_smoothing_ablations(loss_impl):
    """``ngram_main_weight`` replaces the ½ on L₀; ``ngram_heads_label_smoothing`` smooths
    only the heads' targets: checked against losses computed head by head."""
    model = _model(heads="wdr", n=3)
    options = {
        "label_smoothing": 0.1,
        "ngram_alpha": 0.6,
        "ngram_main_weight": 1.0,
        "ngram_heads_label_smoothing": 0.0,
    }
    objective = build_objective(ComponentConfig("cross_entropy", options), model, loss_impl)
    prediction = model(torch.randint(V, (2, 6)))
    targets = torch.randint(V, (2, 8))
    weight, bias = model.output()
    rows = objective.head_rows(prediction, targets, weight)

    def ce(predicted, target, smoothing):
        logits = F.linear(predicted, weight, bias).flatten(0, 1)
        return F.cross_entropy(
            logits, target.flatten(), ignore_index=-100, label_smoothing=smoothing
        )

    expected = 1.0 * ce(*rows[0], 0.1) + 0.6 / 4 * (ce(*rows[1], 0.0) + ce(*rows[2], 0.0))
    out = objective(prediction, targets, weight, bias)
    torch.testing.assert_close(out.loss, expected)
    plain = CrossEntropyObjective()(prediction.main, targets[:, :6], weight, bias)
    torch.testing.assert_close(out.nll_sum, plain.nll_sum)
    with pytest.raises(ConfigError, match="ngram_main_weight"):
        build_objective(ComponentConfig("cross_entropy", {"ngram_main_weight": 0.0}), model)
    with pytest.raises(ConfigError, match="no\n?.*heads"):
        build_objective(
            ComponentConfig("cross_entropy", {"ngram_heads_label_smoothing": 0.0}),
            _model(heads="none"),
        )


def test_wdr_conjugate_adds_no_gradient_to_the_output_embeddings(output_kind):
    """The gradient reaching E_out from a WDR head's loss is the one through the logit layer."""
    model = _model("lstm", output_kind, "wdr", n=4)
    objective = NgramLoss(CrossEntropyObjective(), model.heads)
    predicted = torch.randn(2, 6, model.output.embedding_dim)
    targets = torch.randint(V, (2, 9))
    weight, bias = model.output()
    if not weight.requires_grad:  # pragma: no cover  (every layer learns E_out)
        pytest.skip("E_out has no gradient")
    n = 3
    outputs = model.heads(predicted)
    prediction = Prediction(predicted, outputs, None)
    record = objective.head_losses(prediction, targets, weight, bias)[n]
    (got,) = torch.autograd.grad(record.loss, weight, retain_graph=True)
    # x̂_{t+n} as a constant: only the logit matmul x̂ · E_outᵀ depends on E_out
    embeddings = weight.detach()[targets]
    conjugate = functional.wdr_conjugate(embeddings, n)[:, :6]
    constant = (outputs[n - 1] + conjugate).detach()
    through_logits = F.cross_entropy(
        F.linear(constant, weight, bias).flatten(0, 1), targets[:, n : n + 6].flatten()
    )
    (expected,) = torch.autograd.grad(through_logits, weight, retain_graph=True)
    torch.testing.assert_close(got, expected)
    # a conjugate that was not detached would add a gradient of its own
    live = -sum(
        math.comb(n, i) * (-1) ** i * weight[targets][:, n - i : n - i + 6] for i in range(1, n + 1)
    )
    leaky = F.cross_entropy(
        F.linear(outputs[n - 1].detach() + live, weight, bias).flatten(0, 1),
        targets[:, n : n + 6].flatten(),
    )
    assert not torch.allclose(torch.autograd.grad(leaky, weight)[0], expected)


@pytest.mark.parametrize("kind", KINDS)
def test_split_stream_training_loss_equals_one_long_segment(encoder_kind, kind):
    """With the lookahead, BPTT segments score every head position one long segment scores."""
    model = _model(encoder_kind, "tied", kind, n=3)
    objective = build_objective(ComponentConfig("cross_entropy"), model)
    ids = _ids(41)
    sums = []
    for segment in (5, 20):
        batches = StreamBatches(ids, 2, segment, pad=False, lookahead=objective.lookahead)
        totals, counts, state = [0.0] * 3, [0] * 3, None
        for inputs, targets in batches:
            prediction = model(inputs, state)
            state = prediction.state
            for n, record in enumerate(objective.head_losses(prediction, targets, *model.output())):
                totals[n] += record.loss.item() * record.count
                counts[n] += record.count
        sums.append((totals, counts))
    (split, split_counts), (whole, whole_counts) = sums
    # 40 targets in 2 rows of 20; row 0's last positions take t+n from row 1 (the stream
    # continues there), so only the stream's last n positions lack a target t+n
    assert split_counts == whole_counts == [40, 39, 38]
    for a, b in zip(split, whole):
        assert math.isclose(a, b, rel_tol=1e-5)


# --- the ensemble ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_ensemble_has_no_future_leak(encoder_kind, kind):
    """Changing the word x_t being predicted, or any later one, leaves x̂_ens(t) unchanged."""
    model = _model(encoder_kind, "tied", kind, n=4)
    ids = _ids(16)[None]
    t = 8  # column t predicts y_t = ids[t + 1]
    changed = ids.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % V
    with torch.no_grad():
        a = ensemble_predictions(model, ids[:, :-1], ids[:, 1:], 0.5)
        b = ensemble_predictions(model, changed[:, :-1], changed[:, 1:], 0.5)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1], b[:, t + 1])


def test_lambda_zero_is_the_main_heads_perplexity(encoder_kind):
    model = _model(encoder_kind, "tied", "wdr", n=3)
    ids = _ids(60)
    plain = evaluate_stream(model, ids, 3, 7)
    result = evaluate_ensemble(model, ids, 3, 7, [0.0, 0.3])
    assert result["ppl"] == plain["ppl"] and result["tokens"] == plain["tokens"] == 59
    assert result["ensemble"][0]["ppl"] == plain["ppl"]
    assert result["ensemble"][1]["ppl"] != plain["ppl"]


@pytest.mark.parametrize("kind", KINDS)
def test_streaming_ensemble_equals_one_long_segment(encoder_kind, kind):
    model = _model(encoder_kind, "tied", kind, n=4)
    ids = _ids(61)
    lambdas = [0.0, 0.2, 0.6, 1.0]
    split = evaluate_ensemble(model, ids, 2, 3, lambdas)
    whole = evaluate_ensemble(model, ids, 2, 30, lambdas)
    for a, b in zip(split["ensemble"], whole["ensemble"]):
        assert math.isclose(a["nll"], b["nll"], rel_tol=1e-5)
    # and the one-segment result is the direct formula with the start-of-row rule
    inputs = torch.stack([ids[:30], ids[30:60]])
    targets = torch.stack([ids[1:31], ids[31:61]])
    weight, bias = model.output()
    with torch.no_grad():
        mixed = ensemble_predictions(model, inputs, targets, 0.6)
        predicted, raw, _ = model(inputs)
        heads = model.heads.reconstruct(raw, F.pad(weight[targets], (0, 0, 0, 1)))
    t = 10  # every head available: ê_n(t) is head n's output at column t − n
    expected = 0.4 * predicted[:, t] + 0.6 * torch.stack(
        [heads[n - 1][:, t - n] for n in (1, 2, 3)]
    ).mean(0)
    torch.testing.assert_close(mixed[:, t], expected)
    torch.testing.assert_close(  # t = 1: only head 1 exists
        mixed[:, 1], 0.4 * predicted[:, 1] + 0.6 * heads[0][:, 0]
    )
    nll = F.cross_entropy(F.linear(mixed, weight, bias).flatten(0, 1), targets.flatten())
    assert math.isclose(nll.item(), whole["ensemble"][2]["nll"], rel_tol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_each_heads_top1_is_its_argmax_on_the_word_it_predicts(encoder_kind, kind):
    """Head n's estimate of y_t is its output at column t − n (scored where that column
    exists); streamed in short segments it counts what one long segment counts."""
    model = _model(encoder_kind, "tied", kind, n=4)
    ids = _ids(61)
    split = head_top1(model, ids, 2, 3)
    whole = head_top1(model, ids, 2, 30)
    assert split == whole
    inputs = torch.stack([ids[:30], ids[30:60]])
    targets = torch.stack([ids[1:31], ids[31:61]])
    weight, bias = model.output()
    with torch.no_grad():
        predicted, raw, _ = model(inputs)
        heads = model.heads.reconstruct(raw, F.pad(weight[targets], (0, 0, 0, 1)))
    hits = [F.linear(predicted, weight, bias).argmax(-1) == targets]
    hits += [F.linear(heads[n - 1][:, : 30 - n], weight, bias).argmax(-1) == targets[:, n:]
             for n in (1, 2, 3)]  # fmt: skip
    assert [row["ahead"] for row in whole] == [1, 2, 3, 4]
    assert [row["count"] for row in whole] == [60, 58, 56, 54]
    assert [row["correct"] for row in whole] == [int(h.sum()) for h in hits]


# --- end to end -------------------------------------------------------------------------
def _train_losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines if json.loads(x)["kind"] == "train"]


def test_heads_train_and_resume_exactly(tmp_path, output_kind):
    """WDR heads (the superset: MLPs, conjugate, shared logits) with every output layer;
    simple heads train end to end in the CLI test below."""
    overrides = {
        "train.epochs": 1,
        "train.optimizer": '"adam"',
        "train.lr": 0.01,
        "data.synthetic.train_sentences": 40,
        "model.encoder.dropout_hidden": 0.2,
    }
    data = tiny_config(**overrides).to_dict()
    data["model"]["output"] = {"kind": output_kind, **OUTPUT_OPTIONS[output_kind]}
    data["model"]["heads"] = {"kind": "wdr", "n": 3}
    config = config_lib.from_dict(data)
    full = Trainer(config.replace(["train.max_steps=6"]), tmp_path / "full", log=lambda m: None)
    full_results = full.train()
    Trainer(config.replace(["train.max_steps=3"]), tmp_path / "resumed", log=lambda m: None).train()
    resumed = Trainer(
        config.replace(["train.max_steps=6"]), tmp_path / "resumed", resume=True, log=lambda m: None
    ).train()
    losses = _train_losses(tmp_path / "full")
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert _train_losses(tmp_path / "resumed") == losses
    assert resumed["test"]["ppl"] == full_results["test"]["ppl"]
    assert math.isfinite(full_results["test"]["ppl"])
    assert full_results["params"]["heads"] > 0


def test_cli_eval_with_ensemble_lambdas(tmp_path, capsys):
    config = tiny_config(
        **{"model.heads": '{kind = "simple", n = 3}', "train.epochs": 1, "train.max_steps": 8}
    )
    results = Trainer(config, tmp_path / "run", log=lambda m: None).train()
    assert main(["eval", str(tmp_path / "run"), "--ensemble-lambda", "0,0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [row["lambda"] for row in out["ensemble"]] == [0.0, 0.5]
    assert out["ensemble"][0]["ppl"] == out["ppl"]
    assert math.isclose(out["ppl"], results["test"]["ppl"], rel_tol=1e-9)
    assert all(math.isfinite(row["ppl"]) for row in out["ensemble"])
    assert main(["eval", str(tmp_path / "run"), "--ensemble-lambda", "0,0.5"]) == 0
    assert "λ = 0.5" in capsys.readouterr().out
    assert main(["eval", str(tmp_path / "run"), "--ensemble-lambda", "1.5"]) == 2
    assert "[0, 1]" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "run"), "--head-top1", "--json"]) == 0
    top1 = json.loads(capsys.readouterr().out)["head_top1"]
    assert [row["ahead"] for row in top1] == [1, 2, 3]
    assert top1[0]["count"] == out["tokens"] > top1[1]["count"] > top1[2]["count"]
    assert all(0 <= row["top1"] <= 1 for row in top1)
    assert main(["eval", str(tmp_path / "run"), "--head-top1"]) == 0
    assert "head 3 (word t+3): top-1" in capsys.readouterr().out

    # t-SNE of the targets: needs the optional scikit-learn, else one clear error line
    png = tmp_path / "tsne.png"
    rc = main(["analyze", "tsne", str(tmp_path / "run"), "--out", str(png), "--tokens", "80"])
    try:
        import sklearn  # noqa: F401
    except ImportError:
        assert rc == 2 and "scikit-learn" in capsys.readouterr().err
    else:
        assert rc == 0 and png.is_file()
        capsys.readouterr()

    plain = tiny_config(**{"train.epochs": 1, "train.max_steps": 2})
    Trainer(plain, tmp_path / "plain", log=lambda m: None).train()
    assert main(["eval", str(tmp_path / "plain"), "--ensemble-lambda", "0.5"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no N-gram heads" in err[0]
    assert main(["eval", str(tmp_path / "plain"), "--head-top1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--head-top1 needs a model with N-gram heads" in err[0]


# --- gradient diversity -------------------------------------------------------------------
def test_batch_gradient_diversity_is_eq_14_over_the_rows():
    from targetlm.analysis.diversity import batch_gradient_diversity

    model = _model(heads="wdr", n=3).train()
    objective = build_objective(ComponentConfig("cross_entropy"), model)
    inputs, targets = torch.randint(V, (3, 6)), torch.randint(V, (3, 8))
    got = batch_gradient_diversity(model, objective, inputs, targets)
    assert all(p.grad is None for p in model.parameters())
    rows = []
    for row in range(3):
        loss = objective(model(inputs[row : row + 1]), targets[row : row + 1], *model.output()).loss
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        rows.append(torch.cat([g.flatten() for g in grads if g is not None]))
    assert math.isclose(got, float(functional.gradient_diversity(torch.stack(rows))), rel_tol=1e-5)


def test_gradient_diversity_logging_leaves_training_unchanged(tmp_path):
    overrides = {
        "model.heads": '{kind = "simple", n = 2}',
        "model.encoder.dropout_hidden": 0.3,
        "train.epochs": 1,
        "train.max_steps": 4,
        "data.synthetic.train_sentences": 40,
    }
    plain = Trainer(tiny_config(**overrides), tmp_path / "plain", log=lambda m: None)
    plain.train()
    measured = tiny_config(**overrides, **{"train.gradient_diversity_every": 2})
    Trainer(measured, tmp_path / "measured", log=lambda m: None).train()
    assert _train_losses(tmp_path / "measured") == _train_losses(tmp_path / "plain")
    lines = (tmp_path / "measured" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines if json.loads(x)["kind"] == "diversity"]
    assert [r["step"] for r in records] == [2, 4]
    assert all(r["gradient_diversity"] > 0 for r in records)
