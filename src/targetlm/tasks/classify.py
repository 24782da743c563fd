r"""``classification``: sequence classification with a pooled ``[CLS]``-style head (finetuning a
masked LM, CrammedBERT's GLUE setting).

Each example is one or two sentences read as one row, ``<cls>`` first and ``<eos>`` after each
sentence (the masked LM's packed stream ends every line with ``<eos>``)::

    <cls> the cat sat <eos> [ a second sentence <eos> ]   -> label

The model's embedding and bidirectional encoder read the row (padded columns masked out);
:class:`SequenceClassifier` pools the hidden state of ``<cls>`` (``pooler = "first"``,
CrammedBERT's ``zero_index``; or the mean of the real columns), applies
``Dropout(Tanh(W_p h))`` (``include_ff_layer``, ``nonlin: Tanh``) and its classifier
``W_c x + b_c``. The classifier plays the output layer's part: ``output()`` returns
(W_c, b_c), so the run's objective (cross entropy) scores the pooled vector against the
label exactly as it scores x̂ against a word, and the trainer's step is unchanged.

Data (``data.name``):
- ``brown``: the Brown corpus's sentences labelled by their 15 genres. Split: within each
  genre file (documents in corpus order) the first 80 % of the sentences train, the next 10 %
  validate and the last 10 % test (``genre[:0.8]``, ``genre[0.8:0.9]``, ``genre[0.9:]``, the
  line fractions rounded), so each boundary cuts at most one document per genre.
- ``glue``: a GLUE classification task (``glue_task``) from its unpacked files in ``data.dir``:
  ``train.tsv`` trains; ``dev.tsv`` (MNLI: ``dev_matched.tsv``) is both valid and test, GLUE's
  test labels being hidden (MNLI's test: ``dev_mismatched.tsv``).

Metrics: accuracy, macro-F1 (the unweighted mean of the per-class F1 over the classes that
occur in the gold labels or the predictions), and for two classes the positive class's F1 and
the Matthews correlation (the general K-class form, as scikit-learn computes it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from targetlm.data.catalogue import BROWN_GENRES, candidate_dirs
from targetlm.data.glue import glue_task, read_glue_split
from targetlm.data.readers import read_lines
from targetlm.data.vocab import EOS, DataError, Vocabulary
from targetlm.modules.model import LanguageModel, Prediction, evaluating
from targetlm.registry import ConfigError, Fraction, Size
from targetlm.tasks.base import TASKS, Batch, Task, TaskData
from targetlm.tasks.mlm import CLS

if TYPE_CHECKING:
    from targetlm.config import Config

# Brown genre classification: (split, the line fractions of each genre file it takes)
BROWN_SPLITS = {"train": (0.0, 0.8), "valid": (0.8, 0.9), "test": (0.9, 1.0)}


@dataclass(frozen=True)
class Examples:
    """Labelled examples: ``texts`` (one or two sentences each) and ``labels`` (class ids)."""

    texts: list[tuple[str, ...]]
    labels: list[int]


@dataclass(frozen=True)
class PaddedBatch(Batch):
    """Rows padded to the longest: ``inputs`` (B, T), ``mask`` (B, T) True at real columns,
    ``targets`` (B, 1) the labels."""

    mask: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> PaddedBatch:
        moved = super().to(device)
        mask = None if self.mask is None else self.mask.to(device)
        return PaddedBatch(**{**moved.__dict__, "mask": mask})


def _fraction(value: float) -> str:
    return f"{value:g}"


def brown_genre_examples(data: Any) -> tuple[dict[str, Examples], tuple[str, ...]]:
    """The Brown genre classification splits (see the module docstring) and the genre names
    in class-id order. ``data``: the run's DataConfig (its dir and lowercase)."""
    splits = {name: Examples([], []) for name in BROWN_SPLITS}
    for label, genre in enumerate(BROWN_GENRES):
        for name, (start, stop) in BROWN_SPLITS.items():
            lines = read_lines(data, f"{genre}[{_fraction(start)}:{_fraction(stop)}]")
            splits[name].texts.extend((line,) for line in lines)
            splits[name].labels.extend([label] * len(lines))
    return splits, tuple(BROWN_GENRES)


