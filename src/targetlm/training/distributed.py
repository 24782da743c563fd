r"""Data-parallel training on several processes (``torchrun``): CPUs with gloo, GPUs with NCCL.

::

    torchrun --nproc_per_node K -m targetlm train CONFIG [--run-dir DIR] [--resume]

Every process (rank r of K) holds the whole model and reads its share of each batch's rows;
torch's :class:`~torch.nn.parallel.DistributedDataParallel` averages the K shares' gradients
during backward (bucketed, overlapping the backward pass), so the K processes take the step
one process would take on the whole batch::

    batch (B, T)     rows 0 .. B/K−1 → rank 0 | rows B/K .. 2B/K−1 → rank 1 | ...
    loss             Σ_r (rank r's summed loss) / (the batch's scored positions)
    gradients        DDP's all-reduce (average), during backward; none between the
                     micro-batches of an accumulated step (``no_sync``)
    carried state    each rank carries its rows' encoder state; checkpoints hold the whole
                     batch's state (the same file as one process's: resumable with any K)

DDP wraps the whole step's loss, one module (:class:`~targetlm.training.step.TrainingStep`:
the task's ``predict``, the output layer, the objective), so every parameter the loss reads
is one DDP knows. It searches the graph for parameters without a gradient
(``find_unused_parameters``) only where a step may leave some: the heads-only warm-up and
output layers that declare ``may_leave_parameters_unused`` (GroC's sparse updates).

With ``train.parallel = "fsdp"`` the step is sharded instead (FSDP2, ``fully_shard``; hf
backbones, per decoder layer: :func:`shard_step`): each rank keeps 1/K of the parameters,
gradients and optimiser state, every rank evaluates, and checkpoints are torch distributed
checkpoints beside ``last.pt`` (:func:`save_sharded`), read back with any number of ranks and
without running anything a file of the run directory names (:func:`load_sharded`).

The loss is the batch's: every objective returns its parts' sums with their counts, which
the step divides once (each N-gram head's by its own), and ranks may score different
numbers of positions (translation batches; the last row of an N-gram stream), so each rank
divides each part's sum by the batch's count over K, all-reduced on the device
(:func:`~targetlm.training.step.divide_once`, in the step's forward); the loss value
the trainer sees, logs and checks for NaN is the whole batch's, on every rank. A task that
draws randomness per row (diffusion's times and noise) draws the whole batch's on every rank
and keeps its rows (``Batch.part``), so each row gets what one process gives it.

The trainer is the single-process one; it asks its :class:`Processes` (one process: a no-op)
who writes (``is_main``), for sums and broadcasts. Only rank 0 writes the run directory
(config, vocabulary, metrics, checkpoints, results, report) and logs; validation runs on
rank 0 and its result is broadcast, so the schedule, the best model and early stopping agree
on every rank; Ctrl-C (which ``torchrun`` passes to every worker) stops all ranks after the
same step. All ranks draw from the same random streams (the same seed, restored from
``last.pt``): random decisions shared by the model (GroC's sparse updates) agree and resume is
exact, and rank r's rows get the dropout masks rank 0's rows get.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import pickle
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel

from targetlm.checkpoint import SHARDED_DIRECTORY, CheckpointError, load_failure
from targetlm.config import Config
from targetlm.data.batching import BatchList
from targetlm.modules.model import LanguageModel, evaluating
from targetlm.registry import ConfigError
from targetlm.tasks import Batch, build_task
from targetlm.training.step import TrainingStep

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


class Processes:
    """The processes of a run, as the trainer asks them: whether this one writes
    (``is_main``), sums and broadcasts over them, its share of the batches, the DDP wrapper
    of the step. One process (``Processes()``): every method is a no-op, the trainer runs as
    it always did. Every rank must call the collectives in the same order."""

    def __init__(
        self,
        ranks: Ranks | None = None,
        device: torch.device | None = None,
        owns_group: bool = False,
        parallel: str = "ddp",
    ) -> None:
        self.ranks = ranks
        self.device = device or torch.device("cpu")
        self.owns_group = owns_group
        self.parallel = parallel  # train.parallel: "ddp" or "fsdp"

    @property
    def world_size(self) -> int:
        return 1 if self.ranks is None else self.ranks.world_size

    @property
    def rank(self) -> int:
        return 0 if self.ranks is None else self.ranks.rank

    @property
    def is_main(self) -> bool:
        """Rank 0, or the only process: the one that writes and logs."""
        return self.rank == 0

    @property
    def several(self) -> bool:
        return self.world_size > 1

    @property
    def sharded(self) -> bool:
        """The parameters are sharded over several processes (FSDP2): every rank takes part
        in every forward (evaluation included) and in every checkpoint."""
        return self.several and self.parallel == "fsdp"

    # --- collectives -----------------------------------------------------------------------
    def sum(self, values: Sequence[float]) -> list[float]:
        """The element-wise sum of ``values`` over the processes (float64)."""
        if not self.several:
            return [float(v) for v in values]
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def sum_tensor(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``values`` over the processes, on their device (no host
        sync); one process: ``values`` itself."""
        if not self.several:
            return values
        values = values.clone()
        dist.all_reduce(values)
        return values

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true in some process."""
        return self.sum([float(flag)])[0] > 0

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` (any picklable object) in every process."""
        if not self.several:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=0, device=self.device)
        return holder[0]

    def all_gather(self, value: Any) -> list[Any]:
        """Every process's ``value`` (picklable), in rank order."""
        if not self.several:
            return [value]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def barrier(self) -> None:
        if self.several:
            dist.barrier()

    # --- the data and the step ---------------------------------------------------------------
    def shard(self, batches: Sequence[Batch]) -> Sequence[Batch]:
        """This process's rows of ``batches`` (:func:`shard_rows`); one process: all of them."""
        if not self.several:
            return batches
        return ShardedBatches(batches, self.rank, self.world_size)

    def wrap(self, step: TrainingStep, find_unused_parameters: bool) -> nn.Module:
        """``step`` (the whole step's loss) under DDP; one process: ``step`` itself. DDP
        broadcasts rank 0's parameters and buffers here, so every rank starts alike. With
        ``train.parallel = "fsdp"``: ``step`` sharded in place (:func:`shard_step`)."""
        if not self.several:
            return step
        if self.sharded:
            return shard_step(step)
        return DistributedDataParallel(
            step,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=False,  # the ranks compute the same buffers
        )

    @staticmethod
    def accumulating(wrapped: nn.Module, final: bool) -> contextlib.AbstractContextManager:
        """The context of a micro-batch's forward and backward: without DDP's all-reduce
        (``no_sync``) or FSDP's reduce-scatter unless it is the step's ``final`` one."""
        if isinstance(wrapped, FSDPModule):
            wrapped.set_requires_gradient_sync(final)
            return contextlib.nullcontext()
        if final or not isinstance(wrapped, DistributedDataParallel):
            return contextlib.nullcontext()
        return wrapped.no_sync()

    @contextlib.contextmanager
    def whole(self, step: nn.Module) -> Iterator[None]:
        """With the sharded step's own parameters (embeddings, heads, output layer) gathered,
        so that its model can be called outside ``step.forward`` (evaluation; each decoder
        layer gathers its own); a no-op unless sharded. Every rank must enter it."""
        if not isinstance(step, FSDPModule):
            yield
            return
        step.unshard()
        try:
            yield
        finally:
            step.reshard()

    def close(self) -> None:
        """End the process group this object started (none otherwise)."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_group = False


def start(config: Config) -> Processes:
    """The processes of this run: alone (no ``WORLD_SIZE``, or 1), ``Processes()``; under
    ``torchrun``, this rank of a process group (gloo for the CPU, NCCL for ``train.device =
    "cuda"``, this rank's GPU ``cuda:LOCAL_RANK``), started here unless the caller started it.

    Raises:
        ConfigError: a configuration several processes cannot train (checked before the
            process group starts and before anything is written).
    """
    ranks = Ranks.from_environment()
    if ranks is None:
        return Processes()
    device = torch.device(config.train.device)
    if device.type == "cuda" and device.index is not None:
        raise ConfigError(
            f"train.device = {config.train.device!r}: under torchrun use 'cuda' "
            "(each process takes the GPU cuda:LOCAL_RANK)"
        )
    batch_size, world_size = config.data.batch_size, ranks.world_size
    if not build_task(config).conditional:  # a stream's B rows are shared equally
        if batch_size < world_size:
            raise ConfigError(
                f"--nproc_per_node {world_size} is larger than the batch's data.batch_size = "
                f"{batch_size} rows: every process needs rows; use at most {batch_size} "
                "processes or a larger batch"
            )
        if batch_size % world_size:
            raise ConfigError(
                f"data.batch_size = {batch_size} rows cannot be shared by {world_size} "
                f"processes: use a multiple of {world_size}"
            )
    if config.train.parallel == "fsdp" and config.model.backbone.kind != "hf":
        raise ConfigError(
            "train.parallel = 'fsdp' shards hf backbones (model.backbone.kind = 'hf') by "
            "decoder layer; train this model with train.parallel = 'ddp'"
        )
    if config.train.gradient_diversity_every:
        raise ConfigError("train.gradient_diversity_every: measured in single-process runs only")
    owns_group = not dist.is_initialized()
    if device.type == "cuda":
        torch.cuda.set_device(ranks.local_rank)
        device = torch.device("cuda", ranks.local_rank)
    if owns_group:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            rank=ranks.rank,
            world_size=ranks.world_size,
            timeout=TIMEOUT,
        )
    return Processes(ranks, device, owns_group, config.train.parallel)


# --- FSDP2: an hf backbone sharded by decoder layer ----------------------------------------------
def decoder_layers(model: LanguageModel) -> list[nn.Module]:
    """The decoder layers of ``model``'s hf backbone (Llama's ``layers``, GPT-Neo's ``h``: the
    base model's one list of blocks)."""
    from targetlm.modules.hf import HfEncoder

    encoder = model.encoder
    if not isinstance(encoder, HfEncoder):
        raise ConfigError("train.parallel = 'fsdp' needs an hf backbone (model.backbone.kind)")
    lists = [child for child in encoder.body.children() if isinstance(child, nn.ModuleList)]
    if len(lists) != 1:
        raise ConfigError(
            f"train.parallel = 'fsdp': cannot find the decoder layers of a "
            f"{type(encoder.body).__name__} ({len(lists)} module lists)"
        )
    return list(lists[0])


def shard_step(step: TrainingStep) -> TrainingStep:
    """Shard ``step`` (a :class:`~targetlm.training.step.TrainingStep`) with FSDP2, in place:
    each decoder layer its own unit (gathered for its forward and backward only, as torchtune
    and torchtitan shard them), the rest (embeddings, heads, output layer, objective) the
    root's. Parameters become DTensors: build the optimiser after this."""
    for layer in decoder_layers(step.model):
        fully_shard(layer)
    fully_shard(step)
    return step


def sharded_checkpoint_name(step: int) -> str:
    """The directory (beside last.pt) of the sharded model and optimiser of step ``step``."""
    return f"last-step{step}.dcp"


# --- sharded checkpoints: written by torch, read without running code ----------------------------
# torch's own reader unpickles a distributed checkpoint's ``.metadata`` with plain ``pickle``
# and loads its byte items (the optimiser's param groups: numbers, flags, names) with
# ``torch.load(weights_only=False)``: a crafted file of a run directory would run whatever it
# names on ``train --resume``. load_sharded reads them as checkpoint.load reads last.pt: the
# metadata with an unpickler that builds only the classes torch's Metadata is made of, the byte
# items with ``weights_only=True`` (the tensors torch already reads so), and only files directly
# inside the checkpoint's directory, itself directly inside the run directory.

# what a checkpoint's metadata pickles, beyond plain values: the classes of
# torch/distributed/checkpoint/metadata.py (and the file reader's record of where each item lies),
# tensor sizes, dtypes (:func:`_metadata_global`) and layouts, and the checkpoint's path (read as a
# pure path: nothing touches the file system)
_METADATA_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    **{
        (module, name): path
        for module in ("pathlib", "pathlib._local")
        for names, path in (
            (("PosixPath", "PurePosixPath"), PurePosixPath),
            (("WindowsPath", "PureWindowsPath"), PureWindowsPath),
        )
        for name in names
    },
}
METADATA_FILE = ".metadata"
# the name of a data file of a checkpoint: a plain name (no directory, no leading dot)
_DATA_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _metadata_global(module: str, name: str) -> Any:
    """What the name ``module.name`` in a checkpoint's metadata stands for: one of
    :data:`_METADATA_GLOBALS` or a torch dtype; None for anything else."""
    if (module, name) in _METADATA_GLOBALS:
        return _METADATA_GLOBALS[module, name]
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    return None


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles a distributed checkpoint's metadata, building only what torch's
    :class:`~torch.distributed.checkpoint.metadata.Metadata` is made of: any other name a
    pickle asks for (a function such as ``os.system``, a class whose construction acts) is
    refused before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        found = _metadata_global(module, name)
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")
        return found


