"""Tokenizer contracts, parametrised over every registered tokenizer: one <eos> per line,
ids inside the vocabulary, decode inverts encode on raw text, saved and loaded tokenizers
are equal, a vocabulary of another run is refused; and each tokenizer's own options."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch
from conftest import write_pretrained_tokenizer

from targetlm.config import DataConfig
from targetlm.data import (
    EOS,
    TOKENIZERS,
    UNK,
    DataError,
    EncodedTokens,
    Vocabulary,
    build_tokenizer,
    load_tokenizer,
)
from targetlm.data.tokenizers import BYTE_SYMBOLS
from targetlm.data.vocab import SymbolTokenizer, Tokenizer
from targetlm.registry import ConfigError

# raw text: accents, emoji, punctuation, a tab, repeated and edge spaces, an empty line
RAW = [
    "The café's 3 dogs — über-fast! 😀",
    "",
    "  two  spaces\tand a tab ",
    "a literal <unk> word",
    "Last line.",
]
TRAIN = [
    f"{subject} {verb} the {thing}{mark}"
    for subject in ("The cat", "A dog", "Émile", "Some birds")
    for verb in ("sees", "chased", "ate")
    for thing in ("mat", "café", "ball 😀", "red fish")
    for mark in (".", "!")
]
# options a tokenizer needs for a tiny corpus; a new tokenizer gets none
OPTIONS: dict[str, dict] = {"bpe": {"vocab_size": 300}, "unigram": {"vocab_size": 300}}
NEEDS_LIBRARY = {"bpe", "unigram", "hf"}
TRAINED = {"bpe", "unigram"}  # subword tokenizers learnt on the training split


@pytest.fixture(scope="module", autouse=True)
def _pretrained_model_directory(tmp_path_factory):
    """The ``hf`` tokenizer reads a pretrained model's directory: a tiny stand-in."""
    if importlib.util.find_spec("tokenizers") is not None:
        directory = write_pretrained_tokenizer(tmp_path_factory.mktemp("hf"), TRAIN + RAW, rows=320)
        OPTIONS["hf"] = {"tokenizer_file": str(directory)}


@pytest.fixture(params=TOKENIZERS.names())
def name(request) -> str:
    if request.param in NEEDS_LIBRARY:
        pytest.importorskip("tokenizers")
    return request.param


def fitted(name: str, lines: list[str] = TRAIN, **options) -> Tokenizer:
    tokenizer = TOKENIZERS.build(name, {**OPTIONS.get(name, {}), **options}, "data")
    tokenizer.fit(lines)
    return tokenizer


def vocabulary(tokenizer: Tokenizer, lines: list[str] = TRAIN) -> Vocabulary:
    return tokenizer.vocabulary(tokenizer.tokenize(lines))


# --- contracts of every registered tokenizer ------------------------------------------------


def test_every_line_ends_with_one_eos(name):
    tokenizer = fitted(name)
    tokens = list(tokenizer.tokenize(RAW))
    assert tokens.count(EOS) == len(RAW) and tokens[-1] == EOS
    empty = tokens.index(EOS) + 1  # the empty second line is a lone <eos>
    assert tokens[empty] == EOS
    assert list(tokenizer.tokenize([])) == []


def test_ids_are_inside_the_vocabulary(name):
    tokenizer = fitted(name)
    vocab = vocabulary(tokenizer)
    if name == "hf":  # a pretrained model's specials are where the model has them
        assert vocab.itos[tokenizer.eos_id] == EOS and UNK in vocab
    else:
        assert vocab.itos[:2] == [UNK, EOS]
    assert sum(vocab.counts) == len(tokenizer.tokenize(TRAIN))  # the training stream's counts
    tokens = tokenizer.tokenize(RAW)
    ids = vocab.encode(tokens)
    assert ids.dtype == torch.long and len(ids) == len(tokens)
    assert int(ids.min()) >= 0 and int(ids.max()) < len(vocab)
    assert vocab.decode(ids.tolist()) == [t if t in vocab else UNK for t in tokens]
    if isinstance(tokenizer, SymbolTokenizer):
        assert vocab.oov_rate(tokens) == 0.0  # nothing is out of vocabulary
        assert torch.equal(ids, vocab.encode(list(tokens)))  # the id path is the word path


