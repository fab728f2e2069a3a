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
(`pytorch_loading.helper_engine`; a few seconds: Python, torch and the model), while the engine's
process translates its first batches. A spawned helper translates with exactly the
weights the engine loaded: `helper_engine` compares the digests of what it loaded with
the engine's, and a model file replaced meanwhile (training, `mtkit average`) is one
line, never output from two models. Helpers are kept for the engine's later inputs, and
stopped when the engine is let go or its process ends. As every worker process of
mtkit, they ignore SIGINT and SIGTERM, which the engine's process answers
(`mtkit.core.signals`), and they stop when they notice that it is gone.

Channels. Each helper has two one-way pipes of its own (`mtkit.engines.helper_pipes`:
what their messages hold, how they are framed and read): its inbox brings each
translation and the word to stop, its outbox brings back that it has loaded, each
result and what failed. Neither side ever waits on a pipe for the rest of a message:
the engine waits on every helper's pipe and every helper's sentinel (readable once the
process has ended) together (`multiprocessing.connection.wait`), a helper on its inbox
and the engine's sentinel.
A fork closes its copies of the engine's ends of every pipe: when the engine's process
is gone, its helpers' inboxes end and their writes fail, and they end too. The shared
counter's lock is taken with a timeout, so a helper killed while holding it is found
too. A helper that dies at any moment (starting, loading, translating, sending) or
fails is one `WorkerError` naming it and its exit code; every helper is then killed at
once. A call ends only once every
helper has loaded its engine or failed to, so that a failed load is told whatever the
input's size. Helpers are registered to be stopped (the `Finalize`) before the first
one starts: a start that fails half-way (too many open files) stops those started and
is one line naming its cause.

Fault tests (tests/faults/test_fault_workers.py) break a helper at the moments of its
life named `helper-*` through the library's one hook point (`mtkit.core.faults`). Where
a fault is asked, the engine's process also waits until every helper has loaded before
it takes a batch: a spawned helper loads for seconds, and on a loaded machine the
engine's process could take every batch first, so that a helper's batch moments never
came.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import multiprocessing
import resource
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
from mtkit.core.faults import fault_point, faults_asked
from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import SearchOptions, worker_threads
from mtkit.core.signals import held_while_starting_workers, ignore_in_worker
from mtkit.engines.helper_pipes import Channel, Outbox, frame, send, write

log = logging.getLogger(__name__)

LIVENESS_S = 0.5  # how often a process that waits checks that the others are alive
STOP_WAIT_S = 5.0  # how long helpers that are told to stop may finish their batches


class BatchJob(NamedTuple):
    """One batch of a translation: what `TorchEngine.translate_batch` needs of it, plain
    lists (sent to a helper as they are)."""

    rows: list[list[int]]  # each sentence's source ids, without eos
    forced: list[list[int]] | None  # each sentence's target prefix, or None
    seeds: list[int]  # each sentence's sampling seed (sampling only)
    wanted: list | None  # each sentence's constraints' ids, or None
    banned: list[int]  # target ids this batch never outputs (`EngineBase.output_groups`)
    links: list[bool] | None = None  # with alignments: which sentences want links (None: all)


class WorkerError(UserError):
    """A helper process failed, died or could not start (one line)."""


