"""The command line end to end on a tiny synthetic corpus: train once, then eval, generate,
describe and data info against that run; every bad input is one error line and loses nothing."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from targetlm import config as config_lib
from targetlm.checkpoint import load as load_checkpoint
from targetlm.cli import main
from targetlm.data import StreamBatches, Vocabulary, read_split
from targetlm.runs import load_run

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.toml"
TINY = [
    "train.epochs=1",
    "train.progress=false",
    "data.synthetic.train_sentences=400",
    "data.synthetic.valid_sentences=50",
    "data.synthetic.test_sentences=50",
    "model.encoder.hidden_size=32",
    "model.embedding.size=32",
]


def sets(*pairs: str) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


def train_args(run_dir: Path, *extra: str) -> list[str]:
    return ["train", str(QUICKSTART), *sets(*TINY, *extra), "--run-dir", str(run_dir)]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def assert_one_error(capsys, rc: int, *fragments: str) -> str:
    """A non-zero exit and exactly one stderr line, 'targetlm: error: ...', naming ``fragments``."""
    _, err = capsys.readouterr()
    assert rc != 0
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("targetlm: error:"), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy machine OpenMP threads
    waiting for each other make them ~20x slower; restore the setting for other modules."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, one_thread) -> Path:
    """One tiny training run (a few seconds) shared by the whole module; treat as read-only."""
    run = tmp_path_factory.mktemp("cli") / "run"
    assert main(train_args(run)) == 0
    return run


@pytest.fixture
def run_copy(run_dir, tmp_path) -> Path:
    """A private copy of the trained run, for tests that tamper with it."""
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def tiny_config() -> config_lib.Config:
    return config_lib.load(QUICKSTART, TINY)


# --- train ----------------------------------------------------------------------------------


@pytest.mark.learning_curve  # (run_dir, module-scoped, is trained before any stub)
def test_train_writes_a_complete_run_dir(run_dir):
    names = {p.name for p in run_dir.iterdir()}
    expected = {
        "config.toml",
        "vocab.txt",
        "metrics.jsonl",
        "last.pt",
        "best.pt",
        "results.json",
        "report.md",
        "learning_curve.png",
    }
    assert expected <= names
    assert not [n for n in names if n.endswith(".tmp")]

    config = tiny_config()
    assert config_lib.load(run_dir / "config.toml") == config
    train, test = read_split(config.data, "train"), read_split(config.data, "test")
    assert Vocabulary.load(run_dir / "vocab.txt") == Vocabulary.build(train)

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["kind"] for m in metrics].count("valid") == 1  # one validation per epoch

    results = json.loads((run_dir / "results.json").read_text())
    batches = StreamBatches(torch.zeros(len(train) + 1, dtype=torch.long), 20, 35, pad=False)
    assert results["steps"] == len(batches)
    assert results["test"]["tokens"] == len(test)  # every test token scored exactly once
    assert 1 < results["valid"]["ppl"] < results["vocab_size"] * 2
    assert results["total_params"] == sum(results["params"].values())
    assert "learning_curve.png" in (run_dir / "report.md").read_text()

    last, best = load_checkpoint(run_dir / "last.pt"), load_checkpoint(run_dir / "best.pt")
    assert last["progress"]["epoch"] == 2 and last["progress"]["step"] == results["steps"]
    assert best["valid_ppl"] == pytest.approx(results["valid"]["ppl"], rel=1e-6)


# --- eval -----------------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["test", "valid"])
def test_eval_json_matches_the_results_of_training(run_dir, capsys, split):
    assert main(["eval", str(run_dir), "--split", split, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    result = json.loads(out)  # exactly one JSON object, nothing else on stdout
    assert {"ppl", "tokens", "oov_rate"} <= set(result)
    expected = json.loads((run_dir / "results.json").read_text())[split]
    assert result["ppl"] == pytest.approx(expected["ppl"], rel=1e-6)
    assert result["tokens"] == expected["tokens"]
    assert result["oov_rate"] == pytest.approx(expected["oov_rate"])
    # whitespace tokens are the words: perplexity per word is perplexity per token
    assert result["words"] == result["tokens"]
    assert result["word_ppl"] == pytest.approx(result["ppl"])


def test_eval_text_output(run_dir, capsys):
    assert main(["eval", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("test (test): ppl ") and "tokens" in out


def test_eval_of_a_missing_run_dir(tmp_path, capsys):
    rc = main(["eval", str(tmp_path / "nope")])
    assert_one_error(capsys, rc, "run directory not found", str(tmp_path / "nope"))


# --- generate -------------------------------------------------------------------------------


def generate(capsys, run_dir: Path, *args: str) -> str:
    assert main(["generate", str(run_dir), "--prompt", "the", "--max-tokens", "5", *args]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_generate_is_deterministic_for_a_seed(run_dir, capsys):
    first = generate(capsys, run_dir, "--seed", "3")
    assert generate(capsys, run_dir, "--seed", "3") == first
    assert first.startswith("the")
    assert len(first.split()) <= 6  # the prompt and at most 5 words (<eos> becomes a newline)
    others = {generate(capsys, run_dir, "--seed", str(seed)) for seed in (4, 5, 6)}
    assert others != {first}  # the seed matters


def test_generate_with_temperature_zero_is_greedy(run_dir, capsys):
    greedy = generate(capsys, run_dir, "--temperature", "0", "--seed", "1")
    assert generate(capsys, run_dir, "--temperature", "0", "--seed", "2") == greedy
    # the first generated word is the argmax after "<eos> the"
    _, vocab, model, _ = load_run(run_dir)
    with torch.no_grad():
        log_probs, _ = model.log_probs(torch.tensor([[vocab.eos_id, vocab.stoi["the"]]]))
    best = vocab.itos[int(log_probs[0, -1].argmax())]
    words = greedy.replace("\n", " <eos> ").split()
    assert words[:2] == ["the", best]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback where no GPU exists")
def test_a_run_trained_on_a_gpu_loads_on_the_cpu(run_copy, capsys):
    best = run_copy / "best.pt"
    checkpoint = torch.load(best, weights_only=True)
    checkpoint["config"]["train"]["device"] = "cuda"
    torch.save(checkpoint, best)
    with pytest.warns(UserWarning, match="not available here"):
        config, _, model, _ = load_run(run_copy)
    assert config.train.device == "cpu" and next(model.parameters()).device.type == "cpu"
    with pytest.warns(UserWarning):
        assert main(["eval", str(run_copy), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ppl"] > 1


# --- describe and data info -----------------------------------------------------------------


def test_describe_json(capsys):
    assert main(["describe", str(QUICKSTART), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info["params"]) == {"input_embedding", "encoder", "output", "heads"}
    assert info["total_params"] == sum(info["params"].values())
    assert info["total_params"] > 0


def test_describe_counts_the_parameters_training_reports(run_dir, capsys):
    assert main(["describe", str(QUICKSTART), *sets(*TINY), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    results = json.loads((run_dir / "results.json").read_text())
    assert info["params"] == results["params"]
    assert info["vocab_size"] == results["vocab_size"]


def test_data_info_synthetic_prints_split_sizes(capsys):
    assert main(["data", "info", "synthetic"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split()}
    config = config_lib.DataConfig()
    for split in ("train", "valid", "test"):
        assert int(rows[split][0].replace(",", "")) == len(read_split(config, split))
    assert f"vocabulary (train): {len(Vocabulary.build(read_split(config, 'train'))):,}" in out


# --- bad inputs: one error line, non-zero exit, nothing lost --------------------------------


def test_missing_data_directory(tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(train_args(run, "data.name=ptb", f"data.dir={tmp_path / 'nope'}"))
    assert_one_error(capsys, rc, "data.dir", str(tmp_path / "nope"))
    assert not run.exists()


def _ptb_dir(tmp_path: Path, train: bytes) -> Path:
    directory = tmp_path / "ptb"
    directory.mkdir()
    (directory / "train.txt").write_bytes(train)
    for split in ("valid", "test"):
        (directory / f"{split}.txt").write_bytes(b" a b c \n")
    return directory


def test_empty_training_file(tmp_path, capsys):
    directory = _ptb_dir(tmp_path, b"")
    run = tmp_path / "run"
    rc = main(train_args(run, "data.name=ptb", f"data.dir={directory}"))
    assert_one_error(capsys, rc, "empty", str(directory / "train.txt"))
    assert not run.exists()


def test_undecodable_training_file(tmp_path, capsys):
    directory = _ptb_dir(tmp_path, b" a b \n c \xff d \n e \n")
    run = tmp_path / "run"
    rc = main(train_args(run, "data.name=ptb", f"data.dir={directory}"))
    assert_one_error(capsys, rc, str(directory / "train.txt"), "line 2")
    assert not run.exists()


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.lrr=0.1", "train.lrr"),
        ("model.encoder.hidden_sizee=8", "model.encoder.hidden_sizee"),
        ('train.lr="fast"', "train.lr"),
        ("data.batch_size=1.5", "data.batch_size"),
        ('train.optimizer="rmsprop"', "train.optimizer"),
        ("data.batch_size=0", "data.batch_size"),
        ('model.encoder.kind="gru"', "gru"),
    ],
)
def test_bad_config(tmp_path, capsys, override, fragment):
    run = tmp_path / "run"
    rc = main(train_args(run, override))
    assert rc == 2
    assert_one_error(capsys, rc, fragment)
    assert not run.exists()


def test_describe_with_a_bad_config(capsys):
    rc = main(["describe", str(QUICKSTART), *sets("train.lrr=1")])
    assert_one_error(capsys, rc, "train.lrr")


def test_missing_config_file(tmp_path, capsys):
    rc = main(["train", str(tmp_path / "nope.toml"), "--run-dir", str(tmp_path / "run")])
    assert_one_error(capsys, rc, "nope.toml")


def test_training_into_an_existing_run_refuses_and_changes_nothing(run_copy, capsys):
    before = snapshot(run_copy)
    rc = main(train_args(run_copy))
    assert_one_error(capsys, rc, "not empty", "--resume")
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("make", [False, True], ids=["missing-dir", "empty-dir"])
def test_resume_with_nothing_to_resume(tmp_path, capsys, make):
    run = tmp_path / "run"
    if make:
        run.mkdir()
    rc = main([*train_args(run), "--resume"])
    assert_one_error(capsys, rc, "nothing to resume")
    assert not run.exists() or not any(run.iterdir())


def test_resume_with_different_data_refuses_and_changes_nothing(run_copy, capsys):
    before = snapshot(run_copy)
    rc = main(
        [*train_args(run_copy, "train.epochs=2", "data.synthetic.train_sentences=300"), "--resume"]
    )
    assert_one_error(capsys, rc, "data.synthetic.train_sentences")
    assert snapshot(run_copy) == before


def test_resume_from_a_checkpoint_with_another_vocabulary(run_copy, capsys):
    checkpoint = torch.load(run_copy / "last.pt", weights_only=True)
    words = checkpoint["vocab"]["words"]
    words[2], words[3] = words[3], words[2]
    torch.save(checkpoint, run_copy / "last.pt")
    before = snapshot(run_copy)
    rc = main([*train_args(run_copy, "train.epochs=2"), "--resume"])
    assert_one_error(capsys, rc, "vocabulary", "last.pt")
    assert snapshot(run_copy) == before


def test_eval_with_a_vocabulary_that_does_not_match_the_checkpoint(run_copy, capsys):
    other = Vocabulary.build(["a", "few", "other", "words", "<eos>"])
    other.save(run_copy / "vocab.txt")
    rc = main(["eval", str(run_copy), "--json"])
    line = assert_one_error(capsys, rc, "vocabulary", "vocab.txt")
    assert "does not match" in line
    assert capsys.readouterr().out == ""


def test_eval_with_a_vocabulary_file_without_specials(run_copy, capsys):
    (run_copy / "vocab.txt").write_text("the\t5\ncat\t3\n", encoding="utf-8")
    rc = main(["eval", str(run_copy)])
    assert_one_error(capsys, rc, "vocab.txt")


def test_nan_loss_exits_3_and_keeps_the_last_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    # an absurd SGD step blows the weights up: the second step's loss is inf
    rc = main(train_args(run, 'train.optimizer="sgd"', "train.lr=1e37", "train.checkpoint_every=1"))
    assert rc == 3
    line = assert_one_error(capsys, rc, "loss")
    assert "inf" in line or "nan" in line
    # the checkpoint of the last finished step is still there and readable
    checkpoint = load_checkpoint(run / "last.pt")
    assert checkpoint["progress"]["step"] >= 1
    assert not (run / "results.json").exists()
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def test_eval_of_a_model_with_an_astronomical_loss(run_copy, capsys):
    checkpoint = torch.load(run_copy / "best.pt", weights_only=True)
    checkpoint["model"]["output.bias"][5] = 1e6  # one word takes all the mass: NLL ~ 1e6 nats
    torch.save(checkpoint, run_copy / "best.pt")
    rc = main(["eval", str(run_copy), "--json"])
    if rc == 0:
        assert json.loads(capsys.readouterr().out)["ppl"] == math.inf
    else:
        assert_one_error(capsys, rc)


def test_too_little_training_data_for_the_batch_size(tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(train_args(run, "data.synthetic.train_sentences=1"))
    assert_one_error(capsys, rc, "batch")


# --- the installed console script -----------------------------------------------------------


def _console_script() -> str | None:
    candidate = Path(sys.executable).parent / "targetlm"
    return str(candidate) if candidate.is_file() else shutil.which("targetlm")


@pytest.mark.skipif(
    _console_script() is None, reason="the targetlm console script is not installed"
)
def test_console_script_reports_a_bad_key_in_one_line(tmp_path):
    run = tmp_path / "run"
    command = [_console_script(), *train_args(run, "train.lrr=0.1")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("targetlm: error: unknown key train.lrr")
    assert not run.exists()


def test_eval_reads_its_file_from_a_pipe(run_dir, tmp_path, capsys):
    # `--file <(...)` hands the command a pipe: it reads as a file does (it was "not found")
    text = "the cat saw a dog\n"
    plain = tmp_path / "plain.txt"
    plain.write_text(text)
    assert main(["eval", str(run_dir), "--file", str(plain), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)["ppl"]
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=lambda: pipe.write_text(text), daemon=True)
    writer.start()
    assert main(["eval", str(run_dir), "--file", str(pipe), "--json"]) == 0
    writer.join()
    assert json.loads(capsys.readouterr().out)["ppl"] == pytest.approx(expected)


def test_data_info_text_names_the_files_it_reads(tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text("a b\n", encoding="utf-8")
    assert main(["data", "info", "text", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "reads the files train, valid, test" in err and "it has no train, valid, test" in err
    for split in ("train", "valid.txt", "test"):
        (tmp_path / split).write_text("a b c\nb c\n", encoding="utf-8")
    assert main(["data", "info", "text", "--dir", str(tmp_path)]) == 0
    assert "train" in capsys.readouterr().out
