"""One text reader for every command: corpora, ``eval``/``score`` files, prompt files and the
files to translate are read alike (BOM dropped, NUL and bad UTF-8 refused with the line, the
invisible separators made spaces), and every refusal is one line naming the file."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from targetlm.cli.generate import read_prompts
from targetlm.config import DataConfig
from targetlm.data import DataError, load_corpus, read_file
from targetlm.data.parallel import read_file_lines
from targetlm.data.vocab import INVISIBLE_SEPARATORS, read_text

# every reader of a user's text file, as a function of its path
READERS = {
    "corpus": lambda path: load_corpus(
        DataConfig(
            name="text",
            dir=str(path.parent),
            train=path.name,
            valid=path.name,
            test=path.name,
            batch_size=1,
        )
    ).splits[path.name],
    "eval --file": read_file,
    "translate --input": read_file_lines,
    "generate --prompt-file": lambda path: read_prompts(prompt_args(path)),
}


def prompt_args(path: Path | None, *prompts: str) -> argparse.Namespace:
    return argparse.Namespace(prompt=list(prompts), prompt_file=path)


def write(tmp_path: Path, data: bytes, name: str = "text.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_drops_the_byte_order_mark(reader, tmp_path):
    path = write(tmp_path, "\ufeffthe first line\nthe second\n".encode())
    result = READERS[reader](path)
    assert not any("\ufeff" in item for item in result)
    assert "the" in result or result[0].startswith("the first")


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_nul_naming_the_file_and_line(reader, tmp_path):
    path = write(tmp_path, b"one line\ntwo\nthree \x00 four\n")
    with pytest.raises(DataError, match=rf"{path}, line 3: a NUL character"):
        READERS[reader](path)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_names_the_line_of_undecodable_bytes(reader, tmp_path):
    path = write(tmp_path, b"fine\nstill fine\nbad \xff\xfe here\n")
    with pytest.raises(DataError, match=rf"{path}, line 3: undecodable bytes"):
        READERS[reader](path)


@pytest.mark.parametrize(
    "separator", [*INVISIBLE_SEPARATORS, "\u00a0", "\u2009", "\u3000", "\u2028"]
)
def test_unicode_separators_split_words_in_the_users_text(separator, tmp_path):
    """Zero-width space, word joiner and an inner U+FEFF are made spaces; NBSP, the thin and
    ideographic spaces and the line separator are whitespace already (str.split)."""
    path = write(tmp_path, f"a{separator}cat sat\nthe{separator}dog\n".encode())
    corpus = READERS["corpus"](path)
    assert list(corpus) == ["a", "cat", "sat", "<eos>", "the", "dog", "<eos>"]
    vocab = load_corpus(
        DataConfig(name="text", dir=str(tmp_path), train=path.name, valid=path.name, test=path.name)
    ).vocab
    assert not any(separator in word for word in vocab.itos)


def test_a_registered_corpus_is_read_as_published(tmp_path):
    """WikiText-2's training split has lone U+FEFF tokens: its counts stay the literature's."""
    directory = tmp_path / "ptb"
    directory.mkdir()
    for split in ("train", "valid", "test"):
        write(directory, "a \ufeff b\n".encode(), f"{split}.txt")
    corpus = load_corpus(DataConfig(name="ptb", dir=str(directory), batch_size=1))
    assert list(corpus.splits["train"]) == ["a", "\ufeff", "b", "<eos>"]


def test_prompt_file_messages(tmp_path, capsys):
    from targetlm.cli import main

    missing = tmp_path / "missing.txt"
    assert main(["generate", str(tmp_path), "--prompt-file", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"targetlm: error: prompt file not found: {missing}"
    blank = write(tmp_path, b"\n   \n\t\n", "blank.txt")
    assert main(["generate", str(tmp_path), "--prompt-file", str(blank)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"targetlm: error: {blank} has no prompt (only blank lines)"
    )


def test_prompts_given_on_the_command_line_are_split_alike():
    assert read_prompts(prompt_args(None, "the\u200bcat")) == ["the cat"]


def test_read_text_refuses_a_directory(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        read_text(tmp_path)


def test_an_endless_binary_device_is_refused_at_once(capsys):
    """`generate --prompt-file /dev/zero` was read until memory ran out: the first piece's NUL
    byte ends it with one line."""
    from targetlm.cli import main

    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    rc = main(["generate", "configs/quickstart.toml", "--prompt-file", "/dev/zero"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "/dev/zero, line 1: a NUL character" in err and "\n" not in err


def test_a_text_past_the_size_bound_is_refused_in_one_line(tmp_path, monkeypatch):
    from targetlm.data import vocab

    monkeypatch.setattr(vocab, "MAX_TEXT_BYTES", 100)
    path = tmp_path / "big.txt"
    path.write_text("word " * 50, encoding="utf-8")
    with pytest.raises(DataError, match="larger than 100 bytes"):
        read_text(path)
    path.write_text("word " * 10, encoding="utf-8")
    assert read_text(path) == "word " * 10
