"""``targetlm eval`` of a finished run reprints the figures its run wrote to results.json, for
every registered task kind: each task is asked for its own figures (a masked LM's masked-token
perplexity, a classifier's accuracy, translation's BLEU), never a causal LM's perplexity."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import tiny_config
from test_diffusion import tiny_diffusion_config
from test_translation import tiny_translation_config, write_corpus

from targetlm import config as config_lib
from targetlm.cli import main
from targetlm.tasks import TASKS

BIDIRECTIONAL = {
    "model.encoder": '{kind = "crammed_bert", num_layers = 1, num_heads = 2, ff_size = 16, '
    "max_context = 10}",
    "train.carry_state": "false",
}


def _write_toml(path: Path, overrides: dict) -> Path:
    path.write_text(config_lib.dumps(tiny_config(**overrides)), encoding="utf-8")
    return path


def _lm(directory: Path) -> Path:
    return _write_toml(directory / "lm.toml", {})


def _mlm(directory: Path) -> Path:
    return _write_toml(directory / "mlm.toml", {**BIDIRECTIONAL, "task.kind": '"mlm"'})


def _classification(directory: Path) -> Path:
    glue = directory / "SST-2"
    glue.mkdir()
    good = ["a fine film", "truly good fun", "good and fine", "a fun ride"]
    bad = ["a dull mess", "truly bad", "bad and dull", "a boring mess"]
    rows = "".join(f"{s}\t1\n" for s in good) + "".join(f"{s}\t0\n" for s in bad)
    for name in ("train.tsv", "dev.tsv"):
        (glue / name).write_text("sentence\tlabel\n" + rows, encoding="utf-8")
    return _write_toml(
        directory / "classification.toml",
        {
            **BIDIRECTIONAL,
            "task": '{kind = "classification", glue_task = "SST-2"}',
            "data.name": '"glue"',
            "data.dir": f'"{glue}"',
        },
    )


def _translation(directory: Path) -> Path:
    return tiny_translation_config(directory, write_corpus(directory / "data", pairs=40))


def _diffusion(directory: Path) -> Path:
    return tiny_diffusion_config(directory, write_corpus(directory / "data", pairs=40))


# a config file of a seconds-long run of each task kind
TINY_RUNS: dict[str, Callable[[Path], Path]] = {
    "lm": _lm,
    "mlm": _mlm,
    "classification": _classification,
    "translation": _translation,
    "diffusion": _diffusion,
}
STEPS = ["--set", "train.max_steps=2", "--set", "train.eval_every=2", "--set", "eval.beam=1"]


def _numbers(figures: dict) -> dict:
    """The figures that are numbers and do not time anything."""
    return {
        key: value
        for key, value in figures.items()
        if isinstance(value, int | float) and not key.endswith("_per_s")
    }


@pytest.mark.parametrize("kind", TASKS.names())
def test_eval_reprints_the_figures_of_results_json(kind, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("targetlm.analysis.report.plot_learning_curve", lambda *args: False)
    assert kind in TINY_RUNS, f"no tiny run for task.kind = {kind!r}: add one to TINY_RUNS"
    run = tmp_path / "run"
    assert main(["train", str(TINY_RUNS[kind](tmp_path)), "--run-dir", str(run), *STEPS]) == 0
    results = json.loads((run / "results.json").read_text())
    for split in ("valid", "test"):
        capsys.readouterr()
        assert main(["eval", str(run), "--split", split, "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        evaluated = printed if kind == "lm" else printed[split]  # a stream run: one split
        # every figure both hold (diffusion's eval leaves decoding and BLEU to translate)
        shared = _numbers(evaluated).keys() & _numbers(results[split]).keys()
        assert "ppl" in shared or "accuracy" in shared, (evaluated, results[split])
        expected = {key: results[split][key] for key in shared}
        assert {key: evaluated[key] for key in shared} == pytest.approx(expected, rel=1e-5)
    assert main(["eval", str(run)]) == 0
    text = capsys.readouterr().out
    if kind == "mlm":
        assert "masked-token ppl" in text, text
    if kind == "classification":
        assert "ppl" not in text, text
