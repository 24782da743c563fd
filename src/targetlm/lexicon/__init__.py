"""Characters of words and WordNet relations/definitions (GroC's grounding), cached per vocabulary."""

from targetlm.lexicon.characters import BOW, EOW, NUM_CHARACTERS, PAD, encode_characters
from targetlm.lexicon.lexicon import Lexicon, LexiconError
from targetlm.lexicon.wordnet import coverage, load_lexicon, open_wordnet, wordnet_entry

__all__ = [
    "BOW",
    "EOW",
    "NUM_CHARACTERS",
    "PAD",
    "Lexicon",
    "LexiconError",
    "coverage",
    "encode_characters",
    "load_lexicon",
    "open_wordnet",
    "wordnet_entry",
]
