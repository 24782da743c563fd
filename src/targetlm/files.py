"""Files written whole or not at all.

Every file targetlm writes (checkpoints, metrics, results, outputs of ``score`` and
``translate``, exports) goes through :func:`atomic_write`: a temporary file in the same
directory, flushed and fsync-ed, then renamed over the target. A crash, a kill or a full disk
at any moment leaves the old file or the new one, never half of one, and no temporary file.
The new file gets the mode a plain ``open`` would give it (``0o666`` less the umask), not
``mkstemp``'s ``0o600``.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


class DiskFullError(OSError):
    """No space left (or the file-size limit or quota reached) while writing ``path``; nothing
    was replaced. ``errno`` is ENOSPC, EFBIG or EDQUOT."""

    def __init__(self, code: int, path: str | Path) -> None:
        reason = {
            errno.EFBIG: "the file size limit (ulimit -f) was reached",
            errno.EDQUOT: "the disk quota is exceeded",
        }.get(code, "no space left on the device")
        super().__init__(code, reason, str(path))

    def __str__(self) -> str:
        return f"{self.strerror} writing {self.filename}"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, content: str | bytes | Callable[[IO[Any]], None]) -> None:
    """Write ``content`` to ``path`` through a temporary file renamed into place.

    Args:
        path: the file to create or replace (its directory must exist).
        content: text (written as UTF-8), bytes, or a function that writes to a binary handle
            (e.g. ``lambda f: torch.save(obj, f)``).

    Raises:
        DiskFullError: the device is full or the file-size limit was reached (one line naming
            the path; the temporary file is removed and ``path`` is untouched).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            if isinstance(content, str):
                handle.write(content.encode("utf-8"))
            elif isinstance(content, bytes):
                handle.write(content)
            else:
                content(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        code = disk_full(error)
        if code:
            raise DiskFullError(code, path) from None
        raise


def write_figure(path: str | Path, figure: Any, dpi: int = 120) -> None:
    """A matplotlib ``figure`` saved to ``path`` whole or not at all (:func:`atomic_write`),
    in the format its suffix names (.png, .pdf, .svg; PNG without one)."""
    kind = Path(path).suffix.lstrip(".").lower() or "png"
    atomic_write(path, lambda handle: figure.savefig(handle, format=kind, dpi=dpi))


def file_in_the_way(path: str | Path) -> Path | None:
    """The first of ``path``'s parents that exists and is not a directory (nothing can be
    written under it), or None."""
    return next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)


def disk_full(error: BaseException | None) -> int | None:
    """ENOSPC, EFBIG or EDQUOT when one is anywhere in ``error``'s chain (torch.save wraps the
    OSError in a RuntimeError), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return error.errno
        if isinstance(error, RuntimeError):
            if "No space left" in str(error):
                return errno.ENOSPC
            if "file size limit" in str(error).lower() or "File too large" in str(error):
                return errno.EFBIG
        error = error.__cause__ or error.__context__
    return None
