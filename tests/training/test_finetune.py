"""Cross-domain finetuning with an extended vocabulary, open-vocabulary / cache evaluation and
the frequency-bin analysis (Pappas et al. 2020) through the command line, on tiny synthetic
corpora: the "new domain" is the toy language of another seed (mostly other words)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_cli import QUICKSTART, assert_one_error, sets, snapshot

import targetlm.lexicon
from targetlm import config as config_lib
from targetlm.checkpoint import load as load_checkpoint
from targetlm.cli import main
from targetlm.data import Vocabulary, read_split
from targetlm.modules import build_model

SMALL = [
    "train.epochs=1",
    "train.progress=false",
    "data.synthetic.train_sentences=150",
    "data.synthetic.valid_sentences=30",
    "data.synthetic.test_sentences=30",
    "data.batch_size=4",
    "data.bptt=10",
    "eval.batch_size=2",
    "model.encoder.hidden_size=16",
    "model.embedding.size=16",
]
CHAR_CNN = [  # char-CNN input and output: no parameter depends on the vocabulary
    'model.embedding.kind="groc"',
    "model.embedding.relations=false",
    "model.embedding.definitions=false",
    'model.output.kind="char_cnn"',
    *(
        f"model.{part}.{key}"
        for part in ("embedding", "output")
        for key in ("char_size=8", "widths=[1, 2, 3]", "channels_per_width=8")
    ),
]
NEW_DOMAIN = ["data.synthetic.seed=7"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train(run_dir: Path, *extra: str) -> Path:
    args = ["train", str(QUICKSTART), *sets(*SMALL, *extra), "--run-dir", str(run_dir)]
    assert main(args) == 0
    return run_dir


def finetune(source: Path, run_dir: Path, *extra: str, resume: bool = False) -> int:
    args = ["finetune", str(source), "--run-dir", str(run_dir), *sets(*extra)]
    return main(args + ["--resume"] * resume)


@pytest.fixture(scope="module")
def source(tmp_path_factory, one_thread) -> Path:
    """A tiny lookup-input, tied-output run; treat as read-only."""
    return train(tmp_path_factory.mktemp("finetune") / "tied")


@pytest.fixture(scope="module")
def char_source(tmp_path_factory, one_thread) -> Path:
    """A tiny char-CNN run on the same data; treat as read-only."""
    return train(tmp_path_factory.mktemp("finetune") / "char", *CHAR_CNN)


# --- finetune -------------------------------------------------------------------------------


def test_finetuning_extends_the_vocabulary_and_keeps_the_old_rows(source, tmp_path, capsys):
    run = tmp_path / "ft"
    # a vanishing SGD step: the finetuned weights are the transferred ones
    assert finetune(source, run, *NEW_DOMAIN, 'train.optimizer="sgd"', "train.lr=1e-30") == 0
    old, new = Vocabulary.load(source / "vocab.txt"), Vocabulary.load(run / "vocab.txt")
    config = config_lib.load(run / "config.toml")
    assert config.train.init_from == str(source.resolve())
    train_tokens = read_split(config.data, config.data.train)
    assert new.itos[: len(old)] == old.itos  # every old id unchanged
    assert set(new.itos[len(old) :]) == set(train_tokens) - set(old.itos) != set()
    assert new == old.extend(train_tokens)

    before = load_checkpoint(source / "best.pt")["model"]
    after = load_checkpoint(run / "best.pt")["model"]
    torch.manual_seed(config.train.seed)  # what the trainer initialises the new rows with
    fresh = build_model(config.model, new.itos).state_dict()
    exact = {"rtol": 0.0, "atol": 1e-20}
    for name in ("embedding.weight", "output.bias"):  # tied: the only vocabulary-dependent ones
        assert after[name].size(0) == len(new)
        torch.testing.assert_close(after[name][: len(old)], before[name], **exact)
        torch.testing.assert_close(after[name][len(old) :], fresh[name][len(old) :], **exact)
    for name in before.keys() - {"embedding.weight", "output.bias"}:
        torch.testing.assert_close(after[name], before[name], **exact)


def test_a_compositional_model_finetunes_with_the_same_parameters(char_source, tmp_path):
    run = tmp_path / "ft"
    assert finetune(char_source, run, *NEW_DOMAIN) == 0
    before = json.loads((char_source / "results.json").read_text())
    after = json.loads((run / "results.json").read_text())
    assert after["vocab_size"] > before["vocab_size"]
    assert after["params"] == before["params"]


def test_an_interrupted_finetuning_resumes_exactly_without_its_source(source, tmp_path):
    copy = Path(shutil.copytree(source, tmp_path / "source"))
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert finetune(copy, whole, *NEW_DOMAIN) == 0
    assert finetune(copy, parts, *NEW_DOMAIN, "train.max_steps=5") == 0
    shutil.rmtree(copy)  # resuming reads the finetuning run's own vocabulary
    assert finetune(copy, parts, "train.max_steps=0", resume=True) == 0
    assert (parts / "vocab.txt").read_text() == (whole / "vocab.txt").read_text()
    results = [json.loads((run / "results.json").read_text()) for run in (whole, parts)]
    assert results[1]["steps"] == results[0]["steps"]
    assert results[1]["test"]["ppl"] == pytest.approx(results[0]["test"]["ppl"], rel=1e-6)
    # the training split's counts are in the vocabulary once, however often the run resumed
    assert results[1]["test"]["unigram_ppl"] == results[0]["test"]["unigram_ppl"]


def test_finetuning_a_missing_run(tmp_path, capsys):
    rc = finetune(tmp_path / "nope", tmp_path / "new")
    assert_one_error(capsys, rc, "run directory not found", str(tmp_path / "nope"))
    assert not (tmp_path / "new").exists()


def test_finetuning_into_a_non_empty_directory_changes_nothing(source, tmp_path, capsys):
    target = tmp_path / "taken"
    target.mkdir()
    (target / "notes.txt").write_text("mine\n")
    rc = finetune(source, target, *NEW_DOMAIN)
    assert_one_error(capsys, rc, "not empty")
    assert snapshot(target) == {"notes.txt": b"mine\n"}


def test_finetuning_with_another_model_is_refused(source, tmp_path, capsys):
    rc = finetune(source, tmp_path / "new", *NEW_DOMAIN, "model.encoder.num_layers=1")
    assert_one_error(capsys, rc, "encoder", "source run")
    assert not (tmp_path / "new").exists()


def test_finetuning_from_another_init_from_is_refused(source, tmp_path, capsys):
    # finetune starts from its RUN_DIR: a second source in --set or --changes is an error
    rc = finetune(source, tmp_path / "new", *NEW_DOMAIN, f'train.init_from="{tmp_path}"')
    assert_one_error(capsys, rc, "train.init_from", "RUN_DIR")
    changes = tmp_path / "changes.toml"
    changes.write_text(f'[train]\ninit_from = "{tmp_path}"\n')
    args = ["finetune", str(source), "--run-dir", str(tmp_path / "new"), "--changes", str(changes)]
    assert_one_error(capsys, main(args), "changes.toml", "train.init_from")
    assert not (tmp_path / "new").exists()


def test_resuming_a_finetuning_run_that_does_not_exist(source, tmp_path, capsys):
    rc = finetune(source, tmp_path / "new", resume=True)
    assert_one_error(capsys, rc, "nothing to resume")
    assert not (tmp_path / "new").exists()


def test_finetuning_reads_only_the_data_locations_the_command_line_names(source, tmp_path, capsys):
    """A run directory may come from someone else: the locations its config names (data.dir,
    a split's absolute path) are read only when the command line names them too, so a
    received run cannot copy the words of another file of this machine into vocab.txt."""
    private = tmp_path / "private"
    private.mkdir()
    for split in ("train", "valid", "test"):
        (private / f"{split}.txt").write_text("private words of this machine\n" * 20)
    received = Path(shutil.copytree(source, tmp_path / "received"))
    best = load_checkpoint(received / "best.pt")
    best["config"]["data"].update(name="text", dir=str(private), train=str(private / "train.txt"))
    torch.save(best, received / "best.pt")

    new = tmp_path / "new"
    assert_one_error(capsys, finetune(received, new), "data.dir", repr(str(private)))
    rc = finetune(received, new, f'data.dir="{private}"', 'data.valid="valid"')
    assert_one_error(capsys, rc, "data.train", repr(str(private / "train.txt")))
    assert not new.exists()

    # named on the command line: read (the user chose them)
    named = [f'data.dir="{private}"', f'data.train="{private / "train.txt"}"']
    assert finetune(received, new, *named) == 0
    assert "private" in Vocabulary.load(new / "vocab.txt").itos


# --- eval with open vocabulary and caches ---------------------------------------------------

SUMMARY = {"ppl", "ppl_new", "ppl_known", "nll", "tokens", "new_tokens", "oov_rate"}


def evaluate(capsys, run: Path, *args: str) -> dict:
    assert main(["eval", str(run), *args, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


def test_eval_open_vocabulary_with_a_cache_prints_the_summary(source, capsys):
    result = evaluate(capsys, source, *sets(*NEW_DOMAIN), "--open-vocab", "--unigram-cache", "0.1")
    assert set(result) >= SUMMARY
    assert result["open_vocab"] and result["unigram_cache"] == 0.1
    config = config_lib.load(source / "config.toml", NEW_DOMAIN)
    assert result["tokens"] == len(read_split(config.data, "test"))
    assert 0 < result["new_tokens"] < result["tokens"]
    assert all(result[k] < float("inf") for k in ("ppl", "ppl_new", "ppl_known"))


def test_eval_with_no_combiner_equals_plain_eval(source, capsys):
    plain = evaluate(capsys, source)
    scored = evaluate(capsys, source, "--unigram-cache", "0")
    assert set(scored) >= SUMMARY
    assert scored["ppl"] == pytest.approx(plain["ppl"], rel=1e-5)


def test_eval_compositional_open_vocabulary(char_source, capsys):
    result = evaluate(capsys, char_source, *sets(*NEW_DOMAIN), "--open-vocab", "--lowercase")
    assert result["lowercase"] and result["new_tokens"] > 0
    assert result["ppl_new"] < float("inf")


def test_eval_groc_open_vocabulary_grounds_the_new_words(tmp_path, capsys, monkeypatch):
    run = train(tmp_path / "groc", *CHAR_CNN, 'model.output.kind="groc"', "model.output.depth=1")
    capsys.readouterr()  # the training log
    asked = []
    stand_in = targetlm.lexicon.load_lexicon  # conftest's stand-in for WordNet
    monkeypatch.setattr(
        targetlm.lexicon,
        "load_lexicon",
        lambda words, *a, **k: asked.append(list(words)) or stand_in(words),
    )
    result = evaluate(capsys, run, *sets(*NEW_DOMAIN), "--open-vocab")
    vocab = Vocabulary.load(run / "vocab.txt")
    assert asked[0] == vocab.itos  # the model's own lexicon
    assert asked[-1] and not any(word in vocab for word in asked[-1])  # then the new words'
    assert result["new_tokens"] > 0 and result["ppl_new"] < float("inf")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--neural-theta", "0.5"], "--neural-cache"),
        (["--new-word-weight", "0.5"], "--open-vocab"),
        (["--unigram-cache", "1.5"], "--unigram-cache"),
        (["--neural-cache", "0.1", "--neural-window", "0"], "--neural-window"),
        (["--ensemble-lambda", "0.5", "--unigram-cache", "0.1"], "--ensemble-lambda"),
    ],
)
def test_eval_with_bad_scoring_options(source, capsys, args, fragment):
    rc = main(["eval", str(source), *args, "--json"])
    assert_one_error(capsys, rc, fragment)
    assert capsys.readouterr().out == ""


def test_uniform_weight_is_refused_for_a_compositional_layer(char_source, capsys):
    rc = main(["eval", str(char_source), "--open-vocab", "--uniform-weight", "0.1"])
    assert_one_error(capsys, rc, "--uniform-weight", "compositional")


# --- analyze freq-bins ----------------------------------------------------------------------


def test_frequency_bins_write_a_plot_and_a_table(source, char_source, tmp_path, capsys):
    plot = tmp_path / "bins.png"
    args = ["analyze", "freq-bins", str(source), str(char_source), "--out", str(plot)]
    assert main([*args, *sets(*NEW_DOMAIN), "--open-vocab"]) == 0
    out = capsys.readouterr().out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "new (0)" in out and "median" in out

    assert main([*args, "--json"]) == 2  # the plot exists: replaced only with --force
    assert "pass --force" in capsys.readouterr().err
    assert main([*args, "--json", "--force"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert sum(row["tokens"] for row in result["bins"]) == result["summary"]["a"]["tokens"]
    assert set(result["summary"]["b"]) >= SUMMARY


def test_frequency_bins_need_runs_trained_on_the_same_data(source, tmp_path, capsys):
    other = train(tmp_path / "other", "data.synthetic.train_sentences=100")
    plot = tmp_path / "bins.png"
    rc = main(["analyze", "freq-bins", str(source), str(other), "--out", str(plot)])
    assert_one_error(capsys, rc, "same data")
    assert not plot.exists()
