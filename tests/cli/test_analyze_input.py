"""Bad input to ``analyze`` and ``lexicon`` that used to end in a traceback, a replaced file or
a half-done sweep: each is one error line, exit 2, before anything is read, trained or written."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import files_of, one_error

from targetlm.cli import main

MODEL = """
[data]
name = "synthetic"
batch_size = 4
bptt = 10
[data.synthetic]
train_sentences = 40
valid_sentences = 10
test_sentences = 10
[model.embedding]
kind = "lookup"
size = 8
[model.encoder]
kind = "lstm"
hidden_size = 8
num_layers = 1
[model.output]
kind = "lookup"
[train]
optimizer = "sgd"
lr = 1.0
epochs = 1
max_steps = 2
progress = false
"""
AUGMENTED = '[objective]\nkind = "augmented"\ntarget_source = "input"\ntau = 10.0\nbeta = 1.0\n'


def config(path: Path, augmented: bool = False) -> Path:
    """A tiny config file: a RUN_DIR for tsne and freq-bins (its untrained model), or the
    --config of subspace."""
    path.write_text(MODEL + AUGMENTED * augmented, encoding="utf-8")
    return path


def plot_command(command: str, run: Path, out: Path, *extra: str) -> list[str]:
    runs = [str(run)] * (2 if command == "freq-bins" else 1)
    return ["analyze", command, *runs, "--out", str(out), *extra]


# --- analyze tsne | freq-bins --out ---------------------------------------------------------
@pytest.mark.parametrize("command", ["tsne", "freq-bins"])
@pytest.mark.parametrize("name", ["learning_curve", "plot.txt"])
def test_a_plot_needs_an_image_suffix_so_no_other_file_is_written(command, name, tmp_path, capsys):
    # matplotlib used to add .png to a bare name after the checks: run/learning_curve
    # replaced the run's own learning_curve.png without --force
    run = tmp_path / "run"
    run.mkdir()
    (run / "learning_curve.png").write_bytes(b"the run's own plot")
    before = files_of(run)
    model = config(tmp_path / "model.toml")
    message = one_error(capsys, main(plot_command(command, model, run / name)))
    assert message == f"--out: {run / name} should end in one of .png, .pdf, .svg"
    assert files_of(run) == before


@pytest.mark.parametrize("command", ["tsne", "freq-bins"])
def test_a_config_given_as_run_dir_is_never_the_plot_even_with_force(command, tmp_path, capsys):
    model = config(tmp_path / "model.svg")  # a config file named like a plot
    before = model.read_bytes()
    message = one_error(capsys, main(plot_command(command, model, model, "--force")))
    assert message.startswith(f"--out {model}: is an input of this command")
    assert model.read_bytes() == before and files_of(tmp_path) == {"model.svg": before}


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--seed", "-1"], "argument --seed: -1 is not in [0, 4294967295]"),
        (["--seed", str(2**32)], "argument --seed: 4294967296 is not in [0, 4294967295]"),
        (["--levels", ""], "argument --levels: expected one or more levels"),
        (["--levels", "1.5"], "argument --levels: expected an integer, got '1.5'"),
    ],
)
def test_tsne_flags_are_checked_before_the_run_is_read(flags, fragment, tmp_path, capsys):
    model = config(tmp_path / "model.toml")
    out = tmp_path / "tsne.png"
    message = one_error(capsys, main(plot_command("tsne", model, out, "--tokens", "50", *flags)))
    assert message.startswith(fragment)
    assert not out.exists()


# --- lexicon stats --drop -------------------------------------------------------------------
@pytest.mark.parametrize("drop", ["2", "-1", "nan"])
def test_lexicon_drop_outside_zero_one_is_one_error(drop, capsys):
    message = one_error(capsys, main(["lexicon", "stats", "--data", "synthetic", "--drop", drop]))
    assert message.startswith(f"argument --drop: {float(drop)!r} is not in [0, 1]")


# --- analyze subspace -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "augmented, sweep, message",
    [
        (True, ["--betas", "0.5,2", "--taus", "2"], "objective.beta: 2.0 is not in [0, 1]"),
        (True, ["--betas", "0.5", "--taus", "2,-1"], "objective.tau: -1.0 is not in (0, inf)"),
        (True, ["--betas", "0.5", "--taus", "0"], "objective.tau: 0.0 is not in (0, inf)"),
        (
            True,
            ["--betas", "", "--taus", ""],
            "--betas and --taus are both empty: there is no model to train",
        ),
        (
            False,
            ["--betas", "0.5", "--taus", "2"],
            "the subspace analysis needs objective.kind = 'augmented', not 'cross_entropy'",
        ),
    ],
)
def test_subspace_checks_the_whole_sweep_before_training_any_model(
    augmented, sweep, message, tmp_path, capsys, monkeypatch
):
    def no_training(*args, **kwargs):
        raise AssertionError("a model was trained")

    monkeypatch.setattr("targetlm.training.trainer.Trainer", no_training)
    model = config(tmp_path / "model.toml", augmented)
    out = tmp_path / "sub"
    rc = main(["analyze", "subspace", "--config", str(model), "--out", str(out), *sweep])
    assert one_error(capsys, rc) == message
    assert not out.exists()  # a rerun with the settings fixed is not refused


def test_analyze_subspace_finds_its_default_preset_from_any_directory(tmp_path, monkeypatch):
    from targetlm.cli.analyze import SUBSPACE_PRESET, _subspace_preset

    monkeypatch.chdir(tmp_path)  # not the checkout: a relative default would not be found
    path = _subspace_preset()
    assert path.is_file() and path.name == SUBSPACE_PRESET
