"""Parallel corpora: aligned source and target files, one sentence per line.

A parallel split ``NAME`` of a dataset directory is two files, ``NAME.<source_lang>`` and
``NAME.<target_lang>`` (Multi30k's ``train.en`` / ``train.de``), aligned line by line. One
subword tokenizer (``data.tokenizer``, byte-level BPE by default) is learnt on the training
split's two sides together: a joint vocabulary, which the source and the target share with
the model's one input embedding (and the tied output layer). Every sentence ends with
``<eos>``; the decoder reads ``<eos>`` y₁ … y_m and predicts y₁ … y_m ``<eos>``.

Bad input fails before anything is written, naming the file and the line: files of
different lengths, an empty source line outside training, undecodable bytes. An empty line
(either side) in the training split is skipped and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from targetlm.data.catalogue import TEXT, candidate_dirs, get_spec
from targetlm.data.readers import check_declared_split, check_text_name, parse_split, slice_lines
from targetlm.data.tokenizers import build_tokenizer
from targetlm.data.vocab import (
    EOS,
    DataError,
    SymbolTokenizer,
    Tokenizer,
    Vocabulary,
    read_text_lines,
)

if TYPE_CHECKING:
    from targetlm.config import DataConfig


@dataclass
class ParallelSplit:
    """One split: the raw lines of each side and their ids (each ends with ``<eos>``)."""

    source_lines: list[str]
    target_lines: list[str]
    source: list[torch.Tensor] = field(default_factory=list)
    target: list[torch.Tensor] = field(default_factory=list)
    skipped: int = 0  # empty training pairs left out

    def __len__(self) -> int:
        return len(self.source_lines)


@dataclass
class ParallelCorpus:
    vocab: Vocabulary
    splits: dict[str, ParallelSplit]


def languages(config: DataConfig) -> tuple[str, str]:
    if not config.source_lang or not config.target_lang:
        raise DataError(
            "a parallel corpus needs data.source_lang and data.target_lang (e.g. 'en' and 'de')"
        )
    return config.source_lang, config.target_lang


def split_file(config: DataConfig, stem: str, lang: str) -> Path:
    """``<dir>/<stem>.<lang>``: data.dir, $TARGETLM_DATA/<name>, then the user cache. A
    registered corpus's ``stem`` is one of its declared splits; a ``text`` one stays inside
    its directory or is an absolute path (:func:`~targetlm.data.readers.check_text_name`)."""
    name = f"{stem}.{lang}"
    if config.name != TEXT:
        check_declared_split(get_spec(config.name), config, stem)
    elif (absolute := check_text_name(stem)) is not None:
        path = absolute.with_name(f"{absolute.name}.{lang}")
        if not path.is_file():
            raise DataError(f"parallel file {path} not found")
        return path
    directories = candidate_dirs(config.name, config.dir)
    for directory in directories:
        if (directory / name).is_file():
            return directory / name
    looked = "; ".join(str(d) for d in directories)
    hint = "" if config.name == TEXT else f" Run `targetlm data download {config.name}`,"
    raise DataError(
        f"parallel file {name} not found (looked in: {looked}).{hint} set TARGETLM_DATA or "
        "data.dir."
    )


def read_file_lines(path: Path, lowercase: bool = False, separators: bool = True) -> list[str]:
    """The lines of one side's file (:func:`targetlm.data.vocab.read_text`, the one reader;
    ``separators`` False: a registered corpus, read as published)."""
    return read_text_lines(path, lowercase, separators=separators)


def check_aligned(source: Path, source_lines: list, target: Path, target_lines: list) -> None:
    if len(source_lines) != len(target_lines):
        raise DataError(
            f"{source} has {len(source_lines)} lines but {target} has {len(target_lines)}: "
            "parallel files must be aligned line by line"
        )


def check_nonempty(path: Path, lines: Sequence[str]) -> None:
    """Every line of a source file to translate has a word (the first empty one is named)."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise DataError(f"{path}, line {number}: empty source sentence")


def read_parallel(config: DataConfig, split: str, *, train: bool) -> ParallelSplit:
    """The aligned lines of ``split`` (optionally sliced, ``train[:0.1]``); training drops
    empty pairs (counted), other splits reject an empty source line."""
    source_lang, target_lang = languages(config)
    stem, window = parse_split(split)
    source_path = split_file(config, stem, source_lang)
    target_path = split_file(config, stem, target_lang)
    as_published = config.name != TEXT
    source = read_file_lines(source_path, config.lowercase, separators=not as_published)
    target = read_file_lines(target_path, config.lowercase, separators=not as_published)
    check_aligned(source_path, source, target_path, target)
    source, target = slice_lines(source, window), slice_lines(target, window)
    skipped = 0
    if train:
        kept = [(s, t) for s, t in zip(source, target) if s.strip() and t.strip()]
        skipped = len(source) - len(kept)
        source, target = [s for s, _ in kept], [t for _, t in kept]
    else:
        check_nonempty(source_path, source)
    if not source:
        raise DataError(f"parallel split {split!r} ({source_path}) has no sentence pairs")
    return ParallelSplit(source, target, skipped=skipped)


def encode_lines(
    tokenizer: Tokenizer, vocab: Vocabulary, lines: Sequence[str]
) -> list[torch.Tensor]:
    """Each line's ids, ending with ``<eos>``."""
    ids = vocab.encode(tokenizer.tokenize(list(lines)))
    ends = (ids == vocab.eos_id).nonzero().squeeze(1).tolist()
    starts = [0, *(end + 1 for end in ends[:-1])]
    return [ids[start : end + 1] for start, end in zip(starts, ends)]


def decode_ids(tokenizer: Tokenizer, vocab: Vocabulary, ids: Sequence[int]) -> str:
    """Detokenized text of one sentence's ids (without its ``<eos>``)."""
    ids = [int(i) for i in ids if int(i) != vocab.eos_id]
    if isinstance(tokenizer, SymbolTokenizer):
        return tokenizer.decode_ids(torch.tensor(ids, dtype=torch.long)).rstrip("\n")
    return tokenizer.decode([w for w in vocab.decode(ids) if w != EOS]).rstrip("\n")


def load_parallel(config: DataConfig, splits: Sequence[str] | None = None) -> ParallelCorpus:
    """Read the splits, learn the tokenizer on both sides of the training split, encode all."""
    wanted = list(dict.fromkeys([config.train, *(splits or (config.valid, config.test))]))
    data = {split: read_parallel(config, split, train=split == config.train) for split in wanted}
    train = data[config.train]
    tokenizer = build_tokenizer(config)
    tokenizer.fit(train.source_lines + train.target_lines)
    vocab = tokenizer.vocabulary(tokenizer.tokenize(train.source_lines + train.target_lines))
    vocab.tokenizer = tokenizer
    for part in data.values():
        part.source = encode_lines(tokenizer, vocab, part.source_lines)
        part.target = encode_lines(tokenizer, vocab, part.target_lines)
    return ParallelCorpus(vocab, data)
