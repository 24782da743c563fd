r"""Data-parallel training on several processes (``torchrun``): CPUs with gloo, GPUs with NCCL.

::

    torchrun --nproc_per_node K -m targetlm train CONFIG [--run-dir DIR] [--resume]

Every process (rank r of K) holds the whole model and reads its share of each batch's rows;
the gradients of the K shares are averaged before the optimiser step, so the K processes
take the step one process would take on the whole batch::

    batch (B, T)     rows 0 .. B/K−1 → rank 0 | rows B/K .. 2B/K−1 → rank 1 | ...
    loss             Σ_r (rank r's summed loss) / (the batch's scored positions)
    gradients        all-reduce (average), bucketed, after backward and before clipping
    carried state    each rank carries its rows' encoder state; checkpoints hold the whole
                     batch's state (the same file as one process's: resumable with any K)

Why an explicit all-reduce and not ``torch.nn.parallel.DistributedDataParallel``: the
trainer's step uses parameters outside ``model.forward`` (the task's ``predict`` runs the
translation encoder itself, the objective reads ``E_out`` from ``model.output()``, AL reads
the input embedding) and some steps leave parameters without gradients (GroC's sparse output
updates, the WDR conjugate); DDP's hooks would need the whole loss inside one ``forward``
and ``find_unused_parameters``. Averaging the gradients of the optimiser's parameters after
backward is correct for every component, costs the same bytes, and only gives up the
overlap of communication with backward.

The loss is the batch's: every objective averages over scored positions (each N-gram head
over its own), and ranks may score different numbers of them (translation batches; the last
row of an N-gram stream), so each rank weighs each head's mean by its share of the batch's
positions (:class:`ShardedObjective`); the loss value the trainer sees, logs and checks for
NaN is the whole batch's, on every rank.

Only rank 0 writes the run directory (config, vocabulary, metrics, checkpoints, results,
report) and logs; validation runs on rank 0 and its result is broadcast, so the schedule,
the best model and early stopping agree on every rank; Ctrl-C (which ``torchrun`` passes to
every worker) stops all ranks after the same step. All ranks draw from the same random
streams (the same seed, restored from ``last.pt``): random decisions shared by the model
(GroC's sparse updates) agree and resume is exact, and rank r's rows get the dropout masks
rank 0's rows get. FSDP (sharded parameters for models larger than one device) is not
implemented: every rank holds the whole model.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from targetlm.config import Config
from targetlm.modules.model import LanguageModel, Prediction, evaluating
from targetlm.objectives import LossOutput, NgramLoss
from targetlm.registry import ConfigError
from targetlm.tasks import Batch, Task, build_task
from targetlm.training.trainer import Trainer

BUCKET_BYTES = 25 * 2**20  # gradients all-reduced per ~25 MiB flat buffer (DDP's default)
# rank 0 alone validates and writes checkpoints while the others wait in a collective
TIMEOUT = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class Ranks:
    """Where this process is: ``rank`` of ``world_size``, ``local_rank`` on its node."""

    rank: int
    world_size: int
    local_rank: int

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes and logs."""
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> Ranks | None:
        """The ranks ``torchrun`` set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); None when this
        process is alone (no ``WORLD_SIZE``, or 1)."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return None
        rank = int(os.environ["RANK"])
        return cls(rank, world_size, int(os.environ.get("LOCAL_RANK", rank)))


def launched() -> bool:
    """Whether this process is one of several started by ``torchrun`` (``WORLD_SIZE`` > 1)."""
    return Ranks.from_environment() is not None


def is_main_process() -> bool:
    """True for rank 0 of a distributed run and for a single process."""
    ranks = Ranks.from_environment()
    return ranks is None or ranks.main


class Collectives:
    """The few collectives training needs, on ``device`` (the CPU for gloo, this rank's GPU
    for NCCL); every rank must call them in the same order."""

    def __init__(self, ranks: Ranks, device: torch.device) -> None:
        self.ranks = ranks
        self.device = device

    def sum(self, values: Sequence[float]) -> list[float]:
        """The element-wise sum of ``values`` over the ranks (float64)."""
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on some rank."""
        return self.sum([float(flag)])[0] > 0

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` (any picklable object) on every rank."""
        holder = [value]
        dist.broadcast_object_list(holder, src=0, device=self.device)
        return holder[0]

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order."""
        gathered: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def broadcast_module(self, module: nn.Module) -> None:
        """Overwrite ``module``'s parameters and buffers with rank 0's."""
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def average_gradients(self, parameters: Sequence[nn.Parameter]) -> None:
        """Replace each parameter's gradient by its mean over the ranks (flat buckets of
        ``BUCKET_BYTES``). A parameter without a gradient on some ranks gets zeros there
        (its gradient on the whole batch exists); one without a gradient anywhere keeps
        ``None``, as in one process (so the optimiser skips it the same way)."""
        flags = torch.tensor(
            [p.grad is not None for p in parameters], dtype=torch.float32, device=self.device
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        gradients = []
        for parameter, has_gradient in zip(parameters, flags.tolist()):
            if not has_gradient:
                continue
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            elif parameter.grad.is_sparse:
                raise RuntimeError("distributed training averages dense gradients only")
            gradients.append(parameter.grad)
        for bucket in _buckets(gradients, BUCKET_BYTES):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat)
            flat /= self.ranks.world_size
            for gradient, averaged in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                gradient.copy_(averaged)


def _buckets(tensors: Sequence[torch.Tensor], max_bytes: int) -> Iterator[list[torch.Tensor]]:
    """Consecutive runs of ``tensors`` of one dtype and device, up to ``max_bytes`` each."""
    bucket: list[torch.Tensor] = []
    size = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and (
            size + nbytes > max_bytes
            or (tensor.dtype, tensor.device) != (bucket[0].dtype, bucket[0].device)
        ):
            yield bucket
            bucket, size = [], 0
        bucket.append(tensor)
        size += nbytes
    if bucket:
        yield bucket


# --- the data: each rank's rows ----------------------------------------------------------
def shard_rows(batch: Batch, rank: int, world_size: int) -> Batch:
    """Rank ``rank``'s contiguous share of ``batch``'s rows (the first ``B mod K`` ranks one
    more when ``world_size`` does not divide B; a rank may get none of a short batch)."""
    rows = torch.tensor_split(torch.arange(batch.inputs.size(0)), world_size)[rank]
    index = slice(int(rows[0]), int(rows[-1]) + 1) if len(rows) else slice(0, 0)

    def take(tensor: torch.Tensor | None) -> torch.Tensor | None:
        return None if tensor is None else tensor[index]

    return Batch(
        batch.inputs[index],
        batch.targets[index],
        take(batch.positions),
        take(batch.source),
        take(batch.source_mask),
    )


class ShardedBatches(Sequence[Batch]):
    """``batches`` as rank ``rank`` of ``world_size`` reads them (:func:`shard_rows`)."""

    def __init__(self, batches: Sequence[Batch], rank: int, world_size: int) -> None:
        self.batches = batches
        self.rank = rank
        self.world_size = world_size

    def __len__(self) -> int:
        return len(self.batches)

    @overload
    def __getitem__(self, index: int) -> Batch: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Batch]: ...
    def __getitem__(self, index: int | slice) -> Batch | Sequence[Batch]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return shard_rows(self.batches[index], self.rank, self.world_size)


# --- the loss: the whole batch's, from each rank's rows -----------------------------------
class ShardedObjective(nn.Module):
    """The trainer's objective (:class:`~targetlm.objectives.NgramLoss`) on one rank's rows,
    scaled so that the ranks' averaged gradients are the whole batch's.

    Head n's loss is its summed loss over the whole batch's scored positions, S_n / C_n with
    C_n = Σ_r c_n^r; the N-gram loss divides rank r's sum S_n^r by C_n / K (its
    ``count_divisors``, the counts all-reduced here), so the K ranks' averaged gradients are
    the whole batch's. The returned ``loss`` has the whole batch's value (its gradient is
    this rank's share), ``nll_sum`` and ``count`` are the whole batch's too, so the trainer
    logs and checks what one process would.
    """

    def __init__(self, objective: NgramLoss, collectives: Collectives) -> None:
        super().__init__()
        self.objective = objective
        self.collectives = collectives
        self.lookahead = objective.lookahead
        self.totals: list[float] = []  # the last step's whole-batch counts per head
        objective.count_divisors = self.divisors

    def divisors(self, counts: list[int]) -> list[float]:
        """C_n / K for this rank's counts c_n^r (an all-reduce: every rank calls it)."""
        self.totals = self.collectives.sum(counts)
        return [total / self.collectives.ranks.world_size for total in self.totals]

    def forward(
        self,
        prediction: Prediction,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> LossOutput:
        out = self.objective(prediction, targets, weight, bias)
        world_size = self.collectives.ranks.world_size
        loss_sum, nll_sum = self.collectives.sum([out.loss.item(), float(out.nll_sum)])
        # the value of the whole batch's loss, the gradient of this rank's share
        loss = out.loss + (loss_sum / world_size - out.loss.detach())
        return LossOutput(loss, torch.tensor(nll_sum, dtype=torch.float64), int(self.totals[0]))


# --- the carried encoder state: each rank's rows, the whole batch in checkpoints -----------
def _leaves(state: Any) -> list[torch.Tensor]:
    if state is None:
        return []
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, (list, tuple)):
        return [leaf for part in state for leaf in _leaves(part)]
    raise TypeError(f"cannot split an encoder state of type {type(state).__name__} by rows")


def _rebuild(state: Any, leaves: Iterator[torch.Tensor]) -> Any:
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return next(leaves)
    return type(state)(_rebuild(part, leaves) for part in state)


@torch.no_grad()
def state_batch_dims(model: LanguageModel, device: torch.device) -> list[int]:
    """The row dimension of each tensor of ``model``'s carried state (in :func:`_leaves`
    order), found by encoding one and two rows in evaluation mode (no random draws)."""
    with evaluating(model):
        shapes = [
            [
                leaf.shape
                for leaf in _leaves(
                    model.encode(torch.zeros(rows, 1, dtype=torch.long, device=device))[1]
                )
            ]
            for rows in (1, 2)
        ]
    dims = []
    for one, two in zip(*shapes):
        differing = [d for d, (a, b) in enumerate(zip(one, two)) if a != b]
        if len(differing) != 1:
            raise TypeError(f"cannot find the row dimension of a state tensor {tuple(two)}")
        dims.append(differing[0])
    return dims


def gather_state(state: Any, dims: list[int], collectives: Collectives) -> Any:
    """The whole batch's state from every rank's rows (on the CPU, on every rank)."""
    local = [leaf.detach().cpu() for leaf in _leaves(state)]
    gathered = collectives.all_gather(local)
    joined = [torch.cat(parts, dim) for parts, dim in zip(zip(*gathered), dims)]
    return _rebuild(state, iter(joined))


def shard_state(state: Any, dims: list[int], rank: int, world_size: int) -> Any:
    """Rank ``rank``'s rows of the whole batch's ``state`` (as :func:`shard_rows` splits them)."""
    leaves = [
        torch.tensor_split(leaf, world_size, dim)[rank].clone()
        for leaf, dim in zip(_leaves(state), dims)
    ]
    return _rebuild(state, iter(leaves))


# --- the trainer -----------------------------------------------------------------------------
def _silent(message: str) -> None:
    pass


class DistributedTraining:
    """Mixin before :class:`~targetlm.training.trainer.Trainer` (or a subclass) that makes
    it one rank of a ``torchrun`` job (see the module docstring); a process group already
    initialised by the caller is used as it is, otherwise one is started (gloo for the CPU,
    NCCL for ``train.device = "cuda"``, this rank's GPU ``cuda:LOCAL_RANK``) and ended
    after training."""

    # attributes of the Trainer this class is mixed into
    config: Config
    task: Task
    run_dir: Path
    device: torch.device
    model: LanguageModel
    objective: nn.Module
    optimizer: torch.optim.Optimizer
    state: Any
    step: int
    stop_requested: bool

    def __init__(
        self, config: Config, run_dir: str | Path, resume: bool = False, log: Any = print
    ) -> None:
        ranks = Ranks.from_environment()
        if ranks is None:
            raise RuntimeError("distributed training needs torchrun's RANK and WORLD_SIZE (> 1)")
        self.ranks = ranks
        device = torch.device(config.train.device)
        if device.type == "cuda" and device.index is not None:
            raise ConfigError(
                f"train.device = {config.train.device!r}: under torchrun use 'cuda' "
                "(each process takes the GPU cuda:LOCAL_RANK)"
            )
        # a stream's B rows are shared equally; sentence pairs as evenly as they go
        batch_size, world_size = config.data.batch_size, ranks.world_size
        if not build_task(config).conditional and (batch_size % world_size):
            raise ConfigError(
                f"data.batch_size = {batch_size} rows cannot be shared by {world_size} "
                f"processes: use a multiple of {world_size}"
            )
        if config.train.gradient_diversity_every:
            raise ConfigError(
                "train.gradient_diversity_every: measured in single-process runs only"
            )
        self.owns_process_group = not dist.is_initialized()
        if device.type == "cuda":
            torch.cuda.set_device(ranks.local_rank)
            device = torch.device("cuda", ranks.local_rank)
        if self.owns_process_group:
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                rank=ranks.rank,
                world_size=ranks.world_size,
                timeout=TIMEOUT,
            )
        self.collectives = Collectives(ranks, device)
        self._interrupted = False
        self._shared_evaluation = True  # validation while training; finish() is rank 0's
        self._state_dims: list[int] | None = None
        if not ranks.main:  # one progress bar, one log
            config, log = config.replace(["train.progress=false"]), _silent
        try:
            super().__init__(config, run_dir, resume, log)  # type: ignore[call-arg]
        except Exception:
            self._end_process_group()
            raise
        dist.barrier()  # every rank has checked the run directory before rank 0 writes to it

    # --- setup and data ------------------------------------------------------------------
    def _setup(self) -> None:
        super()._setup()  # type: ignore[misc]
        self.device = self.collectives.device
        self.collectives.broadcast_module(self.model)  # the same initial weights everywhere
        self.collectives.broadcast_module(self.objective)
        if not isinstance(self.objective, NgramLoss):
            raise ConfigError(
                f"task.kind = {self.config.task.kind!r}: its loss is not shared by rows across "
                "processes yet; train it in one process"
            )
        self.objective = ShardedObjective(self.objective, self.collectives)

    def _training_batches(self) -> Any:
        batches = super()._training_batches()  # type: ignore[misc]
        return ShardedBatches(batches, self.ranks.rank, self.ranks.world_size)

    # --- the step --------------------------------------------------------------------------
    def _synchronise_gradients(self) -> None:
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.collectives.average_gradients(parameters)

    def train_step(self, batch: Batch, lr: float) -> tuple[float, int]:
        result = super().train_step(batch, lr)  # type: ignore[misc]
        # the loop checks stop_requested before the next step: the same decision everywhere
        self.stop_requested = self.collectives.any(self._interrupted)
        return result

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        # torchrun passes Ctrl-C on to every worker, which the terminal has already
        # signalled: a repeat is not a second Ctrl-C (torchrun kills the workers after 30 s)
        self._interrupted = True

    def _evaluate(self, split: str) -> dict[str, Any]:
        if not self._shared_evaluation:
            return super()._evaluate(split)  # type: ignore[misc]
        result = super()._evaluate(split) if self.ranks.main else None  # type: ignore[misc]
        return self.collectives.broadcast(result)

    # --- the run directory: rank 0's -------------------------------------------------------
    def _start_run_dir(self) -> None:
        if self.ranks.main:
            super()._start_run_dir()  # type: ignore[misc]

    def _write_metrics(self, record: dict[str, Any]) -> None:
        if self.ranks.main:
            super()._write_metrics(record)  # type: ignore[misc]

    def _forget_later_metrics(self, count: int | None) -> None:
        if self.ranks.main:
            super()._forget_later_metrics(count)  # type: ignore[misc]

    @contextlib.contextmanager
    def _hold_run_dir(self) -> Iterator[None]:
        if not self.ranks.main:  # rank 0 holds the lock for the job
            yield
            return
        with super()._hold_run_dir():  # type: ignore[misc]
            yield

    def _save_best(self, valid_ppl: float) -> None:
        if self.ranks.main:
            super()._save_best(valid_ppl)  # type: ignore[misc]

    def _state_rows(self) -> list[int]:
        if self._state_dims is None:
            self._state_dims = state_batch_dims(self.model, self.device)
        return self._state_dims

    def _checkpoint(self) -> None:
        # the whole batch's state, as one process would save it (a collective: every rank)
        local = self.state
        whole = None if local is None else gather_state(local, self._state_rows(), self.collectives)
        if self.ranks.main:
            self.state = whole
            try:
                super()._checkpoint()  # type: ignore[misc]
            finally:
                self.state = local

    def _restore(self) -> None:
        super()._restore()  # type: ignore[misc]
        if self.state is not None:
            rows = self._state_rows()
            self.state = shard_state(self.state, rows, self.ranks.rank, self.ranks.world_size)

    # --- the end -------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        try:
            return super().train()  # type: ignore[misc]
        finally:
            self._end_process_group()

    def _end_process_group(self) -> None:
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()

    def finish(self) -> dict[str, Any]:
        """Rank 0 evaluates and writes the results (the others return ``{"rank", "steps"}``
        at once)."""
        self._shared_evaluation = False
        if not self.ranks.main:
            return {"rank": self.ranks.rank, "steps": self.step}
        return super().finish()  # type: ignore[misc]


class DistributedTrainer(DistributedTraining, Trainer):
    """:class:`~targetlm.training.trainer.Trainer` as one rank of a ``torchrun`` job."""


def process_trainer() -> type[Trainer]:
    """The trainer class of this process, for every task: :class:`~targetlm.training.Trainer`
    when it runs alone, :class:`DistributedTrainer` under ``torchrun`` with several processes."""
    return DistributedTrainer if launched() else Trainer
