"""Atomic output files: write to a temp file beside the target, rename on success."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def temp_beside(path: str | os.PathLike) -> tuple[IO[bytes], str]:
    """An open binary temp file in ``path``'s folder (created if needed), with normal permissions."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return os.fdopen(fd, "wb"), tmp


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """Yield a binary file; on clean exit it becomes exactly ``path``, on error nothing is left."""
    handle, tmp = temp_beside(path)
    try:
        with handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
