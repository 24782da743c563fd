"""Reading a dataset's splits: lines, slices, the token streams and the vocabulary.

The datasets themselves (where they live, how they are fetched) are
:mod:`targetlm.data.catalogue`. ``text`` is a directory of the user's own files
(``data.dir``): ``data.train``, ``data.valid`` and ``data.test`` name its files (``train.en``;
``NAME`` or ``NAME.txt``).

A split's name never reaches outside its dataset: a registered dataset's split is one of its
declared splits (:func:`split_path`), and a ``text`` split a file inside ``data.dir`` or one
named by its absolute path (:func:`_text_file`).

A split is read as lines (:func:`targetlm.data.vocab.read_text`: a leading byte-order mark
dropped, invisible separators made spaces; optionally lower-cased and sliced by line
fractions); the tokenizer (``data.tokenizer``,
:mod:`targetlm.data.tokenizers`) learnt on the training lines turns every split's lines
into the token stream, one ``<eos>`` per line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from targetlm.data.catalogue import TEXT, DatasetSpec, get_spec, resolve_dir
from targetlm.data.synthetic import SyntheticLanguage
from targetlm.data.tokenizers import build_tokenizer
from targetlm.data.vocab import (
    EOS,
    DataError,
    Vocabulary,
    count_words,
    has_words,
    read_text_lines,
    tokens_from_lines,
)

if TYPE_CHECKING:
    from targetlm.config import DataConfig


@dataclass
class Corpus:
    """The token stream of each split, the vocabulary of the training split, and each split's
    number of words (whitespace words + line ends: the per-word perplexity's denominator;
    absent for a training split cut by ``data.train_tokens``)."""

    vocab: Vocabulary
    splits: dict[str, Sequence[str]]
    words: dict[str, int] = field(default_factory=dict)


def read_lines(config: DataConfig, split: str) -> list[str]:
    """Lines of one split: a file stem such as ``valid`` or ``news`` (for ``text``, a file name
    in ``data.dir``), optionally sliced; lower-cased with ``data.lowercase``.

    ``stem[a:b]`` keeps the sentences (lines) from fraction a to fraction b of the file, so
    one Brown genre can give a finetuning, a validation and a test part:
    ``news[:0.8]``, ``news[0.8:0.9]``, ``news[0.9:]``. A split (or slice) without a single
    word (empty, or only blank lines) is an error naming the file.
    """
    stem, window = parse_split(split)
    if config.name == "synthetic":
        lines = _synthetic_lines(config, stem)
        lines = [line.lower() for line in lines] if config.lowercase else lines
    else:
        # a registered corpus is read as published (its token counts are the literature's)
        path = split_path(config, split)
        lines = read_text_lines(path, config.lowercase, separators=config.name == TEXT)
    lines = slice_lines(lines, window)
    lacking = _lacking_words(lines)
    if lacking:
        raise DataError(f"{split_source(config, split)} {lacking}")
    return lines


def _lacking_words(lines: list[str]) -> str | None:
    """What a text without a word lacks, as an error says it (None: it has words)."""
    if not lines:
        return "is empty"
    if not has_words(lines):
        return "has no words (only blank lines)"
    return None


def split_path(config: DataConfig, split: str) -> Path:
    """The file of a split of a dataset read from files (not ``synthetic``)."""
    stem, _ = parse_split(split)
    return _text_file(config, stem) if config.name == TEXT else _dataset_file(config, split)


def split_source(config: DataConfig, split: str) -> str:
    """A split as messages name it: ``training file PATH (slice 'news[:0.8]')``."""
    stem, window = parse_split(split)
    role = "training " if split == config.train else ""
    if config.name == "synthetic":
        where = f"{role}synthetic split {stem!r}"
    else:
        where = f"{role}file {split_path(config, split)}"
    return where + (f" (slice {split!r})" if window != (0.0, 1.0) else "")


def read_file(path: str | Path, lowercase: bool = False) -> list[str]:
    """Lines of any text file, read like a split (``eval --file``); a file without a word
    (empty, or only blank lines) is an error."""
    lines = read_text_lines(path, lowercase)
    lacking = _lacking_words(lines)
    if lacking:
        raise DataError(f"{path} {lacking}: nothing to evaluate")
    return lines


def read_split(config: DataConfig, split: str) -> list[str]:
    """Whitespace tokens of one split (:func:`read_lines`), one ``<eos>`` per line."""
    return tokens_from_lines(read_lines(config, split))


def _synthetic_lines(config: DataConfig, stem: str) -> list[str]:
    s = config.synthetic
    sizes = {
        parse_split(config.train)[0]: s.train_sentences,
        parse_split(config.valid)[0]: s.valid_sentences,
        parse_split(config.test)[0]: s.test_sentences,
    }
    if stem not in sizes:
        raise DataError(f"synthetic corpus has splits {', '.join(sizes)}, not {stem!r}")
    tokens = SyntheticLanguage(s.seed, s.nouns, s.verbs, s.adjectives).split(stem, sizes[stem])
    lines: list[str] = []
    words: list[str] = []
    for token in tokens:  # the generator ends every sentence with <eos>
        if token == EOS:
            lines.append(" ".join(words))
            words = []
        else:
            words.append(token)
    return lines


def _dataset_file(config: DataConfig, split: str) -> Path:
    """The file of a registered dataset's split: one of its declared splits, so a split name
    never reads a file outside the dataset's directory."""
    spec = get_spec(config.name)
    stem, _ = parse_split(split)
    check_declared_split(spec, config, split)
    return resolve_dir(config.name, config.dir, (stem,)) / f"{stem}.txt"


