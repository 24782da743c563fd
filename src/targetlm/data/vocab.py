"""Reading tokenized text and the Vocabulary."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

UNK = "<unk>"
EOS = "<eos>"
SPECIALS = (UNK, EOS)


class DataError(ValueError):
    """A corpus file is missing, empty or unreadable."""


def read_tokens(path: str | Path, lowercase: bool = False) -> list[str]:
    """Whitespace tokens of a one-sentence-per-line file, with one ``<eos>`` per line.

    Empty lines count too (they yield a lone ``<eos>``), the convention of Zaremba et al.
    and pytorch/examples: PTB train gives 929,589 tokens, WikiText-2 train 2,088,628.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"corpus file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(
            f"{path}, line {line}: undecodable bytes (not UTF-8): {raw[error.start : error.end]!r}"
        ) from None
    return tokens_from_text(text, lowercase)


def tokens_from_text(text: str, lowercase: bool = False) -> list[str]:
    if lowercase:
        text = text.lower()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    tokens: list[str] = []
    for line in lines:
        tokens.extend(line.split())
        tokens.append(EOS)
    return tokens


class Vocabulary:
    """Word types of a training corpus with their counts.

    Ids: the specials first (``<unk>`` = 0, ``<eos>`` = 1), then words by descending
    count, ties broken alphabetically, so ids are deterministic and frequency-ranked
    (what adaptive embeddings and frequency-bin analyses expect).
    """

    def __init__(self, words: Sequence[str], counts: Sequence[int]) -> None:
        if len(words) != len(counts):
            raise DataError("vocabulary: words and counts differ in length")
        if list(words[: len(SPECIALS)]) != list(SPECIALS):
            raise DataError(
                f"vocabulary: must start with {', '.join(SPECIALS)}, got {list(words[:2])}"
            )
        self.itos = list(words)
        self.counts = list(counts)
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise DataError("vocabulary: a word appears twice")

    @classmethod
    def build(cls, tokens: Iterable[str], max_size: int | None = None) -> Vocabulary:
        counter = Counter(tokens)
        specials = [(s, counter.pop(s, 0)) for s in SPECIALS]
        ranked = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(SPECIALS))]
        words, counts = zip(*(specials + ranked))
        return cls(words, counts)

    def extend(self, tokens: Iterable[str]) -> Vocabulary:
        """This vocabulary, ids unchanged, followed by the words of ``tokens`` it lacks
        (by descending count, ties alphabetically): the vocabulary of a finetuning run.

        Counts add up: a word's count is its count in everything the model was trained on.
        """
        counter = Counter(tokens)
        counts = [count + counter.pop(word, 0) for word, count in zip(self.itos, self.counts)]
        added = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
        return Vocabulary([*self.itos, *(w for w, _ in added)], [*counts, *(c for _, c in added)])

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
        """Token ids (int64); words outside the vocabulary map to ``<unk>``."""
        unk = self.unk_id
        return torch.tensor([self.stoi.get(t, unk) for t in tokens], dtype=torch.long)

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[i] for i in ids]

    def oov_rate(self, tokens: Sequence[str]) -> float:
        """Fraction of tokens that are not vocabulary words (mapped to ``<unk>``)."""
        if not tokens:
            return 0.0
        return sum(t not in self.stoi for t in tokens) / len(tokens)

    def unigram_perplexity(self, tokens: Sequence[str]) -> float:
        """Perplexity of ``tokens`` under the add-one-smoothed unigram model of the training counts.

        The reference a language model must beat: p(w) = (count(w) + 1) / (N + |V|), OOV words
        scored as ``<unk>``.
        """
        total = sum(self.counts) + len(self)
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

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_lines(), encoding="utf-8")

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