class BatchWorkers:
    """`workers` - 1 helper processes, each with its share of the threads, for `engine`:
    forks of it on one thread each, or spawned processes that load it again with `load`
    (picklable: `pytorch_loading.helper_engine` with the engine's files, their digests and its
    choices). Made by the engine (`TorchEngine.worker_pool`); `run` spreads a
    translation's batches over them and the engine's own process. Helper K (from 1) is
    `helpers[K - 1]`, with its inbox, its outbox's channel and whether it has loaded."""

    def __init__(
        self, engine: Any, load: Callable[[], Any], workers: int, threads: int | None = None
    ):
        self.workers = workers
        self.threads = worker_threads(workers, threads or torch.get_num_threads())
        self.helped = 0  # batches the helpers have translated
        self.broken = False  # a helper failed or died: the others were stopped too
        self.forked = self.threads == 1 and "fork" in multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if self.forked else "spawn")
        # The batch a process takes next, of the translation `call` (a helper still at the
        # end of an earlier one sees another call and takes nothing of this one)
        self.taken = context.Array("q", [0, 0])  # [call, next batch]
        self.helpers: list[Any] = []  # the processes started
        self.inboxes: list[Outbox] = []  # each one's (call, jobs, opts), then None
        self.channels: list[Channel] = []  # what each one sends back
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
        ends: list[Any] = []  # [inbox's, outbox's] (helper's end, engine's end)
        try:
            for _ in range(2):
                ends.append(context.Pipe(duplex=False))  # (reader, writer)
            (inbox, to_helper), (from_helper, outbox) = ends
            # A fork holds copies of the engine's ends of the pipes (its own and the
            # earlier helpers'): it closes them, or it would never see the engine's end
            # (no end of file, no EPIPE) and could wait forever on a pipe
            inherited = (
                [c.conn for c in self.channels]
                + [o.conn for o in self.inboxes]
                + [to_helper, from_helper]
                if self.forked
                else []
            )
            helper = context.Process(
                target=_helper,
                args=(k, start, self.forked, self.threads, inbox, self.taken, outbox, inherited),
                daemon=True,  # stopped with the engine's process
                name=f"mtkit-helper-{k}",
            )
            helper.start()
        except BaseException:
            for pair in ends:
                for end in pair:
                    end.close()
            raise
        inbox.close()  # the helper's ends are the helper's alone now: the pipes end with it
        outbox.close()
        self.helpers.append(helper)
        self.inboxes.append(Outbox(to_helper, f"mtkit-inbox-{k}"))
        self.channels.append(Channel(from_helper))
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
            message = frame((call, jobs, opts))  # (pickled once for all)
            for inbox in self.inboxes:
                inbox.put(message)
            if faults_asked():  # a fault test: every helper loads before this
                self._settle()  # process takes a batch, so that its batch moments come
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


def _stop(helpers: list[Any], inboxes: list[Outbox], channels: list[Channel], loaded: list) -> None:
    """Each helper ends after its batch (a None in its inbox), or is killed once
    `STOP_WAIT_S` have passed; one still loading is killed at once (nothing of it to
    finish). Then the engine's ends of their inboxes and pipes are closed."""
    for helper, inbox, ready in zip(helpers, inboxes, loaded, strict=True):
        if helper.is_alive() and not ready:
            helper.kill()
        elif helper.is_alive():
            inbox.put(frame(None))
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


def _helper(
    k: int,
    start: Any,
    forked: bool,
    threads: int,
    inbox: Any,
    taken: Any,
    outbox: Any,
    inherited: list[Any],
) -> None:
    """Helper `k`'s life: its engine (`start`: the engine it was forked with, or the
    function that loads it again), "loaded" on its `outbox` (or the error that kept it
    from loading), then for each call in its `inbox` the batches it takes, until None,
    or until the engine's process is gone (killed: no one would send the None; its
    inbox then ends and its outbox refuses writes, as `inherited`, the engine's ends a
    fork holds copies of, are closed first)."""
    ignore_in_worker()  # stop signals are the engine's process's to answer
    for end in inherited:
        end.close()
    fault_point("helper-start", helper=k)
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(threads)  # its share
    out = outbox.fileno()
    parent = multiprocessing.parent_process()
    watched = [inbox] + ([parent.sentinel] if parent is not None else [])
    calls = Channel(inbox)

    def waiting() -> None:
        if parent is not None and not parent.is_alive():
            raise _Orphaned

    try:
        try:
            fault_point("helper-loading", helper=k)
            engine = start if forked else start()
        except Exception as e:  # told to the engine's process, in one line
            send(out, ("error", None, f"could not load the model: {_told(e)}"))
            return
        send(out, ("loaded",))
        holding = functools.partial(fault_point, "helper-taking", helper=k)
        while not calls.ended:  # (the engine's process is gone)
            if parent is not None and parent.sentinel in wait(watched, LIVENESS_S):
                return  # (likewise)
            for message in calls.read():
                if message is None:
                    return
                call, jobs, opts = message
                while (i := _take(taken, call, len(jobs), waiting, holding)) is not None:
                    try:
                        reply = ("result", call, i, engine.translate_batch(jobs[i], opts))
                    except Exception as e:  # told to the engine's process, in one line
                        reply = ("error", call, f"{type(e).__name__}: {first_line(e)}")
                    data = frame(reply)
                    fault_point("helper-sending", helper=k, out=out, data=data)
                    write(out, data)
                    fault_point("helper-sent", helper=k)
    except (_Orphaned, BrokenPipeError):  # the engine's process is gone
        return


def _told(e: Exception) -> str:
    """An error as a helper tells it: a user error's line, else its type and line."""
    return e.line() if isinstance(e, UserError) else f"{type(e).__name__}: {first_line(e)}"
