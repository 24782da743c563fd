"""Data contracts: reading text, the vocabulary, BPTT batching, the synthetic language,
dataset resolution and download (no network), and the real corpora's published counts."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import math
import os
import zipfile
from pathlib import Path

import pytest
import torch

from targetlm.config import DataConfig, SyntheticConfig
from targetlm.data import (
    EOS,
    IGNORE,
    UNK,
    DataError,
    StreamBatches,
    Vocabulary,
    catalogue,
    read_tokens,
    tokens_from_text,
    with_context_token,
)
from targetlm.data.catalogue import DatasetSpec, Remote, download
from targetlm.data.readers import load_corpus, read_split
from targetlm.data.synthetic import (
    PLURAL_DETS,
    PREPOSITIONS,
    SHARED_DETS,
    SINGULAR_DETS,
    SyntheticLanguage,
)

# --- reading text ---------------------------------------------------------------------------


def test_one_eos_per_line_and_empty_lines_count():
    assert tokens_from_text("a b\n\nc\n") == ["a", "b", EOS, EOS, "c", EOS]
    # the final newline ends the last line; it does not start a new (empty) one
    assert tokens_from_text("a b\nc") == tokens_from_text("a b\nc\n")
    assert tokens_from_text("") == []
    assert tokens_from_text("\n") == [EOS]
    assert tokens_from_text("\n\n") == [EOS, EOS]
    # PTB style: leading and trailing spaces on each line are not words
    assert tokens_from_text(" the cat \n a dog \n") == ["the", "cat", EOS, "a", "dog", EOS]


def test_lowercase_option():
    assert tokens_from_text("The CAT\n", lowercase=True) == ["the", "cat", EOS]
    assert tokens_from_text("The CAT\n") == ["The", "CAT", EOS]


def test_read_tokens_matches_tokens_from_text(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(" The cat sat \n\n a Dog \n", encoding="utf-8")
    assert read_tokens(path) == ["The", "cat", "sat", EOS, EOS, "a", "Dog", EOS]
    assert read_tokens(path, lowercase=True) == ["the", "cat", "sat", EOS, EOS, "a", "dog", EOS]


def test_undecodable_bytes_name_the_file_and_line(tmp_path):
    path = tmp_path / "train.txt"
    path.write_bytes(b"one line\nanother line\nbad \xff byte\nlast\n")
    with pytest.raises(DataError) as info:
        read_tokens(path)
    message = str(info.value)
    assert str(path) in message
    assert "line 3" in message


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_tokens(tmp_path / "nope.txt")


# --- vocabulary -----------------------------------------------------------------------------


def test_vocabulary_specials_first_then_frequency_then_alphabetical():
    tokens = ["b", "a", "c", "b", EOS, "c", "d", EOS]
    vocab = Vocabulary.build(tokens)
    # b and c have 2 each (tie -> alphabetical), then a and d with 1 each
    assert vocab.itos == [UNK, EOS, "b", "c", "a", "d"]
    assert vocab.counts == [0, 2, 2, 2, 1, 1]
    assert (vocab.unk_id, vocab.eos_id) == (0, 1)
    assert vocab.stoi == {w: i for i, w in enumerate(vocab.itos)}
    assert len(vocab) == 6
    assert "a" in vocab and "z" not in vocab


def test_vocabulary_counts_a_literal_unk_in_the_text():
    vocab = Vocabulary.build(["x", UNK, UNK, EOS])
    assert vocab.itos[:2] == [UNK, EOS]
    assert vocab.counts[:2] == [2, 1]


def test_vocabulary_max_size_keeps_the_most_frequent():
    vocab = Vocabulary.build(["a", "a", "a", "b", "b", "c"], max_size=4)
    assert vocab.itos == [UNK, EOS, "a", "b"]


def test_vocabulary_extend_keeps_the_ids_and_appends_new_words_by_frequency():
    vocab = Vocabulary.build(["b", "a", "b", EOS])
    extended = vocab.extend(["z", "a", "y", "z", "c", "y", "z", EOS])
    assert extended.itos[: len(vocab)] == vocab.itos  # every old id unchanged
    assert extended.itos[len(vocab) :] == ["z", "y", "c"]  # by count: z 3, y 2, c 1
    assert extended.counts == [0, 2, 2, 2, 3, 2, 1]  # counts add up over both corpora
    assert vocab.extend(["a", "b", EOS]).itos == vocab.itos
    assert vocab.itos == [UNK, EOS, "b", "a"]  # the original is left alone


def test_encode_maps_unknown_words_to_unk_and_decode_inverts():
    vocab = Vocabulary.build(["the", "cat", EOS])
    ids = vocab.encode(["the", "dog", EOS, "cat"])
    assert ids.dtype == torch.long
    assert ids.tolist() == [vocab.stoi["the"], vocab.unk_id, vocab.eos_id, vocab.stoi["cat"]]
    assert vocab.decode(ids.tolist()) == ["the", UNK, EOS, "cat"]


def test_oov_rate():
    vocab = Vocabulary.build(["the", "cat", EOS])
    assert vocab.oov_rate(["the", "dog", "bird", EOS]) == pytest.approx(0.5)
    assert vocab.oov_rate([UNK]) == 0.0  # a literal <unk> is a vocabulary word
    assert vocab.oov_rate([]) == 0.0


def test_vocabulary_save_load_and_state_dict_round_trip(tmp_path):
    vocab = Vocabulary.build(
        ["the", "cat", "sat", "on", "the", "mat", "<eos>", "a", "dog", "<eos>"]
    )
    vocab.save(tmp_path / "vocab.txt")
    loaded = Vocabulary.load(tmp_path / "vocab.txt")
    assert loaded == vocab
    assert loaded.counts == vocab.counts
    restored = Vocabulary.from_state_dict(vocab.state_dict())
    assert restored == vocab and restored.counts == vocab.counts
    first = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()[:3]
    assert first == [f"{UNK}\t0", f"{EOS}\t2", "the\t2"]


def test_vocabulary_from_lines_rejects_a_malformed_line():
    with pytest.raises(DataError, match="line 3"):
        Vocabulary.from_lines(f"{UNK}\t0\n{EOS}\t3\nno-count-here\n")
    with pytest.raises(DataError, match="line 3"):
        Vocabulary.from_lines(f"{UNK}\t0\n{EOS}\t3\nword\tmany\n")


def test_vocabulary_from_lines_rejects_a_file_without_specials_as_data_error():
    with pytest.raises(DataError):
        Vocabulary.from_lines("the\t5\ncat\t3\n")


# --- BPTT batching --------------------------------------------------------------------------


def _stream(n: int) -> torch.Tensor:
    # distinct, non-consecutive ids so a shifted or reordered stream cannot pass by accident
    return torch.randperm(10 * n, generator=torch.Generator().manual_seed(n))[:n]


@pytest.mark.parametrize("n, batch_size", [(14, 3), (15, 3), (2, 1), (100, 7), (5, 10)])
def test_eval_batches_score_every_target_exactly_once_in_order(n, batch_size):
    ids = _stream(n)
    batches = StreamBatches(ids, batch_size, segment=4, pad=True)
    real = batches.targets != IGNORE
    # rows read left to right, top to bottom, give back the stream's targets
    assert batches.targets[real].tolist() == ids[1:].tolist()
    assert batches.inputs[real].tolist() == ids[:-1].tolist()
    assert batches.num_targets == n - 1
    # padded positions: pad id as input, IGNORE as target
    assert (batches.inputs[~real] == 0).all()


def test_inputs_are_targets_shifted_by_one_within_each_row():
    ids = _stream(14)
    batches = StreamBatches(ids, 3, segment=2, pad=True)
    for row in range(3):
        real = batches.targets[row] != IGNORE
        inputs, targets = batches.inputs[row][real], batches.targets[row][real]
        assert inputs[1:].tolist() == targets[:-1].tolist()
    # rows overlap by one token: each row starts with the previous row's last target
    for row in range(1, 3):
        assert batches.inputs[row, 0] == batches.targets[row - 1, -1]


def test_training_batches_drop_only_the_remainder():
    ids = _stream(15)  # 14 targets, 3 rows -> 4 columns, 2 targets dropped
    batches = StreamBatches(ids, 3, segment=3, pad=False)
    assert batches.inputs.shape == (3, 4)
    assert (batches.targets != IGNORE).all()
    assert batches.targets.reshape(-1).tolist() == ids[1:13].tolist()
    assert batches.inputs.reshape(-1).tolist() == ids[:12].tolist()
    assert batches.num_targets == 12


def test_segments_cover_the_rows_and_the_last_one_is_short():
    ids = _stream(31)  # 30 targets, 3 rows of 10, segments of 4 -> 4 + 4 + 2
    batches = StreamBatches(ids, 3, segment=4, pad=False)
    assert len(batches) == 3
    widths = [x.size(1) for x, _ in batches]
    assert widths == [4, 4, 2]
    for x, y in batches:
        assert x.shape == y.shape and x.size(0) == 3
    assert torch.equal(torch.cat([x for x, _ in batches], 1), batches.inputs)
    assert torch.equal(torch.cat([y for _, y in batches], 1), batches.targets)
    with pytest.raises(IndexError):
        batches[3]
    with pytest.raises(IndexError):
        batches[-1]


def test_stream_too_short():
    with pytest.raises(ValueError):
        StreamBatches(torch.tensor([1]), 1, 4, pad=True)
    with pytest.raises(ValueError, match="too few"):
        StreamBatches(torch.arange(5), 10, 4, pad=False)


def test_with_context_token_prepends_one_eos():
    assert with_context_token(torch.tensor([5, 6]), 1).tolist() == [1, 5, 6]


# --- the synthetic language -----------------------------------------------------------------

SMALL = SyntheticConfig(train_sentences=600, valid_sentences=300, test_sentences=300)


def test_synthetic_is_deterministic_and_splits_differ():
    config = DataConfig(name="synthetic", synthetic=SMALL)
    train = read_split(config, "train")
    assert read_split(config, "train") == train
    valid, test = read_split(config, "valid"), read_split(config, "test")
    assert train.count(EOS) == 600 and valid.count(EOS) == 300 and test.count(EOS) == 300
    assert valid != test
    assert valid != train[: len(valid)]
    assert train[-1] == EOS
    other_seed = DataConfig(
        name="synthetic", synthetic=SyntheticConfig(seed=7, train_sentences=600)
    )
    assert read_split(other_seed, "train") != train


def test_synthetic_rejects_an_unknown_split():
    with pytest.raises(DataError, match="splits"):
        read_split(DataConfig(name="synthetic", synthetic=SMALL), "news")


def test_synthetic_unigram_perplexity_is_high():
    """A unigram model cannot explain the corpus: there is something left for a model to learn."""
    config = DataConfig(name="synthetic")  # the default sizes a user trains on
    train, test = read_split(config, "train"), read_split(config, "test")
    counts = collections.Counter(train)
    types = len(set(train) | set(test))
    total = len(train) + types  # add-one smoothing
    nll = -sum(math.log((counts[w] + 1) / total) for w in test) / len(test)
    assert math.exp(nll) > 100


def test_synthetic_singular_determiners_take_singular_words():
    tokens = read_split(DataConfig(name="synthetic", synthetic=SMALL), "train")
    after_singular = [b for a, b in zip(tokens, tokens[1:]) if a in SINGULAR_DETS]
    assert after_singular
    assert not [w for w in after_singular if w.endswith("s")]


class _Parser:
    """Parses the grammar of targetlm.data.synthetic and checks agreement and selection."""

    def __init__(self, language: SyntheticLanguage) -> None:
        lex = language.lexicon
        self.noun_class = {n: c for c, nouns in enumerate(lex.nouns) for n in nouns}
        self.adjective_class = {a: c for c, adjs in enumerate(lex.adjectives) for a in adjs}
        self.subject_class = {v: s for v, s in lex.verbs_intransitive}
        self.subject_class.update({v: s for v, s, _ in lex.verbs_transitive})
        self.object_class = {v: o for v, _, o in lex.verbs_transitive}

    def noun_phrase(self, words: list[str], i: int, with_pp: bool) -> tuple[int, bool, int]:
        det = words[i]
        assert det in SINGULAR_DETS + PLURAL_DETS + SHARED_DETS, (i, det)
        i += 1
        adjective = None
        if words[i] in self.adjective_class:
            adjective, i = words[i], i + 1
        noun = words[i]
        plural = noun.endswith("s")
        stem = noun[:-1] if plural else noun
        assert stem in self.noun_class, (i, noun)
        if det in SINGULAR_DETS:
            assert not plural, (det, noun)
        if det in PLURAL_DETS:
            assert plural, (det, noun)
        cls = self.noun_class[stem]
        if adjective is not None:
            assert self.adjective_class[adjective] == cls, (adjective, noun)
        i += 1
        if with_pp and words[i] in PREPOSITIONS:
            i = self.noun_phrase(words, i + 1, with_pp=False)[0]
        return i, plural, cls

    def clause(self, words: list[str], i: int) -> int:
        i, plural, cls = self.noun_phrase(words, i, with_pp=True)
        verb = words[i]
        stem = verb if plural else verb[:-1]
        if not plural:
            assert verb.endswith("s"), verb
        assert stem in self.subject_class, verb
        assert self.subject_class[stem] == cls, (verb, "subject class")
        i += 1
        if stem in self.object_class:
            i, _, object_cls = self.noun_phrase(words, i, with_pp=True)
            assert object_cls == self.object_class[stem], (verb, "object class")
            while words[i] in PREPOSITIONS:
                i = self.noun_phrase(words, i + 1, with_pp=False)[0]
        return i

    def sentence(self, words: list[str]) -> None:
        """``words``: one sentence including its final ``<eos>``."""
        i = self.clause(words, 0)
        if words[i] == "and":
            i = self.clause(words, i + 1)
        assert i == len(words) - 1 and words[i] == EOS, words


def test_synthetic_sentences_follow_the_grammar_with_agreement_and_selection():
    tokens = read_split(DataConfig(name="synthetic", synthetic=SMALL), "valid")
    parser = _Parser(SyntheticLanguage())
    sentence: list[str] = []
    parsed = 0
    for token in tokens:
        sentence.append(token)
        if token == EOS:
            parser.sentence(sentence)
            parsed, sentence = parsed + 1, []
    assert parsed == 300


def test_synthetic_lexicon_sizes_are_checked():
    with pytest.raises(ValueError):
        SyntheticLanguage(nouns=3)


# --- dataset resolution ---------------------------------------------------------------------


def _write_ptb(directory: Path, word: str = "w") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        (directory / f"{split}.txt").write_text(f" {word} {split} \n {word} \n", encoding="utf-8")
    return directory


@pytest.fixture
def isolated_env(monkeypatch, tmp_path):
    """No $TARGETLM_DATA and an empty user cache, whatever the machine has."""
    monkeypatch.delenv("TARGETLM_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_data_dir_wins_over_the_environment(isolated_env, monkeypatch):
    tmp_path = isolated_env
    _write_ptb(tmp_path / "env" / "ptb", word="from_env")
    explicit = _write_ptb(tmp_path / "explicit", word="explicit")
    monkeypatch.setenv("TARGETLM_DATA", str(tmp_path / "env"))
    tokens = read_split(DataConfig(name="ptb", dir=str(explicit)), "train")
    assert tokens == ["explicit", "train", EOS, "explicit", EOS]


def test_missing_data_dir_is_an_error_naming_it(isolated_env):
    missing = isolated_env / "nope"
    with pytest.raises(DataError) as info:
        read_split(DataConfig(name="ptb", dir=str(missing)), "train")
    assert "data.dir" in str(info.value) and str(missing) in str(info.value)


def test_data_dir_without_the_split_file(isolated_env):
    directory = isolated_env / "partial"
    directory.mkdir()
    (directory / "train.txt").write_text("a\n", encoding="utf-8")
    with pytest.raises(DataError, match="valid.txt"):
        read_split(DataConfig(name="ptb", dir=str(directory)), "valid")


def test_targetlm_data_environment_variable_is_used(isolated_env, monkeypatch):
    _write_ptb(isolated_env / "env" / "ptb", word="from_env")
    monkeypatch.setenv("TARGETLM_DATA", str(isolated_env / "env"))
    corpus = load_corpus(DataConfig(name="ptb"))
    assert corpus.splits["valid"] == ["from_env", "valid", EOS, "from_env", EOS]
    assert corpus.vocab.itos == [UNK, EOS, "from_env", "train"]  # train split only


def test_user_cache_is_the_last_resort(isolated_env):
    _write_ptb(isolated_env / "cache" / "targetlm" / "ptb", word="cached")
    assert read_split(DataConfig(name="ptb"), "test")[0] == "cached"


def test_nothing_found_says_how_to_download(isolated_env, monkeypatch):
    monkeypatch.setenv("TARGETLM_DATA", str(isolated_env / "empty"))
    with pytest.raises(DataError) as info:
        read_split(DataConfig(name="ptb"), "train")
    message = str(info.value)
    assert "targetlm data download ptb" in message
    assert str(isolated_env / "empty" / "ptb") in message  # where it looked


def test_empty_training_file_is_an_error(isolated_env):
    directory = _write_ptb(isolated_env / "ptb")
    (directory / "train.txt").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="empty"):
        load_corpus(DataConfig(name="ptb", dir=str(directory)))


def test_unknown_dataset_name():
    with pytest.raises(DataError, match="available"):
        read_split(DataConfig(name="penn"), "train")


# --- download (file:// URLs, never the network) ---------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def remote_files(tmp_path):
    """Three small split files served from tmp_path/remote via file:// URLs."""
    remote = tmp_path / "remote"
    remote.mkdir()
    contents = {f"{s}.txt": f" tiny {s} text \n".encode() for s in ("train", "valid", "test")}
    for name, data in contents.items():
        (remote / name).write_bytes(data)
    return remote, contents


