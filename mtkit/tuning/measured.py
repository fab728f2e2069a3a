"""Choices that translation measures on this machine, kept so that later processes make
the same ones.

Translation measures two things when it loads a checkpoint on a CPU: the precision
(`--precision auto`: bf16 where it is clearly faster) and the attention kernel (SDPA or
matmul + softmax). Where two timings lie near the margin, a new process could choose the
other way. The kernels round differently, so a few outputs in a thousand could change
from one run of the same command to the next. The first measurement is therefore kept,
keyed by what it depends on (the CPU, the vector instructions its kernels run, torch's
version, the threads, the shape measured), and every later process on the same machine
takes it. A training run keeps its own choices in its checkpoints (`mtkit.tuning.run`),
and distillation with its corpus: the one storage rule is `mtkit.tuning`'s.

The file is `$MTKIT_CACHE_DIR/measured.json`, by default `$XDG_CACHE_HOME/mtkit` or
`~/.cache/mtkit`. `MTKIT_CACHE_DIR` set empty keeps nothing (each process measures).
Delete the file to measure again.

The cache can only ever save a measurement, never crash or mislead a command. Whatever
cannot be used counts as not measured: the choice is measured, as without a cache, and
one warning per process names the file and what is wrong with it. That is:
- a file that is not JSON (invalid bytes, nested too deep to parse), or larger than
  `MAX_BYTES`: measured, and the file is replaced by one that holds the new choice;
- an entry that is not a choice this mtkit can make (a later mtkit sharing the cache may
  keep a kernel this one lacks): the caller's `usable` says so, and the entry is replaced;
- a symbolic link, a named pipe, a folder or a device in the file's place: never opened
  (a pipe's open would wait for a writer; a write through a link would overwrite another
  file) and left as it is, so nothing is kept until it is removed.
A file that cannot be written (a read-only folder) keeps nothing, with a debug log line.

A write goes to a new temporary `.measured.json.<random>.tmp` beside the file, which then
replaces it (a reader sees the old file or the new, never half). Processes that measure
at once (the ranks of a torchrun job, each loading its model) take one choice, the first
finished: after measuring, a process reads the file again, holding a lock of the folder
(`_one_writer`), and takes an entry written meanwhile rather than replacing it. So what
is kept is what each of them translates with, and a later process too (a rerun that keeps
the parts of a torchrun job's ranks, `mtkit.engines.ranks`, compares their choices).
A temporary that a killed process left is removed by the next write once it is
`STALE_S` seconds old.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import reprlib
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from mtkit.core.atomic import reason
from mtkit.core.errors import first_line

log = logging.getLogger(__name__)

FILE = "measured.json"
TEMPORARIES = f".{FILE}.*.tmp"  # what writes leave while they run
MAX_BYTES = 1 << 22  # thousands of entries (one is ~300 bytes); a larger file is not read
STALE_S = 60.0  # a write takes milliseconds: a temporary this old was left by a killed one
LOCK_WAIT_S = 10.0  # the longest a process waits for another's read and write (`_one_writer`)

_warned: set[str] = set()  # the warnings given in this process


def cache_dir() -> Path | None:
    """Where measured choices are kept, or None where `MTKIT_CACHE_DIR` is set empty."""
    given = os.environ.get("MTKIT_CACHE_DIR")
    if given is not None:
        return Path(given) if given else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtkit"


def remembered(
    kind: str, key: dict, measure: Callable[[], dict], usable: Callable[[dict], bool]
) -> dict:
    """The record of choice `kind` for `key` (JSON values) as first measured on this
    machine: kept from an earlier process where `usable(record)` says that this mtkit can
    take it, else `measure()`d now and kept."""
    folder = cache_dir()
    if folder is None:
        return measure()
    path = folder / FILE
    name = f"{kind} {json.dumps(key, sort_keys=True)}"
    kept, problem = _read(path)
    if name in kept:
        if isinstance(kept[name], dict) and usable(kept[name]):
            return kept[name]
        problem = f"its {kind} entry {reprlib.repr(kept[name])} is not one this mtkit can use"
    if problem is not None:
        _warn_once(f"measured choices in {path} not used: {problem}; measuring again")
    record = measure()
    with _one_writer(folder):
        kept, _ = _read(path)  # another process may have measured meanwhile
        first = kept.get(name)
        if isinstance(first, dict) and usable(first):
            return first  # it finished first: its choice is the machine's, and ours
        kept[name] = record
        _write(path, kept)
    return record


@contextlib.contextmanager
def _one_writer(folder: Path) -> Iterator[None]:
    """Within: no other process (nor thread) between its read of the file in `folder` and
    its write: an exclusive `flock` of the folder itself (no file of its own), waited for
    at most `LOCK_WAIT_S`. Held for the milliseconds of a read and a write; a process
    forked meanwhile holds it until it exits, hence the bound: past it, or where the
    folder cannot be made or locked, the read and write go on unlocked (a debug line)."""
    fd = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        log.debug("measured choices in %s written unlocked: %s", folder, reason(e))
    try:
        if fd is not None:
            _lock(fd, folder)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # (closing releases the lock)


def _lock(fd: int, folder: Path) -> None:
    """`_one_writer`'s lock of `folder` (open as `fd`), or none past `LOCK_WAIT_S`."""
    waited = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= waited:
                log.debug("measured choices in %s written unlocked: still locked", folder)
                return
            time.sleep(0.01)
        except OSError as e:  # (a file system without locks)
            log.debug("measured choices in %s written unlocked: %s", folder, reason(e))
            return


