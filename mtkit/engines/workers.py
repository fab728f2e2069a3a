"""Several batches translated at once on a CPU: helper processes beside the engine's own.

A small model's decoder step is many small operations; two threads share each of them
less well than two processes share the batches (CTranslate2's `inter_threads`, Marian's
`--cpu-threads`). With `workers` N, the engine's process and N - 1 helper processes each
translate whole batches on their share of the threads (`torch.get_num_threads()` / N).
A batch is the same batch wherever it runs, so its hypotheses are the ones the engine
would make with that many threads.

Each process takes the next batch not yet taken as soon as it is free (a shared
counter), so that none waits while another has batches queued: the input's last batches
end about together.

Where each process gets one thread (the usual case: one worker per core), a helper is a
fork of the engine's process: it starts at once and shares the engine's loaded weights.
OpenMP's threads do not survive a fork, so a helper with more threads is spawned
instead, and loads the same checkpoint files in the same precision and attention kernel
(`pytorch.helper_engine`; a few seconds: Python, torch and the model), while the engine's
process translates its first batches. A spawned helper translates with exactly the
weights the engine loaded: `helper_engine` compares the digests of what it loaded with
the engine's, and a model file replaced meanwhile (training, `mtkit average`) is one
line, never output from two models. Helpers are kept for the engine's later inputs, and
stopped when the engine is let go or its process ends. As every worker process of
mtkit, they ignore SIGINT and SIGTERM, which the engine's process answers
(`mtkit.core.signals`), and they stop when they notice that it is gone.

Channels. Each helper has an inbox of its own, a queue the engine puts each translation
in, `(call, jobs, opts)`, and None to stop (its feeder thread may stay blocked writing
to a helper that died: it is never waited for at exit, `cancel_join_thread`). What a
helper sends back goes through a one-way pipe of its own, as length-prefixed pickled
messages (`_send`): ("loaded",) once its engine is ready, ("result", call, batch,
hypotheses), ("error", call or None, what failed). The engine waits on every helper's
pipe and every helper's sentinel (readable once the process has ended) together
(`multiprocessing.connection.wait`); it reads a pipe only as far as bytes are there (its
end is non-blocking, `_Channel`) and takes whole messages only, so a helper that dies
half-way through a message never holds it. The shared counter's lock is taken with a
timeout, so a helper killed while holding it is found too. A helper that dies at any
moment (starting, loading, translating, sending) or fails is one `WorkerError` naming
it and its exit code; every helper is then killed at once. A call ends only once every
helper has loaded its engine or failed to, so that a failed load is told whatever the
input's size. Helpers are registered to be stopped (the `Finalize`) before the first
one starts: a start that fails half-way (too many open files) stops those started and
is one line naming its cause.

Fault injection, for the fault tests (tests/faults/test_fault_workers.py) and the soak
(benchmarks/worker_soak.py): the environment variable MTKIT_FAULT_HELPER, read only in
the helpers, makes one of them fail at one moment:

    kill:MOMENT[@K]     helper K (default 1) kills itself (SIGKILL) at MOMENT:
        start           its first act, before anything is loaded or adopted
        loading         Python and torch up, its engine not yet loaded (or adopted)
        taking          on taking its first batch, holding the shared counter's lock
        before-send     its first result ready, nothing of it written
        mid-send        half of its first result's message written
        after-send      its first result written whole
    fail:loading[@K]    its load raises an error
    swap:TARGET:REPLACEMENT
                        helper 1, before it loads, replaces the file TARGET by a copy
                        of REPLACEMENT (atomically, as training does)
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import resource
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from multiprocessing.util import Finalize
from typing import Any, NamedTuple

import torch

from mtkit.core.atomic import reason
from mtkit.core.device import torch_threads
from mtkit.core.errors import UserError, first_line
from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import SearchOptions
from mtkit.core.signals import held_while_starting_workers, ignore_in_worker

log = logging.getLogger(__name__)

LIVENESS_S = 0.5  # how often a process that waits checks that the others are alive
STOP_WAIT_S = 5.0  # how long helpers that are told to stop may finish their batches
HEADER = 8  # bytes of a message's length, before its pickled body
READ_BYTES = 1 << 20  # the most the engine reads from a pipe at once
FAULT_ENV = "MTKIT_FAULT_HELPER"


class BatchJob(NamedTuple):
    """One batch of a translation: what `TorchEngine.translate_batch` needs of it, plain
    lists (sent to a helper as they are)."""

    rows: list[list[int]]  # each sentence's source ids, without eos
    forced: list[list[int]] | None  # each sentence's target prefix, or None
    seeds: list[int]  # each sentence's sampling seed (sampling only)
    wanted: list | None  # each sentence's constraints' ids, or None
    banned: list[int]  # target ids this batch never outputs (`Engine.output_groups`)


class WorkerError(UserError):
    """A helper process failed, died or could not start (one line)."""


class BatchWorkers:
    """`workers` - 1 helper processes, each with its share of the threads, for `engine`:
    forks of it on one thread each, or spawned processes that load it again with `load`
    (picklable: `pytorch.helper_engine` with the engine's files, their digests and its
    choices). Made by the engine (`TorchEngine.worker_pool`); `run` spreads a
    translation's batches over them and the engine's own process. Helper K (from 1) is
    `helpers[K - 1]`, with its inbox, its channel and whether it has loaded."""

    def __init__(
        self, engine: Any, load: Callable[[], Any], workers: int, threads: int | None = None
    ):
        self.workers = workers
        self.threads = max((threads or torch.get_num_threads()) // workers, 1)
        self.helped = 0  # batches the helpers have translated
        self.broken = False  # a helper failed or died: the others were stopped too
        self.forked = self.threads == 1 and "fork" in multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if self.forked else "spawn")
        # The batch a process takes next, of the translation `call` (a helper still at the
        # end of an earlier one sees another call and takes nothing of this one)
        self.taken = context.Array("q", [0, 0])  # [call, next batch]
        self.helpers: list[Any] = []  # the processes started
        self.inboxes: list[Any] = []  # each one's (call, jobs, opts), then None
        self.channels: list[_Channel] = []  # what each one sends back
        self.loaded: list[bool] = []  # each one's engine is ready
        # Stopped when the pool is let go, and at the process's end before
        # multiprocessing's own end joins them (they ignore its SIGTERM): registered
        # before the first starts, so that a start failing half-way stops the others
        self._stop = Finalize(
            self, _stop, (self.helpers, self.inboxes, self.channels, self.loaded), exitpriority=10
        )
        self._start(context, engine if self.forked else load)
        self.calls = itertools.count(1)
        log.info(
            "translating %d batches at once, on %d thread(s) each (helpers %s)",
            workers,
            self.threads,
            "forked" if self.forked else "spawned",
        )

    def _start(self, context: Any, start: Any) -> None:
        """Start the helpers, one after another; the first that cannot start (no file
        descriptors, no memory) stops those started and is a `WorkerError`."""
        failed: tuple[int, OSError] | None = None
        with held_while_starting_workers():
            for k in range(1, self.workers):
                try:
                    self._start_helper(context, k, start)
                except OSError as e:
                    failed = k, e
                    break
        if failed is not None:  # raised out of the `except`: no context, so nothing on
            self._abandon()  # the way (`atomic.write_failure`) takes it for a failed write
            raise WorkerError(_start_failure(*failed, count=self.workers - 1))

    def _start_helper(self, context: Any, k: int, start: Any) -> None:
        reader, writer = context.Pipe(duplex=False)
        inbox = None
        try:
            inbox = context.Queue()
            inbox.cancel_join_thread()  # its feeder may be stuck on a dead helper's pipe
            helper = context.Process(
                target=_helper,
                args=(k, start, self.forked, self.threads, inbox, self.taken, writer),
                daemon=True,  # stopped with the engine's process
                name=f"mtkit-helper-{k}",
            )
            helper.start()
        except BaseException:
            reader.close()
            if inbox is not None:
                inbox.close()
            raise
        finally:
            writer.close()  # the helper's alone now: the pipe ends with it
        self.helpers.append(helper)
        self.inboxes.append(inbox)
        self.channels.append(_Channel(reader))
        self.loaded.append(False)

    def run(
        self,
        jobs: list[BatchJob],
        opts: SearchOptions,
        here: Callable[[BatchJob, SearchOptions], list[list[Hypothesis]]],
    ) -> Iterator[tuple[int, list[list[Hypothesis]]]]:
        """(index, hypotheses) of each of `jobs` as they are finished, by the helpers or
        by `here` (the engine's own `translate_batch`, in this process): each process
        takes the next batch not yet taken whenever it is free. Ends once every helper
        has loaded its engine (or failed to)."""
        if self.broken:
            raise WorkerError("the translation helpers were stopped after a failure")
        call = next(self.calls)
        lock = self.taken.get_lock()
        finished = 0
        try:
            _acquire(lock, self._check_alive)
            self.taken[0], self.taken[1] = call, 0
            lock.release()
            self._check_alive()
            for inbox in self.inboxes:
                inbox.put((call, jobs, opts))
            with torch_threads(self.threads):  # this process's share, beside the helpers
                while (i := _take(self.taken, call, len(jobs), self._check_alive)) is not None:
                    yield i, here(jobs[i], opts)
                    finished += 1
                    for i, hyps in self._ready(call, block=False):
                        yield i, hyps
                        finished += 1
                while finished < len(jobs):
                    for i, hyps in self._ready(call, block=True):
                        yield i, hyps
                        finished += 1
            self._settle()
        except WorkerError:
            self._abandon()
            raise
        finally:  # stopped early (an error, a signal): the helpers take nothing more of it
            if lock.acquire(timeout=LIVENESS_S):  # (else its holder died: all are stopped)
                if self.taken[0] == call:
                    self.taken[1] = len(jobs)
                lock.release()

    def _ready(self, call: int, block: bool) -> Iterator[tuple[int, list[list[Hypothesis]]]]:
        """The helpers' results of `call` that have come back (with `block`, at least
        one, waiting for it); a helper that failed or died is a `WorkerError`."""
        while True:
            found = []
            for k, message in self._receive(LIVENESS_S if block else 0):
                kind, got = message[0], message[1]
                if kind == "error" and got in (call, None):
                    raise WorkerError(f"translation helper {self._name(k)} failed: {message[2]}")
                if kind == "result" and got == call:  # (not an interrupted earlier call's)
                    found.append((message[2], message[3]))
            self.helped += len(found)
            yield from found
            if found or not block:
                return

    def _receive(self, timeout: float) -> list[tuple[int, tuple]]:
        """(helper, message) of the whole messages that have come, waiting up to
        `timeout` for any; "loaded" is noted here, and a helper that ended is a
        `WorkerError`. Never waits on a pipe: only for something to be there."""
        ready = set(wait([c.conn for c in self.channels] + self._sentinels(), timeout))
        got = []
        for k, channel in enumerate(self.channels, 1):
            messages = channel.read() if channel.conn in ready else []
            if channel.ended or self.helpers[k - 1].sentinel in ready:
                self._died(k, messages)
            for message in messages:
                if message[0] == "loaded":
                    self.loaded[k - 1] = True
                else:
                    got.append((k, message))
        return got

    def _settle(self) -> None:
        """Wait until every helper has loaded its engine or failed to (the first call of
        spawned helpers with little input: the engine's process may have translated it
        all meanwhile); a helper that died since is a `WorkerError` too."""
        timeout = 0.0
        while True:
            for k, message in self._receive(timeout):
                if message[0] == "error" and message[1] is None:
                    raise WorkerError(f"translation helper {self._name(k)} failed: {message[2]}")
            if all(self.loaded):
                return
            timeout = LIVENESS_S

    def _sentinels(self) -> list[int]:
        return [h.sentinel for h in self.helpers]

    def _check_alive(self) -> None:
        """A `WorkerError` where a helper has ended."""
        for k, helper in enumerate(self.helpers, 1):
            if not helper.is_alive():
                self._died(k)

    def _died(self, k: int, said: list[tuple] | None = None) -> None:
        """The `WorkerError` of helper `k`, which has ended: what it said it failed at,
        if it said so before it ended (in `said`, the messages of it just read, or among
        the whole ones still there), else its exit code."""
        helper = self.helpers[k - 1]
        helper.join(timeout=STOP_WAIT_S)  # its sentinel may come just before it is reaped
        for message in (said or []) + self.channels[k - 1].read():  # (never waits)
            if message[0] == "error":
                raise WorkerError(f"translation helper {self._name(k)} failed: {message[2]}")
        raise WorkerError(
            f"translation helper {self._name(k)} stopped with exit code {helper.exitcode} "
            f"({_cause(helper.exitcode)}); translate with --workers 1"
        )

    def _name(self, k: int) -> str:
        """How a message names helper `k`: "process 2 of 3 (pid 4242)"."""
        return f"process {k} of {self.workers - 1} (pid {self.helpers[k - 1].pid})"

    def _abandon(self) -> None:
        """Kill every helper now, and let the pool go (`broken`)."""
        self.broken = True
        for helper in self.helpers:
            if helper.is_alive():
                helper.kill()
        self._stop()

    def close(self) -> None:
        """Stop the helpers (`_stop`)."""
        self._stop()


class _Channel:
    """The engine's end of one helper's pipe, read without ever waiting (non-blocking):
    whole messages only, the bytes of one not yet whole kept for the next read."""

    def __init__(self, conn: Any):
        self.conn = conn
        os.set_blocking(conn.fileno(), False)
        self.pending = bytearray()
        self.ended = False  # the helper's end is closed: it has exited

    def read(self) -> list[tuple]:
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


def _stop(helpers: list[Any], inboxes: list[Any], channels: list[_Channel], loaded: list) -> None:
    """Each helper ends after its batch (a None in its inbox), or is killed once
    `STOP_WAIT_S` have passed; one still loading is killed at once (nothing of it to
    finish). Then the engine's ends of their inboxes and pipes are closed."""
    for helper, inbox, ready in zip(helpers, inboxes, loaded, strict=True):
        if helper.is_alive() and not ready:
            helper.kill()
        elif helper.is_alive():
            with contextlib.suppress(ValueError, OSError):
                inbox.put(None)
    deadline = time.monotonic() + STOP_WAIT_S
    for helper in helpers:
        helper.join(timeout=max(deadline - time.monotonic(), 0))
        if helper.is_alive():
            helper.kill()
            helper.join()
    for inbox in inboxes:
        inbox.close()
    for channel in channels:
        channel.conn.close()


