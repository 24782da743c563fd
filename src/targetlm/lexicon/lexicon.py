"""The lexicon GroC grounds words in: per word, related words and definition (gloss) words."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from targetlm.data.vocab import DataError

FORMAT_VERSION = 1


class LexiconError(DataError):
    """WordNet (or NLTK) is missing, or a lexicon file is unreadable."""


class Lexicon:
    """Per word: up to ``max_relations`` related words (WordNet synonyms/hyponyms) and up to
    ``max_definition`` words of its gloss (Pappas et al. 2020). Words without an
    entry have neither; lookups never fail.

    Args:
        relations / definitions: word -> list of strings (longer lists are cut).
    """

    def __init__(
        self,
        relations: Mapping[str, Sequence[str]] | None = None,
        definitions: Mapping[str, Sequence[str]] | None = None,
        max_relations: int = 3,
        max_definition: int = 10,
    ) -> None:
        self.max_relations = max_relations
        self.max_definition = max_definition
        self._relations = {w: list(r[:max_relations]) for w, r in (relations or {}).items() if r}
        self._definitions = {
            w: list(d[:max_definition]) for w, d in (definitions or {}).items() if d
        }

    def relations(self, word: str) -> list[str]:
        return self._relations.get(word, [])

    def definition(self, word: str) -> list[str]:
        return self._definitions.get(word, [])

    def __len__(self) -> int:
        return len(self._relations.keys() | self._definitions.keys())

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Lexicon)
            and self._relations == other._relations
            and self._definitions == other._definitions
        )

    def truncated(self, max_relations: int, max_definition: int) -> Lexicon:
        """The same lexicon with at most ``max_relations`` / ``max_definition`` strings per word."""
        return Lexicon(self._relations, self._definitions, max_relations, max_definition)

    def without(self, fraction: float, seed: int = 0) -> Lexicon:
        """Remove the entries of a random ``fraction`` of its words (Pappas et al. Table 4)."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        words = sorted(self._relations.keys() | self._definitions.keys())
        dropped = set(random.Random(seed).sample(words, round(fraction * len(words))))
        keep = lambda table: {w: v for w, v in table.items() if w not in dropped}  # noqa: E731
        return Lexicon(
            keep(self._relations),
            keep(self._definitions),
            self.max_relations,
            self.max_definition,
        )

    def merged(self, other: Lexicon) -> Lexicon:
        """Entries of both (``other`` wins), e.g. a new vocabulary's words for open-vocabulary use."""
        return Lexicon(
            {**self._relations, **other._relations},
            {**self._definitions, **other._definitions},
            max(self.max_relations, other.max_relations),
            max(self.max_definition, other.max_definition),
        )

    def coverage(self, words: Iterable[str]) -> dict[str, float]:
        """Fractions of ``words`` with related words / with a definition (the paper reports PTB 78% / 86%)."""
        words = list(words)
        n = max(len(words), 1)
        return {
            "words": len(words),
            "relations": sum(w in self._relations for w in words) / n,
            "definitions": sum(w in self._definitions for w in words) / n,
        }

    # --- persistence: one compact JSON file ---------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": FORMAT_VERSION,
            "max_relations": self.max_relations,
            "max_definition": self.max_definition,
            "relations": self._relations,
            "definitions": self._definitions,
        }

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(
            json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":")), "utf-8"
        )
        temporary.replace(path)  # atomic: a concurrent reader never sees half a file

    @classmethod
    def load(cls, path: str | Path) -> Lexicon:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            if data.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {data.get('version')}, expected {FORMAT_VERSION}")
            return cls(
                data["relations"],
                data["definitions"],
                data["max_relations"],
                data["max_definition"],
            )
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise LexiconError(f"{path}: not a lexicon file ({error})") from None


def vocabulary_key(words: Sequence[str], *settings: object) -> str:
    """A short hash of a word list and the settings a lexicon was built with (its cache name)."""
    digest = hashlib.sha256("\n".join([*map(str, settings), *words]).encode("utf-8"))
    return digest.hexdigest()[:16]