def check_declared_split(spec: DatasetSpec, config: DataConfig, split: str) -> None:
    """One error when ``split``'s stem is not a split ``spec`` declares, listing those it has
    (Brown's are its genres: slice one)."""
    stem, _ = parse_split(split)
    if stem in spec.splits:
        return
    keys = [k for k in ("train", "valid", "test") if getattr(config, k) == split]
    key = f"data.{keys[0]}" if keys else "data.valid"
    if spec.name == "brown":
        listed = f"the {len(spec.splits)} genres: {', '.join(spec.splits)}"
    else:
        listed = ", ".join(spec.splits)
    example = "news" if "news" in spec.splits else spec.splits[0]
    raise DataError(
        f"dataset {spec.name!r} has no split {stem!r}; its splits are {listed}; slice one, "
        f'e.g. {key}="{example}[0.8:0.9]"'
    )


def check_text_name(name: str) -> Path | None:
    """A ``text`` split's file name: an absolute path is the user's own file, named in full
    (returned); a relative name must stay inside ``data.dir`` (no ``..``; None: look it up
    there).

    Why absolute paths are allowed and ``..`` is not: an absolute ``data.train`` is a file
    the user points at on purpose and can read anyway, while ``../`` in a name that looks like
    a file of ``data.dir`` silently reads (and copies into ``vocab.txt``) a file elsewhere.
    Registered datasets take neither: their splits are declared (:func:`check_declared_split`).
    """
    path = Path(name)
    if path.is_absolute():
        return path
    if ".." in path.parts:
        raise DataError(
            f"split {name!r}: '..' leaves data.dir; name a file inside data.dir, or give the "
            "file's absolute path"
        )
    return None


def _text_file(config: DataConfig, name: str) -> Path:
    """The user's file ``name`` (or ``name.txt``) in ``data.dir``, or at its absolute path."""
    absolute = check_text_name(name)
    candidates: tuple[Path, ...]
    if absolute is not None:
        candidates = (absolute, absolute.with_name(absolute.name + ".txt"))
    else:
        if not config.dir:
            raise DataError(
                "data.name = 'text' reads your own files: set data.dir to their directory"
            )
        directory = Path(config.dir)
        if not directory.is_dir():
            raise DataError(f"data.dir {directory} does not exist or is not a directory")
        candidates = (directory / name, directory / f"{name}.txt")
    for path in candidates:
        if path.is_file():
            return path
    if absolute is not None:
        raise DataError(f"no file {absolute} (nor {candidates[1]})")
    raise DataError(
        f"no file {candidates[0]} (data.train, data.valid and data.test name files in "
        f"data.dir {config.dir}, or give a file's absolute path)"
    )


_SLICE = re.compile(r"^(?P<stem>[^\[\]]+)(\[(?P<start>[0-9.]*):(?P<stop>[0-9.]*)\])?$")


def parse_split(split: str) -> tuple[str, tuple[float, float]]:
    """``"news[0.8:0.9]"`` -> ``("news", (0.8, 0.9))``; a plain stem keeps everything (0, 1)."""
    match = _SLICE.match(split)
    try:
        if match is None:
            raise ValueError
        start = float(match["start"]) if match["start"] else 0.0
        stop = float(match["stop"]) if match["stop"] else 1.0
    except ValueError:
        raise DataError(
            f"split {split!r}: expected a file stem, optionally sliced by line fractions "
            "like 'news[0.8:0.9]'"
        ) from None
    if not 0 <= start < stop <= 1:
        raise DataError(f"split {split!r}: need 0 <= start < stop <= 1")
    return match["stem"], (start, stop)


def slice_lines(lines: list[str], window: tuple[float, float]) -> list[str]:
    """The lines from fraction ``window[0]`` to fraction ``window[1]`` of ``lines``."""
    if window == (0.0, 1.0):
        return lines
    first, last = (round(fraction * len(lines)) for fraction in window)
    return lines[first:last]


def load_corpus(config: DataConfig, splits: tuple[str, ...] | None = None) -> Corpus:
    """Read the splits, fit the tokenizer on the training lines, and build the vocabulary
    from the training stream only."""
    wanted = splits or (config.train, config.valid, config.test)
    lines = {split: read_lines(config, split) for split in dict.fromkeys((config.train, *wanted))}
    tokenizer = build_tokenizer(config)
    tokenizer.fit(lines[config.train])
    tokens = {split: tokenizer.tokenize(split_lines) for split, split_lines in lines.items()}
    words = {split: count_words(split_lines) for split, split_lines in lines.items()}
    if config.train_tokens and config.train_tokens < len(tokens[config.train]):
        tokens[config.train] = tokens[config.train][: config.train_tokens]
        del words[config.train]
    return Corpus(tokenizer.vocabulary(tokens[config.train]), tokens, words)


def check_training_tokens(config: DataConfig, corpus: Corpus) -> None:
    """One error naming the training file when its stream cannot fill one token per row of
    ``data.batch_size`` (before the training batches are cut)."""
    tokens = len(corpus.splits[config.train])
    if tokens < config.batch_size:
        raise DataError(
            f"{split_source(config, config.train)}: {tokens:,} training tokens are too few for "
            f"data.batch_size = {config.batch_size}"
        )
