"""Reading text, token streams, the Vocabulary and the tokenizer interface.

:class:`Tokenizer` (and :class:`SymbolTokenizer`, whose ids are the vocabulary's) is declared
here, beside the :class:`Vocabulary` it makes and is saved with, because each names the other;
the tokenizers themselves live in :mod:`targetlm.data.tokenizers`, above this module.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar, overload

import torch

UNK = "<unk>"
EOS = "<eos>"
SPECIALS = (UNK, EOS)
UNK_ID, EOS_ID = SPECIALS.index(UNK), SPECIALS.index(EOS)
BOM = "\ufeff"  # a UTF-8 byte-order mark: not part of the first word


class DataError(ValueError):
    """A corpus file is missing, empty or unreadable."""


# Word separators besides Python's whitespace (``str.split()``: every Unicode Zs, Zl, Zp
# character, tabs, line and paragraph separators, NBSP): the invisible ones that separate words
# in real text yet are not whitespace to Python. The reader turns each into a space, so no
# tokenizer ever sees a word glued to an invisible character.
INVISIBLE_SEPARATORS = (
    "\u200b",  # zero-width space
    "\u2060",  # word joiner
    "\ufeff",  # zero-width no-break space (a byte-order mark inside a line)
)
_SEPARATORS_TO_SPACE = str.maketrans(dict.fromkeys(INVISIBLE_SEPARATORS, " "))


def normalize_separators(text: str) -> str:
    """``text`` with every :data:`INVISIBLE_SEPARATORS` character made a space."""
    return text.translate(_SEPARATORS_TO_SPACE)


def read_text(path: str | Path, kind: str = "corpus file", separators: bool = True) -> str:
    """The text of a UTF-8 file: the one reader of every command's text (corpora, ``eval`` and
    ``score`` files, prompts, sources and references to translate).

    A leading byte-order mark is dropped; the invisible separators (:data:`INVISIBLE_SEPARATORS`)
    become spaces, unless ``separators`` is False: the registered corpora are read as
    published, so their token counts are the literature's (WikiText-2's training split has
    nine lone U+FEFF tokens). Refused in one :class:`DataError` naming the file (``kind`` says what it
    is: "prompt file"): a missing file, a directory, bytes that are not UTF-8 and a NUL
    character (binary data), both with their line number.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a directory, not a text file")
    if not path.exists():  # a pipe (`--file <(...)`) or a device reads as a file does
        raise DataError(f"{kind} not found: {path}")
    raw = _read_bounded(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(
            f"{path}, line {line}: undecodable bytes (not UTF-8): {raw[error.start : error.end]!r}"
        ) from None
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise DataError(f"{path}, line {line}: a NUL character (binary data, not text)")
    text = text.removeprefix(BOM)
    return normalize_separators(text) if separators else text


# the largest text file read (whole, into memory): more is refused before memory runs out
MAX_TEXT_BYTES = 2**32


def _read_bounded(path: Path) -> bytes:
    """The bytes of ``path``, read in pieces: a NUL byte (binary data: ``/dev/zero``) is refused
    at the piece it is in, and a file past :data:`MAX_TEXT_BYTES` when it gets there, each in
    one :class:`DataError`, instead of reading until memory runs out."""
    pieces: list[bytes] = []
    size, lines = 0, 0
    try:
        with path.open("rb") as handle:
            while piece := handle.read(1 << 24):
                nul = piece.find(b"\0")
                if nul >= 0:
                    line = lines + piece.count(b"\n", 0, nul) + 1
                    raise DataError(f"{path}, line {line}: a NUL character (binary data, not text)")
                size, lines = size + len(piece), lines + piece.count(b"\n")
                if size > MAX_TEXT_BYTES:
                    raise DataError(
                        f"{path}: larger than {MAX_TEXT_BYTES:,} bytes, the most a text is read "
                        "whole; split it"
                    )
                pieces.append(piece)
    except OSError as error:  # unreadable: permissions, a broken device
        raise DataError(f"{path}: cannot be read ({error.strerror})") from None
    return b"".join(pieces)


def read_text_lines(
    path: str | Path, lowercase: bool = False, kind: str = "corpus file", separators: bool = True
) -> list[str]:
    """The lines of a text file (:func:`read_text`, :func:`lines_from_text`)."""
    return lines_from_text(read_text(path, kind, separators), lowercase)


def has_words(lines: Iterable[str]) -> bool:
    """Whether any line holds a word (a line of whitespace only holds none)."""
    return any(line.split() for line in lines)


def lines_from_text(text: str, lowercase: bool = False) -> list[str]:
    """The lines of ``text`` (``\\n`` or ``\\r\\n`` ends one; the final one ends the last line)."""
    if lowercase:
        text = text.lower()
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    return lines


def tokens_from_lines(lines: Iterable[str]) -> list[str]:
    """Whitespace tokens of each line followed by ``<eos>``: the word stream."""
    tokens: list[str] = []
    for line in lines:
        tokens.extend(line.split())
        tokens.append(EOS)
    return tokens


def count_words(lines: Sequence[str]) -> int:
    """Words of ``lines`` as a word model counts its tokens: whitespace-separated words plus one
    per line end (its ``<eos>``). The denominator of the per-word perplexity."""
    return sum(len(line.split()) for line in lines) + len(lines)


def read_tokens(path: str | Path, lowercase: bool = False) -> list[str]:
    """Whitespace tokens of a one-sentence-per-line file, with one ``<eos>`` per line.

    Empty lines count too (they yield a lone ``<eos>``), the convention of Zaremba et al.
    and pytorch/examples: PTB train gives 929,589 tokens, WikiText-2 train 2,088,628.
    """
    return tokens_from_text(read_text(path), lowercase)


def tokens_from_text(text: str, lowercase: bool = False) -> list[str]:
    return tokens_from_lines(lines_from_text(text, lowercase))


class EncodedTokens(Sequence[str]):
    """A token stream held as the ids of a symbol tokenizer (bytes, BPE, unigram), read as
    token strings on demand.

    A vocabulary made of the tokenizer's symbols (the same ids) encodes it with no per-token
    lookup: the ids come from the tokenizer (Rust-side for BPE / unigram) as they are.

    Args:
        ids: (N,) int64 ids of ``tokenizer.symbols``, one ``<eos>`` after every line.
        tokenizer: the tokenizer that made them.
    """

    def __init__(self, ids: torch.Tensor, tokenizer: SymbolTokenizer) -> None:
        self.ids = ids
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return self.ids.numel()

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> EncodedTokens: ...

    def __getitem__(self, index: int | slice) -> str | EncodedTokens:
        if isinstance(index, slice):
            return EncodedTokens(self.ids[index], self.tokenizer)
        return self.tokenizer.symbols[int(self.ids[index])]

    def __iter__(self) -> Iterator[str]:
        symbols = self.tokenizer.symbols
        return (symbols[i] for i in self.ids.tolist())

    def __repr__(self) -> str:
        return f"EncodedTokens({len(self)} tokens of {type(self.tokenizer).__name__})"


class Vocabulary:
    """Word types of a training corpus with their counts.

    Ids: the specials first (``<unk>`` = 0, ``<eos>`` = 1), then words by descending
    count, ties broken alphabetically, so ids are deterministic and frequency-ranked
    (what adaptive embeddings and frequency-bin analyses expect). A symbol tokenizer's
    vocabulary (bytes, BPE, unigram) is its symbols in its own id order instead
    (``targetlm.data.tokenizers``); a pretrained model's (``hf``) has its specials where
    the model has them.

    ``tokenizer``: what made the tokens, saved with the vocabulary (:meth:`save`); None for
    a vocabulary built directly from words.
    """

    def __init__(
        self, words: Sequence[str], counts: Sequence[int], tokenizer: Tokenizer | None = None
    ) -> None:
        if len(words) != len(counts):
            raise DataError("vocabulary: words and counts differ in length")
        if not set(SPECIALS) <= set(words):
            raise DataError(f"vocabulary: must hold {', '.join(SPECIALS)}")
        self.itos = list(words)
        self.counts = list(counts)
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise DataError("vocabulary: a word appears twice")
        self.tokenizer = tokenizer

    @classmethod
    def build(
        cls,
        tokens: Iterable[str],
        max_size: int | None = None,
        min_count: int = 1,
        tokenizer: Tokenizer | None = None,
    ) -> Vocabulary:
        """The vocabulary of a word stream: its words seen at least ``min_count`` times, at most
        ``max_size`` entries with the specials; the occurrences of the words left out count
        as ``<unk>``, which is what they become."""
        counter = Counter(tokens)
        specials = {s: counter.pop(s, 0) for s in SPECIALS}
        ranked = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
        kept = [(w, c) for w, c in ranked if c >= min_count]
        if max_size is not None:
            kept = kept[: max(0, max_size - len(SPECIALS))]
        specials[UNK] += sum(counter.values()) - sum(c for _, c in kept)
        words, counts = zip(*(list(specials.items()) + kept))
        return cls(words, counts, tokenizer)

    def extend(self, tokens: Iterable[str]) -> Vocabulary:
        """This vocabulary, ids unchanged, followed by the words of ``tokens`` it lacks
        (by descending count, ties alphabetically): the vocabulary of a finetuning run.

        Counts add up: a word's count is its count in everything the model was trained on.
        A symbol tokenizer's stream (:class:`EncodedTokens`) adds no symbols: it must be of
        this vocabulary's tokenizer.
        """
        if isinstance(tokens, EncodedTokens):
            if not self.holds(tokens):
                raise DataError(
                    f"the new text was tokenized by another {type(tokens.tokenizer).__name__} "
                    f"than the one of this vocabulary ({len(self)} symbols): finetuning reads "
                    "the new text with the source run's tokenizer (set data.tokenizer_file to "
                    "its tokenizer.json; `targetlm finetune` does)"
                )
            added = torch.bincount(tokens.ids, minlength=len(self)).tolist()
            counts = [c + a for c, a in zip(self.counts, added)]
            return Vocabulary(self.itos, counts, tokens.tokenizer)
        counter = Counter(tokens)
        counts = [count + counter.pop(word, 0) for word, count in zip(self.itos, self.counts)]
        added = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
        return Vocabulary(
            [*self.itos, *(w for w, _ in added)],
            [*counts, *(c for _, c in added)],
            self.tokenizer,
        )

    def holds(self, tokens: EncodedTokens) -> bool:
        """Whether ``tokens``' ids are ids of this vocabulary (its tokenizer's symbols come first)."""
        symbols = tokens.tokenizer.symbols
        return self.itos[: len(symbols)] == list(symbols)

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    @property
    def unk_id(self) -> int:
        return self.stoi[UNK]

    @property
    def eos_id(self) -> int:
        return self.stoi[EOS]

    def encode(self, tokens: Sequence[str]) -> torch.Tensor:
        """Token ids (int64); words outside the vocabulary map to ``<unk>``. A symbol
        tokenizer's stream of this vocabulary is already ids: they are returned as they are."""
        if isinstance(tokens, EncodedTokens) and self.holds(tokens):
            return tokens.ids.clone()
        unk = self.unk_id
        return torch.tensor([self.stoi.get(t, unk) for t in tokens], dtype=torch.long)

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[i] for i in ids]

    def oov_rate(self, tokens: Sequence[str]) -> float:
        """Fraction of tokens that are not vocabulary words (mapped to ``<unk>``)."""
        if not tokens:
            return 0.0
        if isinstance(tokens, EncodedTokens) and self.holds(tokens):
            return 0.0  # every symbol is a vocabulary entry
        return sum(t not in self.stoi for t in tokens) / len(tokens)

    def unigram_perplexity(self, tokens: Sequence[str]) -> float:
        """Perplexity of ``tokens`` under the add-one-smoothed unigram model of the training counts.

        The reference a language model must beat: p(w) = (count(w) + 1) / (N + |V|), OOV words
        scored as ``<unk>``.
        """
        total = sum(self.counts) + len(self)
        if isinstance(tokens, EncodedTokens) and self.holds(tokens):
            counts = torch.tensor(self.counts, dtype=torch.float64)
            log_probs_t = (counts + 1).log() - math.log(total)  # (V,)
            return math.exp(-float(log_probs_t[tokens.ids].mean())) if len(tokens) else 1.0
        log_probs = [math.log(c + 1) - math.log(total) for c in self.counts]
        unk = self.unk_id
        nll = -sum(log_probs[self.stoi.get(t, unk)] for t in tokens)
        return math.exp(nll / max(len(tokens), 1))

    # --- persistence: one "word<TAB>count" line per id -------------------------
    def to_lines(self) -> str:
        return "".join(f"{w}\t{c}\n" for w, c in zip(self.itos, self.counts))

    @classmethod
    def from_lines(cls, text: str) -> Vocabulary:
        words, counts = [], []
        for number, line in enumerate(text.splitlines(), 1):
            word, sep, count = line.rpartition("\t")
            if not sep or not count.isdigit():
                raise DataError(
                    f"vocabulary line {number}: expected 'word<TAB>count', got {line!r}"
                )
            words.append(word)
            counts.append(int(count))
        return cls(words, counts)

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer that reads text into this vocabulary's tokens (a run's vocabulary
        always has one); a :class:`DataError` for a vocabulary built from words alone."""
        if self.tokenizer is None:
            raise DataError(
                f"this vocabulary ({len(self)} words) has no tokenizer: it was built from words, "
                "not loaded with a run"
            )
        return self.tokenizer

    def save(self, path: str | Path) -> None:
        """Write ``path`` (``vocab.txt``) and, beside it, the tokenizer's own file when it has
        one (``tokenizer.json`` of BPE / unigram): a run directory holds both."""
        Path(path).write_text(self.to_lines(), encoding="utf-8")
        if self.tokenizer is not None:
            self.tokenizer.write(Path(path).parent)

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        try:
            return cls.from_lines(Path(path).read_text(encoding="utf-8"))
        except (DataError, UnicodeDecodeError) as error:
            raise DataError(f"{path}: {error}") from None

    def state_dict(self) -> dict[str, list]:
        return {"words": list(self.itos), "counts": list(self.counts)}

    @classmethod
    def from_state_dict(cls, state: dict[str, list]) -> Vocabulary:
        return cls(state["words"], state["counts"])


class Tokenizer(ABC):
    """Lines of text -> a token stream with one ``<eos>`` after every line, and back."""

    name: ClassVar[str]
    file: ClassVar[str | None] = None  # what write() puts into a run directory

    def fit(self, lines: Sequence[str]) -> None:  # noqa: B027 (nothing to learn by default)
        """Learn from the training split's lines."""

    @abstractmethod
    def tokenize(self, lines: Sequence[str]) -> Sequence[str]:
        """The stream of ``lines``: each line's tokens, then ``<eos>``."""

    @abstractmethod
    def vocabulary(self, tokens: Sequence[str]) -> Vocabulary:
        """The vocabulary of the training stream ``tokens``, with its counts."""

    @abstractmethod
    def decode(self, tokens: Sequence[str]) -> str:
        """The text of a stream; each ``<eos>`` ends a line (``"\\n"``)."""

    def write(self, directory: Path) -> None:  # noqa: B027 (nothing to save by default)
        """Save what :meth:`read` needs into ``directory`` (a run directory)."""

    def read(self, path: Path) -> None:
        """Load the file :meth:`write` wrote."""
        raise DataError(f"the {self.name} tokenizer has no file to read ({path})")

    def check(self, vocab: Vocabulary, where: str) -> None:  # noqa: B027 (any words fit)
        """Raise :class:`DataError` unless ``vocab`` can be this tokenizer's vocabulary."""


