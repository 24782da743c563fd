"""Text diffusion: forward processes, the clipping statistic, the denoiser's contract, the loss
with WDR heads, decoding (λ = 0, seeds) and the CLI end to end on a toy language pair.

Contract cases come from the registries: every denoiser (``DENOISER_ENCODER_OPTIONS``) with
every output layer (``OUTPUT_OPTIONS``) and every head kind (``HEADS``, and none).
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from conftest import DENOISER_ENCODER_OPTIONS, OUTPUT_OPTIONS
from test_translation import write_corpus

from targetlm import functional
from targetlm.cli import main
from targetlm.config import ComponentConfig, ModelConfig
from targetlm.inference.diffusion import (
    DiffusionDecodeOptions,
    generate,
    minimum_bayes_risk,
    translate_ids,
)
from targetlm.modules import HEADS, build_model
from targetlm.modules.diffusion import (
    DinoiserSchedule,
    SqrtSchedule,
    build_schedule,
    clip_noise_scale,
    mean_nearest_neighbour_sq_distance,
)
from targetlm.modules.model import Prediction
from targetlm.objectives import CrossEntropyObjective
from targetlm.objectives.diffusion import DiffusionInputs, DiffusionLoss
from targetlm.registry import ConfigError
from targetlm.tasks import DiffusionTask, pair_batches
from targetlm.tasks.translation import pad

V, EOS = 40, 1
HEAD_KINDS = ["none", *HEADS.names()]


def diffusion_config(denoiser: str, output: str = "tied", heads: str = "none") -> ModelConfig:
    return ModelConfig(
        embedding=ComponentConfig("lookup", {"size": 16, "init_std": 0.25}),
        encoder=ComponentConfig(denoiser, dict(DENOISER_ENCODER_OPTIONS[denoiser])),
        output=ComponentConfig(output, dict(OUTPUT_OPTIONS[output])),
        heads=ComponentConfig(heads, {} if heads == "none" else {"n": 3}),
    )


def model_for(denoiser="diffusion_denoiser", output="tied", heads="none", seed=0):
    torch.manual_seed(seed)
    return build_model(diffusion_config(denoiser, output, heads), V).eval()


def sentences(lengths, seed=0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.cat([torch.randint(2, V, (n,), generator=generator), torch.tensor([EOS])])
        for n in lengths
    ]


def batch(seed=0):
    return pair_batches(sentences((5, 9, 3, 6), seed), sentences((4, 8, 2, 7), seed + 1), EOS)[0]


@pytest.fixture(params=sorted(DENOISER_ENCODER_OPTIONS))
def denoiser(request) -> str:
    return request.param


# --- the forward processes -------------------------------------------------------------------


@pytest.mark.parametrize("schedule", [SqrtSchedule(4.0), SqrtSchedule(1.0), DinoiserSchedule()])
def test_forward_process_mean_and_variance_at_t(schedule):
    t = torch.tensor([0.05, 0.3, 0.7, 0.95])
    if schedule.name == "sqrt":  # Difformer: ᾱ = 1 − √(t + 1e-4), noise scaled by F
        alpha_bar = 1 - torch.sqrt(t + 1e-4)
        scale, std = alpha_bar.sqrt(), schedule.noise_factor * (1 - alpha_bar).sqrt()
    else:  # DINOISER: scale √(1 − t²), std t
        scale, std = (1 - t**2).sqrt(), t
    torch.testing.assert_close(schedule.scale(t), scale)
    torch.testing.assert_close(schedule.std(t), std)
    x0 = torch.randn(1, 3, 4).expand(4, 3, 4)
    noise = torch.randn(4, 3, 4)
    exact = scale[:, None, None] * x0 + std[:, None, None] * noise
    torch.testing.assert_close(schedule.noise(x0, t, noise), exact)
    # Monte Carlo: E[x_t] = a(t)·x₀, Var[x_t] = σ(t)²
    torch.manual_seed(0)
    draws = torch.stack([schedule.noise(x0, t) for _ in range(4000)])  # (S, 4, 3, 4)
    error = (draws.mean(0) - scale[:, None, None] * x0).abs()
    assert bool((error <= 5 * std[:, None, None] / math.sqrt(4000)).all())  # 5 standard errors
    variance = draws.var(0).mean((1, 2))
    torch.testing.assert_close(variance, std**2, atol=0.0, rtol=0.08)


def test_the_posterior_mean_is_ddpm_s_for_consecutive_steps():
    schedule = SqrtSchedule(1.0)
    t, s = torch.tensor([0.5, 0.9]), torch.tensor([0.499, 0.85])
    x_t, x0 = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    bar_t, bar_s = schedule.alpha_bar(t), schedule.alpha_bar(s)
    alpha, beta = bar_t / bar_s, 1 - bar_t / bar_s
    expected = (bar_s.sqrt() * beta / (1 - bar_t))[:, None, None] * x0 + (
        alpha.sqrt() * (1 - bar_s) / (1 - bar_t)
    )[:, None, None] * x_t
    torch.testing.assert_close(schedule.posterior_mean(x_t, x0, t, s), expected)


def test_an_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="unknown noise schedule 'cosine'"):
        build_schedule("cosine")
    with pytest.raises(ConfigError, match="task.schedule"):
        from targetlm.tasks import TASKS

        TASKS.build("diffusion", {"schedule": "cosine"}, "task")


def test_clipping_statistic_equals_brute_force_nearest_neighbours():
    torch.manual_seed(0)
    table = torch.randn(37, 6)
    table[5] = table[9]  # a duplicate row: its nearest neighbour is at distance 0
    distances = torch.cdist(table.double(), table.double()) ** 2
    distances.fill_diagonal_(float("inf"))
    brute = distances.min(1).values.mean()
    chunked = mean_nearest_neighbour_sq_distance(table, chunk=5)  # tiles of 5 rows
    torch.testing.assert_close(chunked.double(), brute, rtol=1e-5, atol=1e-5)
    v = float(brute) / 6
    assert clip_noise_scale(table, chunk=8) == pytest.approx(math.sqrt(v / (1 + v)), rel=1e-5)


# --- the denoiser, the task and the loss -----------------------------------------------------


def test_the_wdr_conjugate_on_the_target_side_rebuilds_the_next_clean_embeddings():
    x0 = torch.randn(2, 7, 5)
    for n in (1, 2, 3):
        both = functional.wdr(x0, n) + functional.wdr_conjugate(x0, n)
        torch.testing.assert_close(both[:, : 7 - n], x0[:, n:])


def test_heads_that_predict_the_wdr_exactly_have_zero_loss():
    """Head n's reconstruction is MLPⁿ + Δʳ_n x₀[s]: raw outputs equal to Δ_n x₀[s] give
    x₀[s+n] exactly, so every L_n (and L₀ with x̂₀ = x₀) is 0."""
    model = model_for(heads="wdr")
    task = DiffusionTask()
    targets = batch().targets
    mask = targets != -100
    weight, bias = model.output()
    clean = task.clean_table(weight)[targets.clamp(min=0)] * mask[..., None]
    raw = torch.stack([functional.wdr(clean, n) for n in (1, 2)])
    extras = DiffusionInputs(
        clean, mask, torch.ones(4), torch.zeros(4, 9), torch.full((4,), 4, dtype=torch.long)
    )
    loss = DiffusionLoss(CrossEntropyObjective(), model.heads, 0.1, **task.loss_weights())
    terms = loss.terms(Prediction(clean, raw, None, extras), targets, weight, bias)
    assert float(terms["mse"].detach()) == 0 and len(terms["head_mse"]) == 2
    assert all(float(v.detach()) < 1e-10 for v in terms["head_mse"])
    # the MSE terms combine as ½·L₀ + α/(2N−2)·Σ L_n
    shifted = Prediction(clean + 1, raw, None, extras)
    terms = loss.terms(shifted, targets, weight, bias)
    expected = 0.5 * terms["mse"] + 0.1 / 4 * sum(terms["head_mse"])
    torch.testing.assert_close(terms["diffusion"], expected)


def test_diffusion_weight_scales_only_the_diffusion_term():
    """``task.diffusion_weight`` w: loss = w·L₀ + anchor + length weight·length (the base
    control with WDR's ½ on L₀); w = 1 is the loss as it was, bit for bit."""
    model = model_for()
    targets = batch().targets
    mask = targets != -100
    weight, bias = model.output()
    clean = DiffusionTask().clean_table(weight)[targets.clamp(min=0)] * mask[..., None]
    extras = DiffusionInputs(
        clean, mask, torch.ones(4), torch.randn(4, 9), torch.full((4,), 4, dtype=torch.long)
    )
    prediction = Prediction(clean + 0.3, None, None, extras)
    terms = {}
    for w in (1.0, 0.5):
        loss = DiffusionLoss(
            CrossEntropyObjective(), None, 1.0, **DiffusionTask(diffusion_weight=w).loss_weights()
        )
        terms[w] = loss.terms(prediction, targets, weight, bias)
    anchor, length = terms[1.0]["anchor"].loss, 0.1 * terms[1.0]["length"]
    assert torch.equal(terms[1.0]["loss"], terms[1.0]["mse"] + anchor + length)
    torch.testing.assert_close(terms[0.5]["loss"], 0.5 * terms[1.0]["mse"] + anchor + length)
    with pytest.raises(ValueError, match="diffusion_weight"):
        DiffusionTask(diffusion_weight=float("nan"))


@pytest.mark.parametrize("heads", HEAD_KINDS)
def test_predict_and_loss_work_with_every_output_layer(denoiser, output_kind, heads):
    model = model_for(denoiser, output_kind, heads).train()
    task = DiffusionTask(schedule="dinoiser", clip_every=1)
    from targetlm.objectives import build_objective

    objective = {"kind": "cross_entropy", "options": {}}
    if heads != "none":
        objective["options"] = {"ngram_alpha": 0.1}
    loss = task.training_objective(
        build_objective(ComponentConfig(objective["kind"], objective["options"]), model), model
    )
    b = batch()
    prediction = task.predict(model, b)
    weight, bias = model.output()
    out = loss(prediction, b.targets, weight, bias)
    assert torch.isfinite(out.loss) and out.count == int((b.targets != -100).sum())
    out.loss.backward()
    assert model.encoder.length_classifier.weight.grad is not None
    assert float(model.encoder.sigma_min) > 0  # DINOISER's clip was computed on the first batch
    if heads != "none":
        assert prediction.heads.shape == (2, *prediction.main.shape)


def test_two_shares_of_a_batch_are_noised_and_weighed_as_the_whole_batch():
    """A process's share of a batch (``Batch.part``) draws the whole batch's t and ε and keeps
    its rows; each part of the loss divided by the whole batch's count over the processes
    (C / K, as the training step divides it) makes the shares' mean the whole batch's loss,
    uneven token counts included."""
    from targetlm.objectives import build_objective
    from targetlm.training.distributed import shard_rows

    model = model_for(heads="wdr").train()
    task = DiffusionTask(self_condition_prob=0.0)
    config = ComponentConfig("cross_entropy", {"ngram_alpha": 0.5})
    loss = task.training_objective(build_objective(config, model), model)
    whole = batch()
    weight, bias = model.output()
    torch.manual_seed(5)
    expected = task.predict(model, whole)
    alone = loss(expected, whole.targets, weight, bias)
    shares = [shard_rows(whole, rank, 2) for rank in range(2)]
    predictions = []
    for share in shares:
        torch.manual_seed(5)  # every process draws from the same stream
        predictions.append(task.predict(model, share))
    for name in ("time", "clean"):
        joined = torch.cat([getattr(p.extras, name) for p in predictions])
        torch.testing.assert_close(joined, getattr(expected.extras, name))
    torch.testing.assert_close(torch.cat([p.main for p in predictions]), expected.main)
    # the two shares' counts, all-reduced by hand
    parts = [loss(p, s.targets, weight, bias) for p, s in zip(predictions, shares)]
    assert parts[0].counts != parts[1].counts  # uneven tokens (and head positions)
    halves = [(a + b) / 2 for a, b in zip(parts[0].counts, parts[1].counts)]
    shared = [part.divided(halves).loss for part in parts]
    torch.testing.assert_close((shared[0] + shared[1]) / 2, alone.loss)


def test_padding_never_changes_the_denoiser_output_at_real_positions(denoiser):
    model = model_for(denoiser, heads="wdr")
    encoder = model.encoder
    source = sentences((6, 3), seed=3)
    short_source = source[1][None]
    together = pad(source, 0)
    mask = torch.arange(together.size(1))[None] < torch.tensor([6 + 1, 3 + 1])[:, None]
    torch.manual_seed(1)
    x = torch.randn(2, 8, 16)
    target_mask = torch.arange(8)[None] < torch.tensor([8, 4])[:, None]
    t = torch.tensor([0.4, 0.7])
    previous = torch.randn(2, 8, 16)
    memory = encoder.start(model.embedding(together), mask)
    padded = model.forward_embedded(x, memory.at(t, target_mask, previous))
    alone_memory = encoder.start(model.embedding(short_source), torch.ones(1, 4, dtype=torch.bool))
    alone = model.forward_embedded(x[1:, :4], alone_memory.at(t[1:], None, previous[1:, :4]))
    torch.testing.assert_close(padded.main[1, :4], alone.main[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded.heads[:, 1, :4], alone.heads[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        encoder.length_logits(memory)[1],
        encoder.length_logits(alone_memory)[0],
        atol=1e-5,
        rtol=1e-5,
    )


def test_cached_memory_keys_values_give_the_same_denoiser_output(denoiser):
    model = model_for(denoiser).eval()
    encoder = model.encoder
    source = pad(sentences((6, 3), seed=3), 0)
    mask = torch.arange(source.size(1))[None] < torch.tensor([7, 4])[:, None]
    memory = encoder.start(model.embedding(source), mask)
    rows = torch.tensor([0, 0, 1, 1, 1])  # candidates per sentence, as decoding selects them
    x, t = torch.randn(5, 8, 16), torch.rand(5)
    plain = model.forward_embedded(x, memory.select(rows).at(t))
    cached_state = encoder.cache_memory(memory).select(rows)
    assert len(cached_state.memory_keys_values) == len(encoder.decoder_layers)
    cached = model.forward_embedded(x, cached_state.at(t))
    torch.testing.assert_close(cached.main, plain.main, atol=1e-6, rtol=1e-6)


def test_the_denoiser_refuses_the_translation_task_and_lm_use(denoiser):
    model = model_for(denoiser)
    with pytest.raises(ValueError, match="diffusion"):
        model(torch.zeros(1, 3, dtype=torch.long))


# --- decoding ---------------------------------------------------------------------------------


def decode(model, options, sources=None, task=None):
    task = task or DiffusionTask(schedule="dinoiser", sampler=options.sampler)
    sources = sources or sentences((5, 2, 7), seed=4)
    return translate_ids(model, task, sources, options, EOS, batch_size=2)


@pytest.mark.parametrize("sampler", ["renoise", "posterior"])
def test_lambda_zero_is_plain_decoding_and_the_same_seed_gives_the_same_output(sampler):
    model = model_for(heads="wdr")
    options = DiffusionDecodeOptions(steps=3, length_beam=2, samples=2, sampler=sampler, seed=7)
    first = decode(model, options)
    assert decode(model, options) == first  # the same seed twice
    plain = copy.deepcopy(model)
    plain.heads = None
    assert decode(plain, options) == first  # λ = 0 with heads is decoding without them
    assert len(first) == 3 and all(isinstance(t, int) for row in first for t in row)


def test_the_ensemble_changes_the_estimate_and_uses_only_earlier_positions():
    from targetlm.inference.diffusion import head_ensemble

    model = model_for(heads="wdr")
    main = torch.randn(2, 6, 16)
    raw = model.heads(main)
    mixed = head_ensemble(model, main, raw, 0.4)
    torch.testing.assert_close(mixed[:, 0], main[:, 0])  # no head reaches position 0
    assert not torch.allclose(mixed[:, 1:], main[:, 1:])
    torch.testing.assert_close(head_ensemble(model, main, raw, 0.0), main)
    # head 1 at position 1 only: (1−λ)·x̂₀[1] + λ·(MLP¹(x̂₀[0]) + x̂₀[0])
    expected = 0.6 * main[:, 1] + 0.4 * (raw[0, :, 0] + main[:, 0])
    torch.testing.assert_close(mixed[:, 1], expected)


def test_decoding_option_errors(denoiser):
    model = model_for(denoiser)
    for options, message in [
        (DiffusionDecodeOptions(steps=0), "denoising steps must be >= 1"),
        (DiffusionDecodeOptions(length_beam=10), r"length beam must be in \[1, 9\]"),
        (DiffusionDecodeOptions(ensemble_lambda=0.2), "needs a model with N-gram heads"),
        (DiffusionDecodeOptions(sampler="ddim"), "unknown sampler"),
    ]:
        with pytest.raises(ConfigError, match=message):
            options.check(model)


def test_minimum_bayes_risk_picks_the_consensus_and_the_first_on_ties():
    pytest.importorskip("sacrebleu")
    outlier, agreed, near = [5, 6, 7, 8, 9], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6]
    # the candidate another one repeats agrees most with the rest; its order does not matter
    assert minimum_bayes_risk([outlier, agreed, near, agreed]) == agreed
    assert minimum_bayes_risk([near, outlier, agreed, agreed]) == agreed
    # no overlap at all: every score is 0, the first (the most probable length) is kept
    assert minimum_bayes_risk([[1, 2, 3, 4], [5, 6, 7, 8]]) == [1, 2, 3, 4]
    assert minimum_bayes_risk([[7, 8]]) == [7, 8]


def test_generate_proposes_lengths_from_the_length_classifier():
    model = model_for()
    with torch.no_grad():  # the classifier always says: 2 tokens longer than the source
        model.encoder.length_classifier.weight.zero_()
        model.encoder.length_classifier.bias.fill_(-10)
        model.encoder.length_classifier.bias[4 + 2] = 10
        model.embedding.weight[EOS] *= 0  # never an <eos> among the outputs
    source = pad(sentences((3, 5), seed=2), 0)
    mask = torch.arange(source.size(1))[None] < torch.tensor([4, 6])[:, None]
    options = DiffusionDecodeOptions(steps=2, length_beam=1)
    out = generate(model, DiffusionTask(), source, mask, options, EOS, torch.Generator())
    assert [len(row) for row in out] == [6, 8]
    # oracle lengths (<eos> included) replace the classifier's beam, whatever its size
    options = DiffusionDecodeOptions(steps=2, length_beam=3, samples=2)
    oracle = torch.tensor([3, 10])
    out = generate(model, DiffusionTask(), source, mask, options, EOS, torch.Generator(), oracle)
    assert [len(row) for row in out] == [3, 10]
    out = translate_ids(
        model,
        DiffusionTask(),
        sentences((3, 5, 2), seed=2),
        options,
        EOS,
        batch_size=2,
        target_lengths=[4, 2, 7],
    )  # batched by source length: each source keeps its own target length
    assert [len(row) for row in out] == [4, 2, 7]


# --- the CLI end to end -----------------------------------------------------------------------


def tiny_diffusion_config(tmp_path, data_dir, heads="none", schedule="dinoiser"):
    alpha = "ngram_alpha = 0.1" if heads != "none" else ""
    text = f"""
[data]
name = "text"
dir = "{data_dir}"
train = "train"
valid = "val"
test = "test"
source_lang = "src"
target_lang = "tgt"
tokenizer = "bpe"
vocab_size = 320
max_tokens = 200
shuffle = true

[model.embedding]
kind = "lookup"
size = 16
init_std = 0.25

[model.encoder]
kind = "diffusion_denoiser"
encoder_layers = 1
decoder_layers = 1
num_heads = 2
ff_size = 32
dropout = 0.1
max_context = 40
max_length_difference = 4

[model.output]
kind = "tied"
bias = false

[model.heads]
kind = "{heads}"
{"n = 3" if heads != "none" else ""}

[objective]
kind = "cross_entropy"
{alpha}

[task]
kind = "diffusion"
schedule = "{schedule}"
embedding_norm = true
decode_steps = 3
length_beam = 2
samples = 2

[train]
optimizer = "adam"
lr = 0.003
schedule = "inverse_sqrt"
warmup_steps = 10
epochs = 1
progress = false
log_every = 5
threads = 1

[eval]
batch_size = 16
"""
    path = tmp_path / f"diffusion-{heads}.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diffusion")
    data = write_corpus(root / "data")
    runs = {}
    for heads, schedule in (("wdr", "dinoiser"), ("none", "sqrt")):
        config = tiny_diffusion_config(root, data, heads=heads, schedule=schedule)
        runs[heads] = root / f"run-{heads}"
        assert main(["train", str(config), "--run-dir", str(runs[heads])]) == 0
    return runs, data


def test_diffusion_trains_evaluates_and_translates_end_to_end(trained_runs, capsys):
    runs, data = trained_runs
    results = json.loads((runs["wdr"] / "results.json").read_text())
    for split in ("valid", "test"):
        r = results[split]
        assert {"loss", "mse", "head_mse", "ppl", "bleu", "chrf", "bleu_signature"} <= r.keys()
        assert r["sentences"] == 20 and len(r["head_mse"]) == 2 and r["steps"] == 3
    assert "BLEU" in (runs["wdr"] / "report.md").read_text()
    capsys.readouterr()
    args = ["translate", str(runs["wdr"]), "--input", str(data / "test.src")]
    args += ["--reference", str(data / "test.tgt"), "--steps", "2", "--length-beam", "3"]
    assert main([*args, "--samples", "1", "--ensemble-lambda", "0.1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sentences"] == 20 and summary["steps"] == 2 and summary["length_beam"] == 3
    assert {"bleu", "chrf", "bleu_signature", "sentences_per_s"} <= summary.keys()
    assert summary["ensemble_lambda"] == 0.1 and summary["oracle_length"] is False
    assert main([*args, "--oracle-length", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["oracle_length"] is True
    # the same seed twice: the same output
    outputs = []
    for _ in range(2):
        assert main(["translate", str(runs["none"]), "--input", str(data / "val.src")]) == 0
        outputs.append(capsys.readouterr().out.splitlines()[:-1])  # the last line: timing
    assert outputs[0] == outputs[1]
    assert main(["eval", str(runs["wdr"]), "--json"]) == 0
    losses = json.loads(capsys.readouterr().out)
    assert set(losses) == {"valid", "test"} and losses["valid"]["loss"] > 0
    assert len(losses["valid"]["head_mse"]) == 2


@pytest.mark.parametrize(
    ("run", "extra", "message"),
    [
        ("wdr", ["--steps", "0"], r"argument --steps: 0 is not in \[1, "),
        ("wdr", ["--length-beam", "12"], r"length beam must be in \[1, 9\]"),
        ("none", ["--ensemble-lambda", "0.2"], "needs a model with N-gram heads"),
        ("wdr", ["--set", "task.schedule='cosine'"], "task.schedule: invalid value 'cosine'"),
        ("wdr", ["--input-is-empty"], "empty"),
        ("wdr", ["--oracle-length"], "--oracle-length decodes at the reference's lengths"),
        ("none", ["--beam", "3"], "--beam: beam search's options; a diffusion run decodes with"),
        ("wdr", ["--length-penalty", "0.6", "--max-len-b", "5"], "--length-penalty, --max-len-b"),
        (
            "wdr",
            ["--input-is-too-long"],
            "line 2: 4[0-9] source tokens exceed the model's max_context 40",
        ),
        ("wdr", ["--input-is-latin-1"], "not UTF-8"),
        ("wdr", ["--reference-is-misaligned"], "lines"),
    ],
)
def test_bad_diffusion_input_is_one_clear_error_and_writes_nothing(
    trained_runs, tmp_path, capsys, run, extra, message
):
    runs, data = trained_runs
    source = data / "test.src"
    if extra[0].startswith("--input-is-"):
        source, problem, extra = tmp_path / "src.txt", extra[0], []
        lines = {
            "--input-is-empty": b"a dog\n\nthe cat\n",
            "--input-is-too-long": ("a dog\n" + " ".join(["dog"] * 45) + "\n").encode(),
            "--input-is-latin-1": "a dog\nle ch\u00e2teau\n".encode("latin-1"),
        }
        source.write_bytes(lines[problem])
    if extra == ["--reference-is-misaligned"]:
        reference = tmp_path / "ref.txt"
        reference.write_text("ONE LINE\n", encoding="utf-8")
        extra = ["--reference", str(reference)]
    output = tmp_path / "hyp.txt"
    args = ["translate", str(runs[run]), "--input", str(source), "--output", str(output)]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and __import__("re").search(message, err), err
    assert not output.exists()


def test_an_unknown_schedule_stops_training_before_anything_is_written(tmp_path, capsys):
    data = write_corpus(tmp_path / "data", pairs=20)
    config = tiny_diffusion_config(tmp_path, data)
    run = tmp_path / "run"
    args = ["train", str(config), "--run-dir", str(run), "--set", "task.schedule='cosine'"]
    assert main(args) == 2
    assert "task.schedule" in capsys.readouterr().err and not run.exists()


def replace_table(text: str, table: str, body: str) -> str:
    """``text`` (TOML) with the ``[table]`` section's lines replaced by ``body``."""
    head = text.index(f"[{table}]\n")
    end = text.find("\n[", head + 1)
    return text[:head] + f"[{table}]\n{body}\n" + text[end + 1 :]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("length beam", r"task.length_beam = 12 exceeds the denoiser's 9 length classes"),
        (
            "translation task",
            "is a diffusion denoiser: it trains with task.kind = 'diffusion', not 'translation'",
        ),
        (
            "seq2seq encoder",
            "task.kind = 'diffusion' needs model.encoder.kind = 'diffusion_denoiser'",
        ),
    ],
)
def test_a_task_and_encoder_that_do_not_fit_stop_training_before_anything_is_written(
    tmp_path, capsys, case, message
):
    """Checked with the options, not after an epoch of training (the length beam) or in the
    middle of the first step (a denoiser under another task)."""
    data = write_corpus(tmp_path / "data", pairs=20)
    text = tiny_diffusion_config(tmp_path, data).read_text(encoding="utf-8")
    if case == "length beam":
        text = text.replace("length_beam = 2", "length_beam = 12")
    elif case == "translation task":
        text = replace_table(text, "task", 'kind = "translation"')
    else:
        text = replace_table(
            text, "model.encoder", 'kind = "transformer_seq2seq"\nmax_context = 40'
        )
    config = tmp_path / "config.toml"
    config.write_text(text, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and __import__("re").search(message, err), err
    assert not run.exists()


def test_diffusion_options_are_refused_for_a_translation_run(tmp_path, capsys):
    from test_translation import tiny_translation_config

    data = write_corpus(tmp_path / "data", pairs=40)
    run = tmp_path / "nmt"
    assert main(["train", str(tiny_translation_config(tmp_path, data)), "--run-dir", str(run)]) == 0
    capsys.readouterr()
    args = ["translate", str(run), "--input", str(data / "test.src")]
    for extra in (["--steps", "3"], ["--oracle-length"]):
        assert main([*args, *extra]) == 2
        assert "are for diffusion runs" in capsys.readouterr().err


def test_diffusion_resumes_exactly(tmp_path):
    """σ_min (recomputed every batch here) and its batch counter travel with the model, the
    noise with torch's RNG state: an interrupted run computes the same losses."""
    from targetlm import builders
    from targetlm.training import train

    data = write_corpus(tmp_path / "data", pairs=60)
    path = tiny_diffusion_config(tmp_path, data, heads="wdr")
    config = builders.load_config(path).replace(
        ["train.log_every=1", "train.epochs=2", "task.clip_every=2", "task.decode_steps=1"]
    )

    def losses(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if r["kind"] == "train"]

    train(config, tmp_path / "whole", log=lambda m: None)
    train(config.replace(["train.max_steps=3"]), tmp_path / "cut", log=lambda m: None)
    train(config, tmp_path / "cut", resume=True, log=lambda m: None)
    assert len(losses(tmp_path / "whole")) > 3
    assert losses(tmp_path / "whole") == losses(tmp_path / "cut")


def test_decoding_may_use_another_noise_factor_than_training():
    task = DiffusionTask(schedule="sqrt", noise_factor=4.0, decode_noise_factor=1.0)
    t = torch.tensor([0.5])
    torch.testing.assert_close(task.schedule.std(t), 4 * task.decode_schedule.std(t))
    assert DiffusionTask(noise_factor=4.0).decode_schedule is not None


@pytest.mark.slow  # a training run; CI runs it
def test_a_tiny_denoiser_learns_the_toy_language_pair(tmp_path, capsys):
    """30 epochs of 300 toy pairs (a few seconds): x̂₀ rounds to the target through the logit
    layer (anchor perplexity near 1) and decoding recovers much of the reference (chrF)."""
    data = write_corpus(tmp_path / "data")
    config = tiny_diffusion_config(tmp_path, data)
    overrides = ["train.epochs=30", "model.embedding.size=32", "model.encoder.ff_size=64"]
    args = ["train", str(config), "--run-dir", str(tmp_path / "run")]
    assert main([*args, *(x for o in overrides for x in ("--set", o))]) == 0
    test = json.loads((tmp_path / "run" / "results.json").read_text())["test"]
    assert test["ppl"] < 4 and test["chrf"] > 15, test
