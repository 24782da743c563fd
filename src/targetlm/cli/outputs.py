"""The rule for every file or directory a command writes (``score --out``, ``translate
--output``, ``export --output``, ``analyze tsne|freq-bins --out``, ``compare --plot``), checked
before any work:

* an output is never one of the command's inputs (the text it reads, RUN_DIR itself, the run
  directory's own files, a directory holding an input), compared as resolved paths, so
  ``--output X --input X`` cannot replace the source with its translation; ``--force`` does not
  change that;
* an output that is a symbolic link, or exists and is not a regular file (a device, a pipe), is
  refused: writing it would replace the link or the device's entry with a regular file;
* an existing output (a file, or a non-empty directory) is replaced only with ``--force``.

Files are written whole or not at all with the umask's mode (:func:`targetlm.files.atomic_write`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

from targetlm.analysis.report import CURVE
from targetlm.files import file_in_the_way
from targetlm.registry import ConfigError
from targetlm.runs import BEST, CONFIG, LAST, METRICS, REPORT, RESULTS, TOKENIZER, VOCAB

HEADS_RESULTS = "heads.json"  # cli/train_heads.HEADS_RESULTS (a copy: no import cycle)
RUN_FILES = (CONFIG, VOCAB, TOKENIZER, METRICS, LAST, BEST, RESULTS, REPORT, CURVE, HEADS_RESULTS)
RUN_RECORDS = ("eval-*.json", "translate-*.json")  # what compare reads beside results.json


def run_inputs(run_dir: Path) -> list[Path]:
    """RUN_DIR (a directory, or a config file) and the files of a run directory that a command
    reads (or another command may), its eval and translate records included: never an output."""
    run_dir = Path(run_dir)
    records = [path for pattern in RUN_RECORDS for path in sorted(run_dir.glob(pattern))]
    return [run_dir, *(run_dir / name for name in RUN_FILES), *records]


def check_output(
    output: Path, flag: str, inputs: Iterable[Path | None], force: bool, directory: bool = False
) -> None:
    """Refuse ``output`` (given by ``flag``) when it is an input, or exists without ``force``.

    Args:
        output: the file (or, with ``directory``, the directory) the command will write.
        flag: the option that named it (``--out``), for the message.
        inputs: the paths the command reads (None entries are skipped); a directory among
            them is an input as a whole.
        force: replace an existing output.
        directory: ``output`` is a directory (it is refused when it holds an input).
    """
    target = Path(output).resolve()
    for path in inputs:
        if path is None:
            continue
        source = Path(path).resolve()
        if target == source or (directory and source.is_relative_to(target)):
            raise ConfigError(
                f"{flag} {output}: is an input of this command ({path}); refusing to write "
                "over it (--force does not change that)"
            )
    blocking = file_in_the_way(output)
    if blocking is not None:
        raise ConfigError(f"{flag} {output}: {blocking} is a file, not a directory to write into")
    if Path(output).is_symlink():
        raise ConfigError(
            f"{flag} {output}: is a symbolic link; refusing to replace it (name the file it "
            "points to)"
        )
    exists = target.is_dir() and any(target.iterdir()) if directory else target.exists()
    if directory and target.exists() and not target.is_dir():
        raise ConfigError(f"{flag} {output}: exists and is not a directory")
    if not directory and target.is_dir():
        raise ConfigError(f"{flag} {output}: is a directory")
    if not directory and target.exists() and not target.is_file():
        raise ConfigError(f"{flag} {output}: exists and is not a regular file")
    if exists and not force:
        what = "exists and is not empty" if directory else "exists"
        raise ConfigError(f"{flag} {output}: {what}; pass --force to replace it")


def add_force_option(parser: argparse.ArgumentParser) -> None:
    """``--force``: replace an existing output (never an input)."""
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output (an input is never overwritten)",
    )


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    """``--quiet``: no progress bar (there is none either when stderr is not a terminal)."""
    parser.add_argument(
        "--quiet",
        action="store_true",
        default=False,
        help="no progress bar on stderr (none either when stderr is not a terminal)",
    )