def test_decode_inverts_tokenize_on_raw_text(name):
    tokenizer = fitted(name)
    text = "".join(line + "\n" for line in RAW)
    decoded = tokenizer.decode(tokenizer.tokenize(RAW))
    if isinstance(tokenizer, SymbolTokenizer):
        assert decoded == text  # exactly, spaces, tab and emoji included
        assert tokenizer.decode(list(tokenizer.tokenize(RAW))) == text  # from token strings too
    else:  # words: whitespace is normalised
        assert decoded == "".join(" ".join(line.split()) + "\n" for line in RAW)


def test_saved_and_loaded_tokenizers_are_equal(name, tmp_path):
    tokenizer = fitted(name)
    vocab = vocabulary(tokenizer)
    vocab.save(tmp_path / "vocab.txt")  # and the tokenizer's own file beside it
    assert {p.name for p in tmp_path.iterdir()} == {"vocab.txt"} | (
        {tokenizer.file} if tokenizer.file else set()
    )
    loaded_vocab = Vocabulary.load(tmp_path / "vocab.txt")
    assert loaded_vocab == vocab and loaded_vocab.counts == vocab.counts
    config = DataConfig(tokenizer=name, **OPTIONS.get(name, {}))
    loaded = load_tokenizer(config, tmp_path, loaded_vocab)
    assert type(loaded) is type(tokenizer)
    assert list(loaded.tokenize(RAW)) == list(tokenizer.tokenize(RAW))
    assert torch.equal(
        loaded_vocab.encode(loaded.tokenize(RAW)), vocab.encode(tokenizer.tokenize(RAW))
    )
    assert loaded.decode(loaded.tokenize(RAW)) == tokenizer.decode(tokenizer.tokenize(RAW))


def test_a_vocabulary_of_other_symbols_is_refused(name, tmp_path):
    tokenizer = fitted(name)
    if not isinstance(tokenizer, SymbolTokenizer):
        pytest.skip("a word vocabulary may hold any words")
    vocabulary(tokenizer).save(tmp_path / "vocab.txt")
    other = Vocabulary([UNK, EOS, "a", "b"], [0, 1, 2, 3])
    with pytest.raises(DataError, match="do not match"):
        load_tokenizer(DataConfig(tokenizer=name, **OPTIONS.get(name, {})), tmp_path, other)


def test_encoded_tokens_read_like_a_list(name):
    tokens = fitted(name).tokenize(RAW)
    as_list = list(tokens)
    assert len(tokens) == len(as_list) and tokens[3] == as_list[3]
    assert list(tokens[2:7]) == as_list[2:7]


# --- the registry and the data.* options -----------------------------------------------------


def test_unknown_tokenizer_lists_the_names():
    with pytest.raises(ConfigError, match="data.tokenizer: unknown tokenizer 'wordpiece'") as error:
        build_tokenizer(DataConfig(tokenizer="wordpiece"))
    for known in ("whitespace", "bpe", "unigram", "bytes"):
        assert known in str(error.value)


@pytest.mark.parametrize(
    "tokenizer, key, value",
    [
        ("bytes", "vocab_size", 1000),
        ("whitespace", "vocab_size", 1000),
        ("bpe", "max_size", 1000),
        ("unigram", "min_count", 2),
        ("whitespace", "tokenizer_file", "tokenizer.json"),
    ],
)
def test_an_option_of_another_tokenizer_is_an_error(tokenizer, key, value):
    if tokenizer in NEEDS_LIBRARY:
        pytest.importorskip("tokenizers")
    with pytest.raises(ConfigError, match=f"data.{key} does not apply"):
        build_tokenizer(DataConfig(tokenizer=tokenizer, **{key: value}))


