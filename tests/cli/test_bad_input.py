"""Bad input that used to end in a traceback or a written file: a checkpoint that is not
targetlm's, a device targetlm does not run on, a run of a task the command cannot read,
damaged records given to ``compare``, and a ``train-heads`` rate that cannot train. Each is
one error line, exit 2, and nothing written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import files_of, one_error

from targetlm import config as config_lib
from targetlm.cli import main

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.toml"
MLM = REPO / "configs" / "mlm-wt2-base.toml"


# --- checkpoints that are not targetlm's ------------------------------------------------------
def test_a_bare_state_dict_as_best_pt_is_not_a_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"weight": torch.zeros(2)}, run / "best.pt")  # a plain model.state_dict()
    for command in (["eval", str(run)], ["generate", str(run), "--prompt", "the"]):
        message = one_error(capsys, main(command))
        assert message == f"{run / 'best.pt'}: not a targetlm checkpoint (no 'model')"
    torch.save([1, 2, 3], run / "best.pt")  # not even a dict
    assert "not a targetlm checkpoint" in one_error(capsys, main(["eval", str(run)]))


def test_resuming_from_a_last_pt_without_its_progress_is_one_error(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(QUICKSTART, run / "config.toml")
    torch.save({"model": {}, "vocab": {}}, run / "last.pt")
    before = files_of(run)
    message = one_error(capsys, main(["train", "--resume", "--run-dir", str(run)]))
    assert message.startswith(f"{run / 'last.pt'}: not a targetlm checkpoint (no ")
    assert files_of(run) == before


# --- devices ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["nosuch", "cuda:abc", "mps", "cpu:0:1"])
def test_a_device_targetlm_does_not_run_on_is_one_error_for_every_command(tmp_path, capsys, device):
    setting = ["--set", f'train.device="{device}"']
    for command in (
        ["eval", str(QUICKSTART), *setting],
        ["train", str(QUICKSTART), *setting, "--run-dir", str(tmp_path / "run")],
    ):
        message = one_error(capsys, main(command))
        assert message.startswith(f"train.device: {device!r} is not a device targetlm runs on")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_the_devices_targetlm_runs_on_are_valid(device):
    config = config_lib.load(QUICKSTART, [f'train.device="{device}"'])
    assert config.train.device == device


# --- a run of a task the command cannot read ------------------------------------------------
def test_a_masked_lm_is_sent_to_eval_by_translate_generate_and_score(tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("the cat\n")
    commands = {
        "sentence-pair": ["translate", str(MLM), "--input", str(text)],
        "language-model (stream)": ["generate", str(MLM), "--prompt", "the"],
    }
    for reads, command in commands.items():
        message = one_error(capsys, main(command))
        assert message == (
            f"{MLM} is a 'mlm' config; this command reads {reads} runs (use `targetlm eval`)"
        )


def test_a_classifier_is_not_read_as_a_language_model(tmp_path, capsys):
    # the masked LM's config as a classification task (what `finetune --changes` trains)
    text = re.sub(r'\[task\]\nkind = "mlm"\n', '[task]\nkind = "classification"\n', MLM.read_text())
    text = text.replace('name = "wikitext-2"', 'name = "brown"')
    config = tmp_path / "classify.toml"
    config.write_text(text)
    scores = tmp_path / "scores.jsonl"
    for command in (
        ["eval", str(config)],
        ["score", str(config), "--file", str(config), "--out", str(scores)],
    ):
        message = one_error(capsys, main(command))
        assert message.startswith(f"{config} is a 'classification' config: this command reads")
    assert not scores.exists()


# --- compare on damaged records --------------------------------------------------------------
def record(directory: Path, files: dict[str, str | bytes]) -> Path:
    directory.mkdir(parents=True)
    config = config_lib.load(QUICKSTART, ["train.seed=1"])
    (directory / "config.toml").write_text(config_lib.dumps(config))
    for name, content in files.items():
        path = directory / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    return directory


GOOD_RESULTS = json.dumps({"valid": {"ppl": 10.0}, "test": {"ppl": 11.0}})
DAMAGED = {
    "results.json is a list": {"results.json": "[1, 2]"},
    "results.json is not UTF-8": {"results.json": b'{"test": "\xff"}'},
    "an ensemble row without its lambda": {
        "results.json": GOOD_RESULTS,
        "eval-test.json": json.dumps({"ppl": 11.0, "ensemble": [{"ppl": 10.0}]}),
    },
    "a validation line without its step": {
        "results.json": GOOD_RESULTS,
        "metrics.jsonl": json.dumps({"kind": "valid", "ppl": 3.0}) + "\n",
    },
    "a validation line whose ppl is text": {
        "results.json": GOOD_RESULTS,
        "metrics.jsonl": json.dumps({"kind": "valid", "step": 1, "ppl": "low"}) + "\n",
    },
    "metrics.jsonl is not UTF-8": {"results.json": GOOD_RESULTS, "metrics.jsonl": b"\xff\xfe\n"},
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_compare_names_the_run_of_a_damaged_record(tmp_path, capsys, damage):
    run = record(tmp_path / "base-s1", DAMAGED[damage])
    message = one_error(capsys, main(["compare", str(run)]))
    assert str(run) in message


# --- train-heads -----------------------------------------------------------------------------
@pytest.mark.parametrize("lr", ["inf", "nan", "0"])
def test_train_heads_refuses_a_rate_that_cannot_train_before_reading_anything(tmp_path, capsys, lr):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat\n")
    command = [
        "train-heads",
        str(tmp_path / "no-such-run"),
        "--corpus",
        str(corpus),
        "--steps",
        "2",
    ]
    message = one_error(capsys, main([*command, "--lr", lr, "--run-dir", str(tmp_path / "h")]))
    assert message.startswith("--lr must be a finite number > 0")
    assert not (tmp_path / "h").exists()


# --- a loss that explodes without reaching inf ------------------------------------------------
def test_an_infinite_validation_perplexity_is_divergence_not_a_result(tmp_path, capsys):
    # lr 1e6 without clipping: the loss stays finite (about 1e7 nats) but exp of it is not
    settings = ["train.max_steps=3", "train.epochs=1", "train.lr=1e6", "train.clip=0"]
    settings += ["data.synthetic.train_sentences=200", "train.progress=false"]
    run = tmp_path / "run"
    argv = ["train", str(QUICKSTART), "--run-dir", str(run)]
    assert main([*argv, *(a for s in settings for a in ("--set", s))]) == 3
    assert "valid perplexity is inf" in capsys.readouterr().err
    assert not (run / "results.json").exists() and not (run / "best.pt").exists()


# --- a λ outside [0, 1], or none --------------------------------------------------------------
def test_compare_lambda_and_an_empty_ensemble_lambda_list_are_checked(capsys):
    records = REPO / "docs" / "records" / "nmt-cpu-48ep"
    for value in ("2", "-0.5", "nan"):
        message = one_error(capsys, main(["compare", str(records), "--lambda", value]))
        assert message.startswith("argument --lambda:")
    for value in (",,", ""):
        message = one_error(capsys, main(["eval", str(QUICKSTART), "--ensemble-lambda", value]))
        assert "expected one or more numbers in [0, 1]" in message


# --- a run inside a run --------------------------------------------------------------------
def test_a_new_run_directory_inside_another_run_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(QUICKSTART, run / "config.toml")
    (run / "metrics.jsonl").write_text("")
    before = files_of(run)
    message = one_error(capsys, main(["train", str(QUICKSTART), "--run-dir", str(run / "sub")]))
    assert (
        message == f"{run / 'sub'} is inside the run directory {run}: choose a --run-dir outside it"
    )
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat\n")
    heads = ["train-heads", str(run), "--corpus", str(corpus), "--steps", "2"]
    message = one_error(capsys, main([*heads, "--run-dir", str(run / "heads")]))
    assert message.startswith(f"{run / 'heads'} is inside the run directory")
    assert files_of(run) == before


def test_a_directory_given_as_a_config_is_named_so(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    message = one_error(capsys, main(["describe", str(run)]))
    assert message == f"{run} is a directory, not a config file"
    shutil.copy(QUICKSTART, run / "config.toml")
    message = one_error(capsys, main(["describe", str(run)]))
    assert message.endswith(f"(the run's config: {run / 'config.toml'})")


def test_an_output_under_a_file_is_one_error_before_any_work(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("the cat\n")
    before = text.read_bytes()
    message = one_error(capsys, main(["train", str(QUICKSTART), "--run-dir", str(text / "run")]))
    assert message == f"{text / 'run'}: {text} is a file, not a directory to write into"
    argv = ["score", str(QUICKSTART), "--file", str(text), "--out", str(text / "scores.jsonl")]
    message = one_error(capsys, main(argv))
    assert (
        message == f"--out {text / 'scores.jsonl'}: {text} is a file, not a directory to write into"
    )
    assert text.read_bytes() == before
