"""Atomic file and directory writes: a reader sees the old version or the new, never half.

Every stage marks its output finished by renaming it into place, so an interrupted
stage leaves nothing a later stage could take for finished.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes `path` on success: a temporary file in the same
    folder, flushed, fsynced and renamed over `path`. On an exception it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, payload: bytes) -> None:
    """Replace `path` with `payload` atomically."""
    with atomic_file(path) as f:
        f.write(payload)


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a fresh temporary folder beside `path`; on success it replaces `path`.

    On an exception the temporary folder is removed and `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial"))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
