"""Training drafting heads on a frozen body into a new run directory (``targetlm train-heads``).

:func:`train_heads` reads the source run (or a config file: its model as built), builds the
heads to train, caches the body's states over the corpus (``targetlm.training.distill``),
trains the heads alone, measures their agreement with the body on held-out segments before and
after, and writes the new run directory beside its place and renames it there (whole or not at
all), its ``best.pt`` through :func:`~targetlm.training.checkpointer.write_best`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from targetlm.checkpoint import CheckpointError
from targetlm.registry import ConfigError

if TYPE_CHECKING:
    from targetlm.modules.heads import NgramHeads

__all__ = ["HEADS_RESULTS", "HeadsRecipe", "hf_eagle_options", "train_heads"]

HEADS_RESULTS = "heads.json"

# files of the source run that the new run does not carry over (rewritten or training-only)
NOT_COPIED = {
    ".lock",
    "last.pt",
    "best.pt",
    "metrics.jsonl",
    "config.toml",
    "report.md",
    "results.json",
    "learning_curve.png",
}


@dataclass
class HeadsRecipe:
    """What ``train-heads`` was asked (the command's flags, checked by the command).

    heads_kind / n / heads_options: the heads to train (None / None / {}: the run's own);
    options given for the run's kind are merged into its options. max_minutes: training stops
    before the step that would start later than this after the body pass began (None: all
    ``steps``). The rest as the flags say.
    """

    source: str
    corpus: str
    steps: int
    run_dir: Path
    heads_kind: str | None = None
    n: int | None = None
    heads_options: Mapping[str, Any] = field(default_factory=dict)
    init_heads: Path | None = None
    segment: int = 64
    batch_size: int = 8
    lr: float = 1e-3
    held_out: float = 0.1
    cache_mb: int = 1024
    seed: int = 0
    log_every: int = 50
    max_minutes: float | None = None


def _results_of_another_model(name: str) -> bool:
    """Whether a file of the source run is left behind: training-only or rewritten files, hidden
    ones, and what was measured on the source model (its evaluations, translations, scores),
    which the new heads would make stale."""
    measured = name.startswith(("eval-", "translate-", "score-", "generate-"))
    return name in NOT_COPIED or name.startswith(".") or measured


def hf_eagle_options(model: Any) -> dict[str, Any]:
    """An ``eagle`` head's shape from a Llama-like Hugging Face body (empty for other bodies):
    its attention heads, key/value heads, head width, MLP width, RoPE theta and norm eps."""
    body = getattr(model.encoder, "body", None)
    config = getattr(body, "config", None)
    if config is None:
        return {}
    options: dict[str, Any] = {}
    names = {
        "num_attention_heads": "num_attention_heads",
        "num_key_value_heads": "num_key_value_heads",
        "head_dim": "head_dim",
        "ff_size": "intermediate_size",
        "rms_norm_eps": "rms_norm_eps",
    }
    for option, name in names.items():
        value = getattr(config, name, None)
        if value is not None:
            options[option] = value
    theta = getattr(config, "rope_theta", None)
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if theta is None and isinstance(rope, Mapping):
        theta = rope.get("rope_theta")
    if theta is not None:
        options["rope_theta"] = float(theta)
    return options


def _heads_config(current: Any, recipe: HeadsRecipe, model: Any) -> Any:
    """The heads to train: the run's, or the recipe's kind / n / options (options of the run's
    heads kept when the kind stays; an ``eagle`` head takes an hf body's shape unless set)."""
    from targetlm.config import ComponentConfig

    kind = recipe.heads_kind or current.kind
    options = dict(current.options) if kind == current.kind else {}
    if kind == "eagle" and kind != current.kind:
        options = hf_eagle_options(model)
    if recipe.n is not None:
        options["n"] = recipe.n
    options.update(recipe.heads_options)
    return ComponentConfig(kind, options)


def _load_heads(model: Any, state: dict, where: str) -> None:
    """The heads of another run's state dict into ``model.heads``: one error naming the first
    tensor that does not fit, with both shapes."""
    own = model.heads.state_dict()
    theirs = {k[len("heads.") :]: v for k, v in state.items() if k.startswith("heads.")}
    for key, value in own.items():
        if key not in theirs:
            raise CheckpointError(f"--init-heads {where}: no tensor heads.{key} (other heads?)")
        if theirs[key].shape != value.shape:
            raise CheckpointError(
                f"--init-heads {where}: heads for another body: heads.{key} is "
                f"{tuple(theirs[key].shape)} there and {tuple(value.shape)} here"
            )
    model.heads.load_state_dict({k: theirs[k] for k in own})


def _set_draft_vocabulary(heads: Any, ids: torch.Tensor, vocab_size: int) -> int | None:
    """Heads with a draft vocabulary (FR-Spec) draft with the K most frequent tokens of the
    training segments ``ids``; returns K (None: no draft vocabulary)."""
    size = getattr(heads, "draft_vocab", None)
    if size is None:
        return None
    from targetlm.modules.eagle import draft_vocabulary

    counts = torch.bincount(ids.flatten().cpu(), minlength=vocab_size)[:vocab_size]
    heads.set_draft_vocabulary(draft_vocabulary(counts, size))
    return int(size)


def train_heads(recipe: HeadsRecipe, print_line: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the recipe's heads on the source run's frozen body and write the new run
    directory; returns the result (also written as ``heads.json``)."""
    from targetlm.rundir import RunDirError, check_outside_runs
    from targetlm.runs import load_run
    from targetlm.training import distill
    from targetlm.training.trainer import TrainingDiverged

    run_dir = Path(recipe.run_dir)
    if run_dir.exists():
        raise RunDirError(f"{run_dir} exists: train-heads writes a new run directory")
    check_outside_runs(run_dir)
    config, vocab, model, checkpoint = load_run(recipe.source)
    torch.manual_seed(recipe.seed)
    heads_config, heads = _heads_to_train(recipe, config, model)
    with torch.no_grad():
        weight, bias = model.output()
    draft_vocab = getattr(heads, "draft_vocab", None)
    if draft_vocab is not None and draft_vocab > weight.size(0):
        raise ConfigError(
            f"model.heads.draft_vocab = {draft_vocab} exceeds the vocabulary's "
            f"{weight.size(0)} tokens"
        )
    train_segments, held_segments, cut = _segments(recipe, config, vocab, model)
    if recipe.init_heads is None:  # (heads read from another run keep their draft vocabulary)
        _set_draft_vocabulary(heads, train_segments, weight.size(0))
    device = next(model.parameters()).device
    started = time.perf_counter()
    train = distill.HiddenCache.build(model, train_segments.to(device))
    held_out = distill.HiddenCache.build(model, held_segments.to(device))
    held = len(held_segments)
    print_line(
        f"body states cached: {len(train)} segments x {recipe.segment} tokens "
        f"({train.bytes / 2**20:.1f} MiB of at most {recipe.cache_mb} MiB"
        f"{', corpus cut to fit' if cut else ''}); "
        f"{held} held out; {time.perf_counter() - started:.1f} s"
    )
    before, accepted_before = distill.draft_acceptance(heads, held_out, weight, bias)

    def log(step: int, loss: float) -> None:
        print_line(f"step {step}/{recipe.steps}: loss {loss:.4f}")

    def out_of_time() -> bool:
        budget = recipe.max_minutes
        return budget is not None and time.perf_counter() - started > budget * 60

    _, steps = distill.train_drafting_heads(
        model, train, recipe.steps, recipe.lr, recipe.batch_size, recipe.seed, log,
        recipe.log_every, out_of_time,
    )  # fmt: skip
    if not all(bool(torch.isfinite(p).all()) for p in heads.parameters()):
        raise TrainingDiverged(
            f"the heads' weights are not finite after {steps} steps at --lr {recipe.lr}: "
            f"nothing written to {run_dir} (try a smaller --lr)"
        )
    after, accepted = distill.draft_acceptance(heads, held_out, weight, bias)
    seconds = time.perf_counter() - started
    new_config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, heads=heads_config)
    )
    result: dict[str, Any] = {
        "source": str(Path(recipe.source).resolve()),
        "corpus": recipe.corpus,
        "heads": {"kind": heads_config.kind, **heads_config.options},
        "steps": steps,
        "batch_size": recipe.batch_size,
        "segment": recipe.segment,
        "lr": recipe.lr,
        "train_segments": len(train),
        "held_out_segments": held,
        "cache_mib": train.bytes / 2**20,
        "epochs": steps * recipe.batch_size / len(train),
        "seconds": seconds,
        "max_minutes": recipe.max_minutes,
        "agreement_before": before,
        "agreement": after,
        "accepted_length_before": accepted_before,
        "accepted_length": accepted,
    }
    _write_run(recipe, run_dir, model, vocab, new_config, checkpoint, result)
    for n, (b, a) in enumerate(zip(before, after), 1):
        print_line(f"head {n}: top-1 agreement with the body on held-out text {b:.3f} -> {a:.3f}")
    print_line(
        f"accepted length (heads in a row from the first that agree): "
        f"{accepted_before:.3f} -> {accepted:.3f}"
    )
    print_line(f"wrote {run_dir} ({seconds:.1f} s)")
    return result


def _heads_to_train(recipe: HeadsRecipe, config: Any, model: Any) -> tuple[Any, NgramHeads]:
    """The heads the recipe trains and their config: ``model.heads`` becomes them (new ones,
    the source's, or another run's with ``--init-heads``), the only parameters that train."""
    from targetlm.modules.heads import build_heads
    from targetlm.runs import read_best

    heads_config = _heads_config(config.model.heads, recipe, model)
    if heads_config.kind == "none":
        raise ConfigError(
            f"{recipe.source} has no heads (model.heads.kind = 'none'): name the kind to train "
            "with --heads-kind (e.g. medusa)"
        )
    if heads_config != config.model.heads:  # other heads: new ones (residual kinds: identity)
        model.heads = build_heads(heads_config, embedding_dim=model.output.embedding_dim)
    heads = model.heads
    if heads is None or model.num_heads < 1:
        raise ConfigError(f"model.heads.n = {heads_config.options.get('n')}: no heads to train")
    if recipe.init_heads is not None:
        start, _, path = read_best(recipe.init_heads)
        _load_heads(model, start["model"], str(path))
    for parameter in model.parameters():  # the body is frozen; the heads train
        parameter.requires_grad_(False)
    for parameter in heads.parameters():
        parameter.requires_grad_(True)
    return heads_config, heads


def _segments(
    recipe: HeadsRecipe, config: Any, vocab: Any, model: Any
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The recipe's corpus as (segments to train on, segments held out, whether the corpus was
    cut to what the cache holds), each segment ``--segment`` tokens."""
    from targetlm.data import read_file, read_lines, with_context_token
    from targetlm.training import distill

    corpus = Path(recipe.corpus)
    if corpus.is_file():
        lines = read_file(corpus, config.data.lowercase)
    elif recipe.corpus in ("train", "valid", "test"):
        lines = read_lines(config.data, getattr(config.data, recipe.corpus))
    else:
        raise ConfigError(
            f"--corpus {recipe.corpus}: neither a file nor a split (train, valid, test)"
        )
    ids = with_context_token(vocab.encode(vocab.require_tokenizer().tokenize(lines)), vocab.eos_id)
    context = model.encoder.max_context
    if context is not None and recipe.segment > context:
        raise ConfigError(f"--segment {recipe.segment} exceeds the body's max_context {context}")
    segments = ids[: ids.numel() // recipe.segment * recipe.segment].view(-1, recipe.segment)
    d = model.output.embedding_dim
    limit = distill.cache_rows(recipe.cache_mb * 2**20, recipe.segment, d)
    if limit < 1:
        raise ConfigError(
            f"--cache-mb {recipe.cache_mb} holds no segment of {recipe.segment} x {d}"
        )
    # the corpus is cut to what the cache holds first, then --held-out of that is kept apart:
    # the held-out body pass costs in proportion to what is trained on, not to the whole corpus
    used = min(segments.size(0), math.ceil(limit / (1 - recipe.held_out)))
    held = max(1, round(used * recipe.held_out))
    if used < 2 or held >= used:
        raise ConfigError(
            f"--corpus {recipe.corpus}: {ids.numel()} tokens make {segments.size(0)} segments "
            f"of {recipe.segment}; need at least one to train on besides {held} held out"
        )
    return segments[: used - held], segments[used - held : used], used < len(ids) // recipe.segment


def _write_run(
    recipe: HeadsRecipe,
    run_dir: Path,
    model: Any,
    vocab: Any,
    config: Any,
    checkpoint: dict,
    result: dict[str, Any],
) -> None:
    """The whole run directory, built beside its place and renamed into it: never half-written."""
    from targetlm import config as config_lib
    from targetlm.files import atomic_write
    from targetlm.runs import BEST, CONFIG, VOCAB
    from targetlm.training.checkpointer import write_best

    parent = run_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{run_dir.name}.*.tmp"):  # left by a killed call
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.", suffix=".tmp", dir=parent))
    staging.chmod(0o755)
    try:
        if Path(recipe.source).is_dir():
            for item in Path(recipe.source).iterdir():
                if item.is_file() and not _results_of_another_model(item.name):
                    shutil.copy2(item, staging / item.name)
        else:  # a config file: its vocabulary (and the tokenizer's own file) are written here
            vocab.save(staging / VOCAB)
        atomic_write(staging / CONFIG, config_lib.dumps(config))
        write_best(
            staging / BEST,
            model.state_dict(),
            vocab,
            config,
            checkpoint.get("valid_ppl"),
            checkpoint.get("step"),
            heads_training=result,
        )
        atomic_write(staging / HEADS_RESULTS, json.dumps(result, indent=2) + "\n")
        os.rename(staging, run_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
