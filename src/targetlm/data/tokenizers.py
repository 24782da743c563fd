"""Tokenizers: how lines of text become the token stream a model reads.

Every tokenizer reads a split as lines and ends each line with ``<eos>`` (an empty line is
a lone ``<eos>``), so sentence ends are predicted alike whatever the symbols are::

    line "A dog runs."
    whitespace   A  dog  runs.  <eos>             words: a word vocabulary, the rest is <unk>
    bpe          ĠA  Ġdog  Ġruns  .  <eos>        byte-level BPE learnt on the training split
    unigram      ĠA  Ġdog  Ġrun  s  .  <eos>      byte-level unigram LM (SentencePiece's algorithm)
    bytes        A  <0x20>  d  o  g  ...  <eos>   UTF-8 bytes

``bpe`` and ``unigram`` are trained with the Hugging Face ``tokenizers`` library
(``pip install -e '.[text]'``) on the training split: ``data.vocab_size`` symbols that
include ``<unk>`` (id 0), ``<eos>`` (id 1) and the 256 byte symbols, so no text is out of
vocabulary. Their pre-tokenizer is GPT-2's byte-level one (words, numbers and punctuation
apart; a space is kept with the word after it, as ``Ġ``). Every line is read with one
leading space, so a word is the same symbol at the start of a line as inside it, and
decoding gives the text back exactly. They are saved in the run directory as
``tokenizer.json`` (a plain Hugging Face tokenizer file), which eval, generate and
finetune read.

Symbol tokenizers (bytes, bpe, unigram) have a fixed inventory: their vocabulary is their
symbols in their own id order, with the training split's counts, and their streams are
ids (:class:`~targetlm.data.vocab.EncodedTokens`) encoded in batches, with no per-token
Python on the way.
"""

from __future__ import annotations

import itertools
import json
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import numpy as np
import torch

from targetlm.data.vocab import (
    EOS,
    EOS_ID,
    SPECIALS,
    UNK,
    UNK_ID,
    DataError,
    EncodedTokens,
    SymbolTokenizer,
    Tokenizer,
    Vocabulary,
    tokens_from_lines,
)
from targetlm.registry import MAX_COUNT, MAX_VOCAB, ConfigError, Range, Registry

if TYPE_CHECKING:
    from targetlm.config import DataConfig

NUM_BYTES = 256
TOKENIZER_FILE = "tokenizer.json"
CHUNK_LINES = 65536  # lines per encode_batch call: bounds the memory of the encodings
ADDED_CHAR_STEP = 1e-4  # the unigram trainer's score step between characters it adds at the end


TOKENIZERS: Registry[Tokenizer] = Registry("tokenizer")

WordVocabSize = Annotated[
    int, Range(len(SPECIALS) + 1, MAX_VOCAB, note="it counts <unk> and <eos>")
]
SubwordVocabSize = Annotated[
    int,
    Range(
        len(SPECIALS) + NUM_BYTES + 1,
        MAX_VOCAB,
        note="it counts <unk>, <eos> and the 256 byte symbols",
    ),
]


@TOKENIZERS.register("whitespace")
class WhitespaceTokenizer(Tokenizer):
    """Words split at whitespace. The vocabulary keeps the training split's words seen at
    least ``min_count`` times, at most ``max_size`` entries with ``<unk>`` and ``<eos>``
    (None: all); other words are ``<unk>``."""

    name = "whitespace"

    def __init__(
        self,
        max_size: WordVocabSize | None = None,
        min_count: Annotated[int, Range(1, MAX_COUNT)] = 1,
    ) -> None:
        if max_size is not None and max_size <= len(SPECIALS):
            raise ValueError(
                f"max_size must be > {len(SPECIALS)} (it counts <unk> and <eos>), got {max_size}"
            )
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        self.max_size, self.min_count = max_size, min_count

    def tokenize(self, lines: Sequence[str]) -> list[str]:
        return tokens_from_lines(lines)

    def vocabulary(self, tokens: Sequence[str]) -> Vocabulary:
        return Vocabulary.build(tokens, self.max_size, self.min_count, tokenizer=self)

    def decode(self, tokens: Sequence[str]) -> str:
        text: list[str] = []
        line: list[str] = []
        for token in tokens:
            if token == EOS:
                text.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(token)
        return "".join(text) + " ".join(line)


