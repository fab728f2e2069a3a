"""Lines translated by the ranks of a `torchrun` job, each rank its own share, put
together in input order: the translations one process writes, byte for byte (a score
can differ in its last decimal: a rank batches its own lines, and a sentence's float
sums then run in another order, as between batched and alone).

Under `torchrun` (WORLD_SIZE above 1: one node or several, meeting through torchrun's
env:// rendezvous; Gloo on a CPU, NCCL on GPUs, `mtkit.core.device.join_ranks` as
training starts it) `mtkit translate -i FILE -o FILE` and `mtkit distill` (each chunk of
its corpus) give every rank a share of the input:

- Shares (`cut_shares`): one contiguous range of lines per rank, balanced by bytes (a
  line weighs its length in bytes with its newline: what is known of a line before it is
  read as tokens), each rank's range ending at the line start nearest its due part of
  the input. Every rank reads the input and cuts the same shares, without a message: a
  rank may get no line (more ranks than lines, or one very long line). A file is read
  once for its line starts and its SHA-256, in blocks, never held whole (`scan_file`).
- Parts (`RankPart`): rank R of N writes its share's output to OUTPUT.rank-R-of-N beside
  the output, atomically (`mtkit.core.atomic`), then its record OUTPUT.rank-R-of-N.json,
  also atomically: the lines and bytes of its range, the input's SHA-256, the
  fingerprint of the options the output depends on (model, search, format, the choices
  measured at load), and the part's size and SHA-256.
- Resuming: a rank whose part and record are in place, the record the one it would
  write (same input, range and options) and the part's checksum its record's, keeps it
  and translates nothing ("kept" in the log). Rerunning the same command after a rank
  was killed (torchrun then stops the others) redoes the missing shares only.
- Assembly (`RankPart.assemble`): after a barrier, rank 0 checks each part against its
  record, concatenates them in rank order into OUTPUT (atomically: the output is
  replaced only when whole, as one process replaces it) and removes the parts, records
  and those of earlier runs with another number of ranks; a last barrier, and every rank
  returns with the output in place.

The ranks must translate alike: the choices a PyTorch engine measures when it loads
(precision under `auto`, the attention kernel) are compared across ranks
(`agree_on_choices`); a rank takes rank 0's attention kernel, and ranks that chose
different precisions are refused in one line (give --precision). Across nodes, the
output's folder must be one that every node sees (a shared file system).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import numpy as np
import torch.distributed as dist

from mtkit.core.atomic import atomic_file, atomic_text
from mtkit.core.checksum import file_sha256
from mtkit.core.device import join_ranks
from mtkit.core.errors import UserError
from mtkit.core.faults import fault_point
from mtkit.core.textio import READ_BYTES, check_text_start

log = logging.getLogger(__name__)

FORMAT = "mtkit-rank-part-1"  # a part record's layout
BLOCK = 1 << 22  # bytes read at a time while a file is scanned


class RanksError(UserError, ValueError):
    """What the ranks of a torchrun job cannot do, or disagree on (one line)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks (`rank` of `world`) and the collectives the
    shares need, which do nothing alone."""

    rank: int
    world: int

    @classmethod
    @contextmanager
    def joined(cls, device: Any) -> Iterator[Ranks]:
        """The ranks of this job, the process group started on `device`'s backend unless
        it is (`mtkit.core.device.join_ranks`), and ended after, where started here (at
        the interpreter's exit its teardown can hang)."""
        ours = not dist.is_initialized()
        ranks = cls(*join_ranks(device))
        try:
            yield ranks
        finally:
            if ours and dist.is_initialized():
                dist.destroy_process_group()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def first_says(self, value: Any) -> Any:
        """Rank 0's `value` (any picklable value), on every rank."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, 0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank."""
        if self.world == 1:
            return [value]
        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value)
        return values


@dataclass(frozen=True)
class Share:
    """A rank's lines of the input, [first, end), and their bytes, [start, stop)."""

    first: int
    end: int
    start: int
    stop: int

    @property
    def lines(self) -> int:
        return self.end - self.first


@dataclass(frozen=True)
class Scanned:
    """What every rank reads of an input before its share: its line count, its size in
    bytes, its SHA-256 and the shares of `world` ranks."""

    lines: int
    size: int
    sha256: str
    shares: list[Share]


