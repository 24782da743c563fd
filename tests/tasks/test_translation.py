"""Translation: the encoder–decoder through the registries, decoding, BLEU, the CLI end to end.

Contract cases come from the registries: every conditional encoder (``CONDITIONAL_ENCODER_OPTIONS``)
with every output layer (``OUTPUT_OPTIONS``) and every head kind (``HEADS``, and none).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import random

import pytest
import torch
import torch.nn.functional as F
from conftest import CONDITIONAL_ENCODER_OPTIONS, OUTPUT_OPTIONS

from targetlm import functional
from targetlm.cli import main
from targetlm.config import ComponentConfig, ModelConfig
from targetlm.data import catalogue
from targetlm.data.catalogue import DatasetSpec, Remote, download
from targetlm.inference.combiners import HeadEstimates
from targetlm.inference.translate import (
    DecodeOptions,
    Stepper,
    beam_search,
    decode,
    greedy,
    score_translations,
)
from targetlm.modules import HEADS, build_model
from targetlm.registry import ConfigError
from targetlm.tasks import Batch, TranslationTask, pair_batches

V, EOS = 40, 1
HEAD_KINDS = ["none", *HEADS.names()]


def seq2seq_config(encoder: str, output: str = "tied", heads: str = "none") -> ModelConfig:
    return ModelConfig(
        embedding=ComponentConfig("lookup", {"size": 16, "init_std": 0.25}),
        encoder=ComponentConfig(encoder, dict(CONDITIONAL_ENCODER_OPTIONS[encoder])),
        output=ComponentConfig(output, dict(OUTPUT_OPTIONS[output])),
        heads=ComponentConfig(heads, {} if heads == "none" else {"n": 3}),
    )


def sentences(lengths, seed=0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.cat([torch.randint(2, V, (n,), generator=generator), torch.tensor([EOS])])
        for n in lengths
    ]


def batch(seed=0) -> Batch:
    return pair_batches(sentences((5, 9, 3, 6), seed), sentences((4, 8, 2, 7), seed + 1), EOS)[0]


def model_for(encoder="transformer_seq2seq", output="tied", heads="none", seed=0):
    """A random model; tied ones get a short <eos> row, so that they do not end every output
    at once (decoding tests compare outputs of several tokens)."""
    torch.manual_seed(seed)
    model = build_model(seq2seq_config(encoder, output, heads), V).eval()
    if output == "tied":
        with torch.no_grad():
            model.embedding.weight[EOS] *= 0.2
    return model


@pytest.fixture(params=sorted(CONDITIONAL_ENCODER_OPTIONS))
def conditional_encoder(request) -> str:
    return request.param


# --- contract: shapes, causality, the source mask ---------------------------------------------


@pytest.mark.parametrize("heads", HEAD_KINDS)
@pytest.mark.parametrize("output", sorted(OUTPUT_OPTIONS))
def test_decoder_shapes_causality_and_source_mask(conditional_encoder, output, heads):
    model = model_for(conditional_encoder, output, heads)
    task = TranslationTask()
    b = batch()
    prediction = task.predict(model, b)
    B, T = b.inputs.shape
    assert prediction.main.shape == (B, T, model.output.embedding_dim)
    if heads != "none":
        assert prediction.heads.shape == (2, B, T, model.output.embedding_dim)
    assert prediction.state is None
    # causality: a later target token never changes earlier decoder outputs
    changed = b.inputs.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % V
    after = task.predict(
        model, Batch(changed, b.targets, source=b.source, source_mask=b.source_mask)
    )
    torch.testing.assert_close(after.main[:, :4], prediction.main[:, :4])
    assert not torch.allclose(after.main[:, 4:], prediction.main[:, 4:])
    # the source mask: a sentence alone equals the same sentence padded in a batch
    row = 2  # the shortest source: padded in the batch
    alone = pair_batches(
        [b.source[row, : int(b.source_mask[row].sum())]], [b.targets[row][b.targets[row] >= 0]], EOS
    )[0]
    single = task.predict(model, alone)
    length = alone.inputs.size(1)
    torch.testing.assert_close(single.main[0], prediction.main[row, :length], atol=1e-5, rtol=1e-5)
    # ... and whatever sits in the padded source positions is never read
    noisy = b.source.masked_fill(~b.source_mask, 7)
    again = task.predict(model, Batch(b.inputs, b.targets, source=noisy, source_mask=b.source_mask))
    torch.testing.assert_close(again.main, prediction.main)


def test_the_lm_task_rejects_a_conditional_encoder():
    model = model_for()
    with pytest.raises(ValueError, match="needs a source"):
        model(torch.zeros(2, 3, dtype=torch.long))


def test_pair_batches_hold_every_pair_once_within_the_token_budget():
    lengths = [random.Random(i).randint(1, 30) for i in range(200)]
    source, target = sentences(lengths), sentences(lengths[::-1], 1)
    batches = pair_batches(source, target, EOS, max_tokens=120)
    seen = []
    for b in batches:
        assert b.source.numel() <= 120 or b.source.size(0) == 1
        assert b.targets.numel() <= 120 or b.targets.size(0) == 1
        # decoder input = <eos> + target without its last token; targets padded with IGNORE
        real = b.targets >= 0
        assert torch.equal(b.inputs[:, 0], torch.full((b.inputs.size(0),), EOS))
        assert torch.equal(b.inputs[:, 1:][real[:, 1:]], b.targets[:, :-1][real[:, 1:]])
        seen += [tuple(s[m].tolist()) for s, m in zip(b.source, b.source_mask)]
    assert sorted(seen) == sorted(tuple(s.tolist()) for s in source)


# --- decoding -------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", HEAD_KINDS)
def test_cached_decoding_equals_uncached_and_beam_1_equals_greedy(heads):
    model = model_for(heads=heads, seed=3)
    b = batch(5)
    lam = 0.0 if heads == "none" else 0.4
    options = DecodeOptions(beam=1, max_len_b=12, ensemble_lambda=lam)
    uncached = DecodeOptions(beam=1, max_len_b=12, ensemble_lambda=lam, cache=False)
    outputs = greedy(model, b.source, b.source_mask, options, EOS)
    assert outputs == greedy(model, b.source, b.source_mask, uncached, EOS)
    assert outputs == beam_search(model, b.source, b.source_mask, options, EOS)
    assert any(outputs)  # something was generated (the comparison is not between empty lists)
    beam = DecodeOptions(beam=4, max_len_b=12, ensemble_lambda=lam)
    beam_uncached = DecodeOptions(beam=4, max_len_b=12, ensemble_lambda=lam, cache=False)
    assert decode(model, b.source, b.source_mask, beam, EOS) == decode(
        model, b.source, b.source_mask, beam_uncached, EOS
    )


def test_cached_log_probs_equal_the_full_prefix():
    model = model_for(seed=1)
    b = batch(2)
    start = model.encoder.start(model.embedding(b.source), b.source_mask, cache=True)
    stepper = Stepper(model, start, DecodeOptions(beam=1), EOS)
    full = torch.log_softmax(model.logits(TranslationTask().predict(model, b).main), -1)
    for t in range(b.inputs.size(1) - 1):
        torch.testing.assert_close(stepper.log_probs(), full[:, t], atol=1e-5, rtol=1e-5)
        stepper.advance(b.inputs[:, t + 1])


@pytest.mark.parametrize("heads", HEADS.names())
def test_ensemble_inside_decoding_equals_the_lm_head_ensemble(heads):
    """Forcing the reference tokens, each step's ensembled distribution is the LM head ensemble
    (HeadEstimates + functional.ensemble) of the whole target sequence at that column."""
    model = model_for(heads=heads, seed=4)
    b, lam = batch(6), 0.6
    prediction = TranslationTask().predict(model, b)
    weight, bias = model.output()
    estimates, available = HeadEstimates(model.heads, weight)(prediction, b.targets)
    expected = torch.log_softmax(
        F.linear(functional.ensemble(prediction.main, estimates, lam, available), weight, bias), -1
    )
    start = model.encoder.start(model.embedding(b.source), b.source_mask, cache=True)
    stepper = Stepper(model, start, DecodeOptions(ensemble_lambda=lam), EOS)
    shorter = (b.targets >= 0).sum(1).min()
    for t in range(int(shorter)):
        torch.testing.assert_close(stepper.log_probs(), expected[:, t], atol=1e-5, rtol=1e-5)
        stepper.advance(b.targets[:, t])


def test_ensemble_with_lambda_zero_is_plain_beam_search():
    model = model_for(heads="wdr", seed=7)
    b = batch(8)
    plain = decode(model, b.source, b.source_mask, DecodeOptions(beam=3, max_len_b=10), EOS)
    zero = DecodeOptions(beam=3, max_len_b=10, ensemble_lambda=0.0)
    assert decode(model, b.source, b.source_mask, zero, EOS) == plain
    some = DecodeOptions(beam=3, max_len_b=10, ensemble_lambda=1.0)
    assert decode(model, b.source, b.source_mask, some, EOS) != plain  # λ does act


def test_outputs_respect_the_maximum_length():
    model = model_for(seed=9)
    b = batch(1)
    for beam in (1, 3):
        options = DecodeOptions(beam=beam, max_len_a=0.0, max_len_b=3)
        assert all(len(o) <= 2 for o in decode(model, b.source, b.source_mask, options, EOS))


def test_bleu_of_the_references_themselves_is_100():
    references = ["Ein Hund läuft im Park.", "Zwei Männer spielen Fußball auf einer Wiese."]
    scores = score_translations(references, references)
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)
    assert scores["bleu_signature"].startswith("nrefs:1|") and scores["sentences"] == 2
    assert score_translations(["Ein Hund."], ["Eine Katze schläft."])["bleu"] < 100


# --- data and the CLI -------------------------------------------------------------------------

WORDS = [
    "a",
    "dog",
    "cat",
    "man",
    "woman",
    "runs",
    "sits",
    "plays",
    "in",
    "the",
    "park",
    "on",
    "grass",
    "with",
    "ball",
    "red",
    "blue",
    "small",
]


def write_corpus(directory, pairs=300, seed=0):
    """A toy language pair: the target is the source reversed, in capitals."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", pairs), ("val", 20), ("test", 20)):
        src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(n)]
        tgt = [" ".join(reversed(line.upper().split())) for line in src]
        (directory / f"{split}.src").write_text("\n".join(src) + "\n", encoding="utf-8")
        (directory / f"{split}.tgt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return directory


def tiny_translation_config(tmp_path, data_dir, heads="none", epochs=1):
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
kind = "transformer_seq2seq"
encoder_layers = 1
decoder_layers = 1
num_heads = 2
ff_size = 32
dropout = 0.1
max_context = 40

[model.output]
kind = "tied"
bias = false

[model.heads]
kind = "{heads}"
{"n = 3" if heads != "none" else ""}

[objective]
kind = "cross_entropy"
label_smoothing = 0.1

[task]
kind = "translation"

[train]
optimizer = "adam"
lr = 0.003
schedule = "inverse_sqrt"
warmup_steps = 10
epochs = {epochs}
progress = false
log_every = 5
threads = 1

[eval]
batch_size = 16
beam = 2
"""
    path = tmp_path / f"nmt-{heads}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_eval_of_a_translation_config_scores_the_untrained_model(tmp_path, capsys):
    # a config is read with its task's vocabulary (the joint subwords of the pairs), not as a
    # stream corpus: before, multi30k-like data "was not found" (no train.txt)
    config = tiny_translation_config(tmp_path, write_corpus(tmp_path / "data", pairs=60))
    assert main(["eval", str(config), "--json", "--set", "eval.beam=1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["test"]["ppl"] > 1 and 0 <= result["test"]["bleu"] <= 100


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("nmt")
    data = write_corpus(root / "data")
    config = tiny_translation_config(root, data, heads="wdr")
    run = root / "run"
    assert main(["train", str(config), "--run-dir", str(run)]) == 0
    return run, data


def test_translation_trains_evaluates_and_translates_end_to_end(trained_run, capsys, tmp_path):
    run, data = trained_run
    results = json.loads((run / "results.json").read_text())
    for split in ("valid", "test"):
        assert {"ppl", "bleu", "chrf", "bleu_signature", "sentences"} <= results[split].keys()
        assert results[split]["sentences"] == 20
    assert "BLEU" in (run / "report.md").read_text()
    capsys.readouterr()
    output = tmp_path / "out" / "hyp.txt"
    args = ["translate", str(run), "--input", str(data / "test.src"), "--reference",
            str(data / "test.tgt"), "--beam", "2", "--ensemble-lambda", "0.3", "--json",
            "--output", str(output)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {"bleu", "chrf", "sentences", "bleu_signature", "sentences_per_s"} <= summary.keys()
    assert summary["sentences"] == 20 and len(output.read_text().splitlines()) == 20
    assert main(["eval", str(run), "--json"]) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert {"valid", "test"} == evaluation.keys()
    assert {"nll", "ppl", "bleu", "chrf"} <= evaluation["test"].keys()
    # the BLEU of eval is the BLEU the run reported at the end of training (same beam)
    assert evaluation["test"]["bleu"] == pytest.approx(results["test"]["bleu"])


def bad(tmp_path, name, text: bytes | str):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    "case, source, reference, message",
    [
        ("empty line", "a dog\n\nthe cat\n", None, r"src.txt, line 2: empty source"),
        ("not utf-8", b"a dog\n\xff\xfe cat\n", None, r"src.txt, line 2: undecodable"),
        ("too long", "a dog\n" + "dog " * 60 + "\n", None, r"src.txt, line 2: .* exceed"),
        ("misaligned reference", "a dog\nthe cat\n", "A DOG\n", r"has 2 lines but .*ref.txt has 1"),
        ("a directory", None, None, r"src.txt is a directory, not a text file"),
        ("no such file", "", None, r"corpus file not found: .*missing.txt"),
    ],
)
def test_bad_translate_input_is_one_clear_error_and_writes_nothing(
    trained_run, tmp_path, capsys, case, source, reference, message
):
    run, _ = trained_run
    if case == "a directory":
        (tmp_path / "src.txt").mkdir()
        args = ["translate", str(run), "--input", str(tmp_path / "src.txt")]
    elif case == "no such file":
        args = ["translate", str(run), "--input", str(tmp_path / "missing.txt")]
    else:
        args = ["translate", str(run), "--input", str(bad(tmp_path, "src.txt", source))]
    if reference is not None:
        args += ["--reference", str(bad(tmp_path, "ref.txt", reference))]
    output = tmp_path / "hyp.txt"
    assert main([*args, "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert __import__("re").search(message, err), err
    assert not output.exists()


def test_misaligned_training_files_and_empty_pairs(tmp_path, capsys):
    data = write_corpus(tmp_path / "data", pairs=40)
    config = tiny_translation_config(tmp_path, data)
    lines = (data / "train.tgt").read_text().splitlines()
    (data / "train.tgt").write_text("\n".join(lines[:-1]) + "\n")
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run), "--set", "train.max_steps=1"]) == 2
    assert "train.src has 40 lines but" in capsys.readouterr().err
    assert not run.exists()
    lines[3] = ""
    (data / "train.tgt").write_text("\n".join(lines) + "\n")
    assert main(["train", str(config), "--run-dir", str(run), "--set", "train.max_steps=2"]) == 0
    assert "skipped 1 training pairs with an empty side" in capsys.readouterr().out


def test_pairs_longer_than_the_context_are_skipped_in_training_and_refused_in_evaluation(
    tmp_path, capsys
):
    """A training pair the encoder cannot read is left out and counted (it crashed the first
    step before); a valid or test pair is one error naming it, before the run directory."""
    data = write_corpus(tmp_path / "data", pairs=40)
    config = tiny_translation_config(tmp_path, data)
    long_line = " ".join(["dog"] * 45)  # > max_context 40 tokens, whatever the BPE merges
    for split in ("train", "val"):
        lines = (data / f"{split}.src").read_text().splitlines()
        lines[2] = long_line
        (data / f"{split}.src").write_text("\n".join(lines) + "\n")
        run = tmp_path / f"run-{split}"
        code = main(["train", str(config), "--run-dir", str(run), "--set", "train.max_steps=2"])
        out, err = capsys.readouterr()
        if split == "train":
            assert code == 0
            assert "skipped 1 training pairs longer than the model's max_context 40" in out
        else:
            assert code == 2 and not run.exists()
            assert len(err.strip().splitlines()) == 1
            assert "val.src, pair 3 of split 'val': its source has" in err
            assert "over the model's max_context 40" in err


def test_translation_resumes_exactly(tmp_path):
    from targetlm import builders
    from targetlm.training import train

    data = write_corpus(tmp_path / "data", pairs=60)
    path = tiny_translation_config(tmp_path, data, heads="simple", epochs=2)
    config = builders.load_config(path).replace(["train.log_every=1"])

    def losses(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if r["kind"] == "train"]

    train(config, tmp_path / "whole", log=lambda m: None)
    train(config.replace(["train.max_steps=3"]), tmp_path / "cut", log=lambda m: None)
    train(config, tmp_path / "cut", resume=True, log=lambda m: None)
    assert len(losses(tmp_path / "whole")) > 3
    assert losses(tmp_path / "whole") == losses(tmp_path / "cut")


def test_multi30k_is_registered_with_pinned_gzip_files_and_downloads_them(monkeypatch, tmp_path):
    spec = catalogue.get_spec("multi30k")
    assert set(spec.files) == {f"{s}.{lang}" for s in spec.splits for lang in ("en", "de")}
    for remote in spec.files.values():
        assert remote.gzip and len(remote.sha256) == 64
        assert "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/" in remote.url
    # the download path: gzip files checked by their own sha256, saved decompressed
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    files = {}
    for name, text in (("train.en", "A dog.\n"), ("train.de", "Ein Hund.\n")):
        blob = gzip.compress(text.encode())
        (remote_dir / f"{name}.gz").write_bytes(blob)
        files[name] = Remote(
            (remote_dir / f"{name}.gz").as_uri(), sha256=hashlib.sha256(blob).hexdigest(), gzip=True
        )
    monkeypatch.setitem(
        catalogue.DATASETS, "tiny30k", DatasetSpec("tiny30k", "t", ("train",), files=files)
    )
    target = download("tiny30k", tmp_path / "data" / "tiny30k")
    assert (target / "train.de").read_text() == "Ein Hund.\n"


def test_data_info_lists_the_multi30k_splits_and_languages(capsys):
    import os
    from pathlib import Path

    root = os.environ.get("TARGETLM_DATA")
    if not root or not (Path(root) / "multi30k" / "train.en").is_file():
        pytest.skip("TARGETLM_DATA with multi30k/ is not set (the shared data)")
    assert main(["data", "info", "multi30k"]) == 0
    out = capsys.readouterr().out
    assert "test_2016_flickr" in out and "29,000" in out and "1,014" in out


def test_language_model_commands_refuse_a_translation_run(trained_run, capsys):
    run, data = trained_run
    assert main(["generate", str(run), "--prompt", "a dog"]) == 2
    assert "'translation' run" in capsys.readouterr().err
    assert main(["score", str(run), "--file", str(data / "test.tgt"), "--out", "x.jsonl"]) == 2
    assert "targetlm translate" in capsys.readouterr().err


def test_training_continues_in_train_mode_after_validation_and_decoding(tmp_path):
    """Validation and beam search run in eval mode; the steps after them still use dropout
    (a regression: the model once stayed in eval mode after the first validation)."""
    from targetlm import builders
    from targetlm.inference.translate import DecodeOptions, evaluate_pairs, translate_ids
    from targetlm.training import Trainer

    data = write_corpus(tmp_path / "data", pairs=40)
    config = builders.load_config(tiny_translation_config(tmp_path, data))
    trainer = Trainer(config, tmp_path / "run", log=lambda m: None)
    trainer._setup()
    model = trainer.model
    model.train()
    evaluate_pairs(model, trainer.data.batches["valid"], trainer.task)
    assert model.training
    translate_ids(model, [torch.tensor([5, 6, 7])], DecodeOptions(beam=2), trainer.vocab.eos_id)
    assert model.training
    model.eval()
    trainer.train_step(trainer.batches[0], 1e-3)
    assert model.training  # a training step always trains in train mode


# --- a separate source embedding --------------------------------------------------------------


def with_source_embedding(config: ModelConfig, size: int = 16) -> ModelConfig:
    source = ComponentConfig("lookup", {"size": size, "init_std": 0.25})
    return dataclasses.replace(config, source_embedding=source)


def test_a_separate_source_embedding_reads_the_source_and_only_the_source():
    config = seq2seq_config("transformer_seq2seq")
    torch.manual_seed(0)
    shared = build_model(config, V)
    torch.manual_seed(0)
    separate = build_model(with_source_embedding(config), V)
    # built last: the shared parts draw the same initial weights as a model without it
    for name, tensor in shared.state_dict().items():
        torch.testing.assert_close(separate.state_dict()[name], tensor, rtol=0, atol=0)
    assert separate.parameter_counts()["source_embedding"] == V * 16
    assert "source_embedding" not in shared.parameter_counts()
    source = torch.randint(2, V, (3, 5))
    torch.testing.assert_close(separate.embed_source(source), separate.source_embedding(source))
    torch.testing.assert_close(shared.embed_source(source), shared.embedding(source))
    separate.eval()
    task = TranslationTask()
    b = batch()
    before = task.predict(separate, b).main
    with torch.no_grad():  # the source table changes what is predicted ...
        separate.source_embedding.weight.mul_(2.0)
    assert not torch.allclose(task.predict(separate, b).main, before)
    # ... and the gradient of a loss reaches it
    separate.source_embedding.weight.grad = None
    task.predict(separate, b).main.sum().backward()
    assert separate.source_embedding.weight.grad.abs().sum() > 0


def test_a_source_embedding_is_refused_where_no_source_is_read_or_its_size_differs(tmp_path):
    from targetlm import builders

    lm = {"data": {"name": "synthetic"}, "model": {"source_embedding": {"kind": "lookup"}}}
    with pytest.raises(
        ConfigError, match="model.source_embedding: task.kind = 'lm' reads no source"
    ):
        builders.config_from_dict(lm)  # (it validates)
    with pytest.raises(ConfigError, match="model.source_embedding.size = 8: the encoder reads"):
        build_model(with_source_embedding(seq2seq_config("transformer_seq2seq"), size=8), V)


def test_translation_with_a_separate_source_embedding_trains_and_translates(tmp_path, capsys):
    data = write_corpus(tmp_path / "data", pairs=60)
    config = tiny_translation_config(tmp_path, data)
    run = tmp_path / "run"
    sets = ['model.source_embedding.kind="lookup"', "model.source_embedding.size=16"]
    args = ["train", str(config), "--run-dir", str(run), "--set", "train.max_steps=3"]
    assert main([*args, *(a for s in sets for a in ("--set", s))]) == 0
    capsys.readouterr()
    assert main(["describe", str(run / "config.toml")]) == 0
    assert "source_embedding" in capsys.readouterr().out
    output = tmp_path / "hyp.txt"
    assert main(["translate", str(run), "--input", str(data / "test.src"), "--output",
                 str(output), "--beam", "2"]) == 0  # fmt: skip
    assert len(output.read_text().splitlines()) == 20
