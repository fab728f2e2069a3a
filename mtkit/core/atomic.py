"""Atomic file and directory writes: a reader sees the old version or the new, never half.

Every stage marks its output finished by renaming it into place, so an interrupted
stage leaves nothing a later stage could take for finished, and a user's file given as
an output is replaced only once the new content is complete. A failed write (disk full,
read-only folder, a name too long) becomes one `WriteError` naming the path the caller
gave, never the temporary beside it; the temporary is removed. A write killed outright
(SIGKILL, the OOM killer) cannot remove its own: each temporary names its writer
(`.NAME.PID@HOST.*.tmp`), and the next write of the same file removes those whose
writer is gone.

Only regular files are replaced that way. An output that is a device or a FIFO
(`/dev/null`, a named pipe), or that names an open descriptor (`/dev/stdout`,
`/dev/fd/N`, `/proc/self/fd/N`, as a shell's `>(...)` does) is written in place, as any
Unix tool writes it: renaming a file over it would replace the device with a file.
"""

from __future__ import annotations

import errno
import glob
import io
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO

from mtkit.core.errors import UserError

_REASONS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the file system",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


class WriteError(OSError):
    """An output that could not be written (one line naming the path)."""

    def __str__(self) -> str:
        return str(self.strerror)


def reason(e: OSError) -> str:
    """A short lower-case reason for an OS error: "no space left on device"."""
    return _REASONS.get(e.errno, (e.strerror or type(e).__name__).lower())


def write_failure(
    e: BaseException, path: Path | str, temporary: Path | str | None = None
) -> WriteError | None:
    """The `WriteError` behind `e` (also when a library wrapped the OSError, as
    `torch.save` does), naming `path`, or None when `e` is not a failed write. Any
    OSError about `temporary` (the file or folder written in place of `path`, or what is
    inside it) is a failed write of `path`, whatever its errno: the user never named the
    temporary, so no message may."""
    seen = e
    while seen is not None:
        if isinstance(seen, WriteError):
            return seen
        if isinstance(seen, OSError) and (seen.errno in _REASONS or _about(seen, temporary)):
            return WriteError(seen.errno, f"{reason(seen)} while writing {path}")
        seen = seen.__cause__ or seen.__context__
    return None


def _about(e: OSError, temporary: Path | str | None) -> bool:
    """Whether `e` names `temporary` or a path inside it (a write to an open file names
    none: it is about the temporary too, when one is given)."""
    if temporary is None or e.errno in (None, errno.EPIPE):  # a reader that left: not ours
        return False
    names = [n for n in (e.filename, e.filename2) if n is not None]
    temporary = os.fspath(temporary)
    return not names or any(
        os.fspath(n) == temporary or os.fspath(n).startswith(temporary + os.sep) for n in names
    )


def _temporary_prefix(path: Path, owner: str = "") -> str:
    """`.NAME.` (and `OWNER.` when given) for the temporary beside `path`; a name too
    long to take the prefix and a random suffix within the file system's 255 bytes is
    shortened (its leftovers are then not found by `remove_leftovers` nor
    `_remove_dead_temporaries`, which a name that long never needs)."""
    prefix = f".{path.name}.{owner + '.' if owner else ''}"
    while len(os.fsencode(prefix)) > 255 - 24:  # mkstemp's 8 random characters + suffix
        prefix = prefix[:-2] + "."
    return prefix


def _owner() -> str:
    """Who writes a temporary: this process on this host, `PID@HOST`."""
    return f"{os.getpid()}@{socket.gethostname().split('.')[0] or 'localhost'}"