def _end_lines(ids: torch.Tensor, lengths: torch.Tensor, eos: int = EOS_ID) -> torch.Tensor:
    """The ids of all lines (sum of ``lengths``,) with ``<eos>`` (id ``eos``) after each line."""
    ends = torch.cumsum(lengths + 1, 0) - 1  # where each line's <eos> goes
    stream = torch.full((ids.numel() + lengths.numel(),), eos, dtype=torch.long)
    keep = torch.ones_like(stream, dtype=torch.bool)
    keep[ends] = False
    stream[keep] = ids
    return stream


def _lines_of(ids: torch.Tensor, eos: int = EOS_ID) -> Iterator[tuple[list[int], bool]]:
    """Each line's ids of a stream (N,), and whether an ``<eos>`` (id ``eos``) ended it (the
    last may not)."""
    start = 0
    for end in (ids == eos).nonzero().flatten().tolist():
        yield ids[start:end].tolist(), True
        start = end + 1
    if start < ids.numel():
        yield ids[start:].tolist(), False


BYTE_SYMBOLS = [
    *SPECIALS,
    *(chr(b) if 0x21 <= b <= 0x7E else f"<0x{b:02X}>" for b in range(NUM_BYTES)),
]


@TOKENIZERS.register("bytes")
class ByteTokenizer(SymbolTokenizer):
    """UTF-8 bytes: byte b is id b + 2, after ``<unk>`` and ``<eos>``; printable ASCII reads
    as itself, other bytes as ``<0xNN>``. Nothing to learn and nothing out of vocabulary."""

    name = "bytes"

    @property
    def symbols(self) -> list[str]:
        return BYTE_SYMBOLS

    def tokenize(self, lines: Sequence[str]) -> EncodedTokens:
        data = bytearray("".join(line + "\n" for line in lines).encode("utf-8"))
        if not data:
            return EncodedTokens(torch.empty(0, dtype=torch.long), self)
        ids = torch.frombuffer(data, dtype=torch.uint8).long() + len(SPECIALS)  # (N,)
        ids[ids == ord("\n") + len(SPECIALS)] = EOS_ID  # a line's end is its <eos>
        return EncodedTokens(ids, self)

    def decode_ids(self, ids: torch.Tensor) -> str:
        ids = ids[ids != UNK_ID]
        data = torch.where(ids == EOS_ID, ord("\n"), ids - len(SPECIALS))
        return bytes(data.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


def _spaced(line: str) -> str:
    """A line as a subword tokenizer reads it: with one leading space (the line's first word is
    the symbol it is inside a line); an empty line stays empty (a lone ``<eos>``)."""
    return " " + line if line else line


def _require_library(name: str) -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(
            f"the {name} tokenizer needs the Hugging Face `tokenizers` library: "
            "pip install -e '.[text]' (or pip install tokenizers)"
        ) from None
    return tokenizers


class SubwordTokenizer(SymbolTokenizer):
    """Byte-level subwords learnt on the training split with Hugging Face ``tokenizers``.

    Args:
        vocab_size: symbols including ``<unk>``, ``<eos>`` and the 256 byte symbols
            (training may stop short of it on a small text).
        tokenizer_file: a saved ``tokenizer.json`` to use instead of training one.
    """

    file = TOKENIZER_FILE
    model_type: ClassVar[str]  # the Hugging Face model class: "BPE" | "Unigram"
    eos_id: int = EOS_ID  # the symbol that ends a line

    def __init__(
        self,
        vocab_size: SubwordVocabSize = 8000,
        tokenizer_file: str | None = None,
    ) -> None:
        self._library = _require_library(self.name)
        minimum = len(SPECIALS) + NUM_BYTES
        if vocab_size <= minimum:
            raise ValueError(
                f"vocab_size must be > {minimum} (<unk>, <eos> and the 256 byte symbols), "
                f"got {vocab_size}"
            )
        self.vocab_size, self.tokenizer_file = vocab_size, tokenizer_file
        self._tokenizer: Any = None
        self._symbols: list[str] = []

    @abstractmethod
    def _untrained(self) -> tuple[Any, Any]:
        """A Hugging Face tokenizer with its model, and the trainer of that model."""

    def _canonical(self, tokenizer: Any) -> Any:
        """The trained tokenizer in a form that does not depend on the run (default: as is)."""
        return tokenizer

    @property
    def symbols(self) -> list[str]:
        self._trained()
        return self._symbols

    def _trained(self) -> Any:
        if self._tokenizer is None:
            raise DataError(f"the {self.name} tokenizer is not trained or read yet")
        return self._tokenizer

    def fit(self, lines: Sequence[str]) -> None:
        if self.tokenizer_file:
            self.read(Path(self.tokenizer_file))
            return
        tokenizer, trainer = self._untrained()
        byte_level = self._library.pre_tokenizers.ByteLevel
        tokenizer.pre_tokenizer = byte_level(add_prefix_space=True, use_regex=True)
        tokenizer.decoder = self._library.decoders.ByteLevel()
        tokenizer.train_from_iterator(map(_spaced, lines), trainer, length=len(lines))
        self._use(self._canonical(tokenizer), "the trained tokenizer")

    def tokenize(self, lines: Sequence[str]) -> EncodedTokens:
        tokenizer = self._trained()
        pieces: list[np.ndarray] = []
        lengths: list[int] = []
        for start in range(0, len(lines), CHUNK_LINES):
            encodings = tokenizer.encode_batch_fast(
                [_spaced(line) for line in lines[start : start + CHUNK_LINES]],
                add_special_tokens=False,
            )
            lengths.extend(len(encoding) for encoding in encodings)
            ids = itertools.chain.from_iterable(encoding.ids for encoding in encodings)
            pieces.append(np.fromiter(ids, dtype=np.int64))
        flat = torch.from_numpy(np.concatenate(pieces)) if pieces else torch.empty(0).long()
        lengths_t = torch.tensor(lengths, dtype=torch.long)
        return EncodedTokens(_end_lines(flat, lengths_t, self.eos_id), self)

    def decode_ids(self, ids: torch.Tensor) -> str:
        lines = list(_lines_of(ids, self.eos_id))
        texts = self._trained().decode_batch([i for i, _ in lines], skip_special_tokens=False)
        # each line was read with one leading space
        return "".join(
            t.removeprefix(" ") + ("\n" if ended else "") for t, (_, ended) in zip(texts, lines)
        )

    def write(self, directory: Path) -> None:
        self._trained().save(str(Path(directory) / TOKENIZER_FILE))

    def read(self, path: Path) -> None:
        if not path.is_file():
            raise DataError(f"tokenizer file not found: {path}")
        try:
            tokenizer = self._library.Tokenizer.from_file(str(path))
        except Exception as error:  # the library raises a bare Exception
            reason = (str(error).splitlines() or ["unreadable"])[0]
            raise DataError(f"{path}: not a tokenizer file ({reason})") from None
        kind = type(tokenizer.model).__name__
        if kind != self.model_type:
            raise DataError(
                f"{path}: a {kind} tokenizer, not {self.model_type} (data.tokenizer = {self.name!r})"
            )
        self._use(tokenizer, str(path))

    def _use(self, tokenizer: Any, where: str) -> None:
        symbols = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
        if symbols[: len(SPECIALS)] != list(SPECIALS) or None in symbols:
            raise DataError(
                f"{where}: ids 0 and 1 must be {UNK} and {EOS}, and ids contiguous "
                f"(got {symbols[: len(SPECIALS)]})"
            )
        self._tokenizer, self._symbols = tokenizer, symbols


@TOKENIZERS.register("bpe")
class BpeTokenizer(SubwordTokenizer):
    """Byte-level BPE (Sennrich et al. 2016; GPT-2's byte-level alphabet)."""

    name = "bpe"
    model_type = "BPE"

    def _untrained(self) -> tuple[Any, Any]:
        lib = self._library
        trainer = lib.trainers.BpeTrainer(
            vocab_size=self.vocab_size,
            special_tokens=list(SPECIALS),
            initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        return lib.Tokenizer(lib.models.BPE(unk_token=UNK)), trainer


@TOKENIZERS.register("unigram")
class UnigramTokenizer(SubwordTokenizer):
    """Byte-level unigram language model (Kudo 2018, SentencePiece's algorithm)."""

    name = "unigram"
    model_type = "Unigram"

    def _untrained(self) -> tuple[Any, Any]:
        lib = self._library
        trainer = lib.trainers.UnigramTrainer(
            vocab_size=self.vocab_size,
            special_tokens=list(SPECIALS),
            unk_token=UNK,
            initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        return lib.Tokenizer(lib.models.Unigram()), trainer

    def _canonical(self, tokenizer: Any) -> Any:
        """The pieces in an order that does not depend on the process: by score (rounded to
        1e-9), ties by name. Two things vary from one process to the next otherwise: the
        last bits of the trainer's parallel sums, and which of the characters it adds after
        training (bytes never seen, with scores 1e-4 apart below the lowest) gets which
        score; they get those scores in alphabetical order here. A resumed run must rebuild
        the same vocabulary."""
        state = json.loads(tokenizer.to_str())
        specials, pieces = state["model"]["vocab"][:2], state["model"]["vocab"][2:]
        chars = sorted((piece for piece in pieces if len(piece[0]) == 1), key=lambda p: -p[1])
        start = len(chars) - 1  # the lowest character was added; walk up its 1e-4 steps
        while start > 0 and abs(chars[start - 1][1] - chars[start][1] - ADDED_CHAR_STEP) < 1e-7:
            start -= 1
        added = chars[start:]
        scores = dict(zip(sorted(c for c, _ in added), (score for _, score in added)))
        pieces = [[p, scores.get(p, s)] for p, s in pieces]
        pieces = sorted(([p, round(s, 9)] for p, s in pieces), key=lambda ps: (-ps[1], ps[0]))
        state["model"]["vocab"], state["model"]["unk_id"] = specials + pieces, UNK_ID
        return self._library.Tokenizer.from_str(json.dumps(state))


@TOKENIZERS.register("hf")
class PretrainedTokenizer(SubwordTokenizer):
    """A pretrained model's own tokenizer (an ``hf`` backbone reads text with it).

    ``tokenizer_file``: the model's directory or name (``model.backbone.path``, e.g.
    ``"smollm2-135m"``), whose ``tokenizer.json`` is read; nothing is learnt. Ids are the
    model's ids. Lines are read as the other subword tokenizers read them (one leading
    space) and each ends with the model's newline symbol, which the vocabulary calls
    ``<eos>``; the model's unknown (or first special) symbol is called ``<unk>``. Ids beyond
    the tokenizer up to the model's embedding rows are ``<unused:ID>`` (never produced).
    """

    name = "hf"
    model_type = "any"
    tokenizer_file: str  # always set: the model's directory or name

    def __init__(self, tokenizer_file: str | None = None) -> None:
        self._library = _require_library(self.name)
        if not tokenizer_file:
            raise ValueError(
                "the hf tokenizer reads a pretrained model's tokenizer: set data.tokenizer_file "
                "to the model's directory or name (the backbone's path)"
            )
        self.tokenizer_file = tokenizer_file
        self._tokenizer: Any = None
        self._symbols: list[str] = []
        self.rows = 0

    def _untrained(self) -> tuple[Any, Any]:  # pragma: no cover (never trained)
        raise NotImplementedError

    def fit(self, lines: Sequence[str]) -> None:
        from targetlm.pretrained import model_rows, resolve

        directory = resolve(self.tokenizer_file)
        self.rows = model_rows(directory)
        self.read(directory / TOKENIZER_FILE)

    def read(self, path: Path) -> None:
        if not path.is_file():
            raise DataError(f"tokenizer file not found: {path} (the model needs a fast tokenizer)")
        try:
            tokenizer = self._library.Tokenizer.from_file(str(path))
        except Exception as error:  # the library raises a bare Exception
            reason = (str(error).splitlines() or ["unreadable"])[0]
            raise DataError(f"{path}: not a tokenizer file ({reason})") from None
        self._use(tokenizer, str(path))

    def _use(self, tokenizer: Any, where: str) -> None:
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        rows = max(self.rows, size)
        if self.rows and size > self.rows:
            raise DataError(
                f"{where}: the tokenizer has {size:,} symbols but the model only {self.rows:,} "
                "embedding rows: it is another model's tokenizer"
            )
        symbols = [tokenizer.id_to_token(i) for i in range(rows)]
        symbols = [f"<unused:{i}>" if s is None else s for i, s in enumerate(symbols)]
        newline = tokenizer.encode("\n", add_special_tokens=False).ids
        if len(newline) != 1:
            raise DataError(f"{where}: a newline is not one symbol; lines cannot end with <eos>")
        unk = _unknown_id(tokenizer, newline[0])
        if unk is None:
            raise DataError(f"{where}: the tokenizer has no unknown or special symbol for <unk>")
        for special in SPECIALS:
            if special in symbols:  # the model's own "<unk>"/"<eos>" elsewhere: keep it apart
                symbols[symbols.index(special)] = f"{special}:model"
        symbols[unk], symbols[newline[0]] = UNK, EOS
        self.eos_id = newline[0]
        self._tokenizer, self._symbols = tokenizer, symbols

    def check(self, vocab: Vocabulary, where: str) -> None:
        unused = [f"<unused:{i}>" for i in range(len(self._symbols), len(vocab))]
        if vocab.itos[len(self._symbols) :] == unused:  # the model's rows past the tokenizer
            self._symbols = self._symbols + unused
        super().check(vocab, where)


def _unknown_id(tokenizer: Any, newline: int) -> int | None:
    """The id the vocabulary calls ``<unk>``: the model's unknown symbol, else its first special."""
    unknown = getattr(tokenizer.model, "unk_token", None)
    candidates = [tokenizer.token_to_id(unknown)] if unknown else []
    added = tokenizer.get_added_tokens_decoder()
    candidates += [i for i in sorted(added) if added[i].special]
    return next((i for i in candidates if i is not None and i != newline), None)


TOKENIZER_KEYS = ("max_size", "min_count", "vocab_size", "tokenizer_file")  # data.* options


def build_tokenizer(config: DataConfig) -> Tokenizer:
    """The (untrained) tokenizer ``data.tokenizer`` with the ``data.*`` options that are set;
    an option of another tokenizer is an error."""
    if config.tokenizer not in TOKENIZERS.names():
        raise ConfigError(
            f"data.tokenizer: unknown tokenizer {config.tokenizer!r}; "
            f"available: {', '.join(TOKENIZERS.names())}"
        )
    allowed = TOKENIZERS.options(config.tokenizer)
    options = {k: getattr(config, k) for k in TOKENIZER_KEYS if getattr(config, k) is not None}
    for key in options:
        if key not in allowed:
            keys = ", ".join(f"data.{k}" for k in allowed) or "none"
            raise ConfigError(
                f"data.{key} does not apply to data.tokenizer = {config.tokenizer!r} "
                f"(its options: {keys})"
            )
    return TOKENIZERS.build(config.tokenizer, options, "data")


def load_tokenizer(config: DataConfig, directory: Path, vocab: Vocabulary) -> Tokenizer:
    """The tokenizer of a run directory: ``data.tokenizer``, its file read from ``directory``,
    checked against the run's vocabulary."""
    tokenizer = build_tokenizer(config)
    where = str(directory)
    if tokenizer.file is not None:
        path = Path(directory) / tokenizer.file
        if not path.is_file():
            raise DataError(
                f"{path} is missing: the run was trained with data.tokenizer = "
                f"{config.tokenizer!r}, which reads it"
            )
        tokenizer.read(path)
        where = str(path)
    tokenizer.check(vocab, where)
    return tokenizer
