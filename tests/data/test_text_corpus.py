"""Users' own corpora: a directory of text files as the ``text`` dataset (file names, line
slices, a byte-order mark), subword and byte tokenizers through training, evaluation,
generation and finetuning, the per-word perplexity, and ``targetlm eval RUN --file`` end to
end with its bad inputs (one error line, non-zero exit, nothing written)."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from targetlm import config as config_lib
from targetlm.cli import main
from targetlm.config import DataConfig
from targetlm.data import (
    EOS,
    DataError,
    EncodedTokens,
    Vocabulary,
    build_tokenizer,
    count_words,
    load_corpus,
    read_lines,
    read_split,
    read_tokens,
    with_context_token,
)
from targetlm.inference.evaluate import evaluate_stream, per_word
from targetlm.modules import build_model
from targetlm.registry import ConfigError

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.toml"
TINY = [
    "train.epochs=1",
    "train.progress=false",
    "model.encoder.hidden_size=32",
    "model.embedding.size=32",
    "data.batch_size=4",
]
WORDS = [
    "the",
    "a",
    "dog",
    "cat",
    "café",
    "runs",
    "sleeps",
    "über",
    "big",
    "small",
    "red",
    "on",
    "under",
    "tree",
    "ball",
    "😀",
]
FILES = {"train.en": 240, "val.en": 30, "test.en": 30}


def sets(*pairs: str) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


def text_lines(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))).capitalize()
        + rng.choice([".", "!", " ?"])
        for _ in range(count)
    ]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*")}


def assert_one_error(capsys, rc: int, *fragments: str) -> None:
    out, err = capsys.readouterr()
    assert rc != 0 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("targetlm: error:"), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    """Raw text in the user's own file names (a byte-order mark opens train.en)."""
    directory = tmp_path_factory.mktemp("corpus")
    for seed, (name, count) in enumerate(FILES.items()):
        text = "".join(line + "\n" for line in text_lines(count, seed))
        prefix = "\ufeff" if name == "train.en" else ""
        (directory / name).write_text(prefix + text, encoding="utf-8")
    return directory


def text_sets(corpus_dir: Path, tokenizer: str, *extra: str) -> list[str]:
    return [
        'data.name="text"',
        f"data.dir={json.dumps(str(corpus_dir))}",
        'data.train="train.en"',
        'data.valid="val.en"',
        'data.test="test.en"',
        f"data.tokenizer={json.dumps(tokenizer)}",
        *extra,
    ]


def train(run_dir: Path, corpus_dir: Path, tokenizer: str, *extra: str) -> int:
    overrides = [*TINY, *text_sets(corpus_dir, tokenizer, *extra)]
    return main(["train", str(QUICKSTART), *sets(*overrides), "--run-dir", str(run_dir)])


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, corpus_dir, one_thread) -> Path:
    pytest.importorskip("tokenizers")
    run = tmp_path_factory.mktemp("bpe") / "run"
    assert train(run, corpus_dir, "bpe", "data.vocab_size=300") == 0
    return run


def eval_json(capsys, *args: str) -> dict:
    assert main(["eval", *args, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


def text_config(corpus_dir: Path, **options) -> DataConfig:
    return DataConfig(
        name="text",
        dir=str(corpus_dir),
        train="train.en",
        valid="val.en",
        test="test.en",
        **options,
    )


# --- the text dataset -------------------------------------------------------------------------


def test_text_dataset_reads_the_named_files_and_their_slices(corpus_dir):
    config = text_config(corpus_dir)
    lines = read_lines(config, "val.en")
    assert lines == text_lines(FILES["val.en"], 1)
    first, rest = read_lines(config, "val.en[:0.5]"), read_lines(config, "val.en[0.5:]")
    assert first + rest == lines and len(first) == 15
    assert read_lines(config, "val.en[0.1:0.2]") == lines[3:6]
    (corpus_dir / "notes.txt").write_text("one note\n", encoding="utf-8")
    assert read_lines(config, "notes") == ["one note"]  # NAME.txt when NAME is not a file


def test_a_byte_order_mark_is_not_part_of_the_first_word(corpus_dir, tmp_path):
    config = text_config(corpus_dir)
    first = read_lines(config, "train.en")[0]
    assert first == text_lines(1, 0)[0] and not first.startswith("\ufeff")
    assert read_split(config, "train.en")[0] == first.split()[0]
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffHello world\n".encode())
    assert read_tokens(path) == ["Hello", "world", EOS]
    ptb = tmp_path / "ptb"
    ptb.mkdir()
    (ptb / "train.txt").write_bytes(b"\xef\xbb\xbfthe cat\n")
    assert read_split(DataConfig(name="ptb", dir=str(ptb)), "train") == ["the", "cat", EOS]
    byte_ids = build_tokenizer(DataConfig(tokenizer="bytes")).tokenize(
        read_lines(config, "train.en")
    )
    assert byte_ids[0] == first[0]  # not the mark's bytes


def test_text_dataset_errors_name_the_key_the_directory_and_the_file(corpus_dir, tmp_path):
    with pytest.raises(ConfigError, match="data.dir"):
        config_lib.from_dict({"data": {"name": "text"}})
    absent = DataConfig(name="text", dir=str(tmp_path / "nope"))
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "nope"))):
        read_lines(absent, "train")
    with pytest.raises(DataError, match=re.escape(str(corpus_dir / "train.de"))):
        read_lines(text_config(corpus_dir), "train.de")