def _acquire(lock: Any, waiting: Callable[[], None]) -> None:
    """Take `lock`, calling `waiting` each `LIVENESS_S` meanwhile: it raises where the
    wait is hopeless (a process that may hold the lock is gone)."""
    while not lock.acquire(timeout=LIVENESS_S):
        waiting()


def _take(
    taken: Any,
    call: int,
    total: int,
    waiting: Callable[[], None],
    holding: Callable[[], None] | None = None,
) -> int | None:
    """The next batch of `call` not yet taken, taken now; None when all are (or another
    call has begun). `waiting`: as `_acquire`'s; `holding`: called with the lock held
    (a fault injection)."""
    lock = taken.get_lock()
    _acquire(lock, waiting)
    try:
        if holding is not None:
            holding()
        if taken[0] != call or taken[1] >= total:
            return None
        taken[1] += 1
        return taken[1] - 1
    finally:
        lock.release()


def _start_failure(k: int, e: OSError, count: int) -> str:
    """The line for helper `k` of `count` that could not start because of `e`."""
    line = f"{reason(e)} while starting translation helper process {k} of {count}"
    if e.errno in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return f"{line} (open-file limit {soft}); use fewer --workers or raise it (ulimit -n)"
    return f"{line}; use fewer --workers"


def _cause(code: int | None) -> str:
    """What an exit code says of a helper's end, for people."""
    if code is None:
        return "still running, not answering"
    if code == -signal.SIGKILL:
        return "killed by SIGKILL: kill -9, or out of memory"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return "it ended by itself" if code == 0 else "it failed"


