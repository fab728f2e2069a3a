"""The one kind of error the user can fix: `UserError`, which the CLI catches once.

Each module raises its own subclass (`ConfigError`, `DataError`, `CheckpointError`, ...)
with a message that is already the line to print: it names the file, the key or the
option at fault and what to do. The CLI prints `label` + the message's first line to
stderr and exits with `exit_code`; anything else that escapes is a bug, and keeps its
traceback. An `OSError` (a missing file, a full disk) is reported the same way, by the
CLI, from its errno.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A mistake in the user's input, options or files, told in one line."""

    label = "error: "  # what the CLI prints before the message
    exit_code = 2

    def line(self) -> str:
        """The message as one line: its first line, or the class name if it is empty."""
        text = str(self).strip()
        return text.splitlines()[0] if text else type(self).__name__


class OptionError(UserError, ValueError):
    """A command-line option (or a request's field) out of its range or at odds with
    another; `option` names it where one is at fault (a field of `mtkit serve`'s
    requests)."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option


class TrainError(UserError, RuntimeError):
    """A training run that cannot start or go on (one line): its data, its checkpoints,
    or a resume whose config asks for other choices than the run made at its first start
    (`mtkit.tuning.run`)."""


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """ "1 line", "2 lines" ("1 hypothesis", "2 hypotheses" with `nouns`), for messages."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def first_line(e: BaseException, limit: int = 160) -> str:
    """An exception's message for a log line or a record: its first line, at most
    `limit` characters, or the class name where it has none."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The one of `known` that a mistyped `name` most likely meant (difflib's closest, at
    a ratio of 0.6 or more), or None: what a message offers as "did you mean ...?" (a
    config's key, a jsonl record's field)."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None
