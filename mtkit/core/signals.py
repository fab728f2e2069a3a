"""Stop signals (SIGINT, SIGTERM): the main process decides what they mean, its worker
processes ignore them.

Ctrl-C reaches every process in the terminal's foreground group, and `kill -TERM -- -PGID`,
`timeout`, systemd, Kubernetes and Slurm signal a whole process group too. A DataLoader
worker that died of such a signal took the trainer down with it ("DataLoader worker (pid N)
is killed by signal: Terminated") before the trainer could save, and a preprocessing worker
printed its own KeyboardInterrupt traceback. So every worker process mtkit starts ignores
both signals (`ignore_in_worker`, its first act), and the main process holds them back while
it starts workers (`held_while_starting_workers`), so that a signal arriving between a
worker's birth and its first act is discarded there rather than obeyed (a blocked signal
stays pending in the new process, and setting it to be ignored discards it: POSIX), and so
that no start is cut in half in the main process. The main
process gets the same signal once the block lifts and decides: the trainer saves a
checkpoint and exits 130/143 (`StopFlag`), other commands stop at once. The workers end
when the main process shuts them down, or, if it is killed, when they notice it is gone.

While it starts workers the main process also freezes its objects for the garbage
collector (`gc.freeze`): a forked worker never collects the objects it inherited. A
garbage cycle of the parent's collected in a fork runs its objects' destructors there;
one that holds a C++ object with threads of its own joins threads the fork does not
have. Seen once in CI: a DataLoader worker of a test process that had run many tests
before aborted while collecting garbage (`terminate called after throwing an instance
of 'std::system_error'`, "DataLoader worker (pid N) is killed by signal: Aborted").
"""

from __future__ import annotations

import gc
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignore_in_worker(*_args) -> None:
    """A worker process's first act (a DataLoader's `worker_init_fn`, a process pool's
    initializer): ignore stop signals, then unblock them (`held_while_starting_workers`)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # also discards one already pending
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextmanager
def held_while_starting_workers() -> Iterator[None]:
    """Hold stop signals back while this (main) thread starts worker processes, so that
    none interrupts the start half-way (a worker started but not yet known to its pool
    is one nobody stops). Blocked in this thread, the new processes inherit the block
    until `ignore_in_worker` runs. Another thread of this process (a pool's manager) may
    still receive one, and Python would then run the handler here at once: so the
    handlers are swapped for a recorder meanwhile, and a signal that came is raised
    again when the start is over, to the handler that was in place. The process's objects
    are frozen for the garbage collector meanwhile, so that a forked worker never collects
    them (see the module)."""
    seen: list[int] = []
    try:
        handlers = {sig: signal.signal(sig, lambda s, _: seen.append(s)) for sig in STOP_SIGNALS}
    except ValueError:  # not the main thread: signals are the main thread's anyway
        with _frozen_for_forks():
            yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        with _frozen_for_forks():
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a blocked one is recorded now
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(seen):
            signal.raise_signal(sig)


@contextmanager
def _frozen_for_forks() -> Iterator[None]:
    """This process's objects kept from the garbage collector of the processes forked in
    the block (`gc.freeze`: they stay frozen there), and given back to its own after."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class StopFlag:
    """Turns the first SIGINT/SIGTERM into a flag (`received`: "SIGINT" or "SIGTERM"), so
    that a loop can finish what it is doing, save, and stop; a second signal raises
    KeyboardInterrupt at once. Outside the main thread it sets no handlers."""

    def __init__(self):
        self.received: str | None = None
        self._previous = {}

    def __enter__(self) -> StopFlag:
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # a second signal: stop at once
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        log.warning("%s received: saving a checkpoint and stopping (again to abort)", self.received)

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