class _Orphaned(Exception):
    """The engine's process is gone: a helper has no one to translate for."""


class _Fault(NamedTuple):
    """The fault `MTKIT_FAULT_HELPER` asks of this helper (the module's docstring);
    action "" where it asks none, or of another helper."""

    action: str  # kill, fail or swap
    moment: str  # start, loading, taking, before-send, mid-send, after-send
    files: list[str]  # swap's target and replacement

    @classmethod
    def of_helper(cls, k: int) -> _Fault:
        value = os.environ.get(FAULT_ENV, "")
        head, at, which = value.rpartition("@")
        if at and which.isdigit():
            value, helper = head, int(which)
        else:
            helper = 1
        action, _, rest = value.partition(":")
        if helper != k or action not in ("kill", "fail", "swap"):
            return cls("", "", [])
        if action == "swap":
            return cls(action, "loading", rest.split(os.pathsep, 1))
        return cls(action, rest, [])

    def at(self, moment: str) -> None:
        """Fail now if this is the moment asked."""
        if moment != self.moment:
            return
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.action == "fail":
            raise RuntimeError(f"a load failure ({FAULT_ENV})")
        elif self.action == "swap" and len(self.files) == 2:
            target, replacement = self.files
            shutil.copyfile(replacement, target + ".swap")
            os.replace(target + ".swap", target)