def cut_shares(starts: Iterable[np.ndarray], lines: int, size: int, world: int) -> list[Share]:
    """One contiguous share of the lines per rank, balanced by bytes. `starts`: the byte
    offsets at which the input's lines 1, 2, ... start (line 0 starts at 0), in
    increasing order, given in blocks; `lines`, `size`: the input's line count and
    bytes. Rank k's share ends at the line start nearest to k/world of the input (the
    earlier one on a tie), so shares are empty where lines are fewer than ranks or one
    line outweighs the others."""
    # (offset, line) of the last line start at or before each cut's target, and of the
    # first one after it; a cut's target is size * k / world, compared times world
    targets = [size * k for k in range(1, world)]
    below: list[tuple[int, int]] = [(0, 0)] * len(targets)
    above: list[tuple[int, int] | None] = [None] * len(targets)
    seen = 0  # line starts seen before this block
    for block in (*starts, np.asarray([size], dtype=np.int64)):
        if not len(block):
            continue
        scaled = block.astype(np.int64) * world
        for k, target in enumerate(targets):
            if above[k] is not None:
                continue
            j = int(np.searchsorted(scaled, target, side="right"))  # starts <= target: j
            if j:
                below[k] = (int(block[j - 1]), seen + j)
            if j < len(block):
                above[k] = (int(block[j]), seen + j + 1)
        seen += len(block)
    cuts = [(0, 0)]
    for target, low, high in zip(targets, below, above, strict=True):
        nearest = low
        if high is not None and high[0] * world - target < target - low[0] * world:
            nearest = high
        nearest = (nearest[0], min(nearest[1], lines))
        cuts.append(max(nearest, cuts[-1]))
    cuts.append((size, lines))
    return [Share(a[1], b[1], a[0], b[0]) for a, b in zip(cuts, cuts[1:], strict=False)]


def scan_file(path: Path, world: int) -> Scanned:
    """The file's line starts, count, size and SHA-256, read once in blocks (a line is
    ended by a newline; a last line without one counts), and the shares of `world`
    ranks; its first bytes checked as a line input's are (`check_text_start`)."""
    digest = hashlib.sha256()
    newlines, size, last = 0, 0, b"\n"
    blocks: list[np.ndarray] = []
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            if not size:  # (as one process reads it: its first read)
                check_text_start(block[:READ_BYTES])
            digest.update(block)
            ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            if world > 1:
                blocks.append(ends + size + 1)
            newlines += len(ends)
            size += len(block)
            last = block[-1:]
    if blocks and len(blocks[-1]) and blocks[-1][-1] == size:  # (after the last newline)
        blocks[-1] = blocks[-1][:-1]
    lines = newlines + (last != b"\n")
    return Scanned(lines, size, digest.hexdigest(), cut_shares(blocks, lines, size, world))


def scan_texts(texts: Sequence[str], world: int) -> Scanned:
    """`scan_file` for lines in memory: as the file that holds each text and a newline."""
    digest = hashlib.sha256()
    lengths = np.zeros(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        data = text.encode("utf-8", "surrogatepass") + b"\n"
        digest.update(data)
        lengths[i] = len(data)
    ends = np.cumsum(lengths)
    size = int(ends[-1]) if len(ends) else 0
    shares = cut_shares([ends[:-1]], len(texts), size, world)
    return Scanned(len(texts), size, digest.hexdigest(), shares)


def options_digest(options: dict) -> str:
    """The SHA-256 of what an output depends on beside its input (JSON values; others
    by their repr)."""
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=repr).encode()).hexdigest()


def engine_choices(engine: Any) -> dict:
    """What a PyTorch engine measured at load and translates with (its precision, its
    attention kernel); {} for an engine that measures nothing."""
    record = getattr(engine, "precision", None)
    if not isinstance(record, dict):
        return {}
    return {
        "precision": record.get("precision"),
        "attention": record.get("attention", {}).get("kernel"),
    }


def agree_on_choices(ranks: Ranks, engine: Any) -> dict:
    """The engine's measured choices made rank 0's on every rank (the attention kernel
    taken from rank 0; different precisions refused in one line); returns them."""
    chosen = ranks.gather(engine_choices(engine))
    first = chosen[0]
    if any(c.get("precision") != first.get("precision") for c in chosen):
        found = ", ".join(f"rank {r}: {c.get('precision')}" for r, c in enumerate(chosen))
        raise RanksError(
            f"the ranks chose different precisions ({found}): give --precision "
            f"{first.get('precision')} so that every rank translates alike"
        )
    if engine_choices(engine).get("attention") != first.get("attention"):
        log.info("rank %d: attention kernel %s, as rank 0's", ranks.rank, first["attention"])
        engine.use_attention(first["attention"])
    return first


def part_paths(output: Path, rank: int, world: int) -> tuple[Path, Path]:
    """Rank `rank` of `world`'s part of `output` and its record, beside it."""
    name = f"{output.name}.rank-{rank}-of-{world}"
    return output.with_name(name), output.with_name(name + ".json")


