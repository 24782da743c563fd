"""A deterministic toy language with real structure: the default corpus.

A small probabilistic grammar over a Zipfian lexicon of pseudo-words::

    S   -> NP_subj VP [and S]            (at most one coordination)
    NP  -> Det [Adj] N [PP]              (PP only at depth 0)
    VP  -> Vi | Vt NP_obj [PP]
    PP  -> P NP

Structure a model can learn and a unigram model cannot:
- agreement: singular determiners (a, every, this) take singular nouns; singular
  subjects take verbs ending in -s; plural nouns end in -s;
- selection: nouns fall into semantic classes; each adjective modifies one class,
  each verb takes subjects of one class and objects of another;
- Zipfian choice inside every category, so the unigram distribution is skewed too.

The same seed always gives the same corpus, split by split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from targetlm.data.vocab import EOS

_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "tr",
    "st",
    "pl",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "n", "m", "r", "l", "k", "t"]

SINGULAR_DETS = ["a", "every", "this"]
PLURAL_DETS = ["many", "these", "few"]
SHARED_DETS = ["the", "some", "no"]
PREPOSITIONS = ["in", "near", "under", "with", "behind", "over"]
NUM_CLASSES = 6


def _pseudo_words(rng: random.Random, count: int, syllables: int, taken: set[str]) -> list[str]:
    words: list[str] = []
    while len(words) < count:
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
        )
        if word not in taken and not word.endswith("s"):
            taken.add(word)
            words.append(word)
    return words


def _zipf_choice(rng: random.Random, items: list):
    weights = [1.0 / (rank + 1) for rank in range(len(items))]
    return rng.choices(items, weights)[0]


@dataclass(frozen=True)
class _Lexicon:
    nouns: list[list[str]]  # per semantic class
    verbs_intransitive: list[tuple[str, int]]  # (stem, subject class)
    verbs_transitive: list[tuple[str, int, int]]  # (stem, subject class, object class)
    adjectives: list[list[str]]  # per semantic class


def _lexicon(seed: int, nouns: int, verbs: int, adjectives: int) -> _Lexicon:
    rng = random.Random(seed)
    taken = set(SINGULAR_DETS + PLURAL_DETS + SHARED_DETS + PREPOSITIONS + ["and"])
    noun_words = _pseudo_words(rng, nouns, 2, taken)
    verb_words = _pseudo_words(rng, verbs, 2, taken)
    adjective_words = _pseudo_words(rng, adjectives, 3, taken)
    by_class = [noun_words[c::NUM_CLASSES] for c in range(NUM_CLASSES)]
    adjective_classes = [adjective_words[c::NUM_CLASSES] for c in range(NUM_CLASSES)]
    intransitive = [(v, rng.randrange(NUM_CLASSES)) for v in verb_words[: verbs // 3]]
    transitive = [
        (v, rng.randrange(NUM_CLASSES), rng.randrange(NUM_CLASSES))
        for v in verb_words[verbs // 3 :]
    ]
    return _Lexicon(by_class, intransitive, transitive, adjective_classes)


class SyntheticLanguage:
    """Sentence generator; ``split(name, n)`` gives n sentences, deterministic per (seed, name)."""

    def __init__(self, seed: int = 1234, nouns: int = 300, verbs: int = 120, adjectives: int = 60):
        if min(nouns, verbs, adjectives) < NUM_CLASSES:
            raise ValueError(f"synthetic lexicon sizes must be >= {NUM_CLASSES}")
        self.seed = seed
        self.lexicon = _lexicon(seed, nouns, verbs, adjectives)

    def _noun_phrase(self, rng: random.Random, cls: int, depth: int) -> tuple[list[str], bool]:
        plural = rng.random() < 0.35
        det = rng.choice((PLURAL_DETS if plural else SINGULAR_DETS) + SHARED_DETS)
        words = [det]
        if rng.random() < 0.4:
            words.append(_zipf_choice(rng, self.lexicon.adjectives[cls]))
        noun = _zipf_choice(rng, self.lexicon.nouns[cls])
        words.append(noun + "s" if plural else noun)
        if depth == 0 and rng.random() < 0.25:
            words += self._prepositional_phrase(rng, depth + 1)
        return words, plural

    def _prepositional_phrase(self, rng: random.Random, depth: int) -> list[str]:
        return [
            rng.choice(PREPOSITIONS),
            *self._noun_phrase(rng, rng.randrange(NUM_CLASSES), depth)[0],
        ]

    def _clause(self, rng: random.Random) -> list[str]:
        if rng.random() < 0.35:
            verb, subject_class = _zipf_choice(rng, self.lexicon.verbs_intransitive)
            object_class = None
        else:
            verb, subject_class, object_class = _zipf_choice(rng, self.lexicon.verbs_transitive)
        subject, plural = self._noun_phrase(rng, subject_class, 0)
        words = subject + [verb if plural else verb + "s"]
        if object_class is not None:
            words += self._noun_phrase(rng, object_class, 0)[0]
            if rng.random() < 0.2:
                words += self._prepositional_phrase(rng, 1)
        return words

    def sentence(self, rng: random.Random) -> list[str]:
        words = self._clause(rng)
        if rng.random() < 0.2:
            words += ["and", *self._clause(rng)]
        return words

    def split(self, name: str, sentences: int) -> list[str]:
        """Tokens of ``sentences`` sentences, each followed by ``<eos>``."""
        rng = random.Random(f"{self.seed}/{name}")
        tokens: list[str] = []
        for _ in range(sentences):
            tokens += self.sentence(rng)
            tokens.append(EOS)
        return tokens