def _helper(
    k: int,
    start: Any,
    forked: bool,
    threads: int,
    inbox: Any,
    taken: Any,
    conn: Any,
) -> None:
    """Helper `k`'s life: its engine (`start`: the engine it was forked with, or the
    function that loads it again), "loaded" on its pipe (or the error that kept it
    from loading), then for each call in its inbox the batches it takes, until None,
    or until the engine's process is gone (killed: no one would send the None)."""
    ignore_in_worker()  # stop signals are the engine's process's to answer
    fault = _Fault.of_helper(k)
    fault.at("start")
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(threads)  # its share
    out = conn.fileno()
    parent = multiprocessing.parent_process()

    def waiting() -> None:
        if parent is not None and not parent.is_alive():
            raise _Orphaned

    try:
        try:
            fault.at("loading")
            engine = start if forked else start()
        except Exception as e:  # told to the engine's process, in one line
            _send(out, ("error", None, f"could not load the model: {_told(e)}"))
            return
        _send(out, ("loaded",))
        while True:
            try:
                message = inbox.get(timeout=LIVENESS_S)
            except queue.Empty:
                waiting()
                continue
            if message is None:
                return
            call, jobs, opts = message
            holding = functools.partial(fault.at, "taking")
            while (i := _take(taken, call, len(jobs), waiting, holding)) is not None:
                try:
                    reply = ("result", call, i, engine.translate_batch(jobs[i], opts))
                except Exception as e:  # told to the engine's process, in one line
                    reply = ("error", call, f"{type(e).__name__}: {first_line(e)}")
                _send(out, reply, fault)
    except (_Orphaned, BrokenPipeError):  # the engine's process is gone
        return


def _send(out: int, message: tuple, fault: _Fault | None = None) -> None:
    """Write `message` whole to the pipe `out`: its length, then its pickled body."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(len(body).to_bytes(HEADER, "big") + body)
    if fault is not None:
        fault.at("before-send")
        if fault.moment == "mid-send":
            _write(out, data[: HEADER + len(body) // 2])
            fault.at("mid-send")
    _write(out, data)
    if fault is not None:
        fault.at("after-send")


def _write(out: int, data: memoryview) -> None:
    while data:
        data = data[os.write(out, data) :]


def _told(e: Exception) -> str:
    """An error as a helper tells it: a user error's line, else its type and line."""
    return e.line() if isinstance(e, UserError) else f"{type(e).__name__}: {first_line(e)}"