class RankPart:
    """This rank's part of `output` (its share of the input, translated), its record,
    and the assembly of every rank's parts into `output`."""

    def __init__(self, ranks: Ranks, output: Path, scanned: Scanned, options: str):
        self.ranks, self.output = ranks, Path(output)
        self.share = scanned.shares[ranks.rank]
        self.path, self.record_path = part_paths(self.output, ranks.rank, ranks.world)
        self.record = {
            "format": FORMAT,
            "rank": ranks.rank,
            "ranks": ranks.world,
            "lines": [self.share.first, self.share.end],
            "bytes": [self.share.start, self.share.stop],
            "input_sha256": scanned.sha256,
            "options_sha256": options,
        }

    def finished(self) -> bool:
        """Whether this rank's part is in place from the same input, range and options,
        whole (its SHA-256 its record's)."""
        try:
            kept = json.loads(self.record_path.read_bytes())
        except (OSError, ValueError, RecursionError):
            return False
        if not isinstance(kept, dict) or {k: kept.get(k) for k in self.record} != self.record:
            return False
        try:
            return self.path.stat().st_size == kept.get("part_bytes") and file_sha256(
                self.path
            ) == kept.get("part_sha256")
        except OSError:
            return False

    @contextmanager
    def writing(self) -> Iterator[TextIO]:
        """The part (UTF-8 text), written atomically, then its record (an earlier one
        removed first: a part never passes for finished by another's record)."""
        self.record_path.unlink(missing_ok=True)
        with atomic_text(self.path) as f:
            yield f
        record = {
            **self.record,
            "part_bytes": self.path.stat().st_size,
            "part_sha256": file_sha256(self.path),
        }
        with atomic_text(self.record_path) as f:
            f.write(json.dumps(record, indent=2) + "\n")

    def translate(self, write: Callable[[Share, TextIO], None]) -> bool:
        """This rank's part: kept when finished, else `write(share, part)`; then every
        rank's parts assembled into the output. Returns whether the part was kept."""
        kept = self.finished()
        if kept:
            log.info(
                "rank %d: lines %d to %d of %s already translated (kept)",
                self.ranks.rank,
                self.share.first + 1,
                self.share.end,
                self.output.name,
            )
        else:
            with self.writing() as f:
                write(self.share, f)
        self.ranks.barrier()
        if self.ranks.main:
            self.assemble()
        self.ranks.barrier()
        return kept

    def assemble(self) -> None:
        """Rank 0: every rank's part, checked against its record, into the output in rank
        order (atomically), then the parts and records removed, with those of another
        number of ranks."""
        with atomic_file(self.output) as out:
            for rank in range(self.ranks.world):
                path, record_path = part_paths(self.output, rank, self.ranks.world)
                try:
                    record = json.loads(record_path.read_bytes())
                    whole = file_sha256(path) == record["part_sha256"]
                except (OSError, ValueError, KeyError, TypeError, RecursionError):
                    whole = False
                if not whole or record["input_sha256"] != self.record["input_sha256"]:
                    raise RanksError(
                        f"{path}: missing or damaged before it was put into "
                        f"{self.output}; run the command again to translate its lines again"
                    )
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        for path in self.output.parent.glob(f"{glob.escape(self.output.name)}.rank-*-of-*"):
            path.unlink(missing_ok=True)


class ShareReader:
    """The bytes [start, stop) of a file, read as a stream (no file descriptor: a reader
    of it reads no further than `stop`)."""

    def __init__(self, path: Path, share: Share):
        self.file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self.file.seek(share.start)
        self.left = share.stop - share.start

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.file.read(n)
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> ShareReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def translate_file_by_ranks(
    engine: Any,
    input: Path | None,
    output: Path | None,
    options: dict,
    translate: Callable[[Share, BinaryIO, TextIO, Callable[[int], None]], None],
    line_files: dict[str, int] | None = None,
) -> bool:
    """`mtkit translate` under torchrun: the file `input`'s lines shared among the ranks,
    each rank's share translated by `translate(share, source, sink, done)` (`source`: the
    share's bytes; `sink`: the rank's part, text; `done(n)`: n more lines translated,
    `translated`) unless its part is finished, and the
    parts put together into `output`. `options`: what the output depends on beside the
    input and the engine's measured choices. `line_files`: files that need a line for
    each input line (--prefix-file: its line count), checked against the input's.
    Returns whether this rank's part was kept from an earlier run."""
    from mtkit.core.textio import check_line_count

    if input is None:
        raise RanksError(
            "under torchrun the input must be a file (-i FILE): the ranks cannot share stdin"
        )
    if output is None:
        raise RanksError(
            "under torchrun the output must be a file (-o FILE): each rank writes its part "
            "beside it, and rank 0 puts them together"
        )
    if not Path(input).is_file():
        raise RanksError(f"under torchrun the input must be a regular file; {input} is not")
    with Ranks.joined(getattr(engine, "device", "cpu")) as ranks:
        choices = agree_on_choices(ranks, engine)
        scanned = scan_file(Path(input), ranks.world)
        for what, count in (line_files or {}).items():
            check_line_count(scanned.lines, count, what)
        part = RankPart(ranks, Path(output), scanned, options_digest({**options, **choices}))

        def write(share: Share, sink: TextIO) -> None:
            with ShareReader(Path(input), share) as source:
                translate(share, source, sink, translated(ranks, Path(output)))

        return part.translate(write)


def translated(ranks: Ranks, output: Path) -> Callable[[int], None]:
    """What a rank is told as its lines are translated (`done(n)`, a batch at a time):
    the fault point "rank-translated" with rank=R, world=N, output (the path the parts
    are beside) and lines (this rank's lines translated so far), `mtkit.core.faults`."""
    lines = 0

    def done(n: int) -> None:
        nonlocal lines
        lines += n
        fault_point(
            "rank-translated", rank=ranks.rank, world=ranks.world, output=output, lines=lines
        )

    return done