def glue_examples(data: Any, name: str) -> tuple[dict[str, Examples], tuple[str, ...]]:
    """A GLUE classification task's train / valid / test (see the module docstring) from its
    unpacked TSV files (``data.dir``, else ``<the glue directory>/<task>``: ``$TARGETLM_DATA/glue``
    or the user cache)."""
    task = glue_task(name)
    if task.labels is None:
        raise ConfigError(f"task.glue_task: {name} is a regression task, not a classification one")
    directory = Path(data.dir) if data.dir else candidate_dirs("glue", None)[0] / name
    files = {"train": "train.tsv", "valid": task.valid[0], "test": task.valid[-1]}
    splits = {}
    for split, file in files.items():
        texts, labels = read_glue_split(task, directory / file)
        if data.lowercase:
            texts = [tuple(t.lower() for t in text) for text in texts]
        splits[split] = Examples(texts, labels)
    return splits, task.labels


def encode_example(text: tuple[str, ...], vocab: Vocabulary, max_length: int) -> torch.Tensor:
    """``<cls>`` s₁ ``<eos>`` [s₂ ``<eos>``] as ids (whitespace words; unknown ones ``<unk>``),
    cut to ``max_length`` tokens."""
    words = [CLS]
    for sentence in text:
        words += sentence.split() + [EOS]
    return vocab.encode(words[:max_length])