@pytest.mark.parametrize(
    "tokenizer, key, value, fragment",
    [
        ("bpe", "vocab_size", 258, r"data.vocab_size: 258 is not in \[259, .*the 256 byte"),
        ("whitespace", "max_size", 2, r"data.max_size: 2 is not in \[3, .*<unk> and <eos>"),
        ("whitespace", "min_count", 0, r"data.min_count: 0 is not in \[1, "),
    ],
)
def test_option_values_are_checked(tokenizer, key, value, fragment):
    if tokenizer in NEEDS_LIBRARY:
        pytest.importorskip("tokenizers")
    with pytest.raises(ConfigError, match=fragment):
        build_tokenizer(DataConfig(tokenizer=tokenizer, **{key: value}))


@pytest.mark.parametrize("tokenizer", sorted(NEEDS_LIBRARY))
def test_without_the_library_a_subword_tokenizer_says_what_to_install(tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[text\]'"):
        build_tokenizer(DataConfig(tokenizer=tokenizer))


# --- each tokenizer's own behaviour ----------------------------------------------------------


def test_word_vocabulary_max_size_and_min_count_make_the_rest_unk():
    lines = ["a a a b b c", "a b d"]
    tokenizer = build_tokenizer(DataConfig(min_count=2))
    vocab = vocabulary(tokenizer, lines)
    assert vocab.itos == [UNK, EOS, "a", "b"]
    assert vocab.counts == [2, 2, 4, 3]  # c and d became <unk>
    capped = vocabulary(build_tokenizer(DataConfig(max_size=3)), lines)
    assert capped.itos == [UNK, EOS, "a"] and capped.counts == [5, 2, 4]
    assert vocab.encode(tokenizer.tokenize(["a c"])).tolist() == [2, 0, 1]


def test_bytes_are_utf8_bytes_after_the_specials():
    tokenizer = build_tokenizer(DataConfig(tokenizer="bytes"))
    tokens = tokenizer.tokenize(["é a", ""])
    assert isinstance(tokens, EncodedTokens)
    assert tokens.ids.tolist() == [0xC3 + 2, 0xA9 + 2, 0x20 + 2, ord("a") + 2, 1, 1]
    assert list(tokens) == ["<0xC3>", "<0xA9>", "<0x20>", "a", EOS, EOS]
    assert len(BYTE_SYMBOLS) == 258 and len(set(BYTE_SYMBOLS)) == 258


def test_subword_tokens_are_shared_by_line_starts_and_middles():
    pytest.importorskip("tokenizers")
    tokenizer = fitted("bpe")
    first, middle = (list(tokenizer.tokenize([line]))[:-1] for line in ("cat", "the cat"))
    assert first == middle[-len(first) :]  # "cat" starting a line is the same symbol(s)


@pytest.mark.parametrize("kind", sorted(TRAINED))
def test_subword_training_is_deterministic(kind):
    pytest.importorskip("tokenizers")
    first, second = fitted(kind), fitted(kind)
    assert first.symbols == second.symbols
    assert list(first.tokenize(RAW)) == list(second.tokenize(RAW))


@pytest.mark.parametrize("kind", sorted(TRAINED))
def test_a_saved_tokenizer_file_replaces_training(kind, tmp_path):
    pytest.importorskip("tokenizers")
    trained = fitted(kind)
    trained.write(tmp_path)
    reused = fitted(
        kind, ["completely other text"], tokenizer_file=str(tmp_path / "tokenizer.json")
    )
    assert reused.symbols == trained.symbols
    other = "bpe" if kind == "unigram" else "unigram"
    with pytest.raises(DataError, match="not"):
        fitted(other, tokenizer_file=str(tmp_path / "tokenizer.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(DataError, match="not a tokenizer file"):
        fitted(kind, tokenizer_file=str(tmp_path / "bad.json"))
