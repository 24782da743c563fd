"""Corpora, vocabulary, batching and the dataset registry."""

from targetlm.data.batching import IGNORE, StreamBatches, with_context_token
from targetlm.data.datasets import DATASETS, Corpus, download, load_corpus, read_split, resolve_dir
from targetlm.data.vocab import EOS, UNK, DataError, Vocabulary, read_tokens, tokens_from_text

__all__ = [
    "DATASETS",
    "EOS",
    "IGNORE",
    "UNK",
    "Corpus",
    "DataError",
    "StreamBatches",
    "Vocabulary",
    "download",
    "load_corpus",
    "read_split",
    "read_tokens",
    "resolve_dir",
    "tokens_from_text",
    "with_context_token",
]