def _spec(remote: Path, contents: dict[str, bytes], wrong: str | None = None) -> DatasetSpec:
    files = {
        name: Remote((remote / name).as_uri(), sha256="0" * 64 if name == wrong else _sha256(data))
        for name, data in contents.items()
    }
    return DatasetSpec("tiny", "a test corpus", ("train", "valid", "test"), files=files)


def test_download_fetches_and_verifies(monkeypatch, remote_files, tmp_path):
    remote, contents = remote_files
    monkeypatch.setitem(catalogue.DATASETS, "tiny", _spec(remote, contents))
    target = tmp_path / "data" / "tiny"
    assert download("tiny", target) == target
    assert {p.name: p.read_bytes() for p in target.iterdir()} == contents
    assert os.listdir(target.parent) == ["tiny"]  # no staging directory left behind
    assert read_split(DataConfig(name="tiny", dir=str(target)), "valid") == [
        "tiny",
        "valid",
        "text",
        EOS,
    ]


def test_download_defaults_to_the_user_cache(monkeypatch, remote_files, tmp_path):
    remote, contents = remote_files
    monkeypatch.setitem(catalogue.DATASETS, "tiny", _spec(remote, contents))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TARGETLM_DATA", raising=False)
    path = download("tiny")
    assert path == tmp_path / "cache" / "targetlm" / "tiny"
    assert read_split(DataConfig(name="tiny"), "train") == ["tiny", "train", "text", EOS]


