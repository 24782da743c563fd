"""Masked LM with WDR targets, the bidirectional encoder it runs on, and sequence classification.

Contract cases for the bidirectional encoders come from ``BIDIRECTIONAL_ENCODER_OPTIONS``
(every registered encoder with ``causal = False`` that is not conditional)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from conftest import BIDIRECTIONAL_ENCODER_OPTIONS, OUTPUT_OPTIONS

from targetlm import builders
from targetlm import config as config_lib
from targetlm.cli import main
from targetlm.config import ComponentConfig, ModelConfig
from targetlm.data.batching import IGNORE
from targetlm.data.catalogue import DATASETS
from targetlm.data.glue import GLUE_TASKS, read_glue_split
from targetlm.data.vocab import DataError, Vocabulary
from targetlm.modules import build_model
from targetlm.objectives import build_objective
from targetlm.registry import ConfigError
from targetlm.tasks.classify import (
    SequenceClassificationTask,
    brown_genre_examples,
    classification_metrics,
)
from targetlm.tasks.mlm import CLS, MASK, MaskedLmTask, mask_tokens, masked_targets

ROOT = Path(__file__).resolve().parents[2]
V = 40


@pytest.fixture(params=sorted(BIDIRECTIONAL_ENCODER_OPTIONS))
def bidirectional_kind(request) -> str:
    return request.param


def _model(encoder: str, output: str = "tied", heads: str = "none", n: int = 1, vocab=V):
    torch.manual_seed(0)
    config = ModelConfig(
        embedding=ComponentConfig("lookup", {"size": 16}),
        encoder=ComponentConfig(encoder, dict(BIDIRECTIONAL_ENCODER_OPTIONS[encoder])),
        output=ComponentConfig(output, dict(OUTPUT_OPTIONS[output])),
        heads=ComponentConfig(heads, {} if heads == "none" else {"n": n}),
    )
    return build_model(config, vocab).eval()


def _vocabulary(size: int = 30) -> Vocabulary:
    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(size - 2)]
    return MaskedLmTask.with_special_words(Vocabulary(words, [1] * size))


# --- the bidirectional encoder's contract ----------------------------------------------------
def test_bidirectional_shapes_and_normalised_log_probs(bidirectional_kind, output_kind):
    model = _model(bidirectional_kind, output_kind)
    tokens = torch.randint(V, (3, 9))
    log_probs, state = model.log_probs(tokens)
    assert log_probs.shape == (3, 9, V) and state is None
    torch.testing.assert_close(log_probs.logsumexp(-1), torch.zeros(3, 9), atol=1e-5, rtol=0)


def test_bidirectional_encoder_reads_the_right_context(bidirectional_kind):
    """The honest opposite of the causal contract: a later token changes earlier outputs."""
    model = _model(bidirectional_kind)
    tokens = torch.randint(V, (2, 10))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % V
    assert not torch.allclose(model(tokens).main[:, :7], model(changed).main[:, :7])
    assert model.encoder.causal is False


def test_padding_mask_gives_each_row_its_own_outputs(bidirectional_kind):
    model = _model(bidirectional_kind)
    short, long = torch.randint(V, (1, 4)), torch.randint(V, (1, 7))
    padded = torch.cat([torch.cat([short, torch.full((1, 3), 5)], 1), long])
    mask = torch.tensor([[True] * 4 + [False] * 3, [True] * 7])
    hidden, _ = model.encode(padded, mask)
    torch.testing.assert_close(hidden[0, :4], model.encode(short)[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden[1], model.encode(long)[0][0], atol=1e-5, rtol=1e-5)


def test_tasks_and_encoders_must_agree_on_causality():
    base = {"data": {"name": "synthetic"}, "model": {"embedding": {"kind": "lookup", "size": 16}}}
    bert = {"kind": "crammed_bert", "num_layers": 1, "num_heads": 2, "ff_size": 32}
    with pytest.raises(ConfigError, match="predicts from the past only"):
        builders.config_from_dict({**base, "model": {**base["model"], "encoder": bert}})
    with pytest.raises(ConfigError, match="reads the whole sequence"):
        builders.config_from_dict({**base, "task": {"kind": "mlm"}})


# --- masking ---------------------------------------------------------------------------------
def test_masking_statistics():
    """Fixed counts per row (round(0.15 · 127) = 19: 15 <mask>, 2 random, 2 kept), the
    protected <cls> column never masked, positions drawn uniformly."""
    rows, T, mask_id = 3000, 128, 10**6  # random words never equal the mask id here
    tokens = torch.randint(1000, (rows, T))
    protected = torch.zeros(rows, T, dtype=torch.bool)
    protected[:, 0] = True
    generator = torch.Generator().manual_seed(0)
    inputs, masked = mask_tokens(
        tokens, 0.15, mask_id, 10**5, protected=protected, generator=generator
    )
    assert (masked.sum(1) == 19).all()
    assert not masked[:, 0].any()
    assert ((inputs == mask_id).sum(1) == 15).all()
    kept = masked & (inputs == tokens)
    randomised = masked & (inputs != tokens) & (inputs != mask_id)
    assert (kept.sum(1) == 2).all() and (randomised.sum(1) == 2).all()
    assert (inputs[~masked] == tokens[~masked]).all()
    frequency = masked[:, 1:].float().mean(0)  # each column's masking rate
    assert (frequency - 19 / 127).abs().max() < 0.03


def test_masked_targets_hold_each_masked_word_and_the_next_ones():
    tokens = torch.tensor([[5, 6, 7, 8, 9]])
    masked = torch.tensor([[False, True, False, False, True]])
    expected = torch.tensor([[6, 7, 8], [9, IGNORE, IGNORE]])
    assert torch.equal(masked_targets(tokens, masked, 2), expected)


def test_evaluation_masks_are_fixed_and_training_masks_differ():
    vocab, task = _vocabulary(), MaskedLmTask()
    ids = torch.randint(2, 30, (500,))
    evaluation = task.batches(ids, 4, 16, vocab=vocab, train=False)
    assert torch.equal(evaluation[1].inputs, evaluation[1].inputs)
    assert sum(int(b.masked.sum()) for b in evaluation) > 0
    assert evaluation[len(evaluation) - 1].inputs.size(1) < 16  # the last, partial block
    training = task.batches(ids, 4, 16, vocab=vocab, train=True)
    assert not torch.equal(training[0].masked, training[0].masked)
    assert (training[0].inputs[:, 0] == vocab.stoi[CLS]).all()


# --- WDR targets at the masked positions -----------------------------------------------------
def test_wdr_targets_of_masked_positions_against_an_independent_computation():
    """Head n at a masked column t is scored against x_{t+n}, its prediction being the raw
    output plus the conjugate of x_t..x_{t+n−1}; so the head itself is trained towards the
    n-level WDR Δ_n x_t = Σ_i C(n,i)(−1)^i x_{t+n−i} of the original words."""
    vocab, task = _vocabulary(), MaskedLmTask(mask_rate=0.3)
    model = _model("crammed_bert", "tied", "wdr", n=3, vocab=len(vocab))
    objective = build_objective(ComponentConfig("cross_entropy"), model, "full")
    tokens = torch.randint(2, 30, (200,))
    batch = task.batches(tokens, 2, 12, vocab=vocab, train=False, lookahead=2)[0]
    originals = torch.cat([torch.full((2, 1), vocab.stoi[CLS]), tokens[:22].view(2, 11)], 1)
    prediction = task.predict(model, batch)
    weight, _ = model.output()
    rows = objective.head_rows(prediction, batch.targets, weight)
    columns = batch.masked.nonzero().tolist()  # (b, t) of each masked column, row-major
    assert rows[0][1][:, 0].tolist() == [int(originals[b, t]) for b, t in columns]
    for n in (1, 2):
        predicted, targets = rows[n]
        for m, (b, t) in enumerate(columns):
            if t + n >= 12:  # past the row's end: no target
                assert targets[m, 0] == IGNORE
                continue
            assert targets[m, 0] == originals[b, t + n]
            wdr = sum(
                math.comb(n, i) * (-1) ** i * weight[originals[b, t + n - i]] for i in range(n + 1)
            )
            # the head's own output must equal x_{t+n} − conjugate = Δ_n x_t for a zero loss
            raw = prediction.heads[n - 1, m, 0]
            conjugate = predicted[m, 0] - raw
            torch.testing.assert_close(weight[originals[b, t + n]] - conjugate, wdr)


def test_no_information_about_a_masked_word_reaches_its_own_prediction():
    """Changing the original word under a <mask> changes nothing the model computes at that
    column (main prediction and every head's raw output): only the targets differ."""
    vocab, task = _vocabulary(), MaskedLmTask(mask_rate=0.3)
    model = _model("crammed_bert", "tied", "wdr", n=3, vocab=len(vocab))
    ids = torch.randint(2, 30, (60,))
    batch = task.batches(ids, 2, 12, vocab=vocab, train=False, lookahead=2)[0]
    mask_id = vocab.stoi[MASK]
    b, t = (batch.masked & (batch.inputs == mask_id)).nonzero()[0].tolist()
    position = b * 11 + (t - 1)  # its index in the stream (row b: <cls> + 11 stream tokens)
    changed_ids = ids.clone()
    changed_ids[position] = 2 + (int(ids[position]) - 1) % 28  # another word
    changed = task.batches(changed_ids, 2, 12, vocab=vocab, train=False, lookahead=2)[0]
    assert torch.equal(changed.masked, batch.masked) and torch.equal(changed.inputs, batch.inputs)
    assert not torch.equal(changed.targets, batch.targets)
    first, second = task.predict(model, batch), task.predict(model, changed)
    torch.testing.assert_close(first.main, second.main)
    torch.testing.assert_close(first.heads, second.heads)
    # the check has teeth: a visible word does reach the masked column's prediction
    visible = (~batch.masked[b]).nonzero()[-1].item()
    changed_ids = ids.clone()
    changed_ids[b * 11 + visible - 1] = 2 + (int(ids[b * 11 + visible - 1]) - 1) % 28
    other = task.predict(model, task.batches(changed_ids, 2, 12, vocab=vocab, train=False)[0])
    assert not torch.allclose(other.main, first.main)


def test_without_heads_the_loss_is_the_masked_tokens_cross_entropy():
    vocab, task = _vocabulary(), MaskedLmTask()
    model = _model("crammed_bert", vocab=len(vocab))
    objective = build_objective(ComponentConfig("cross_entropy"), model, "full")
    batch = task.batches(torch.randint(2, 30, (300,)), 3, 20, vocab=vocab, train=False)[0]
    weight, bias = model.output()
    out = objective(task.predict(model, batch), batch.targets, weight, bias)
    log_probs, _ = model.log_probs(batch.inputs)
    expected = -log_probs[batch.masked].gather(-1, batch.targets[:, :1]).mean()
    torch.testing.assert_close(out.loss, expected, atol=1e-5, rtol=1e-5)
    assert out.count == int(batch.masked.sum())


# --- classification --------------------------------------------------------------------------
def test_classification_metrics_against_hand_computations():
    gold = torch.tensor([0, 0, 1, 1, 2, 2])
    predicted = torch.tensor([0, 1, 1, 1, 2, 0])
    three = classification_metrics(predicted, gold, 3)
    # F1 per class: 2·1/(2+1+1) = 0.5, 2·2/(4+1+0) = 0.8, 2·1/(2+0+1) = 2/3
    assert three["accuracy"] == pytest.approx(4 / 6)
    assert three["macro_f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert "matthews" not in three
    binary = classification_metrics(torch.tensor([1, 0, 0, 1, 1]), torch.tensor([1, 1, 0, 0, 1]), 2)
    # tp 2, fp 1, fn 1, tn 1: F1 = 4/6; MCC = (2·1 − 1·1)/sqrt(3·3·2·2) = 1/6
    assert binary["f1"] == pytest.approx(2 / 3)
    assert binary["matthews"] == pytest.approx(1 / 6)
    assert binary["accuracy"] == pytest.approx(3 / 5)
    assert binary["macro_f1"] == pytest.approx((0.5 + 2 / 3) / 2)
    # a class never predicted nor present does not count towards the macro average
    assert classification_metrics(gold, gold, 5)["macro_f1"] == pytest.approx(1.0)


def test_brown_genre_split_is_deterministic_disjoint_and_complete():
    if not os.environ.get("TARGETLM_DATA"):
        pytest.skip("TARGETLM_DATA is not set (the Brown corpus is shared data)")
    data = config_lib.DataConfig(name="brown")
    splits, genres = brown_genre_examples(data)
    assert len(genres) == 15 and set(splits["train"].labels) == set(range(15))
    sizes = {name: len(part.labels) for name, part in splits.items()}
    total = sum(sizes.values())
    brown = Path(os.environ["TARGETLM_DATA"]) / "brown"
    lines = sum(len((brown / f"{g}.txt").read_text().splitlines()) for g in genres)
    assert total == lines  # every sentence in exactly one split
    assert abs(sizes["train"] / total - 0.8) < 0.01 and abs(sizes["test"] / total - 0.1) < 0.01
    assert brown_genre_examples(data)[0]["test"].texts == splits["test"].texts


# --- GLUE --------------------------------------------------------------------------------------
def test_glue_registry_names_official_files_with_checksums():
    assert set(GLUE_TASKS) >= {"CoLA", "SST-2", "MRPC", "QQP", "STS-B", "MNLI", "QNLI", "RTE"}
    for task in GLUE_TASKS.values():
        for remote in task.files:
            assert remote.url.startswith("https://dl.fbaipublicfiles.com/")
            assert remote.sha256 is None or len(remote.sha256) == 64
    assert GLUE_TASKS["CoLA"].metrics[0] == "matthews" and GLUE_TASKS["MRPC"].metrics[0] == "f1"
    spec = DATASETS["glue"]
    assert spec.files and all(r.sha256 for r in spec.files.values())


def _write_toy_sst2(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    good = ["a fine film", "truly good fun", "good and fine", "a fun ride"]
    bad = ["a dull mess", "truly bad", "bad and dull", "a boring mess"]
    rows = [f"{s}\t1" for s in good] + [f"{s}\t0" for s in bad]
    (directory / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (directory / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")


def test_glue_toy_files_are_read_and_checked(tmp_path):
    _write_toy_sst2(tmp_path)
    texts, labels = read_glue_split(GLUE_TASKS["SST-2"], tmp_path / "dev.tsv")
    assert texts[0] == ("a fine film",) and labels == [1] * 4 + [0] * 4
    (tmp_path / "mrpc.tsv").write_text(
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b\tC d\n"
    )
    assert read_glue_split(GLUE_TASKS["MRPC"], tmp_path / "mrpc.tsv") == ([("A b", "C d")], [1])
    (tmp_path / "cola.tsv").write_text("src\t1\t\tIt works .\nsrc\t0\t*\tWorks it .\n")
    assert read_glue_split(GLUE_TASKS["CoLA"], tmp_path / "cola.tsv")[1] == [1, 0]
    (tmp_path / "bad.tsv").write_text("sentence\tlabel\nfine\t7\n")
    with pytest.raises(DataError, match="bad.tsv, line 2: label '7'"):
        read_glue_split(GLUE_TASKS["SST-2"], tmp_path / "bad.tsv")
    with pytest.raises(ConfigError, match="task.glue_task"):
        SequenceClassificationTask(glue_task="SST-3")


# --- end to end --------------------------------------------------------------------------------
TINY = [
    "--set", "model.embedding.size=16", "--set", "model.encoder.num_layers=1",
    "--set", "model.encoder.num_heads=2", "--set", "model.encoder.ff_size=32",
    "--set", "model.encoder.max_context=16", "--set", "data.bptt=16", "--set", "data.batch_size=4",
    "--set", "train.max_steps=2", "--set", "train.warmup_steps=1", "--set", "train.eval_every=2",
    "--set", "train.progress=false", "--set", "eval.batch_size=8",
]  # fmt: skip


def test_cli_pretrains_a_wdr_masked_lm_and_finetunes_a_classifier(tmp_path, capsys, monkeypatch):
    # the learning-curve figure is not what this test checks (matplotlib is most of its time)
    monkeypatch.setattr("targetlm.analysis.report.plot_learning_curve", lambda *args: False)
    synthetic = [
        "--set", 'data.name="synthetic"', "--set", "data.synthetic.train_sentences=20",
        "--set", "data.synthetic.valid_sentences=4", "--set", "data.synthetic.test_sentences=4",
    ]  # fmt: skip
    pretrained = tmp_path / "pretrained"
    status = main(
        ["train", str(ROOT / "configs" / "mlm-wt2-wdr-n2.toml"), "--run-dir", str(pretrained)]
        + TINY
        + synthetic
    )
    assert status == 0 and (pretrained / "best.pt").is_file()
    glue = tmp_path / "SST-2"
    _write_toy_sst2(glue)
    finetuned = tmp_path / "finetuned"
    status = main(
        [
            "finetune",
            str(pretrained),
            "--run-dir",
            str(finetuned),
            "--changes",
            str(ROOT / "configs" / "finetune" / "mlm-brown-genre.toml"),
            "--set",
            'data.name="glue"',
            "--set",
            f'data.dir="{glue}"',
            "--set",
            'task.glue_task="SST-2"',
            "--set",
            "train.max_steps=1",
            "--set",
            "train.eval_every=1",
            "--set",
            "train.warmup_steps=1",
            "--set",
            "data.batch_size=4",
            "--set",
            "train.progress=false",
        ]  # fmt: skip
    )
    assert status == 0
    out = capsys.readouterr().out
    assert "test accuracy" in out
    closing = [line for line in out.splitlines() if " parameters | " in line][-1]
    assert closing.startswith("valid accuracy ") and "ppl" not in closing  # not a perplexity
    results = json.loads((finetuned / "results.json").read_text())
    assert results["test"]["examples"] == 8
    assert set(results["test"]) >= {"accuracy", "macro_f1", "f1", "matthews"}
    # the classifier's body starts from the pretrained weights (1 step at 4e-5 moves little)
    body = torch.load(finetuned / "best.pt", weights_only=True)["model"]
    source = torch.load(pretrained / "best.pt", weights_only=True)["model"]
    assert "classifier.weight" in body and "heads.mlps.0.0.weight" in source
    name = "encoder.blocks.0.qkv.weight"
    torch.testing.assert_close(body[f"body.{name}"], source[name], atol=2e-3, rtol=0)

    # eval rebuilds the classifier from best.pt: the figures the run wrote at its end
    capsys.readouterr()
    assert main(["eval", str(finetuned), "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    for split in ("valid", "test"):
        expected = {k: v for k, v in results[split].items() if k != "labels"}
        assert evaluated[split] == pytest.approx(expected), split
    assert main(["eval", str(finetuned), "--split", "test"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"test: accuracy {results['test']['accuracy']:.4f}, macro_f1 ")
    assert line.endswith("over 8 examples")
    for bad in (["--file", str(glue / "dev.tsv")], ["--ensemble-lambda", "0.2"], ["--head-top1"]):
        assert main(["eval", str(finetuned), *bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "classifier run" in err[0], err


def test_data_info_glue_counts_the_local_files(tmp_path, capsys):
    _write_toy_sst2(tmp_path / "SST-2")
    assert main(["data", "info", "glue", "--dir", str(tmp_path)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["SST-2"][2:4] == ["8", "8"] and rows["CoLA"][2:4] == ["-", "-"]
    assert "(no checksum)" in " ".join(rows["QQP"])


def test_finetuning_changes_replace_a_component_table_and_merge_the_others():
    from targetlm.cli.finetune import merge_changes

    source = {
        "task": {"kind": "mlm", "mask_rate": 0.2},
        "train": {"lr": 0.001, "seed": 3},
        "model": {"encoder": {"kind": "crammed_bert", "dropout": 0.0, "num_layers": 2}},
    }
    changes = {
        "task": {"kind": "classification"},
        "train": {"lr": 4e-5},
        "model": {"encoder": {"dropout": 0.1}},
    }
    merged = merge_changes(source, changes)
    assert merged["task"] == {"kind": "classification"}
    assert merged["train"] == {"lr": 4e-5, "seed": 3}
    assert merged["model"]["encoder"] == {"kind": "crammed_bert", "dropout": 0.1, "num_layers": 2}
    for preset in ("mlm-wt2-base", "mlm-wt2-wdr-n2", "mlm-wt2-wdr-n3"):  # each finetunes
        data = config_lib.load(ROOT / "configs" / f"{preset}.toml").to_dict()
        changes = config_lib.load_table(ROOT / "configs" / "finetune" / "mlm-brown-genre.toml")
        config = builders.config_from_dict(merge_changes(data, changes))
        assert config.task.kind == "classification" and config.model.encoder.options["dropout"]


@pytest.mark.slow  # three short trainings, each with its final evaluation and report
def test_an_interrupted_masked_lm_run_resumes_exactly(tmp_path):
    """The training masks come from torch's RNG, which last.pt restores: 3 + 3 steps equal 6."""
    from conftest import tiny_config

    from targetlm.training import Trainer

    config = tiny_config(
        **{
            "model.encoder": '{kind = "crammed_bert", num_layers = 1, num_heads = 2, '
            "ff_size = 16, max_context = 10, dropout = 0.1}",
            "model.heads": '{kind = "wdr", n = 3}',
            "task.kind": '"mlm"',
            "task.mask_rate": 0.3,
            "train.carry_state": "false",
            "train.max_steps": 6,
        }
    )

    def losses(run_dir: Path) -> list[float]:
        records = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        return [r["loss"] for r in records if r["kind"] == "train"]

    quiet = lambda message: None  # noqa: E731
    full = Trainer(config, tmp_path / "full", log=quiet).train()
    stopped = config.replace(["train.max_steps=3"])
    Trainer(stopped, tmp_path / "resumed", log=quiet).train()
    resumed = Trainer(config, tmp_path / "resumed", resume=True, log=quiet).train()
    assert len(losses(tmp_path / "full")) == 6
    assert losses(tmp_path / "resumed") == losses(tmp_path / "full")
    assert resumed["valid"]["ppl"] == full["valid"]["ppl"]


@pytest.mark.slow  # a pretraining and three short finetunings
def test_an_interrupted_finetuning_resumes_exactly_with_its_own_vocabulary(
    tmp_path, capsys, monkeypatch
):
    """A resumed classification run reads its own vocab.txt (the pretrained run may be gone)
    and the restored weights: 1 + 1 steps equal 2."""
    monkeypatch.setattr("targetlm.analysis.report.plot_learning_curve", lambda *args: False)
    synthetic = ["--set", 'data.name="synthetic"', "--set", "data.synthetic.train_sentences=20"]
    pretrained = tmp_path / "pretrained"
    config = str(ROOT / "configs" / "mlm-wt2-base.toml")
    assert main(["train", config, "--run-dir", str(pretrained)] + TINY + synthetic) == 0
    glue = tmp_path / "SST-2"
    _write_toy_sst2(glue)
    changes = str(ROOT / "configs" / "finetune" / "mlm-brown-genre.toml")
    finetune = [
        "--changes", changes, "--set", 'data.name="glue"', "--set", f'data.dir="{glue}"',
        "--set", 'task.glue_task="SST-2"', "--set", 'train.schedule="constant"',
        "--set", "train.warmup_steps=0",  # (a linear decay follows max_steps)
        "--set", "data.batch_size=4", "--set", "train.progress=false",
        "--set", "train.eval_every=1", "--set", "train.log_every=1",
    ]  # fmt: skip

    def run(run_dir: Path, steps: int, *extra: str) -> int:
        source = [] if extra else [str(pretrained)]
        command = "train" if extra else "finetune"
        return main(
            [
                command,
                *source,
                *extra,
                "--run-dir",
                str(run_dir),
                "--set",
                f"train.max_steps={steps}",
            ]
            + ([] if extra else finetune)
        )

    def losses(run_dir: Path) -> list[float]:
        records = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().split("\n") if line
        ]
        return [r["loss"] for r in records if r["kind"] == "train"]

    assert run(tmp_path / "full", 2) == 0
    assert run(tmp_path / "resumed", 1) == 0
    pretrained.rename(tmp_path / "moved")  # the source run is gone
    assert run(tmp_path / "resumed", 2, "--resume") == 0
    assert len(losses(tmp_path / "full")) == 2
    assert losses(tmp_path / "resumed") == losses(tmp_path / "full")
