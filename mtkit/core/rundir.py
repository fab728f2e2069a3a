"""The run directory's guard: one writer at a time.

Every stage that writes into RUN holds an exclusive lock on `RUN/.lock` while it runs;
a second writer stops at once with one line naming the first one's pid. The kernel drops
the lock when its process dies, so a lock file left by a killed process never blocks.
The lock is re-entrant within a process (`mtkit run` holds it across the stages it
calls).

It is a POSIX record lock (`fcntl.lockf`), not `flock`: an flock belongs to the open
file, so forked DataLoader workers would inherit it and hold it after their trainer
was killed; a POSIX lock belongs to the process that took it.

(Stages tie their outputs to their inputs with SHA-256 fingerprints, `mtkit.core.checksum`:
the shard manifest records the tokenizer model it was encoded with, a checkpoint records
the shard manifest it was trained on, and the next stage refuses a mismatch.)
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mtkit.core.atomic import reason
from mtkit.core.errors import UserError

LOCK_NAME = ".lock"
_held: dict[Path, int] = {}  # run dir -> nesting depth of this process's lock


class RunDirError(UserError, RuntimeError):
    """The run directory is in use by another process, or cannot be written (one line)."""


@contextmanager
def run_lock(run_dir: Path, stage: str) -> Iterator[None]:
    """Hold the exclusive writer lock of `run_dir` (created if needed) for `stage`."""
    run = Path(run_dir).resolve()
    if run in _held:
        _held[run] += 1
        try:
            yield
        finally:
            _held[run] -= 1
        return
    try:
        run.mkdir(parents=True, exist_ok=True)
        fd = os.open(run / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirError(f"cannot write to the run directory {run_dir} ({reason(e)})") from None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise RunDirError(
                    f"cannot lock the run directory {run_dir} ({reason(e)})"
                ) from None
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise RunDirError(
                f"{run_dir} is in use by {holder}; wait for it to finish or use another run_dir"
            ) from None
        try:  # the lock file only names its holder: written in place
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} (mtkit {stage})\n".encode(), 0)
        except OSError as e:
            raise RunDirError(
                f"cannot write to the run directory {run_dir} ({reason(e)})"
            ) from None
        _held[run] = 1
        try:
            yield
        finally:
            del _held[run]
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing releases the lock