def test_load_corpus_with_a_subword_tokenizer(corpus_dir):
    pytest.importorskip("tokenizers")
    corpus = load_corpus(text_config(corpus_dir, tokenizer="bpe", vocab_size=300))
    tokenizer = corpus.vocab.tokenizer
    assert corpus.vocab.itos == tokenizer.symbols and len(corpus.vocab) == 300
    for split, tokens in corpus.splits.items():
        assert isinstance(tokens, EncodedTokens)
        assert torch.equal(corpus.vocab.encode(tokens), tokens.ids)
        lines = read_lines(text_config(corpus_dir), split)
        assert corpus.words[split] == count_words(lines)
        assert list(tokens).count(EOS) == len(lines)
        assert tokenizer.decode(tokens) == "".join(line + "\n" for line in lines)
    assert sum(corpus.vocab.counts) == len(corpus.splits["train.en"])
    cut = load_corpus(text_config(corpus_dir, tokenizer="bpe", vocab_size=300, train_tokens=100))
    assert len(cut.splits["train.en"]) == 100 and "train.en" not in cut.words
    assert cut.vocab.itos == corpus.vocab.itos  # learnt on the whole training split


# --- perplexity per token and per word --------------------------------------------------------


@pytest.mark.parametrize("tokenizer", ["bytes", "whitespace"])
def test_per_word_perplexity_is_the_total_nll_over_the_words(corpus_dir, tokenizer):
    config = text_config(corpus_dir, tokenizer=tokenizer)
    corpus = load_corpus(config)
    vocab, tokens = corpus.vocab, corpus.splits["test.en"]
    torch.manual_seed(0)
    model_config = config_lib.load(QUICKSTART, TINY).model
    model = build_model(model_config, vocab.itos).eval()
    ids = with_context_token(vocab.encode(tokens), vocab.eos_id)
    text = (corpus_dir / "test.en").read_text(encoding="utf-8")
    words = len(re.findall(r"\S+", text)) + text.count("\n")  # independently of count_words
    result = per_word(evaluate_stream(model, ids, batch_size=1, segment=7), words)
    with torch.no_grad():  # one forward pass over the whole stream
        log_probs, _ = model.log_probs(ids[None, :-1])
    total = -float(log_probs[0].double().gather(-1, ids[1:, None]).sum())
    assert result["tokens"] == len(ids) - 1 and result["words"] == words
    assert result["ppl"] == pytest.approx(math.exp(total / result["tokens"]), rel=1e-5)
    assert result["word_ppl"] == pytest.approx(math.exp(total / words), rel=1e-5)
    if tokenizer == "whitespace":  # the tokens are the words
        assert result["tokens"] == words and result["word_ppl"] == pytest.approx(result["ppl"])
    else:
        assert result["tokens"] > words and result["word_ppl"] > result["ppl"]


# --- the command line end to end --------------------------------------------------------------


