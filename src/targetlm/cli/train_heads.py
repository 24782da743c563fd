"""``targetlm train-heads RUN --corpus FILE_OR_SPLIT --steps S --run-dir NEW``: drafting heads
trained by self-distillation on the run's frozen body (``targetlm.training.distill``), written
with the body into a new run directory (whole or not at all), with per-head top-1 agreement
with the body on held-out text before and after."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from targetlm.checkpoint import CheckpointError
from targetlm.registry import MAX_SEED, MAX_SIZE, ConfigError

# the largest AdamW rate and body-state cache (MiB) train-heads takes: far beyond any useful one
MAX_LR = 10.0
MAX_CACHE_MB = 2**30

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
HEADS_RESULTS = "heads.json"


def _results_of_another_model(name: str) -> bool:
    """Whether a file of the source run is left behind: training-only or rewritten files, hidden
    ones, and what was measured on the source model (its evaluations, translations, scores),
    which the new heads would make stale."""
    measured = name.startswith(("eval-", "translate-", "score-", "generate-"))
    return name in NOT_COPIED or name.startswith(".") or measured


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm train-heads``; returns the exit status."""
    from targetlm import config as config_lib
    from targetlm.config import ComponentConfig
    from targetlm.data import read_file, read_lines, with_context_token
    from targetlm.files import atomic_write
    from targetlm.modules.heads import build_heads
    from targetlm.rundir import RunDirError, check_outside_runs
    from targetlm.runs import BEST, CONFIG, VOCAB, load_run, read_best
    from targetlm.training import distill
    from targetlm.training.checkpointer import write_best
    from targetlm.training.trainer import TrainingDiverged

    _check_numbers(args)
    if args.run_dir.exists():
        raise RunDirError(f"{args.run_dir} exists: train-heads writes a new run directory")
    check_outside_runs(args.run_dir)
    config, vocab, model, checkpoint = load_run(args.source)
    torch.manual_seed(args.seed)
    heads_config = _heads_config(config.model.heads, args, ComponentConfig)
    if heads_config.kind == "none":
        raise ConfigError(
            f"{args.source} has no heads (model.heads.kind = 'none'): name the kind to train "
            "with --heads-kind (e.g. medusa)"
        )
    if heads_config != config.model.heads:  # other heads: new ones (residual kinds: identity)
        model.heads = build_heads(heads_config, embedding_dim=model.output.embedding_dim)
    heads = model.heads
    if heads is None or model.num_heads < 1:
        raise ConfigError(f"model.heads.n = {heads_config.options.get('n')}: no heads to train")
    if args.init_heads is not None:
        start, _, path = read_best(args.init_heads)
        _load_heads(model, start["model"], str(path))
    for parameter in model.parameters():  # the body is frozen; the heads train
        parameter.requires_grad_(False)
    for parameter in heads.parameters():
        parameter.requires_grad_(True)

    corpus = Path(args.corpus)
    if corpus.is_file():
        lines = read_file(corpus, config.data.lowercase)
    elif args.corpus in ("train", "valid", "test"):
        lines = read_lines(config.data, getattr(config.data, args.corpus))
    else:
        raise ConfigError(
            f"--corpus {args.corpus}: neither a file nor a split (train, valid, test)"
        )
    ids = with_context_token(vocab.encode(vocab.require_tokenizer().tokenize(lines)), vocab.eos_id)
    context = model.encoder.max_context
    if context is not None and args.segment > context:
        raise ConfigError(f"--segment {args.segment} exceeds the body's max_context {context}")
    segments = ids[: ids.numel() // args.segment * args.segment].view(-1, args.segment)
    d = model.output.embedding_dim
    limit = distill.cache_rows(args.cache_mb * 2**20, args.segment, d)
    if limit < 1:
        raise ConfigError(f"--cache-mb {args.cache_mb} holds no segment of {args.segment} x {d}")
    # the corpus is cut to what the cache holds first, then --held-out of that is kept apart:
    # the held-out body pass costs in proportion to what is trained on, not to the whole corpus
    used = min(segments.size(0), math.ceil(limit / (1 - args.held_out)))
    held = max(1, round(used * args.held_out))
    if used < 2 or held >= used:
        raise ConfigError(
            f"--corpus {args.corpus}: {ids.numel()} tokens make {segments.size(0)} segments of "
            f"{args.segment}; need at least one to train on besides {held} held out"
        )
    train_segments = segments[: used - held]
    segments = segments[:used]
    device = next(model.parameters()).device
    started = time.perf_counter()
    train = distill.HiddenCache.build(model, train_segments.to(device))
    held_out = distill.HiddenCache.build(model, segments[-held:].to(device))
    cached = time.perf_counter() - started
    print(
        f"body states cached: {len(train)} segments x {args.segment} tokens "
        f"({train.bytes / 2**20:.1f} MiB of at most {args.cache_mb} MiB"
        f"{', corpus cut to fit' if used < len(ids) // args.segment else ''}); "
        f"{held} held out; {cached:.1f} s",
        flush=True,
    )
    with torch.no_grad():
        weight, bias = model.output()
    before = distill.head_agreement(heads, held_out, weight, bias)

    def log(step: int, loss: float) -> None:
        print(f"step {step}/{args.steps}: loss {loss:.4f}", flush=True)

    distill.train_drafting_heads(
        model, train, args.steps, args.lr, args.batch_size, args.seed, log, args.log_every
    )
    if not all(bool(torch.isfinite(p).all()) for p in heads.parameters()):
        raise TrainingDiverged(
            f"the heads' weights are not finite after {args.steps} steps at --lr {args.lr}: "
            f"nothing written to {args.run_dir} (try a smaller --lr)"
        )
    after = distill.head_agreement(heads, held_out, weight, bias)
    seconds = time.perf_counter() - started
    new_config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, heads=heads_config)
    )
    result = {
        "source": str(Path(args.source).resolve()),
        "corpus": args.corpus,
        "heads": {"kind": heads_config.kind, **heads_config.options},
        "steps": args.steps,
        "batch_size": args.batch_size,
        "segment": args.segment,
        "lr": args.lr,
        "train_segments": len(train),
        "held_out_segments": held,
        "cache_mib": train.bytes / 2**20,
        "epochs": args.steps * args.batch_size / len(train),
        "seconds": seconds,
        "agreement_before": before,
        "agreement": after,
    }

    # the whole run directory is built beside its place and renamed into it: never half-written
    parent = args.run_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{args.run_dir.name}.*.tmp"):  # left by a killed call
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{args.run_dir.name}.", suffix=".tmp", dir=parent))
    staging.chmod(0o755)
    try:
        if Path(args.source).is_dir():
            for item in Path(args.source).iterdir():
                if item.is_file() and not _results_of_another_model(item.name):
                    shutil.copy2(item, staging / item.name)
        else:  # a config file: its vocabulary (and the tokenizer's own file) are written here
            vocab.save(staging / VOCAB)
        atomic_write(staging / CONFIG, config_lib.dumps(new_config))
        write_best(
            staging / BEST,
            model.state_dict(),
            vocab,
            new_config,
            checkpoint.get("valid_ppl"),
            checkpoint.get("step"),
            heads_training=result,
        )
        atomic_write(staging / HEADS_RESULTS, json.dumps(result, indent=2) + "\n")
        os.rename(staging, args.run_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for n, (b, a) in enumerate(zip(before, after), 1):
        print(f"head {n}: top-1 agreement with the body on held-out text {b:.3f} -> {a:.3f}")
    print(f"wrote {args.run_dir} ({seconds:.1f} s)")
    if args.json:
        print(json.dumps(result))
    return 0


def _check_numbers(args: argparse.Namespace) -> None:
    """Each numeric flag in a range the training can run (before anything is read)."""
    limits = {"steps": MAX_SIZE, "segment": MAX_SIZE, "batch_size": MAX_SIZE}
    limits |= {"log_every": MAX_SIZE, "cache_mb": MAX_CACHE_MB}
    for name, most in limits.items():
        value = getattr(args, name)
        if not 1 <= value <= most:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1 and <= {most}, got {value}")
    if not 0 <= args.seed <= MAX_SEED:
        raise ConfigError(f"--seed must be >= 0 and <= {MAX_SEED}, got {args.seed}")
    if not 0 < args.held_out < 1:
        raise ConfigError(f"--held-out must be in (0, 1), got {args.held_out}")
    if not 0 < args.lr <= MAX_LR:
        raise ConfigError(f"--lr must be a finite number > 0 and <= {MAX_LR:g}, got {args.lr}")


def _heads_config(current, args: argparse.Namespace, component_config):
    """The heads to train: the run's, or ``--heads-kind`` / ``--n`` / ``--heads-set`` ones
    (options of the run's heads kept when the kind stays)."""
    from targetlm import config as config_lib

    kind = args.heads_kind or current.kind
    options = dict(current.options) if kind == current.kind else {}
    if args.n is not None:
        options["n"] = args.n
    for pair in args.heads_set:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--heads-set {pair!r}: expected KEY=VALUE")
        options[key.strip()] = config_lib.parse_value(value.strip())
    return component_config(kind, options)


def _load_heads(model, state: dict, where: str) -> None:
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm train-heads`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "train-heads",
        help="train drafting heads by self-distillation on a run's frozen body (Medusa-1)",
    )
    p.add_argument(
        "source",
        metavar="RUN_DIR",
        help="the trained run (its best checkpoint), or a config file: its model as built "
        "(a pretrained backbone as published)",
    )
    p.add_argument(
        "--corpus", required=True, help="a text file, or a split of the run's data (train, ...)"
    )
    p.add_argument("--steps", type=int, required=True, help="optimiser steps of the heads")
    p.add_argument("--run-dir", type=Path, required=True, help="the new run directory")
    p.add_argument("--heads-kind", help="train new heads of this kind (default: the run's)")
    p.add_argument("--n", type=int, help="N of the new heads (the main head counts)")
    p.add_argument(
        "--heads-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the heads, e.g. num_layers=2 or window=8",
    )
    p.add_argument("--init-heads", type=Path, help="start from the heads of this run")
    p.add_argument("--segment", type=int, default=64, help="tokens per cached segment")
    p.add_argument("--batch-size", type=int, default=8, help="segments per step")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument(
        "--held-out",
        type=float,
        default=0.1,
        help="fraction of the segments read (the cached ones and these) kept apart for agreement",
    )
    p.add_argument(
        "--cache-mb",
        type=int,
        default=1024,
        help="bound of the in-memory cache of body states (the corpus is cut to fit)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--json", action="store_true", help="also print the result as JSON")
    p.set_defaults(func=run)
