"""Corpora, tokenizers, vocabulary, batching and the dataset catalogue."""

from targetlm.data.batching import IGNORE, StreamBatches, with_context_token
from targetlm.data.catalogue import DATASETS, download, resolve_dir
from targetlm.data.glue import GLUE_TASKS, GlueTask, read_glue_split
from targetlm.data.readers import Corpus, load_corpus, read_file, read_lines, read_split
from targetlm.data.tokenizers import TOKENIZERS, build_tokenizer, load_tokenizer
from targetlm.data.vocab import (
    EOS,
    UNK,
    DataError,
    EncodedTokens,
    Tokenizer,
    Vocabulary,
    count_words,
    read_text,
    read_tokens,
    tokens_from_text,
)

__all__ = [
    "DATASETS",
    "GLUE_TASKS",
    "GlueTask",
    "EOS",
    "IGNORE",
    "TOKENIZERS",
    "UNK",
    "Corpus",
    "DataError",
    "EncodedTokens",
    "StreamBatches",
    "Tokenizer",
    "Vocabulary",
    "build_tokenizer",
    "count_words",
    "download",
    "load_corpus",
    "load_tokenizer",
    "read_file",
    "read_glue_split",
    "read_lines",
    "read_split",
    "read_text",
    "read_tokens",
    "resolve_dir",
    "tokens_from_text",
    "with_context_token",
]