def test_train_on_raw_text_with_bpe_writes_the_tokenizer(bpe_run):
    assert (bpe_run / "tokenizer.json").is_file()
    symbols = json.loads((bpe_run / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    vocab = Vocabulary.load(bpe_run / "vocab.txt")
    assert len(vocab) == len(symbols) == 300
    assert all(symbols[word] == i for i, word in enumerate(vocab.itos))  # the same ids


def test_eval_file_reports_per_token_and_per_word_perplexity(bpe_run, corpus_dir, capsys):
    test_file = corpus_dir / "test.en"
    result = eval_json(capsys, str(bpe_run), "--file", str(test_file))
    lines = test_file.read_text(encoding="utf-8").splitlines()
    assert result["file"] == str(test_file) and result["split"] is None
    assert result["words"] == sum(len(line.split()) + 1 for line in lines)
    assert result["tokens"] > result["words"]
    assert result["word_ppl"] == pytest.approx(
        math.exp(result["nll"] * result["tokens"] / result["words"])
    )
    assert result["oov_rate"] == 0.0 and result["tokenizer"] == "bpe"
    split = eval_json(capsys, str(bpe_run), "--split", "test")  # the same file as a split
    assert split["ppl"] == pytest.approx(result["ppl"]) and split["words"] == result["words"]
    trained = json.loads((bpe_run / "results.json").read_text())["test"]
    assert split["ppl"] == pytest.approx(trained["ppl"], rel=1e-6)
    assert main(["eval", str(bpe_run), "--file", str(test_file)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{test_file}: ppl ") and "per word" in out


def test_eval_file_of_a_word_run_maps_new_words_to_unk(tmp_path, corpus_dir, capsys):
    run = tmp_path / "run"
    assert train(run, corpus_dir, "whitespace", "data.min_count=2") == 0
    capsys.readouterr()
    other = tmp_path / "other.txt"
    other.write_text("\ufeffthe zebra runs\nthe dog sleeps .\n", encoding="utf-8")
    result = eval_json(capsys, str(run), "--file", str(other))
    assert result["tokens"] == result["words"] == 9
    assert result["word_ppl"] == pytest.approx(result["ppl"])
    assert result["oov_rate"] == pytest.approx(2 / 9)  # "zebra", "." are <unk>; not the BOM


def test_generate_decodes_subword_text(bpe_run, capsys):
    assert main(["generate", str(bpe_run), "--prompt", "A dog", "--seed", "1"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("A dog")
    assert "Ġ" not in out and EOS not in out


def test_finetune_reads_the_new_text_with_the_source_tokenizer(
    bpe_run, corpus_dir, tmp_path, capsys
):
    new = tmp_path / "finetuned"
    args = ["finetune", str(bpe_run), "--run-dir", str(new)]
    named = [f'data.dir="{corpus_dir}"', 'data.train="val.en"']  # (data.dir: named again)
    assert main([*args, *sets(*named, "train.epochs=1")]) == 0
    capsys.readouterr()
    assert Vocabulary.load(new / "vocab.txt") == Vocabulary.load(bpe_run / "vocab.txt")
    assert (new / "tokenizer.json").read_bytes() == (bpe_run / "tokenizer.json").read_bytes()
    config = config_lib.load(new / "config.toml")
    assert config.data.tokenizer_file == str((bpe_run / "tokenizer.json").resolve())
    assert eval_json(capsys, str(new), "--file", str(corpus_dir / "test.en"))["ppl"] > 1
    other = tmp_path / "other"
    rc = main(
        [*["finetune", str(bpe_run), "--run-dir", str(other)], *sets('data.tokenizer="bytes"')]
    )
    assert_one_error(capsys, rc, "data.tokenizer", "'bpe'")
    assert not other.exists()


@pytest.mark.parametrize("tokenizer", ["bpe", "unigram"])
def test_a_subword_run_resumes_with_the_same_tokenizer(tmp_path, corpus_dir, capsys, tokenizer):
    """A resumed run trains its tokenizer again: it must give the same vocabulary."""
    pytest.importorskip("tokenizers")
    run = tmp_path / "run"
    assert train(run, corpus_dir, tokenizer, "data.vocab_size=300", "train.max_steps=3") == 0
    saved = (run / "tokenizer.json").read_bytes()
    overrides = [*TINY, *text_sets(corpus_dir, tokenizer, "data.vocab_size=300")]
    rc = main(["train", str(QUICKSTART), *sets(*overrides), "--run-dir", str(run), "--resume"])
    assert rc == 0, capsys.readouterr().err
    assert (run / "tokenizer.json").read_bytes() == saved
    assert json.loads((run / "results.json").read_text())["steps"] > 3


def test_a_byte_run_trains_and_evaluates(tmp_path, corpus_dir, capsys):
    run = tmp_path / "run"
    assert train(run, corpus_dir, "bytes") == 0
    capsys.readouterr()
    assert not (run / "tokenizer.json").exists() and len(Vocabulary.load(run / "vocab.txt")) == 258
    result = eval_json(capsys, str(run), "--file", str(corpus_dir / "val.en"))
    text = (corpus_dir / "val.en").read_bytes()
    assert result["tokens"] == len(text)  # every byte, each newline as <eos>
    assert result["word_ppl"] > result["ppl"]


# --- bad inputs: one error line, non-zero exit, nothing written -------------------------------


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (['data.tokenizer="wordpiece"'], ["wordpiece", "bpe, bytes, hf, unigram, whitespace"]),
        (['data.tokenizer="bytes"', "data.vocab_size=500"], ["data.vocab_size", "bytes"]),
        (["data.max_size=1"], ["max_size"]),
    ],
)
def test_bad_tokenizer_settings(tmp_path, corpus_dir, capsys, extra, fragments):
    run = tmp_path / "run"
    overrides = [*TINY, *text_sets(corpus_dir, "whitespace"), *extra]
    rc = main(["train", str(QUICKSTART), *sets(*overrides), "--run-dir", str(run)])
    assert_one_error(capsys, rc, *fragments)
    assert not run.exists()


def test_text_without_a_directory(tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["train", str(QUICKSTART), *sets(*TINY, 'data.name="text"'), "--run-dir", str(run)])
    assert_one_error(capsys, rc, "data.dir")
    rc = main(
        ["train", str(QUICKSTART), *sets(*TINY, 'data.name="text"', f"data.dir={tmp_path / 'no'}")]
        + ["--run-dir", str(run)]
    )
    assert_one_error(capsys, rc, str(tmp_path / "no"))
    assert not run.exists()


def test_without_the_library_bpe_says_what_to_install(tmp_path, corpus_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    run = tmp_path / "run"
    rc = train(run, corpus_dir, "bpe")
    assert_one_error(capsys, rc, "tokenizers", "pip install")
    assert not run.exists()


@pytest.fixture
def run_copy(bpe_run, tmp_path) -> Path:
    return Path(shutil.copytree(bpe_run, tmp_path / "run"))


def test_a_tokenizer_file_of_another_vocabulary(run_copy, corpus_dir, capsys):
    other = build_tokenizer(DataConfig(tokenizer="bpe", vocab_size=280))
    other.fit(read_lines(text_config(corpus_dir), "train.en"))
    other.write(run_copy)  # 280 symbols beside a vocab.txt of 300
    before = snapshot(run_copy)
    rc = main(["eval", str(run_copy), "--file", str(corpus_dir / "test.en"), "--json"])
    assert_one_error(capsys, rc, "tokenizer.json", "280", "300", "do not match")
    assert snapshot(run_copy) == before


def test_a_missing_tokenizer_file(run_copy, capsys):
    (run_copy / "tokenizer.json").unlink()
    rc = main(["eval", str(run_copy), "--json"])
    assert_one_error(capsys, rc, "tokenizer.json is missing", "'bpe'")


@pytest.mark.parametrize(
    "content, fragments",
    [(b"", ["empty"]), (b"a dog\n\xff\xfe cat\n", ["line 2", "not UTF-8"])],
)
def test_eval_of_an_empty_or_undecodable_file(run_copy, tmp_path, capsys, content, fragments):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    before = snapshot(run_copy)
    rc = main(["eval", str(run_copy), "--file", str(path), "--json"])
    assert_one_error(capsys, rc, str(path), *fragments)
    assert snapshot(run_copy) == before


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--file", "x.txt", "--split", "valid"], ["--file", "--split"]),
        (["--open-vocab"], ["--open-vocab", "bpe"]),
        (["--file", "does-not-exist.txt"], ["does-not-exist.txt"]),
    ],
)
def test_eval_option_errors(run_copy, capsys, args, fragments):
    rc = main(["eval", str(run_copy), *args, "--json"])
    assert_one_error(capsys, rc, *fragments)
