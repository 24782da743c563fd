"""Progress bars of the long inference loops (evaluation and scoring, generation, translation).

The loops always report their progress to a :func:`progress_bar`; it is shown only inside
:func:`showing_progress` ``(True)``, which the commands enter when ``--quiet`` is not given and
stderr is a terminal (:func:`wanted`). Elsewhere (the trainer's validation, tests, a pipe) the
bar is disabled and costs nothing. The bar is tqdm's, as the trainer's: a rate (tokens/s,
sentences/s) and an ETA, on stderr, gone when the loop ends.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tqdm import tqdm

_showing: ContextVar[bool] = ContextVar("targetlm_progress", default=False)


def wanted(quiet: bool) -> bool:
    """Whether a command shows progress: not ``--quiet``, and stderr is a terminal."""
    return not quiet and sys.stderr.isatty()


@contextmanager
def showing_progress(show: bool) -> Iterator[None]:
    """Show (or hide) the loops' progress bars inside this block."""
    token = _showing.set(show)
    try:
        yield
    finally:
        _showing.reset(token)


def progress_bar(total: int | None, unit: str, desc: str) -> tqdm:
    """A tqdm bar of ``total`` ``unit`` s on stderr, disabled outside :func:`showing_progress`."""
    return tqdm(
        total=total,
        unit=unit,
        desc=desc,
        disable=not _showing.get(),
        leave=False,
        dynamic_ncols=True,
        file=sys.stderr,
        unit_scale=True,
    )