def padded_batches(
    rows: Sequence[torch.Tensor],
    labels: Sequence[int],
    batch_size: int,
    *,
    train: bool,
    seed: int = 0,
) -> list[PaddedBatch]:
    """Batches of ``batch_size`` examples: training in one seeded random order (so a batch
    mixes classes; the trainer may shuffle the batches' order too), evaluation in the given
    order with the last batch partial. Rows are right-padded with id 0, masked out."""
    order = list(range(len(rows)))
    if train:
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(rows), generator=generator).tolist()
        order = order[: len(order) // batch_size * batch_size]
    batches = []
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        group = [rows[i] for i in chosen]
        inputs = nn.utils.rnn.pad_sequence(group, batch_first=True, padding_value=0)
        lengths = torch.tensor([len(r) for r in group])
        mask = torch.arange(inputs.size(1))[None] < lengths[:, None]
        targets = torch.tensor([labels[i] for i in chosen])[:, None]
        batches.append(PaddedBatch(inputs, targets, mask=mask))
    return batches


class SequenceClassifier(nn.Module):
    """A pooled classification head on a language model's embedding and encoder.

    ``forward(tokens, mask)`` -> :class:`Prediction` with x = Dropout(Tanh(W_p pool(h))) as
    ``main`` (B, 1, d); ``output()`` -> (W_c (C, d), b_c (C,)), the classifier, in the place
    of the output layer's (E_out, b). The language model's N-gram heads are not used (they
    were for pretraining) and its output layer stays unused.

    Args:
        body: the (pretrained) language model; its ``encoder`` must read a padding mask as its
            state (a bidirectional encoder).
        num_labels: C.
        pooler: ``first`` (the ``<cls>`` column) or ``mean`` (of the real columns).
        dropout: before the classifier (CrammedBERT: the hidden dropout, 0.1).
    """

    heads = None
    num_heads = 0

    def __init__(
        self,
        body: LanguageModel,
        num_labels: int,
        pooler: Literal["first", "mean"] = "first",
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        body.heads = None  # the pretraining heads: not part of the classifier
        self.body = body
        d = body.encoder.output_size
        self.pooler_kind = pooler
        self.pooler = nn.Linear(d, d)
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(d, num_labels)

    @property
    def embedding(self) -> nn.Module:
        return self.body.embedding

    @property
    def encoder(self) -> nn.Module:
        return self.body.encoder

    def forward(
        self, tokens: torch.Tensor, mask: torch.Tensor | None = None, *, run_heads: bool = True
    ) -> Prediction:
        hidden, _ = self.body.encode(tokens, mask)  # (B, T, H)
        if self.pooler_kind == "first":
            pooled = hidden[:, 0]
        else:
            weights = torch.ones_like(tokens, dtype=hidden.dtype) if mask is None else mask
            weights = weights.to(hidden.dtype)[..., None]
            pooled = (hidden * weights).sum(1) / weights.sum(1)
        x = self.drop(torch.tanh(self.pooler(pooled)))  # (B, H)
        return Prediction(x[:, None], None, None)

    def output(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.classifier.weight, self.classifier.bias

    def parameter_counts(self) -> dict[str, int]:
        counts = self.body.parameter_counts()
        counts["classifier"] = sum(
            p.numel() for m in (self.pooler, self.classifier) for p in m.parameters()
        )
        return counts


@TASKS.register("classification")
class SequenceClassificationTask(Task[SequenceClassifier]):
    """Sequence classification by a pooled head on a bidirectional encoder (finetuning a masked
    LM: ``train.init_from``; see the module docstring).

    Args:
        pooler: ``first`` (the ``<cls>`` column; CrammedBERT's GLUE setting) or ``mean``.
        head_dropout: the dropout before the classifier (0.1).
        max_length: tokens kept per example, ``<cls>`` and ``<eos>`` included (128).
        glue_task: with ``data.name = "glue"``, the GLUE task (``CoLA``, ``SST-2``, ...).
    """

    causal = False
    finetunable = True  # train.init_from: the pretrained run's vocabulary and weights
    wraps_model = True  # a SequenceClassifier: its figures are the run's results.json

    def __init__(
        self,
        pooler: Literal["first", "mean"] = "first",
        head_dropout: Fraction = 0.1,
        max_length: Size = 128,
        glue_task: str = "",
    ) -> None:
        if pooler not in ("first", "mean"):
            raise ValueError(f"pooler must be 'first' or 'mean', got {pooler!r}")
        if glue_task:
            glue_task_or_error(glue_task)  # an unknown name fails before any work
        self.pooler, self.head_dropout = pooler, head_dropout
        self.max_length, self.glue_task = max_length, glue_task

    def examples(self, data: Any) -> tuple[dict[str, Examples], tuple[str, ...]]:
        """The train / valid / test examples of ``data`` and the label names. Their split is
        the dataset's own (see the module docstring): ``data.train`` / ``valid`` / ``test``
        must keep their default names (a slice of another split would be ignored)."""
        if data.tokenizer != "whitespace":
            raise ConfigError(
                f"data.tokenizer: classification reads whitespace words, not {data.tokenizer!r} "
                "symbols (finetune a run pretrained with data.tokenizer = 'whitespace')"
            )
        for key in ("train", "valid", "test"):
            if getattr(data, key) != key:
                raise ConfigError(
                    f"data.{key}: classification reads the {data.name!r} split named {key!r} "
                    f"(fixed, see the task), not {getattr(data, key)!r}; set data.{key}='\"{key}\"'"
                )
        if data.name == "brown":
            return brown_genre_examples(data)
        if data.name == "glue":
            if not self.glue_task:
                raise ConfigError("task.glue_task: data.name = 'glue' needs the task's name")
            return glue_examples(data, self.glue_task)
        raise ConfigError(
            f"data.name: classification reads 'brown' (genres) or 'glue', not {data.name!r}"
        )

    # --- the data ------------------------------------------------------------------------------
    def load_data(
        self, config: Config, base_vocabulary: Vocabulary | None, log: Callable[[str], None]
    ) -> TaskData:
        """The labelled examples of train / valid / test (``corpus``: the label names) and the
        evaluation batches. The vocabulary: the pretrained run's as it is (``train.init_from``;
        words unseen in pretraining read ``<unk>``), else the training sentences' words and
        ``<cls>``."""
        splits, label_names = self.examples(config.data)
        if base_vocabulary is not None:
            vocab = base_vocabulary
        else:
            words = [w for text in splits["train"].texts for s in text for w in s.split()]
            vocab = Vocabulary.build(words).extend([CLS])
        batches = {
            role: self.batches(splits[role], vocab, config.eval.batch_size, train=False)
            for role in ("valid", "test")
        }
        return TaskData(vocab, label_names, splits, batches)

    def model_to_train(self, model: LanguageModel) -> SequenceClassifier:
        """The classifier around the (pretrained) language model: ``len(data.corpus)``
        classes."""
        return SequenceClassifier(model, len(self.data.corpus), self.pooler, self.head_dropout)

    def training_batches(self, lookahead: int) -> Sequence[PaddedBatch]:
        """``data.batch_size`` examples a batch, in one order drawn with ``train.seed``."""
        c = self.config
        return self.batches(
            self.data.splits["train"], self.data.vocab, c.data.batch_size, train=True,
            seed=c.train.seed,
        )  # fmt: skip

    def batches(
        self,
        examples: Examples,
        vocab: Vocabulary,
        batch_size: int,
        *,
        train: bool,
        seed: int = 0,
    ) -> list[PaddedBatch]:
        rows = [encode_example(text, vocab, self.max_length) for text in examples.texts]
        return padded_batches(rows, examples.labels, batch_size, train=train, seed=seed)

    def predict(
        self, model: Any, batch: Batch, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        if not isinstance(batch, PaddedBatch):
            raise ValueError("a classification batch needs its padding mask (a PaddedBatch)")
        return model(batch.inputs, batch.mask)

    # --- evaluation ----------------------------------------------------------------------------
    def evaluate(self, model: SequenceClassifier, split: str) -> dict[str, Any]:
        """The figures of :meth:`score` on ``split``."""
        return self.score(model, self.data.batches[split], len(self.data.corpus), self.device)

    def split_results(self, model: SequenceClassifier, split: str) -> dict[str, Any]:
        """:meth:`score`'s figures and the label names (logged: the metrics)."""
        result = self.evaluate(model, split)
        self.log(self.describe(split, result))
        return {**result, "labels": list(self.data.corpus)}

    def describe(self, split: str, result: dict[str, Any]) -> str:
        """One line of ``split``'s figures (:meth:`score`'s)."""
        figures = ", ".join(
            f"{k} {result[k]:.4f}"
            for k in ("accuracy", "macro_f1", "f1", "matthews")
            if k in result
        )
        return f"{split}: {figures} over {result['examples']:,} examples"

    def headline(self, results: dict[str, Any]) -> str:
        """Valid and test accuracy (a classifier's perplexity is no figure of it)."""
        valid, test = results["valid"]["accuracy"], results["test"]["accuracy"]
        return f"valid accuracy {valid:.4f} | test accuracy {test:.4f}"

    def summary(self, results: dict[str, Any]) -> list[str]:
        """Test accuracy and macro-F1 (the perplexity is exp of the labels' cross entropy)."""
        test = results["test"]
        return [f"test accuracy: {test['accuracy']:.4f}, macro-F1: {test['macro_f1']:.4f}"]

    @torch.no_grad()
    def score(
        self,
        model: SequenceClassifier,
        batches: Sequence[PaddedBatch],
        num_labels: int,
        device: torch.device | str,
    ) -> dict[str, Any]:
        """``{"nll", "ppl", "examples", "accuracy", "macro_f1"[, "f1", "matthews"]}`` of
        ``model`` on ``batches`` (eval mode; the mode it was in is restored)."""
        with evaluating(model):
            weight, bias = model.output()
            total, predicted, gold = 0.0, [], []
            for batch in batches:
                batch = batch.to(device)
                logits = F.linear(self.predict(model, batch).main[:, 0], weight, bias).float()
                total += float(F.cross_entropy(logits, batch.targets[:, 0], reduction="sum"))
                predicted.append(logits.argmax(-1).cpu())
                gold.append(batch.targets[:, 0].cpu())
        predictions, labels = torch.cat(predicted), torch.cat(gold)
        nll = total / max(len(labels), 1)
        return {
            "nll": nll,
            "ppl": math.exp(min(nll, 700.0)),
            "examples": len(labels),
            **classification_metrics(predictions, labels, num_labels),
        }


def glue_task_or_error(name: str) -> Any:
    """The GLUE registry entry, as a ConfigError naming ``task.glue_task`` when unknown."""
    try:
        return glue_task(name)
    except DataError as error:
        raise ConfigError(f"task.glue_task: {error}") from None


# --- metrics ----------------------------------------------------------------------------------
def confusion_matrix(predicted: torch.Tensor, gold: torch.Tensor, num_labels: int) -> torch.Tensor:
    """(C, C) counts, row = gold class, column = predicted class."""
    index = gold.long() * num_labels + predicted.long()
    return torch.bincount(index, minlength=num_labels * num_labels).view(num_labels, num_labels)


def classification_metrics(
    predicted: torch.Tensor, gold: torch.Tensor, num_labels: int
) -> dict[str, float]:
    """Accuracy, macro-F1 and, for two classes, the positive class's F1 and the Matthews
    correlation, of ``predicted`` against ``gold`` ((N,) class ids)."""
    matrix = confusion_matrix(predicted, gold, num_labels).double()
    total = matrix.sum()
    tp = matrix.diag()
    fp, fn = matrix.sum(0) - tp, matrix.sum(1) - tp
    present = (matrix.sum(0) + matrix.sum(1)) > 0
    f1 = torch.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn).clamp(min=1), 0.0)
    results = {
        "accuracy": float(tp.sum() / total) if total else 0.0,
        "macro_f1": float(f1[present].mean()) if bool(present.any()) else 0.0,
    }
    if num_labels == 2:
        results["f1"] = float(f1[1])
        results["matthews"] = matthews_correlation(matrix)
    return results


def matthews_correlation(matrix: torch.Tensor) -> float:
    """The K-class Matthews correlation of a (K, K) confusion matrix (row gold, column
    predicted): (c·s − Σ p_k t_k) / sqrt((s² − Σ p_k²)(s² − Σ t_k²)), 0 when undefined."""
    matrix = matrix.double()
    s, c = matrix.sum(), matrix.diag().sum()
    p, t = matrix.sum(0), matrix.sum(1)
    denominator = math.sqrt(float((s * s - (p * p).sum()) * (s * s - (t * t).sum())))
    return float((c * s - (p * t).sum()) / denominator) if denominator else 0.0