def _alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (PermissionError: someone else's, alive)
        return True
    return True


def _remove_dead_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries that writes of `path` by processes of this host that no
    longer exist left beside it (a SIGKILL, an OOM kill: no `finally` ran). A live
    writer's, another host's (a shared folder) and a name too long to hold its owner are
    left alone. Returns what was removed."""
    owner = _owner()
    prefix = _temporary_prefix(path)
    if prefix != f".{path.name}." or _temporary_prefix(path, owner) != f"{prefix}{owner}.":
        return []
    host = owner.split("@", 1)[1]
    removed = []
    for p in path.parent.glob(f"{glob.escape(prefix)}*@{glob.escape(host)}.*.tmp"):
        pid, _, their_host = p.name[len(prefix) :].split(".", 1)[0].partition("@")
        if their_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        if p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _refuse_folder(path: Path, given: Path | str) -> None:
    """A folder where a file is to be written: one line, before any temporary exists."""
    if os.path.isdir(path):
        raise WriteError(errno.EISDIR, f"{given} is a folder; name a file to write")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def descriptor_of(path: str | os.PathLike) -> int | None:
    """The open file descriptor that `path` names (/dev/stdout, /dev/stderr, /dev/fd/N,
    /proc/self/fd/N), or None."""
    text = os.path.abspath(path)
    if text in ("/dev/stdout", "/dev/stderr"):
        return 1 if text == "/dev/stdout" else 2
    for prefix in ("/dev/fd/", "/proc/self/fd/"):
        if text.startswith(prefix) and text[len(prefix) :].isdigit():
            return int(text[len(prefix) :])
    return None


def writes_in_place(path: str | os.PathLike) -> bool:
    """Whether an output at `path` is written in place rather than through a temporary
    file and a rename: `path` names an open descriptor, or an existing file that is
    neither regular nor a folder (a character or block device, a FIFO, a socket)."""
    if descriptor_of(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextmanager
def _in_place(path: Path) -> Iterator[BinaryIO]:
    """The file at `path` opened for writing as it is (no temporary, no rename, never
    created or truncated); a descriptor it names is duplicated, so closing ours leaves
    the caller's open."""
    fd = descriptor_of(path)
    try:
        f = os.fdopen(os.dup(fd) if fd is not None else os.open(path, os.O_WRONLY), "wb")
        with f:
            yield f
            f.flush()
    except BaseException as e:
        failure = write_failure(e, path, path)
        if failure is not None:
            raise failure from None
        raise


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes `path` on success: a temporary file in the same
    folder, flushed, fsynced and renamed over `path`. On an exception it is removed.
    A symbolic link at `path` is followed: its target is what gets replaced. A device,
    a FIFO or a descriptor's name (`writes_in_place`) is written in place instead."""
    if writes_in_place(path):
        with _in_place(Path(path)) as f:
            yield f
        return
    given = path
    path = Path(os.path.realpath(path))
    _refuse_folder(path, given)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_temporaries(path)  # a killed earlier write's
        fd, tmp = tempfile.mkstemp(
            dir=path.parent, prefix=_temporary_prefix(path, _owner()), suffix=".tmp"
        )
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        failure = write_failure(e, given, tmp if tmp is not None else path.parent)
        if failure is not None:
            raise failure from None
        raise


@contextmanager
def atomic_text(path: Path) -> Iterator[TextIO]:
    """`atomic_file` for UTF-8 text with '\\n' line ends."""
    with atomic_file(path) as f:
        text = io.TextIOWrapper(f, encoding="utf-8", newline="\n")
        yield text
        text.flush()
        text.detach()  # leave closing the binary file to atomic_file


def write_atomic(path: Path, payload: bytes) -> None:
    """Replace `path` with `payload` atomically."""
    with atomic_file(path) as f:
        f.write(payload)


def copy_atomic(src: Path, dst: Path) -> None:
    """Make `dst` an independent copy of `src`, atomically (never a hard link: a later
    write through one name must not change the other)."""
    with open(src, "rb") as source, atomic_file(dst) as f:
        shutil.copyfileobj(source, f, 1 << 20)


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a fresh temporary folder beside `path`; on success it replaces `path`.

    On an exception the temporary folder is removed and `path` is left as it was.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(
            tempfile.mkdtemp(dir=path.parent, prefix=_temporary_prefix(path), suffix=".partial")
        )
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        old = path.with_name(_temporary_prefix(path) + "old")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        failure = write_failure(e, path, tmp if tmp is not None else path.parent)
        if failure is not None:
            raise failure from None
        raise


def remove_leftovers(folder: Path, names: tuple[str, ...]) -> list[Path]:
    """Delete what killed atomic writes of `names` left in `folder` (`.NAME.*.tmp` files,
    `.NAME.*.partial` and `.NAME.old` folders). Call it only while holding the folder's
    run lock, so no live writer's temporary is taken. Returns what was removed."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for name in names:
        for pattern in (
            f".{name}.*.tmp",
            f".{name}.*.partial",
            f".{name}.old",
            f".{name}.link",
        ):  # (.link: hard-link temporaries of mtkit < 0.2)
            for p in folder.glob(pattern):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def refuse_same_file(output: Path, inputs: dict[str, Path | str | list[Path] | None]) -> None:
    """Raise `SameFileError` when `output` is the same file as one of `inputs` (through a
    hard link or a symbolic link too): writing it would destroy the input.

    `inputs` maps how the user named each input (e.g. "--input") to its path, or to the
    list of files it stands for (every file of a folder the command reads)."""
    output = Path(output)
    if output.is_dir():
        raise SameFileError(f"{output} is a folder; the output must be a file")
    if not output.is_file():  # nothing there, or a device or FIFO: written in place
        return
    for option, given in inputs.items():
        for path in given if isinstance(given, list) else [given]:
            if path is not None and Path(path).exists() and os.path.samefile(output, path):
                raise SameFileError(
                    f"the output {output} is the same file as {option} "
                    f"{path}; writing it would destroy that input"
                )


class SameFileError(UserError, ValueError):
    """An output path that names an input (one line)."""
