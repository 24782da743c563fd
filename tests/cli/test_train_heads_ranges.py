"""``targetlm train-heads``: a numeric flag outside the range its training can run (an AdamW
rate of 1e300, a seed past 64 bits, a cache of 10^300 MiB) is one error line before anything is
read or written, never an overflow traceback."""

from __future__ import annotations

import pytest
from conftest import one_error

from targetlm.cli import main


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--lr", "1e300", "--lr must be a finite number > 0 and <= 10, got 1e+300"),
        ("--seed", "1" * 23, "--seed must be >= 0 and <= 9223372036854775807"),
        ("--seed", "-1", "--seed must be >= 0 and <= "),
        ("--cache-mb", "9" * 300, "--cache-mb must be >= 1 and <= 1073741824"),
        ("--steps", "9" * 30, "--steps must be >= 1 and <= "),
        ("--segment", "9" * 30, "--segment must be >= 1 and <= "),
        ("--batch-size", "9" * 30, "--batch-size must be >= 1 and <= "),
        ("--log-every", "9" * 30, "--log-every must be >= 1 and <= "),
    ],
)
def test_train_heads_refuses_a_flag_outside_its_range(tmp_path, capsys, flag, value, message):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat\n", encoding="utf-8")
    argv = ["train-heads", str(tmp_path / "no-such-run"), "--corpus", str(corpus)]
    argv += ["--steps", "2", "--run-dir", str(tmp_path / "heads"), flag, value]
    assert one_error(capsys, main(argv)).startswith(message)
    assert not (tmp_path / "heads").exists()
