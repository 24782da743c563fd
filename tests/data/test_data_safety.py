"""What a split name may read, splits without words, and the Brown example of docs/cli.md.

A registered dataset's split is one of its declared splits (Brown's are its genres); a
``text`` split is a file inside ``data.dir`` or one named by its absolute path; ``../`` never
leaves the directory. A split (or ``eval --file``) without a single word is one error naming
the file, before any run directory is written.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import torch

from targetlm.cli import main
from targetlm.config import DataConfig
from targetlm.data import DataError, load_corpus, read_file, read_lines
from targetlm.data.catalogue import BROWN_GENRES
from targetlm.data.parallel import read_parallel

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.toml"
WORDS = "the cat sat on the mat\na dog ran to the cat\n" * 10


def text_dir(tmp_path: Path, **files: str) -> Path:
    directory = tmp_path / "data"
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def text_config(directory: Path, **splits: str) -> DataConfig:
    names = {"train": "train.txt", "valid": "valid.txt", "test": "test.txt", **splits}
    return DataConfig(name="text", dir=str(directory), batch_size=1, **names)


# --- split names stay inside the dataset ---------------------------------------------------


def test_a_text_split_cannot_leave_data_dir(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("password hunter2\n", encoding="utf-8")
    directory = text_dir(tmp_path, **{"train.txt": WORDS, "valid.txt": WORDS, "test.txt": WORDS})
    for name in ("../secret.txt", "../secret", "sub/../../secret.txt"):
        with pytest.raises(DataError, match=r"'\.\.' leaves data\.dir"):
            load_corpus(text_config(directory, train=name))


def test_a_text_split_may_be_the_users_file_by_its_absolute_path(tmp_path):
    own = tmp_path / "elsewhere" / "mine.txt"
    own.parent.mkdir()
    own.write_text("zebra quagga\n" * 5, encoding="utf-8")
    directory = text_dir(tmp_path, **{"valid.txt": WORDS, "test.txt": WORDS})
    corpus = load_corpus(text_config(directory, train=str(own)))
    assert "zebra" in corpus.vocab and "quagga" in corpus.vocab
    # NAME or NAME.txt, as inside data.dir
    assert load_corpus(text_config(directory, train=str(own.with_suffix("")))).vocab == corpus.vocab


def test_a_parallel_text_split_cannot_leave_its_directory(tmp_path):
    directory = text_dir(tmp_path, **{"train.en": "a b\n", "train.de": "c d\n"})
    (tmp_path / "other.en").write_text("x\n", encoding="utf-8")
    (tmp_path / "other.de").write_text("y\n", encoding="utf-8")
    config = DataConfig(name="text", dir=str(directory), source_lang="en", target_lang="de")
    with pytest.raises(DataError, match=r"'\.\.' leaves data\.dir"):
        read_parallel(config, "../other", train=True)
    assert read_parallel(config, str(tmp_path / "other"), train=True).source_lines == ["x"]


@pytest.mark.parametrize("name", ["../ptb/train", "/etc/hostname", "train/../../x"])
def test_a_registered_dataset_reads_only_its_declared_splits(tmp_path, name):
    directory = tmp_path / "ptb"
    directory.mkdir()
    for split in ("train", "valid", "test"):
        (directory / f"{split}.txt").write_text(WORDS, encoding="utf-8")
    with pytest.raises(
        DataError, match=r"dataset 'ptb' has no split .*its splits are train, valid, test"
    ):
        read_lines(DataConfig(name="ptb", dir=str(directory)), name)


def test_brown_has_no_valid_split_and_says_so():
    """No data needed: the split is refused before any directory is looked up."""
    with pytest.raises(DataError) as info:
        read_lines(DataConfig(name="brown", train="news[:0.8]", test="news[0.9:]"), "valid")
    message = str(info.value)
    assert message.startswith(
        "dataset 'brown' has no split 'valid'; its splits are the 15 genres: "
    )
    assert all(genre in message for genre in BROWN_GENRES)
    assert 'slice one, e.g. data.valid="news[0.8:0.9]"' in message
    assert "download" not in message


def readme_brown_command() -> list[str]:
    """The Brown example of docs/cli.md, as the argument list of ``targetlm``."""
    readme = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", readme, flags=re.S)
    commands = [
        command
        for block in blocks
        for command in block.replace("\\\n", " ").splitlines()
        if "data.name='\"brown\"'" in command
    ]
    assert len(commands) == 1, commands
    words = shlex.split(commands[0])
    assert words[0] == "targetlm"
    return words[1:]


@pytest.mark.skipif(
    not os.environ.get("TARGETLM_DATA"), reason="the Brown corpus: set TARGETLM_DATA"
)
def test_the_readme_brown_example_trains(tmp_path, monkeypatch, capsys):
    args = readme_brown_command()
    monkeypatch.chdir(REPO)  # the example's paths are the checkout's
    if "--run-dir" in args:  # the example's run directory, moved into tmp_path
        index = args.index("--run-dir")
        args[index + 1] = str(tmp_path / "run")
    # a seconds-long budget; one thread: on a busy machine OpenMP threads wait for each other
    tiny = ["train.max_steps=2", "train.progress=false", "train.threads=1",
            "model.encoder.hidden_size=16", "model.embedding.size=16", "model.encoder.num_layers=1",
            "data.max_size=500", "eval.batch_size=100", "data.bptt=50"]  # fmt: skip
    threads = torch.get_num_threads()
    try:
        assert main([*args, *(a for pair in tiny for a in ("--set", pair))]) == 0
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "run" / "results.json").is_file()


# --- splits without words --------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_a_split_of_blank_lines_is_one_error_naming_the_file(tmp_path, split):
    files = {"train.txt": WORDS, "valid.txt": WORDS, "test.txt": WORDS}
    files[f"{split}.txt"] = "\n  \n\t\n\n"
    directory = text_dir(tmp_path, **files)
    with pytest.raises(DataError, match=rf"{directory / f'{split}.txt'} has no words"):
        load_corpus(text_config(directory))


def test_a_slice_of_blank_lines_is_one_error_naming_the_file_and_slice(tmp_path):
    directory = text_dir(tmp_path, **{"t.txt": WORDS + "\n" * 200})
    with pytest.raises(
        DataError, match=rf"{directory / 't.txt'} \(slice 't\[0.9:\]'\) has no words"
    ):
        read_lines(text_config(directory), "t[0.9:]")


def test_an_eval_file_of_blank_lines_is_an_error(tmp_path):
    path = tmp_path / "blank_lines.txt"
    path.write_text("\n" * 10, encoding="utf-8")
    with pytest.raises(DataError, match=rf"{path} has no words"):
        read_file(path)


def test_too_few_training_tokens_name_the_file(tmp_path, capsys):
    directory = text_dir(tmp_path, **{"train.txt": "a b\n", "valid.txt": WORDS, "test.txt": WORDS})
    run = tmp_path / "run"
    overrides = [
        'data.name="text"',
        f'data.dir="{directory}"',
        'data.train="train.txt"',
        'data.valid="valid.txt"',
        'data.test="test.txt"',
        "data.batch_size=20",
    ]
    rc = main(
        [
            "train",
            str(QUICKSTART),
            *(a for o in overrides for a in ("--set", o)),
            "--run-dir",
            str(run),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err == (
        f"targetlm: error: training file {directory / 'train.txt'}: 3 training tokens are too "
        "few for data.batch_size = 20"
    )
    assert not run.exists()


def test_the_readme_presets_table_has_one_row_per_preset_and_timings_say_idle():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Presets", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows and all(row.count(" | ") == 1 for row in rows), "a row with more than 2 cells"
    names = [name for row in rows for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for timing in ("~1 min", "~35 s", "pytest ~1.5 min"):
        line = next(line for line in readme.splitlines() if timing in line)
        assert "idle" in line, line
