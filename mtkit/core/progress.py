"""Every progress bar and progress log line, all on stderr (never stdout).

- `ProgressView`: training (rank 0). On a terminal one live rich bar, elsewhere a line
  per `train.log_every` steps (`train_line`).
- `ProgressLog`: preprocessing, a log line at most every 10 s.
- `progress_bar`: translating a file, a bar for files of at least `BAR_MIN_LINES` lines.

`mtkit --quiet` shows none of them. rich is imported only when a bar is drawn.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from mtkit.core.config import TrainConfig
from mtkit.core.textio import line_count

log = logging.getLogger(__name__)


# --- training -------------------------------------------------------------------------------


class TrainPosition(Protocol):
    """Where training stands, as the view reads it (`mtkit.training.loop.Progress`)."""

    step: int
    epoch: int
    elapsed: float  # seconds of training, over all sessions


class ProgressView:
    """Training progress on stderr (rank 0). On a terminal: one live rich bar that moves
    every step (step/total or time/budget, loss, lr, tok/s, ETA), with log lines printed
    above it. Elsewhere (a file, a pipe): a line per `train.log_every` steps, as logs read
    best. `mtkit --quiet` shows neither."""

    def __init__(
        self, tc: TrainConfig, progress: TrainPosition, enabled: bool = True, console=None
    ):
        self.tc = tc
        self.bar = None
        self._handlers: list[tuple[logging.StreamHandler, object]] = []
        if not enabled or not log.isEnabledFor(logging.INFO):
            return
        from rich.console import Console

        console = console or Console(file=sys.stderr)
        if not console.is_terminal:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("train {task.fields[where]}"),
            BarColumn(),
            TextColumn("{task.fields[figures]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.task = self.bar.add_task(
            "train", total=tc.max_steps or tc.max_time or None, where="", figures=""
        )
        self.bar.start()
        self.update(progress)
        for handler in logging.getLogger().handlers:  # log lines go above the bar
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
                self._handlers.append((handler, handler.setStream(_ConsoleStream(console))))

    def update(self, progress: TrainPosition, record: dict | None = None) -> None:
        """Every step; `record` (loss, lr, tok/s) every `log_every` steps."""
        tc = self.tc
        if self.bar is None:
            if record is not None:
                train_line(progress, record, tc)
            return
        where = (
            f"step {progress.step}"
            + (f"/{tc.max_steps}" if tc.max_steps else "")
            + f" | epoch {progress.epoch}"
        )
        done = progress.step if tc.max_steps else progress.elapsed if tc.max_time else None
        figures = (
            {}
            if record is None
            else {
                "figures": (
                    f"loss {record['loss']:.3f} | lr {record['lr']:.2e} | "
                    f"{record['tokens_per_s']:,.0f} tok/s"
                )
            }
        )
        self.bar.update(self.task, completed=done, where=where, **figures)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        for handler, stream in self._handlers:
            handler.setStream(stream)


class _ConsoleStream:
    """A file-like stream that prints through a rich console (above its live bar)."""

    def __init__(self, console):
        self.console = console

    def write(self, text: str) -> int:
        if text.strip():
            self.console.out(text.rstrip("\n"), highlight=False)  # (the console is stderr)
        return len(text)

    def flush(self) -> None:
        self.console.file.flush()


def train_line(progress: TrainPosition, record: dict, tc: TrainConfig) -> None:
    """Progress on stderr: step, loss, lr, tokens/s and, with a step limit, the ETA."""
    if not log.isEnabledFor(logging.INFO):  # mtkit --quiet
        return
    eta = ""
    if tc.max_steps:
        per_step = progress.elapsed / max(progress.step, 1)
        eta = f" | ETA {_clock((tc.max_steps - progress.step) * per_step)}"
    elif tc.max_time:
        eta = f" | ETA {_clock(tc.max_time - progress.elapsed)}"
    total = f"/{tc.max_steps}" if tc.max_steps else ""
    line = (
        f"train | step {progress.step}{total} | epoch {progress.epoch} | loss "
        f"{record['loss']:.3f} | lr {record['lr']:.2e} | "
        f"{record['tokens_per_s']:,.0f} tok/s{eta}"
    )
    print(line, file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# --- preprocessing --------------------------------------------------------------------------


class ProgressLog:
    """Logs how far a stage that reads the corpora is (`stage`: preprocess, distill), at
    most every `every` seconds: pairs read of the total (known from the opened corpora),
    pairs/s and the time left."""

    def __init__(self, total: int, every: float = 10.0, stage: str = "preprocess"):
        self.total, self.every, self.stage = total, every, stage
        self.done = 0
        self.start = self.last = time.perf_counter()

    def advance(self, pairs: int) -> None:
        self.done += pairs
        now = time.perf_counter()
        if now - self.last < self.every or not self.total:
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-9)
        log.info(
            "%s: %s of %s pairs (%.0f%%), %s pairs/s, ~%.0f s left",
            self.stage,
            f"{self.done:,}",
            f"{self.total:,}",
            100 * self.done / self.total,
            f"{rate:,.0f}",
            (self.total - self.done) / max(rate, 1e-9),
        )


# --- translation ----------------------------------------------------------------------------


BAR_MIN_LINES = 300  # files shorter than this translate without a progress bar


@contextmanager
def progress_bar(
    path: str | os.PathLike | None, console=None
) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar (lines done, sentences/s, ETA) for translating the file `path`,
    on stderr when it is a terminal and the file has at least `BAR_MIN_LINES` lines;
    yields the callback that advances it, or None. Never touches stdout."""
    if path is None:
        yield None
        return
    from rich.console import Console

    console = console or Console(file=sys.stderr)
    total = 0
    if console.is_terminal and Path(path).is_file():  # (never a pipe's: translation reads it)
        with open(path, "rb") as f:
            total = line_count(f)
    if total < BAR_MIN_LINES:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("translate"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        redirect_stdout=False,
        redirect_stderr=False,
    )
    task = bar.add_task("translate", total=total, rate="")
    start = time.perf_counter()

    def advance(n: int) -> None:
        done = bar.tasks[0].completed + n
        rate = done / max(time.perf_counter() - start, 1e-9)
        bar.update(task, completed=done, rate=f"{rate:,.1f} sentences/s")

    with bar:
        yield advance
