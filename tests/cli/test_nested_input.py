"""A run directory's files read by eval, train --resume and compare (config.toml, results.json,
metrics.jsonl) and ``--set`` values: deeply nested or invalid ones are one error line naming
the file, never a RecursionError or a JSON traceback, and nothing is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import one_error, tiny_config

from targetlm import config as config_lib
from targetlm.cli import main

DEPTH = 100_000
DEEP_TOML = "[model]\nx = " + "[" * DEPTH + "]" * DEPTH + "\n"
DEEP_JSON = "[" * DEPTH + "]" * DEPTH


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nested")
    config = root / "tiny.toml"
    config.write_text(config_lib.dumps(tiny_config(**{"train.max_steps": 2})), encoding="utf-8")
    run = root / "run"
    assert main(["train", str(config), "--run-dir", str(run)]) == 0
    return run


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _refused(capsys, run: Path, argv: list[str], *fragments: str) -> None:
    before = _files(run.parent)
    line = one_error(capsys, main(argv))
    for fragment in fragments:
        assert fragment in line, line
    assert _files(run.parent) == before  # nothing written


@pytest.mark.parametrize("command", ["eval", "resume", "compare"])
def test_a_deeply_nested_config_toml(run, capsys, command):
    (run / "config.toml").write_text(DEEP_TOML, encoding="utf-8")
    argv = {
        "eval": ["eval", str(run / "config.toml")],
        "resume": ["train", "--resume", "--run-dir", str(run)],
        "compare": ["compare", str(run)],
    }[command]
    _refused(capsys, run, argv, str(run / "config.toml"), "nested too deeply")


@pytest.mark.parametrize(
    ("text", "reason"), [(DEEP_JSON, "nested too deeply"), ('{"test": {"ppl": 3', "not valid JSON")]
)
@pytest.mark.parametrize("command", ["resume", "compare"])
def test_a_deeply_nested_or_invalid_results_json(run, capsys, command, text, reason):
    (run / "results.json").write_text(text, encoding="utf-8")
    argv = {
        "resume": ["train", "--resume", "--run-dir", str(run)],
        "compare": ["compare", str(run)],
    }[command]
    _refused(capsys, run, argv, str(run / "results.json"), reason)


@pytest.mark.parametrize("command", ["resume", "compare"])
def test_a_deeply_nested_metrics_line(run, capsys, command):
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text(encoding="utf-8").splitlines()
    metrics.write_text("\n".join([DEEP_JSON, *lines]) + "\n", encoding="utf-8")
    argv = {  # a longer budget: the resumed run reads its log to continue it
        "resume": ["train", "--resume", "--run-dir", str(run), "--set", "train.max_steps=4"],
        "compare": ["compare", str(run)],
    }[command]
    _refused(capsys, run, argv, f"{metrics}, line 1", "nested too deeply")


def test_a_deeply_nested_set_value(run, capsys):
    deep = "[" * DEPTH + "]" * DEPTH
    _refused(capsys, run, ["eval", str(run), "--set", f"eval.batch_size={deep}"], "nested too deep")
