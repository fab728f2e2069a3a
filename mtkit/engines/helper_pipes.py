"""The pipes between the translation pool (`mtkit.engines.workers`) and its helper
processes: what a message holds, how it is framed, sent and received.

Each helper has two one-way pipes of its own. A message is a pickled Python value after
its body's length (`frame`: `HEADER` bytes, big-endian).

Its inbox, written by the pool, read by the helper:

    (call, jobs, opts)                   a translation: its number, its `BatchJob`s and
                                         its `SearchOptions`; the helper takes batches
                                         of it through the pool's shared counter
    None                                 stop

Its outbox, written by the helper, read by the pool:

    ("loaded",)                          its engine is ready
    ("result", call, batch, hypotheses)  batch `batch` of translation `call`, translated
    ("error", call, line)                a batch of `call` failed (call None: the helper
                                         could not load its engine), in one line

The pool writes each inbox from a thread of its own (`Outbox`), so that it never waits
for a helper that is busy, loading or dead (the write then fails and the thread ends; it
is never waited for at exit). A helper writes its outbox whole (`send`, `write`). Each
side reads only as far as bytes are there (its end is non-blocking, `Channel`) and takes
whole messages only, so a process that dies half-way through a message never holds the
other.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
from typing import Any

HEADER = 8  # bytes of a message's length, before its pickled body
READ_BYTES = 1 << 20  # the most a channel reads from a pipe at once


def frame(message: Any) -> bytes:
    """`message` as it goes through a pipe: its pickled body's length, then the body."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(body).to_bytes(HEADER, "big") + body


def send(out: int, message: Any) -> None:
    """Write `message` whole to the pipe `out` (`frame`)."""
    write(out, frame(message))


def write(out: int, data: bytes) -> None:
    """Write all of `data` to the pipe `out` (blocking)."""
    view = memoryview(data)
    while view:
        view = view[os.write(out, view) :]


class Channel:
    """The reading end of one pipe, read without ever waiting (non-blocking): whole
    messages only, the bytes of one not yet whole kept for the next read."""

    def __init__(self, conn: Any):
        self.conn = conn
        os.set_blocking(conn.fileno(), False)
        self.pending = bytearray()
        self.ended = False  # the writing end is closed: its process has exited

    def read(self) -> list[Any]:
        """The whole messages among the bytes there now."""
        while not self.ended:
            try:
                chunk = os.read(self.conn.fileno(), READ_BYTES)
            except BlockingIOError:
                break
            self.ended = not chunk
            self.pending += chunk
        messages, start = [], 0
        view = memoryview(self.pending)
        while len(view) - start >= HEADER:
            end = start + HEADER + int.from_bytes(view[start : start + HEADER], "big")
            if end > len(view):
                break
            messages.append(pickle.loads(view[start + HEADER : end]))
            start = end
        view.release()
        del self.pending[:start]
        return messages


class Outbox:
    """The pool's end of one helper's inbox: what is put (`frame`d) is written by a
    thread of its own, started at the first put (after every helper has been forked),
    so that the pool never waits for the helper. A write to a helper that has ended
    fails (EPIPE): the thread then ends, as it does once `close` is put; it closes the
    pipe."""

    def __init__(self, conn: Any, name: str):
        self.conn = conn
        self.name = name
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def put(self, data: bytes) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._feed, name=self.name, daemon=True)
            self.thread.start()
        self.queue.put(data)

    def close(self) -> None:
        if self.thread is None:
            self.conn.close()
        else:
            self.queue.put(None)

    def _feed(self) -> None:
        try:
            while (data := self.queue.get()) is not None:
                write(self.conn.fileno(), data)
        except OSError:  # the helper has ended
            pass
        finally:
            self.conn.close()