def test_download_with_a_wrong_checksum_saves_nothing(monkeypatch, remote_files, tmp_path):
    remote, contents = remote_files
    # train and valid are fine, test is not: not even the good files may appear
    monkeypatch.setitem(catalogue.DATASETS, "tiny", _spec(remote, contents, wrong="test.txt"))
    target = tmp_path / "data" / "tiny"
    with pytest.raises(DataError, match="sha256 mismatch"):
        download("tiny", target)
    # nothing left: no staging directory, and not the folders the download created
    assert not (tmp_path / "data").exists()


def test_download_with_a_wrong_checksum_keeps_existing_files(monkeypatch, remote_files, tmp_path):
    remote, contents = remote_files
    target = tmp_path / "data" / "tiny"
    target.mkdir(parents=True)
    (target / "train.txt").write_bytes(b"old\n")
    monkeypatch.setitem(catalogue.DATASETS, "tiny", _spec(remote, contents, wrong="valid.txt"))
    with pytest.raises(DataError):
        download("tiny", target)
    assert [p.name for p in target.iterdir()] == ["train.txt"]
    assert (target / "train.txt").read_bytes() == b"old\n"


def test_download_md5_checked_archive(monkeypatch, tmp_path):
    """An archive dataset (WikiText-103 layout) is fetched, md5-checked and unpacked."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for split in ("train", "valid", "test"):
            archive.writestr(f"wikitext-103/wiki.{split}.tokens", f" = {split} = \n")
    blob = buffer.getvalue()
    (tmp_path / "wt.zip").write_bytes(blob)
    good = Remote((tmp_path / "wt.zip").as_uri(), md5=hashlib.md5(blob).hexdigest())
    spec = catalogue.DATASETS["wikitext-103"]
    monkeypatch.setitem(catalogue.DATASETS, "wikitext-103", dataclasses.replace(spec, archive=good))
    target = download("wikitext-103", tmp_path / "wt103")
    assert read_split(DataConfig(name="wikitext-103", dir=str(target)), "test") == [
        "=",
        "test",
        "=",
        EOS,
    ]

    bad = Remote(good.url, md5="0" * 32)
    monkeypatch.setitem(catalogue.DATASETS, "wikitext-103", dataclasses.replace(spec, archive=bad))
    with pytest.raises(DataError, match="md5 mismatch"):
        download("wikitext-103", tmp_path / "other")
    assert not (tmp_path / "other").exists()


def _text8_archive(tmp_path, text: bytes):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("text8", text)
    blob = buffer.getvalue()
    (tmp_path / "text8.zip").write_bytes(blob)
    return blob


def test_text8_is_downloaded_checked_and_cut_between_words(monkeypatch, tmp_path):
    """A toy text8.zip from a file:// URL: size and md5 checked, cut at characters 10 and 20
    (moved to the next space: no word is split)."""
    text = b" anarchism originated as a term of abuse first used"
    blob = _text8_archive(tmp_path, text)
    unpack = catalogue.text8_unpacker((10, 20), hashlib.md5(text).hexdigest(), len(blob))
    spec = dataclasses.replace(
        catalogue.DATASETS["text8"],
        archive=Remote((tmp_path / "text8.zip").as_uri()),
        unpack=unpack,
    )
    monkeypatch.setitem(catalogue.DATASETS, "text8", spec)
    target = download("text8", tmp_path / "t8")
    config = DataConfig(name="text8", dir=str(target))
    splits = [read_split(config, split) for split in ("train", "valid", "test")]
    assert splits == [
        ["anarchism", EOS],
        ["originated", EOS],
        ["as", "a", "term", "of", "abuse", "first", "used", EOS],
    ]
    for wrong in (
        catalogue.text8_unpacker((10, 20), "0" * 32, len(blob)),
        catalogue.text8_unpacker((10, 20), None, len(blob) + 1),
    ):
        monkeypatch.setitem(catalogue.DATASETS, "text8", dataclasses.replace(spec, unpack=wrong))
        with pytest.raises(DataError, match="md5 mismatch|bytes, expected"):
            download("text8", tmp_path / "other")
        assert not (tmp_path / "other").exists()


def test_text8_and_wikitext103_have_canonical_sources_and_say_they_are_not_obtainable_here(
    tmp_path, capsys
):
    from targetlm.cli import main

    text8 = catalogue.DATASETS["text8"]
    assert text8.archive.url == "http://mattmahoney.net/dc/text8.zip"
    assert catalogue.TEXT8_MD5 == "3bea1919949baf155f99411df5fada7e"
    assert catalogue.DATASETS["wikitext-103"].archive.md5 == "9ddaacaf6af0710eda8c456decff7832"
    for name in ("text8", "wikitext-103"):
        assert main(["data", "info", name, "--dir", str(tmp_path / "absent")]) != 0
        out = capsys.readouterr()
        assert "availability: not obtainable on machines without the open web" in out.out
        assert f"targetlm data download {name}" in out.out + out.err


def test_brown_unpacking_drops_tags(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("brown/cats.txt", "ca01 news\ncf01 lore\n")
        archive.writestr(
            "brown/ca01", "\n\n\tThe/at Fulton/np-tl said/vbd ./.\n\n\tIt/pps was/bedz ./.\n"
        )
        archive.writestr("brown/cf01", "\n\tA/at 1/2/cd inch/nn\n")
    catalogue._unpack_brown(buffer.getvalue(), tmp_path)
    assert (tmp_path / "news.txt").read_text() == "The Fulton said .\nIt was .\n"
    assert (tmp_path / "lore.txt").read_text() == "A 1/2 inch\n"
    assert {p.stem for p in tmp_path.iterdir()} == set(catalogue.BROWN_GENRES)


def test_generated_dataset_cannot_be_downloaded(tmp_path):
    with pytest.raises(DataError, match="generated"):
        download("synthetic", tmp_path / "x")


# --- the real corpora (shared/data/README.md) -----------------------------------------------

REAL_DATA = os.environ.get("TARGETLM_DATA", "")
HAS_REAL_DATA = bool(REAL_DATA) and all(
    (Path(REAL_DATA) / name).is_dir() for name in ("ptb", "wikitext-2")
)
real_data = pytest.mark.skipif(
    not HAS_REAL_DATA,
    reason="real corpora not available: set TARGETLM_DATA to a directory with ptb/ and wikitext-2/",
)


@pytest.fixture(scope="module")
def real_corpus():
    cache: dict[str, dict[str, list[str]]] = {}

    def get(name: str) -> dict[str, list[str]]:
        if name not in cache:
            config = DataConfig(name=name, dir=str(Path(REAL_DATA) / name))
            cache[name] = {s: read_split(config, s) for s in ("train", "valid", "test")}
        return cache[name]

    return get


@real_data
@pytest.mark.parametrize(
    "name, sizes, vocab_size",
    [
        ("ptb", (929_589, 73_760, 82_430), 10_000),
        ("wikitext-2", (2_088_628, 217_646, 245_569), 33_278),
    ],
)
def test_real_corpus_counts(real_corpus, name, sizes, vocab_size):
    splits = real_corpus(name)
    assert tuple(len(splits[s]) for s in ("train", "valid", "test")) == sizes
    vocab = Vocabulary.build(splits["train"])
    assert len(vocab) == vocab_size
    # valid and test contain no type missing from train
    assert vocab.oov_rate(splits["valid"]) == 0.0
    assert vocab.oov_rate(splits["test"]) == 0.0


def test_split_slices_partition_a_file_by_lines(tmp_path):
    lines = [f"w{i} x{i}" for i in range(10)]
    (tmp_path / "news.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = DataConfig(name="brown", dir=str(tmp_path))
    whole = read_split(config, "news")
    parts = [read_split(config, s) for s in ("news[:0.8]", "news[0.8:0.9]", "news[0.9:]")]
    assert [len(p) for p in parts] == [24, 3, 3]  # 8, 1 and 1 lines of 2 words + <eos>
    assert parts[0] + parts[1] + parts[2] == whole
    assert parts[1] == ["w8", "x8", EOS]
    for bad in ("news[0.9:0.1]", "news[a:b]", "news[0.5:1.5]"):
        with pytest.raises(DataError, match="split"):
            read_split(config, bad)
    with pytest.raises(DataError, match="empty"):
        read_split(config, "news[0.5:0.52]")
