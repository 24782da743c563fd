r"""``mlm``: masked language modelling (BERT; CrammedBERT's recipe), optionally with N-gram / WDR
heads at the masked positions (Heo et al. 2024, App. A.3).

The training stream is cut into packed blocks of ``data.bptt`` tokens, ``<cls>`` first, as
CrammedBERT packs its corpus; each row gets a fixed number of masks, ``round(rate · (T − 1))``
(``<cls>`` is never masked), at uniformly drawn positions, of which the first 80 % read
``<mask>``, the next 10 % a uniformly drawn word and the rest the word itself (Devlin et al.'s
80/10/10, with CrammedBERT's fixed counts: ``use_80_20_rule``, ``mlm_probability``)::

    block       <cls>  the   cat   sat   on    the   mat
    inputs      <cls>  the  <mask> sat   on   <mask> mat       (masked: columns 2 and 5)
    targets     one row per masked column: its word, then ``lookahead`` later words
                 col 2: cat  sat  on        col 5: the  mat  IGNORE   (lookahead = N − 1 = 2)

The model reads the whole row (a bidirectional encoder, ``causal = False``); :meth:`predict`
keeps only the masked columns (CrammedBERT's sparse prediction), as a Prediction of M rows of
one column: x̂ (M, 1, d), the heads' raw outputs (N−1, M, 1, d). So the run's objective sees an
ordinary batch: the main head's loss is the masked-token loss through the run's output layer,
and the N-gram loss gives head n at a masked column t the word x_{t+n} as target; a WDR head
adds the detached conjugate Δʳ_n of x_t..x_{t+n−1} (the masked word and the words after it, the
true ones, from the targets), so it is trained towards the n-level WDR Δ_n x_t composed from
the masked word and its next words (App. A.3). The total is §3.1's unequal average
½·L₀ + α/(2N−2)·Σ L_n (:func:`targetlm.functional.ngram_loss`). A head whose later word lies past
the row's end has no target there.

Evaluation masks each split once, with a generator seeded by ``eval_seed`` and the batch's
index (the same masks at every validation and for every arm), and reports the masked tokens'
perplexity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from targetlm.data.batching import IGNORE, BatchList
from targetlm.data.vocab import Vocabulary
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.registry import ConfigError, Probability, Seed
from targetlm.tasks.base import TASKS, Batch, Task, TaskData

if TYPE_CHECKING:
    from targetlm.config import Config

CLS = "<cls>"  # the first token of every row (the classifier's pooled position)
MASK = "<mask>"


@dataclass(frozen=True)
class MaskedBatch(Batch):
    """A :class:`Batch` of masked rows: ``inputs`` (B, T) with the masks applied, ``masked``
    (B, T) bool at the masked columns, ``targets`` (M, 1 + lookahead): per masked column
    (row-major order) its original word and the ``lookahead`` words after it (IGNORE past the
    row's end)."""

    masked: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> MaskedBatch:
        moved = super().to(device)
        masked = None if self.masked is None else self.masked.to(device)
        return MaskedBatch(**{**moved.__dict__, "masked": masked})


def mask_tokens(
    tokens: torch.Tensor,
    rate: float,
    mask_id: int,
    vocab_size: int,
    *,
    replace_with_mask: float = 0.8,
    replace_with_random: float = 0.1,
    protected: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask ``round(rate · maskable)`` columns of every row of ``tokens`` (B, T).

    The masked columns are a uniform draw among the row's columns that ``protected`` (B, T)
    bool does not mark (every column when None; all rows must have the same number of
    maskable columns). Of the k masked columns of a row, the first ``round(0.8 k)`` read
    ``mask_id``, the next ``round(0.9 k) − round(0.8 k)`` a word drawn uniformly from
    ``0..vocab_size−1`` and the rest keep their word (fractions ``replace_with_mask``,
    ``replace_with_random``). Returns (inputs (B, T), masked (B, T) bool).
    """
    B, T = tokens.shape
    if protected is None:
        protected = torch.zeros(B, T, dtype=torch.bool, device=tokens.device)
    maskable = T - protected.sum(1)
    if bool((maskable != maskable[0]).any()):
        raise ValueError("mask_tokens: every row needs the same number of maskable columns")
    count = round(rate * int(maskable[0])) if B else 0
    scores = torch.rand(B, T, generator=generator, device=tokens.device)
    scores = scores.masked_fill(protected, 2.0)  # protected columns sort last
    order = scores.argsort(1)[:, :count]  # (B, k) the masked columns, in drawn order
    to_mask = round(replace_with_mask * count)
    to_random = round((replace_with_mask + replace_with_random) * count) - to_mask
    masked = torch.zeros(B, T, dtype=torch.bool, device=tokens.device)
    masked.scatter_(1, order, True)
    inputs = tokens.clone()
    inputs.scatter_(1, order[:, :to_mask], mask_id)
    random_columns = order[:, to_mask : to_mask + to_random]
    words = torch.randint(
        vocab_size, random_columns.shape, generator=generator, device=tokens.device
    )
    inputs.scatter_(1, random_columns, words)
    return inputs, masked


def masked_targets(tokens: torch.Tensor, masked: torch.Tensor, lookahead: int) -> torch.Tensor:
    """tokens (B, T), masked (B, T) -> (M, 1 + lookahead): each masked column's word and the
    ``lookahead`` words after it in its row (IGNORE past the row's end), row-major order."""
    padded = F.pad(tokens, (0, lookahead), value=IGNORE)  # (B, T + lookahead)
    windows = padded.unfold(1, lookahead + 1, 1)  # (B, T, 1 + lookahead)
    return windows[masked]


class MaskedBlocks(BatchList[MaskedBatch]):
    """The batches of a token stream cut into rows ``<cls>`` + ``block − 1`` tokens.

    Training drops the tokens that do not fill a last batch and masks each batch when it is
    read, from torch's global RNG (which the trainer's checkpoints restore, so a resumed run
    masks as an uninterrupted one). Evaluation keeps every token (the rows of the last, partial
    block form a batch of their own) and masks batch i with a generator seeded
    ``seed + i``: the same masks at every read.
    """

    def __init__(
        self,
        ids: torch.Tensor,
        batch_size: int,
        block: int,
        *,
        task: MaskedLmTask,
        vocab: Vocabulary,
        train: bool,
        lookahead: int = 0,
    ) -> None:
        if block < 2:
            raise ConfigError(f"data.bptt: a masked-LM row is <cls> plus tokens: >= 2, got {block}")
        if CLS not in vocab or MASK not in vocab:
            raise ConfigError(f"the masked-LM vocabulary needs {CLS} and {MASK}")
        self.task, self.train, self.lookahead = task, train, lookahead
        self.cls_id, self.mask_id, self.vocab_size = vocab.stoi[CLS], vocab.stoi[MASK], len(vocab)
        width = block - 1
        full = len(ids) // width
        rows = ids[: full * width].view(full, width)
        self.groups: list[torch.Tensor] = []
        step = batch_size
        if train:
            usable = full // batch_size * batch_size
            self.groups = [rows[i : i + step] for i in range(0, usable, step)]
        else:
            self.groups = [rows[i : i + step] for i in range(0, full, step)]
            if len(ids) > full * width:
                self.groups.append(ids[full * width :][None])

    def __len__(self) -> int:
        return len(self.groups)

    def _batch(self, index: int) -> MaskedBatch:
        rows = self.groups[index]
        tokens = torch.cat([torch.full((rows.size(0), 1), self.cls_id), rows], 1)  # (B, T)
        protected = torch.zeros_like(tokens, dtype=torch.bool)
        protected[:, 0] = True
        generator = None
        if not self.train:
            generator = torch.Generator().manual_seed(self.task.eval_seed + index)
        inputs, masked = mask_tokens(
            tokens,
            self.task.mask_rate,
            self.mask_id,
            self.vocab_size,
            replace_with_mask=self.task.replace_with_mask,
            replace_with_random=self.task.replace_with_random,
            protected=protected,
            generator=generator,
        )
        targets = masked_targets(tokens, masked, self.lookahead)
        return MaskedBatch(inputs, targets, masked=masked)


@TASKS.register("mlm")
class MaskedLmTask(Task[LanguageModel]):
    """Masked language modelling with a bidirectional encoder (``model.encoder.kind =
    "crammed_bert"``), the masked-token loss through the run's output layer, and N-gram / WDR
    heads at the masked positions (see the module docstring).

    Args:
        mask_rate: the fraction of each row's tokens masked (CrammedBERT: 0.15 in the paper's
            recipe, ``train/bert-o3.yaml``; its later ``bert-o4`` uses 0.25).
        replace_with_mask: the fraction of the masked tokens that read ``<mask>`` (0.8).
        replace_with_random: the fraction that read a random word (0.1); the rest keep theirs.
        eval_seed: the seed of the evaluation masks (batch i: ``eval_seed + i``).
    """

    causal = False

    def __init__(
        self,
        mask_rate: Probability = 0.15,
        replace_with_mask: Probability = 0.8,
        replace_with_random: Probability = 0.1,
        eval_seed: Seed = 0,
    ) -> None:
        if not 0 < mask_rate <= 1:
            raise ValueError(f"mask_rate must be in (0, 1], got {mask_rate}")
        if replace_with_mask + replace_with_random > 1:
            raise ValueError(
                "replace_with_mask + replace_with_random must be <= 1, got "
                f"{replace_with_mask} + {replace_with_random}"
            )
        self.mask_rate = mask_rate
        self.replace_with_mask = replace_with_mask
        self.replace_with_random = replace_with_random
        self.eval_seed = eval_seed

    @staticmethod
    def with_special_words(vocab: Vocabulary) -> Vocabulary:
        """The training vocabulary with ``<cls>`` and ``<mask>`` appended (ids unchanged)."""
        return vocab.extend([w for w in (CLS, MASK) if w not in vocab])

    # --- the data ------------------------------------------------------------------------------
    def load_data(
        self, config: Config, base_vocabulary: Vocabulary | None, log: Callable[[str], None]
    ) -> TaskData:
        """The corpus's splits as token streams (no context token: each row starts with
        ``<cls>``) and the fixed-mask evaluation batches of valid and test."""
        from targetlm.data.readers import check_training_tokens, load_corpus

        c = config.data
        if config.train.init_from:
            raise ConfigError(
                "train.init_from: a masked-LM run pretrains from scratch (finetune it with "
                "task.kind = 'classification')"
            )
        corpus = load_corpus(c)
        check_training_tokens(c, corpus)
        vocab = self.with_special_words(corpus.vocab)
        ids = {split: vocab.encode(tokens) for split, tokens in corpus.splits.items()}
        splits = {role: ids[getattr(c, role)] for role in ("train", "valid", "test")}
        batches = {
            role: self.batches(
                splits[role], config.eval.batch_size, c.bptt, vocab=vocab, train=False
            )
            for role in ("valid", "test")
        }
        return TaskData(vocab, corpus, splits, batches)

    def vocabulary(self, config: Config) -> Vocabulary:
        from targetlm.data.readers import load_corpus

        return self.with_special_words(load_corpus(config.data, (config.data.train,)).vocab)

    def run_data(self, config: Config, vocab: Vocabulary, splits: Sequence[str]) -> TaskData:
        """The evaluation batches of a finished run's ``splits``, read with its tokenizer and
        vocabulary (the evaluation's fixed masks)."""
        from targetlm.data import read_lines

        tokenizer, c = vocab.require_tokenizer(), config.data
        batches = {}
        for split in splits:
            ids = vocab.encode(tokenizer.tokenize(read_lines(c, getattr(c, split))))
            batches[split] = self.batches(
                ids, config.eval.batch_size, c.bptt, vocab=vocab, train=False
            )
        return TaskData(vocab, None, {}, batches)

    def training_batches(self, lookahead: int) -> MaskedBlocks:
        """Rows of ``data.bptt`` tokens, ``data.batch_size`` a batch, masked when read."""
        c = self.config.data
        batches = self.batches(
            self.data.splits["train"], c.batch_size, c.bptt, vocab=self.data.vocab, train=True,
            lookahead=lookahead,
        )  # fmt: skip
        if not len(batches):
            raise ConfigError(
                f"data.batch_size: the training split fills no batch of {c.batch_size} "
                f"rows of {c.bptt} tokens"
            )
        return batches

    # --- evaluation ----------------------------------------------------------------------------
    def evaluate(self, model: LanguageModel, split: str) -> dict[str, Any]:
        """The masked tokens' ``{"nll", "ppl", "tokens"}`` on ``split`` (fixed masks)."""
        from targetlm.inference.translate import evaluate_pairs

        return evaluate_pairs(model, self.data.batches[split], self, self.device)

    def split_results(self, model: LanguageModel, split: str) -> dict[str, Any]:
        """The masked tokens' perplexity on ``split`` and the mask rate."""
        result = self.evaluate(model, split)
        return {
            "ppl": result["ppl"],
            "nll": result["nll"],
            "masked_tokens": result["tokens"],
            "mask_rate": self.mask_rate,
        }

    def summary(self, results: dict[str, Any]) -> list[str]:
        """The masked tokens' test perplexity."""
        return [f"test masked-token perplexity: {results['test']['ppl']:.2f}"]

    def evaluate_run(
        self, model: LanguageModel, split: str, ensemble_lambda: float
    ) -> dict[str, Any]:
        """The masked tokens' perplexity on ``split`` with the evaluation's fixed masks, as
        :meth:`final_results` computes it (the task bound to :meth:`run_data`: the split read
        with the run's tokenizer and vocabulary). The main head only: ``ensemble_lambda``
        must be 0."""
        if ensemble_lambda:
            raise ConfigError(
                "--ensemble-lambda: a masked-LM run is evaluated with its main head (the "
                "masked tokens' perplexity)"
            )
        return self.split_results(model, split)

    def describe(self, split: str, result: dict[str, Any]) -> str:
        """One printed line of :meth:`evaluate_run`'s ``result``."""
        return (
            f"{split}: masked-token ppl {result['ppl']:.2f} over {result['masked_tokens']:,} "
            f"masked tokens (mask rate {result['mask_rate']:.0%})"
        )

    def batches(
        self,
        ids: torch.Tensor,
        batch_size: int,
        block: int,
        *,
        vocab: Vocabulary,
        train: bool,
        lookahead: int = 0,
    ) -> MaskedBlocks:
        """The masked batches of the stream ``ids`` (N,): rows of ``block`` tokens, ``<cls>``
        first, ``batch_size`` rows a batch; ``lookahead`` later words per masked column."""
        return MaskedBlocks(
            ids, batch_size, block, task=self, vocab=vocab, train=train, lookahead=lookahead
        )

    def predict(
        self, model: LanguageModel, batch: Batch, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        """Read the whole rows; keep the masked columns: x̂ (M, 1, d), heads (N−1, M, 1, d).
        No state is carried (rows are independent)."""
        if not isinstance(batch, MaskedBatch) or batch.masked is None:
            raise ValueError("a masked-LM batch needs its masked columns (a MaskedBatch)")
        prediction = model(batch.inputs, None, run_heads=run_heads)
        masked = batch.masked
        heads = None if prediction.heads is None else prediction.heads[:, masked][:, :, None]
        return Prediction(prediction.main[masked][:, None], heads, None)
