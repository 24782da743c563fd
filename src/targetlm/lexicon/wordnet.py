"""WordNet 3.0 through NLTK over local files: entries for a vocabulary, cached per vocabulary.

Install WordNet offline with ``bash scripts/install_wordnet.sh SHARED_DATA_DIR`` (Debian's
``wordnet-base`` + ``wordnet-sense-index`` + ``lexnames``) or online with
``python -m nltk.downloader wordnet``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from targetlm.lexicon.lexicon import Lexicon, LexiconError, vocabulary_key

INSTALL_HINT = (
    "run `bash scripts/install_wordnet.sh $TARGETLM_DATA` (offline, Debian packages) "
    "or `python -m nltk.downloader wordnet`"
)
_TOKEN = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")


def open_wordnet() -> Any:
    """NLTK's WordNet reader, loaded; a one-line :class:`LexiconError` when it is missing."""
    try:
        import nltk
        from nltk.corpus import wordnet
    except ImportError:
        raise LexiconError(
            "the WordNet lexicon needs NLTK: pip install nltk (or pip install 'targetlm[lexicon]')"
        ) from None
    try:
        nltk.data.find("corpora/wordnet")
        wordnet.ensure_loaded()
    except (LookupError, OSError) as error:
        detail = str(error).strip().splitlines()
        missing = "not found" if isinstance(error, LookupError) else detail[-1] if detail else ""
        raise LexiconError(f"WordNet 3.0 for NLTK: {missing}; {INSTALL_HINT}") from None
    return wordnet


def wordnet_available() -> bool:
    """Whether NLTK finds WordNet files (cheap: nothing is loaded)."""
    try:
        import nltk

        nltk.data.find("corpora/wordnet")
    except (ImportError, LookupError):
        return False
    return True


def wordnet_entry(
    wordnet: Any, word: str, max_relations: int = 3, max_definition: int = 10
) -> tuple[list[str], list[str]]:
    """A word's related words and gloss words (Pappas et al. 2020).

    Related: synonyms (other lemmas of its synsets, in WordNet's sense order), then
    hyponyms of its first synset, at most ``max_relations``. Gloss: the first
    ``max_definition`` tokens of the first synset's definition (lowercased; words,
    numbers, inner apostrophes and hyphens). NLTK's morphy maps inflected forms
    ("dogs") to their lemma.
    """
    try:
        synsets = wordnet.synsets(word)
    except Exception:  # noqa: BLE001  odd strings (e.g. a lone "_") make morphy raise
        return [], []
    if not synsets:
        return [], []
    related: list[str] = []
    seen = {word.lower()}

    def add(name: str) -> None:
        if len(related) < max_relations and name.lower() not in seen:
            seen.add(name.lower())
            related.append(name)

    for synset in synsets:
        for name in synset.lemma_names():
            add(name)
    for hyponym in synsets[0].hyponyms():
        add(hyponym.lemma_names()[0])
    gloss = _TOKEN.findall(synsets[0].definition().lower())[:max_definition]
    return related, gloss


def lexicon_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "targetlm" / "lexicon"


def load_lexicon(
    words: Sequence[str],
    max_relations: int = 3,
    max_definition: int = 10,
    cache_dir: str | Path | None = None,
) -> Lexicon:
    """The WordNet lexicon of ``words``: read from ``cache_dir`` (default
    ``~/.cache/targetlm/lexicon``) or built from WordNet once and saved there, as
    ``<hash of the words and settings>.json``."""
    words = list(words)
    key = vocabulary_key(words, "wordnet-3.0", max_relations, max_definition)
    path = Path(cache_dir or lexicon_cache_dir()) / f"{key}.json"
    if path.is_file():
        return Lexicon.load(path)
    wordnet = open_wordnet()
    relations, definitions = {}, {}
    for word in words:
        related, gloss = wordnet_entry(wordnet, word, max_relations, max_definition)
        if related:
            relations[word] = related
        if gloss:
            definitions[word] = gloss
    lexicon = Lexicon(relations, definitions, max_relations, max_definition)
    with contextlib.suppress(OSError):  # a read-only cache only costs the rebuild next time
        lexicon.save(path)
    return lexicon


def coverage(words: Sequence[str], lexicon: Lexicon | None = None) -> dict[str, float]:
    """Fractions of ``words`` with WordNet relations / definitions (paper: PTB 78% / 86%,
    WikiText-2 73% / 76%)."""
    return (lexicon or load_lexicon(words)).coverage(words)