def _resolved(path: Path) -> Path:
    """``path`` with its symbolic links followed; a loop of links is a CheckpointError."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as error:  # (a loop: RuntimeError before Python 3.13)
        raise CheckpointError(f"{path}: {error}") from None


def _inside(directory: Path, name: str) -> Path:
    """The file ``name`` of ``directory`` (resolved), refused unless it is a plain file
    directly inside it (a symbolic link may not lead elsewhere)."""
    path = directory / name
    resolved = _resolved(path)
    if resolved.parent != directory or not resolved.is_file():
        raise CheckpointError(f"{path}: not a file of the sharded checkpoint {directory}; refused")
    return resolved


def _check_metadata(metadata: Any, path: Path) -> dcp_metadata.Metadata:
    """``metadata``, refused unless it is what :func:`save_sharded` writes: a Metadata whose
    items lie in plain files of the checkpoint's directory, read as written (no stream
    transforms)."""
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise CheckpointError(
            f"{path}: not a sharded checkpoint's metadata (a {type(metadata).__name__})"
        )
    items = metadata.state_dict_metadata
    storage = metadata.storage_data
    if not isinstance(items, dict) or not isinstance(storage, dict):
        raise CheckpointError(f"{path}: not a sharded checkpoint's metadata (no item tables)")
    kinds = (dcp_metadata.TensorStorageMetadata, dcp_metadata.BytesStorageMetadata)
    for fqn, kind in items.items():
        if not isinstance(fqn, str) or not isinstance(kind, kinds):
            raise CheckpointError(f"{path}: item {fqn!r} is of no kind torch writes")
    for index, where in storage.items():
        if not isinstance(index, dcp_metadata.MetadataIndex) or not isinstance(where, _StorageInfo):
            raise CheckpointError(f"{path}: an item's location is of no kind torch writes")
        name = where.relative_path
        if not isinstance(name, str) or not _DATA_FILE.fullmatch(name):
            raise CheckpointError(
                f"{path}: item {index.fqn!r} lies in {name!r}, not a file of this directory"
            )
        if not all(isinstance(n, int) and n >= 0 for n in (where.offset, where.length)):
            raise CheckpointError(f"{path}: item {index.fqn!r} has no valid offset and length")
        if where.transform_descriptors:
            raise CheckpointError(
                f"{path}: item {index.fqn!r} is stored through transforms "
                f"{list(where.transform_descriptors)!r}, which targetlm does not write"
            )
    return metadata


def read_metadata(directory: Path) -> dcp_metadata.Metadata:
    """The metadata of the sharded checkpoint ``directory`` (resolved), read without running
    code (:class:`MetadataUnpickler`) and checked (:func:`_check_metadata`).

    Raises:
        CheckpointError: unreadable or unexpected metadata (one line, naming the file).
    """
    path = _inside(directory, METADATA_FILE)
    try:
        with path.open("rb") as handle:
            metadata = MetadataUnpickler(handle).load()
    except Exception as error:  # unpickling errors come in many types
        raise CheckpointError(
            f"{path}: unreadable sharded checkpoint metadata ({load_failure(error)})"
        ) from None
    return _check_metadata(metadata, path)


class _Reader(FileSystemReader):
    """torch's file-system reader of a distributed checkpoint, but for the metadata (read by
    :func:`read_metadata`) and the files it reads data from (each checked to be a plain file
    directly inside the checkpoint's directory). Tensors it reads, as torch does, with
    ``torch.load(weights_only=True)``."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.directory = directory

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        """The checkpoint's one metadata file, whatever rank asks (save_sharded writes no
        per-rank ones)."""
        metadata = read_metadata(self.directory)
        if metadata.storage_meta is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for name in {self.storage_data[item.storage_index].relative_path for item in plan.items}:
            _inside(self.directory, name)
        return super().read_data(plan, planner)


class _Planner(DefaultLoadPlanner):
    """torch's default load planner, but byte items (whatever the state held that is not a
    tensor: the optimiser's param groups) load with ``torch.load(weights_only=True)``: plain
    values only, never an object whose unpickling runs code."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, map_location="cpu", weights_only=True)
        except Exception as error:  # unpickling errors come in many types
            assert self.metadata is not None and self.metadata.storage_data is not None
            where = self.metadata.storage_data[read_item.storage_index]
            raise CheckpointError(
                f"{self.directory / where.relative_path}: item {read_item.dest_index.fqn!r} "
                f"is unreadable ({load_failure(error)})"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def sharded_directory(
    directory: str | os.PathLike[str], run_dir: str | os.PathLike[str] | None = None
) -> Path:
    """``directory`` resolved, refused unless it is a directory named ``last-step<N>.dcp``
    directly inside the run directory ``run_dir``, symbolic links followed: a checkpoint
    cannot send its reader elsewhere. Without ``run_dir``, the run directory is the parent
    ``directory`` names, and a path that climbs out of a directory it has named
    (``run/../elsewhere/last-step3.dcp``) is refused.

    Raises:
        CheckpointError: any other path (one line, naming it).
    """
    path = Path(directory)
    run = Path(run_dir) if run_dir is not None else path.parent
    parts = path.parts
    leading = next((i for i, part in enumerate(parts) if part != ".."), len(parts))
    resolved = _resolved(path)
    if (
        ".." in parts[leading:]
        or not SHARDED_DIRECTORY.fullmatch(path.name)
        or not SHARDED_DIRECTORY.fullmatch(resolved.name)
        or resolved.parent != _resolved(run)
    ):
        raise CheckpointError(
            f"{path}: not a sharded checkpoint directory last-step<N>.dcp of the run "
            f"directory {run}; refused"
        )
    if not resolved.is_dir():
        raise CheckpointError(f"sharded checkpoint not found: {path}")
    return resolved


def save_sharded(
    step: nn.Module, optimizer: torch.optim.Optimizer, directory: str | os.PathLike[str]
) -> None:
    """Write ``step``'s parameters and ``optimizer``'s state to ``directory`` with torch
    distributed checkpoint: every rank its shards (a collective; with one process, the whole).
    ``directory`` is ``last-step<N>.dcp`` in the run directory, not a symbolic link (a link
    planted there would send the write elsewhere)."""
    path = Path(directory)
    if not SHARDED_DIRECTORY.fullmatch(path.name) or path.is_symlink():
        raise CheckpointError(f"{path}: not a directory last-step<N>.dcp to write a checkpoint to")
    model_state, optimizer_state = get_state_dict(step, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path)


def load_sharded(
    step: nn.Module,
    optimizer: torch.optim.Optimizer,
    directory: str | os.PathLike[str],
    run_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Read what :func:`save_sharded` wrote into ``step`` and ``optimizer``, resharded for
    this run's processes (another number of processes than the writer's reads it too).

    Nothing in the checkpoint runs code: ``directory`` must be ``last-step<N>.dcp`` directly
    inside the run directory ``run_dir`` (default: ``directory``'s parent;
    :func:`sharded_directory`), its metadata is read by :func:`read_metadata`, its byte items
    with ``weights_only=True`` and its data only from its own files.

    Raises:
        CheckpointError: a path elsewhere, or a file that is unreadable or holds more than
            tensors and plain values (one line, naming it; raised on every rank).
    """
    resolved = sharded_directory(directory, run_dir)
    read_metadata(resolved)  # refused here, before any collective, if it is not plain metadata
    model_state, optimizer_state = get_state_dict(step, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.load(state, storage_reader=_Reader(resolved), planner=_Planner(resolved))
    except CheckpointException as failure:  # every rank's failures: the first of ours
        for error, _ in failure.failures.values():
            if isinstance(error, CheckpointError):
                raise CheckpointError(str(error)) from None
        raise
    set_state_dict(
        step, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def _aliases(model: nn.Module) -> dict[str, str]:
    """The second and later names of a parameter shared under several names (tied weights)
    mapped to its first name (the one torch's full state dicts keep)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            aliases[name] = first[id(parameter)]
        else:
            first[id(parameter)] = name
    return aliases


def full_model_state(step: TrainingStep, processes: Processes) -> dict[str, torch.Tensor]:
    """The model's whole state dict (unsharded, on the CPU) as ``model.state_dict()`` names
    it (a tied weight under each of its names), for best.pt (a collective when sharded: rank 0
    gets it, the others ``{}``)."""
    model = step.model
    if not processes.sharded:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = get_model_state_dict(model, options=options)  # full: tensors
    if state:
        for alias, name in _aliases(model).items():
            state[alias] = state[name]
        state = {name: state[name] for name in model.state_dict() if name in state}
    return state


def load_full_model_state(step: TrainingStep, state: dict, processes: Processes) -> None:
    """Load a whole state dict (best.pt's, read by rank 0; the others pass ``{}``) into the
    model, sharded as it is."""
    model = step.model
    if not processes.sharded:
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    aliases = _aliases(model)
    state = {name: tensor for name, tensor in state.items() if name not in aliases}
    # (not strict: a tied weight's other names are the same tensor, loaded with the first)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    result = set_model_state_dict(model, state, options=options)
    missing = [name for name in result.missing_keys if name not in aliases]
    if missing:
        raise RuntimeError(f"the model's state lacks {', '.join(missing)}")


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
        (index.start, batch.inputs.size(0)),
    )


class ShardedBatches(BatchList[Batch]):
    """``batches`` as rank ``rank`` of ``world_size`` reads them (:func:`shard_rows`)."""

    def __init__(self, batches: Sequence[Batch], rank: int, world_size: int) -> None:
        self.batches = batches
        self.rank = rank
        self.world_size = world_size

    def __len__(self) -> int:
        return len(self.batches)

    def _batch(self, index: int) -> Batch:
        return shard_rows(self.batches[index], self.rank, self.world_size)


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


def gather_state(state: Any, dims: list[int], processes: Processes) -> Any:
    """The whole batch's state from every rank's rows (on the CPU, on every rank)."""
    local = [leaf.detach().cpu() for leaf in _leaves(state)]
    gathered = processes.all_gather(local)
    joined = [torch.cat(parts, dim) for parts, dim in zip(zip(*gathered), dims)]
    return _rebuild(state, iter(joined))


def shard_state(state: Any, dims: list[int], rank: int, world_size: int) -> Any:
    """Rank ``rank``'s rows of the whole batch's ``state`` (as :func:`shard_rows` splits them)."""
    leaves = [
        torch.tensor_split(leaf, world_size, dim)[rank].clone()
        for leaf, dim in zip(_leaves(state), dims)
    ]
    return _rebuild(state, iter(leaves))