class SymbolTokenizer(Tokenizer):
    """A tokenizer with a fixed inventory of symbols whose ids are the vocabulary's ids."""

    @property
    @abstractmethod
    def symbols(self) -> list[str]:
        """The symbols in id order, ``<unk>`` and ``<eos>`` first."""

    @abstractmethod
    def tokenize(self, lines: Sequence[str]) -> EncodedTokens: ...

    @abstractmethod
    def decode_ids(self, ids: torch.Tensor) -> str:
        """The text of a stream of ids (N,)."""

    def vocabulary(self, tokens: Sequence[str]) -> Vocabulary:
        counts = torch.bincount(self._ids(tokens), minlength=len(self.symbols))
        return Vocabulary(self.symbols, counts.tolist(), tokenizer=self)

    def decode(self, tokens: Sequence[str]) -> str:
        return self.decode_ids(self._ids(tokens))

    def check(self, vocab: Vocabulary, where: str) -> None:
        if vocab.itos != self.symbols:
            raise DataError(
                f"{where}: the {self.name} tokenizer's {len(self.symbols):,} symbols do not match "
                f"the run's vocabulary ({len(vocab):,} entries, vocab.txt): they belong to "
                "different runs"
            )

    def _ids(self, tokens: Sequence[str]) -> torch.Tensor:
        if isinstance(tokens, EncodedTokens) and tokens.tokenizer.symbols == self.symbols:
            return tokens.ids
        index = {symbol: i for i, symbol in enumerate(self.symbols)}
        return torch.tensor([index.get(t, UNK_ID) for t in tokens], dtype=torch.long)
