"""``targetlm score RUN --file PATH --out scores.jsonl``: one record per token, any combiners."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import tiny_config

from targetlm.cli import main
from targetlm.training import Trainer


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("score") / "run"
    config = tiny_config(
        **{"model.heads": '{kind = "simple", n = 2}', "train.epochs": 1, "train.max_steps": 3}
    )
    Trainer(config, path, log=lambda m: None).train()
    torch.set_num_threads(threads)
    return path


def test_score_writes_one_record_per_token_matching_eval(run, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("the zebra saw a sofa\nthe cat\n", encoding="utf-8")
    out = tmp_path / "scores.jsonl"
    args = ["--file", str(text), "--open-vocab", "--unigram-cache", "0.1"]
    assert main(["score", str(run), *args, "--out", str(out), "--ensemble-lambda", "0,0.5"]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["position"] for r in records] == list(range(len(records)))
    assert [r["token"] for r in records] == [
        "the",
        "zebra",
        "saw",
        "a",
        "sofa",
        "<eos>",
        "the",
        "cat",
        "<eos>",
    ]
    assert [r["new"] for r in records][:2] == [False, True]
    assert all(r["log_prob"] <= 0 and set(r["ensemble"]) == {"0", "0.5"} for r in records)
    assert all(r["ensemble"]["0"] == r["log_prob"] for r in records)
    # the same scores as eval with the same combiners
    assert main(["eval", str(run), *args, "--json"]) == 0
    ppl = json.loads(capsys.readouterr().out)["ppl"]
    nll = -sum(r["log_prob"] for r in records) / len(records)
    assert math.isclose(math.exp(nll), ppl, rel_tol=1e-6)


def test_score_bad_input_is_one_error_and_writes_nothing(run, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(run), "--file", str(empty), "--out", str(out)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1 and not out.exists()
    text = tmp_path / "text.txt"
    text.write_text("the cat\n", encoding="utf-8")
    assert (
        main(["score", str(run), "--file", str(text), "--out", str(out), "--ensemble-lambda", "2"])
        == 2
    )
    assert "[0, 1]" in capsys.readouterr().err and not out.exists()
    assert list(tmp_path.glob(".scores*")) == []


def test_open_vocabulary_with_a_byte_tokenizer_is_one_error(tmp_path, capsys):
    config = tiny_config(**{"data.tokenizer": '"bytes"', "train.epochs": 1, "train.max_steps": 2})
    Trainer(config, tmp_path / "bytes", log=lambda m: None).train()
    text = tmp_path / "text.txt"
    text.write_text("the cat\n", encoding="utf-8")
    out = tmp_path / "scores.jsonl"
    for command in (["eval"], ["score", "--out", str(out)]):
        rc = main([*command, str(tmp_path / "bytes"), "--file", str(text), "--open-vocab"])
        err = capsys.readouterr().err.splitlines()
        assert rc == 2 and len(err) == 1 and "bytes tokenizer" in err[0]
    assert not out.exists()
