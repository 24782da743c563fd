"""``targetlm finetune RUN_DIR --run-dir NEW_DIR``: continue a trained run on new data (or, with
a ``--changes`` file that sets another task, e.g. classification, finetune it for that task)."""

from __future__ import annotations

import argparse
from pathlib import Path

from targetlm import builders
from targetlm import config as config_lib
from targetlm.cli.common import add_set_option
from targetlm.cli.train import train_and_report
from targetlm.registry import ConfigError
from targetlm.rundir import RunDirError


def run(args: argparse.Namespace) -> int:
    """Run ``targetlm finetune``; returns the exit status."""
    from targetlm.runs import CONFIG, read_best

    source = str(Path(args.source).resolve())
    if any(kv.partition("=")[0].strip() == "train.init_from" for kv in args.set):
        raise ConfigError(
            f"--set train.init_from: finetune starts from its RUN_DIR ({args.source}); "
            "name the run to start from there"
        )
    if args.resume:  # the finetuning run's own config: its source and vocabulary are recorded
        if not (args.run_dir / CONFIG).is_file():
            raise RunDirError(f"nothing to resume: {args.run_dir / CONFIG} does not exist")
        config = builders.load_config(args.run_dir / CONFIG, args.set)
        if config.train.init_from != source:
            raise RunDirError(
                f"{args.run_dir} was finetuned from {config.train.init_from}, not {source}"
            )
    else:  # the source run's config, changed by --set (typically data.* and train.*)
        from targetlm.training.finetune import reuse_tokenizer

        checkpoint, _, _ = read_best(args.source)
        data = checkpoint["config"]
        changes: dict = {}
        if args.changes is not None:
            changes = config_lib.load_table(args.changes)
            if "init_from" in changes.get("train", {}):
                raise ConfigError(
                    f"{args.changes}: train.init_from: finetune starts from its RUN_DIR "
                    f"({args.source}); name the run to start from there"
                )
            data = merge_changes(data, changes)
        data = config_lib.apply_overrides(data, args.set)
        data.setdefault("train", {})["init_from"] = source
        reuse_tokenizer(checkpoint["config"], data, Path(source))
        check_data_locations(checkpoint["config"].get("data", {}), changes, args.set, args.source)
        config = builders.config_from_dict(data)
    return train_and_report(config, args.run_dir, args.resume)


# the data.* entries that name where files are read: data.dir, and a split (a ``text`` one)
# may be a file's absolute path
DATA_LOCATIONS = ("dir", "train", "valid", "test")


def check_data_locations(
    source_data: dict, changes: dict, overrides: list[str], source: str | Path
) -> None:
    """Refuse to read, for a finetuning run, files that the source run's config names and
    the command line does not: its ``data.dir`` and a split given by absolute path.

    A run directory may come from someone else, and its config may name any file of this
    machine; the words of what it names would be copied into the new run's ``vocab.txt``.
    Named again on the command line (``--set data.dir=...``, or the ``--changes`` file's
    ``[data]``), they are read: the user chose them. A split name relative to the data
    directory (``$TARGETLM_DATA/<name>``, the cache) is read as always.

    Raises:
        ConfigError: a location only the source run's config names (one line).
    """
    given = set(changes.get("data", {}))
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key == "data":
            given.update(DATA_LOCATIONS)
        elif key.startswith("data."):
            given.add(key.split(".")[1])
    for key in DATA_LOCATIONS:
        value = source_data.get(key)
        if key in given or not isinstance(value, str):
            continue
        if key == "dir" or Path(value).is_absolute():
            raise ConfigError(
                f"{source}'s config reads data.{key} = {value!r}: finetuning reads no "
                "location a run's own config names; to read it, name it on the command line "
                f"(--set data.{key}=PATH)"
            )


def merge_changes(source: dict, changes: dict) -> dict:
    """``changes`` (a partial config) over ``source`` (both TOML-shaped): tables merge key by
    key, except a table that names a ``kind`` (another component: [task], [objective], ...),
    which replaces the source's whole table (its options belonged to the other kind)."""
    merged = dict(source)
    for key, value in changes.items():
        if isinstance(value, dict) and "kind" not in value and isinstance(merged.get(key), dict):
            merged[key] = merge_changes(merged[key], value)
        else:
            merged[key] = value
    return merged


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``targetlm finetune`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "finetune",
        help="continue a trained run on new data, its vocabulary extended (Pappas et al. 2020)",
    )
    p.add_argument("source", metavar="RUN_DIR", help="the trained run (its best checkpoint)")
    add_set_option(
        p, help="override the source run's config, e.g. data.name=brown data.train='news[:0.8]'"
    )
    p.add_argument(
        "--changes",
        type=Path,
        metavar="TOML",
        help="a partial config applied over the source run's (before --set), e.g. "
        "configs/finetune/mlm-brown-genre.toml: finetune a masked LM for genre classification",
    )
    p.add_argument("--run-dir", type=Path, required=True, help="the new run directory")
    p.add_argument("--resume", action="store_true", help="continue the finetuning run exactly")
    p.set_defaults(func=run)