def holds_timings(record: dict, names: Iterable[str]) -> bool:
    """Whether each of `names` that `record` has is a time, in milliseconds, that a
    measurement could have given (a finite number, not negative)."""
    return all(
        isinstance(record[n], int | float)
        and not isinstance(record[n], bool)
        and 0 <= record[n] < math.inf  # (NaN compares false)
        for n in names
        if n in record
    )


def _read(path: Path) -> tuple[dict, str | None]:
    """The choices kept at `path` ({} where there is no file) and, where there is one that
    cannot be used, why not. Only a regular file is opened, never through a link, and
    without waiting (a named pipe put in its place after the check is not read)."""
    try:
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            return {}, f"it is {_what(mode)}, not a regular file, and is left as it is"
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                return {}, f"it is {_what(mode)}, not a regular file, and is left as it is"
            data = f.read(MAX_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):  # no file (or no folder) yet
        return {}, None
    except OSError as e:
        return {}, f"it cannot be read ({reason(e)})"
    if len(data) > MAX_BYTES:
        return {}, f"it is larger than {MAX_BYTES} bytes"
    try:
        kept = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # (a UnicodeDecodeError is a ValueError)
        return {}, f"it is not JSON ({first_line(e)})"
    if not isinstance(kept, dict):
        return {}, "it is not a JSON object"
    return kept, None


def _write(path: Path, kept: dict) -> None:
    """Replace the file at `path` with `kept`: written to a new temporary beside it
    (created exclusively, so never through a link nor into a pipe), which is then renamed
    over it; a rename replaces a link itself, never its target. What is at `path` and is
    not a regular file is left as it is (`_read` has warned of it). First removes the
    temporaries that killed writes left. A failed write keeps nothing (a debug line)."""
    temporary = path.with_name(TEMPORARIES.replace("*", secrets.token_hex(8)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(path.parent)
        if _other_than_a_file(path):
            return
        fd = os.open(
            temporary,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o666,  # less the umask, as any new file
        )
        try:
            # a fresh temporary, renamed over the file below
            with open(fd, "wb") as f:  # written in place on purpose
                f.write(json.dumps(kept, indent=1, sort_keys=True).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    except OSError as e:
        log.debug("measured choices not kept (%s): %s", path, e)


def _remove_stale_temporaries(folder: Path) -> None:
    """Delete the temporaries (regular files only) that writes killed midway left in
    `folder`: those last modified `STALE_S` seconds ago or earlier, so that a live write's
    is never taken."""
    now = time.time()
    for temporary in folder.glob(TEMPORARIES):
        with contextlib.suppress(OSError):  # removed meanwhile, or not ours to remove
            found = os.lstat(temporary)
            if stat.S_ISREG(found.st_mode) and now - found.st_mtime >= STALE_S:
                temporary.unlink()


def _other_than_a_file(path: Path) -> bool:
    """Whether something other than a regular file is at `path` (a link, a pipe...)."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _what(mode: int) -> str:
    """What a file of `mode` is, for a warning: "a symbolic link"."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def _warn_once(message: str) -> None:
    """Log `message` as a warning, unless this process has already given it (each of a
    command's measured choices reads the file)."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)
