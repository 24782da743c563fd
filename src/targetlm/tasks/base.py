"""The task interface and the typed batch every task produces.

A task says everything that depends on what is being learned (in the shape of fairseq's
``FairseqTask``, which holds its config and datasets): how its corpus loads
(:meth:`Task.load_data`); then, bound once to the run's config, data and device
(:meth:`Task.setup`), how its training batches are made (:meth:`Task.training_batches`), how
the model reads a batch (:meth:`Task.predict`), what loss the step minimises around the run's
objective (:meth:`Task.training_objective`), how a split is evaluated
(``Task.evaluate(model, split)``, the figure validation and early stopping read) and which
final figures a finished run reports (``Task.final_results(model)``: perplexity; BLEU / chrF
of its decoder with SacreBLEU's signature; :meth:`Task.summary`: what ``targetlm train``
prints of them). A task may train a module around the language model
(:meth:`Task.model_to_train`: a classifier's pooled head). The one
:class:`~targetlm.training.Trainer` and the commands only talk to this interface, and ask a
task what it is through its declared capabilities (:attr:`Task.reads`, :attr:`Task.conditional`,
...), never its class, so a new task (masked-LM pretraining, sentence classification) is one
file in ``tasks/`` registered in :data:`TASKS`; output layers, heads, objectives and
combiners stay as they are: they read ``Prediction`` and the targets.

A task that reads sentence pairs also decodes (``targetlm translate``, ``targetlm eval``):
:class:`~targetlm.tasks.translation.SentencePairTask`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

import torch
from torch import nn

from targetlm.data.batching import Batch, stream_batches
from targetlm.modules.model import LanguageModel, Prediction
from targetlm.registry import ConfigError, Registry

if TYPE_CHECKING:
    from collections.abc import Callable

    from targetlm.config import Config
    from targetlm.data.vocab import Vocabulary
    from targetlm.objectives.ngram import NgramLoss

# the module a task trains, evaluates and reads batches with (:meth:`Task.model_to_train`):
# the language model itself, or a module around it (a classifier)
ModelT = TypeVar("ModelT", bound=nn.Module)


@dataclass
class TaskData:
    """A task's corpus as the trainer holds it.

    vocab: the vocabulary every split is encoded with. corpus: what the task read (its
    splits' raw text and tokens, for the final figures). splits: what each role ("train",
    "valid", "test") is batched from (a token stream, sentence pairs...), the task's own.
    batches: each role's batches where the task makes them once (evaluation), or empty.
    """

    vocab: Vocabulary
    corpus: Any
    splits: dict[str, Any]
    batches: dict[str, Any] = field(default_factory=dict)


class Task(ABC, Generic[ModelT]):
    """What a task is: its data, its batches, how the model reads one, its loss around the
    run's objective, its evaluation and final figures (see the module). ``ModelT``: the
    module it trains (:meth:`model_to_train`), which every method after that reads.

    A task is built from its options (``[task]``, :func:`build_task`), reads its data
    (:meth:`load_data`; a finished run's: :meth:`run_data`) and is then bound once to the
    run's config, data and device (:meth:`setup`): the methods after that read them from the
    task and take only what is theirs (``evaluate(model, split)``, ``final_results(model)``).

    Declared capabilities:
        reads: what its data is, which says the commands that read its runs: ``"stream"``,
            one token stream per split (a :class:`StreamTask`: the language-model commands,
            ``generate``, ``score``, ``eval`` on a file); ``"pairs"``, sentence pairs it
            decodes (a :class:`~targetlm.tasks.translation.SentencePairTask`: ``translate``);
            ``"own"``, data of its own (masked rows, labelled sentences), which ``eval``
            evaluates on its splits.
        conditional: the task reads a source besides the target stream (translation) and
            needs an encoder that is conditional (``Encoder.conditional``); a stream task
            needs one that is not.
        denoising: the task trains a diffusion denoiser (``Encoder.denoiser``); the other
            tasks refuse one.
        finetunable: ``train.init_from`` may start from a trained run: the trainer loads its
            weights, and :meth:`load_data` is given its vocabulary (which the task may extend
            with its own words; theirs keep their ids).
        causal: the task predicts from the past only and needs an encoder whose output t
            reads inputs 0..t (``Encoder.causal``); a task that declares False (masked LM,
            classification, diffusion) needs one that reads the whole sequence.
        wraps_model: the module it trains wraps the language model (a classifier around it),
            which the commands that rebuild a run's model (eval, score, translate...) do not
            read.
    """

    reads: Literal["stream", "pairs", "own"] = "own"
    conditional: bool = False
    denoising: bool = False
    finetunable: bool = False
    causal: bool = True
    wraps_model: bool = False

    # what :meth:`setup` binds
    config: Config
    data: TaskData
    device: torch.device
    log: Callable[[str], None]

    def setup(
        self,
        config: Config,
        data: TaskData,
        device: str | torch.device,
        log: Callable[[str], None] | None = None,
    ) -> None:
        """Bind the task to a run: its ``config``, its ``data`` (:meth:`load_data`'s, or
        :meth:`run_data`'s for a finished run) and the ``device`` its batches are evaluated
        on; ``log``: where the final figures' lines go (nowhere by default)."""
        self.config, self.data, self.device = config, data, torch.device(device)
        self.log = log or _silent

    # --- the model and the loss ------------------------------------------------------------
    def check_model(self, kind: str, encoder_kind: str, model: LanguageModel) -> None:
        """Refuse a model this task cannot train (``kind``: ``task.kind``; ``encoder_kind``:
        ``model.encoder.kind``), before any work starts."""
        encoder = model.encoder
        where = f"model.encoder.kind = {encoder_kind!r}"
        if encoder.denoiser != self.denoising:
            raise ConfigError(
                f"task.kind = {kind!r} needs model.encoder.kind = 'diffusion_denoiser', not "
                f"{encoder_kind!r}"
                if self.denoising
                else f"{where} is a diffusion denoiser: it trains with task.kind = 'diffusion', "
                f"not {kind!r}"
            )
        if encoder.conditional != self.conditional:
            raise ConfigError(
                f"task.kind = {kind!r} reads a source sentence: {where} does not "
                "(use 'transformer_seq2seq')"
                if self.conditional
                else f"{where} reads a source sentence: use task.kind = 'translation', not {kind!r}"
            )
        if model.source_embedding is not None and not self.conditional:
            raise ConfigError(
                f"model.source_embedding: task.kind = {kind!r} reads no source sentence "
                "(set model.source_embedding.kind = 'none')"
            )
        if encoder.causal != self.causal:
            raise ConfigError(
                f"task.kind = {kind!r} predicts from the past only: {where} reads the whole "
                "sequence (a bidirectional encoder would see the words it predicts)"
                if self.causal
                else f"task.kind = {kind!r} reads the whole sequence: {where} is causal "
                "(use a bidirectional encoder, e.g. 'crammed_bert')"
            )

    def model_to_train(self, model: LanguageModel) -> ModelT:
        """The module the run trains, evaluates and checkpoints, around the built language
        model (its weights already loaded when finetuning). It reads a batch through
        :meth:`predict`, and its ``output()`` plays the output layer's part for the run's
        objective, which is built for it. The model itself by default (a task whose
        ``ModelT`` is :class:`LanguageModel`); a classifier wraps it in a pooled head
        (``classification``) and overrides this."""
        return cast(ModelT, model)  # the default is right for ModelT = LanguageModel only

    def training_objective(self, objective: NgramLoss, model: ModelT) -> nn.Module:
        """The loss the step minimises, around the run's built objective (an
        :class:`~targetlm.objectives.NgramLoss`); the objective itself by default."""
        return objective

    # --- the data ---------------------------------------------------------------------------
    @abstractmethod
    def load_data(
        self, config: Config, base_vocabulary: Vocabulary | None, log: Callable[[str], None]
    ) -> TaskData:
        """Read ``config.data``'s splits. ``base_vocabulary``: a finetuned run's (its words
        keep their ids; only a :attr:`finetunable` task is given one)."""

    def run_data(self, config: Config, vocab: Vocabulary, splits: Sequence[str]) -> TaskData:
        """A finished run's ``splits`` ("train", "valid", "test"), read with its vocabulary
        ``vocab`` (``targetlm eval``): by default :meth:`load_data`'s, given ``vocab`` as the
        base vocabulary (a task that keeps it as it is)."""
        return self.load_data(config, vocab, _silent)

    def prepare(self, model: ModelT) -> None:
        """Fit the data to the built model before training (e.g. leave out training pairs
        longer than its context); runs before the run directory is written. Nothing by
        default."""
        return None

    @abstractmethod
    def training_batches(self, lookahead: int) -> Sequence[Batch]:
        """The batches of an epoch, in a fixed order the trainer shuffles (``data.shuffle``).
        ``lookahead``: the extra target columns the objective reads (N-gram heads)."""

    # --- evaluation -------------------------------------------------------------------------
    @abstractmethod
    def evaluate(self, model: ModelT, split: str) -> dict[str, Any]:
        """The figures of ``split`` ("valid" or "test") that validation reads: at least
        ``nll`` (the schedule's) and ``ppl`` (the best model's and early stopping's)."""

    def final_results(self, model: ModelT) -> dict[str, dict[str, Any]]:
        """A finished run's figures in its results.json: :meth:`split_results` of valid and
        test."""
        return {split: self.split_results(model, split) for split in ("valid", "test")}

    @abstractmethod
    def split_results(self, model: ModelT, split: str) -> dict[str, Any]:
        """``split``'s figures in results.json (with at least ``ppl``)."""

    def headline(self, results: dict[str, Any]) -> str:
        """The figures that open the line training ends with: valid and test perplexity."""
        return f"valid ppl {results['valid']['ppl']:.2f} | test ppl {results['test']['ppl']:.2f}"

    def summary(self, results: dict[str, Any]) -> list[str]:
        """The lines ``targetlm train`` prints for a finished run's ``results`` (results.json's
        content): the test perplexity by default."""
        return [f"test perplexity: {results['test']['ppl']:.2f}"]

    def evaluate_run(self, model: ModelT, split: str, ensemble_lambda: float) -> dict[str, Any]:
        """``targetlm eval``'s figures of a finished run on ``split`` (the task bound to its
        :meth:`run_data`): the figures :meth:`final_results` writes to results.json, for a
        task that ``eval`` does not score as a token stream (a :class:`StreamTask`'s runs
        are scored token by token by the command). ``ensemble_lambda``: the N-gram head
        ensemble's λ, where the task uses it."""
        raise NotImplementedError(f"{type(self).__name__} is not evaluated by targetlm eval")

    def describe(self, split: str, result: dict[str, Any]) -> str:
        """One printed line of :meth:`evaluate_run`'s ``result``."""
        raise NotImplementedError(f"{type(self).__name__} is not evaluated by targetlm eval")

    def vocabulary(self, config: Config) -> Vocabulary:
        """The vocabulary a model of ``config`` is built with (``targetlm describe``, the model
        of a config file before training)."""
        return self.load_data(config, None, _silent).vocab

    @abstractmethod
    def predict(
        self, model: ModelT, batch: Batch, state: Any = None, *, run_heads: bool = True
    ) -> Prediction:
        """Run ``model`` on ``batch`` (continuing ``state``): its :class:`Prediction`."""


class StreamTask(Task[LanguageModel]):
    """A task over one token stream per split (language modelling); the language-model
    commands (``generate``, ``score``, ``eval`` on a file) read its runs."""

    reads = "stream"

    def batches(
        self, ids: torch.Tensor, batch_size: int, segment: int, **options: Any
    ) -> Sequence[Batch]:
        """The batches of a token stream ``ids`` (N + 1,), the context token first: by default
        :func:`~targetlm.data.batching.stream_batches`'s, whose keyword ``options`` it takes
        (``train``: drop what does not fill the batch, or pad it so that every target is
        scored once; ``lookahead``: extra target columns; ``input_ids``: what the model reads
        instead of ``ids``; ``positions``: fill :attr:`Batch.positions`)."""
        return stream_batches(ids, batch_size, segment, **options)


def _silent(message: str) -> None:
    pass


TASKS: Registry[Task[Any]] = Registry("task")


def build_task(config: Config) -> Task[Any]:
    """The task of ``config`` (``[task]``), built from the registry (not yet bound to a run:
    :meth:`Task.setup`)."""
    return TASKS.build(config.task.kind, config.task.options, "task")
