"""Several batches translated at once on a CPU: helper processes beside the engine's own.

A small model's decoder step is many small operations; two threads share each of them
less well than two processes share the batches (CTranslate2's `inter_threads`, Marian's
`--cpu-threads`). With `workers` N, the engine's process and N - 1 helper processes each
translate whole batches on their share of the threads (`torch.get_num_threads()` / N).
A batch is the same batch wherever it runs, so its hypotheses are the ones the engine
would make with that many threads.

Each process takes the next batch not yet taken as soon as it is free (a shared
counter), so that none waits while another has batches queued: the input's last batches
end about together. Results come back through one queue, with their batch's index.

Where each process gets one thread (the usual case: one worker per core), a helper is a
fork of the engine's process: it starts at once and shares the engine's loaded weights.
OpenMP's threads do not survive a fork, so a helper with more threads is spawned
instead, and loads the same checkpoint files in the same precision and attention kernel
(`pytorch.helper_engine`; a few seconds: Python, torch and the model), while the engine's
process translates its first batches. Helpers are kept for the engine's later inputs,
and stopped when the engine is let go or its process ends. As every worker process of
mtkit, they ignore SIGINT and SIGTERM, which the engine's process answers
(`mtkit.core.signals`), and they stop when they notice that it is gone. A helper that
dies, or fails, is one line (`WorkerError`).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import queue
from collections.abc import Callable, Iterator
from multiprocessing.util import Finalize
from typing import Any, NamedTuple

import torch

from mtkit.core.device import torch_threads
from mtkit.core.errors import UserError, first_line
from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import SearchOptions
from mtkit.core.signals import held_while_starting_workers, ignore_in_worker

log = logging.getLogger(__name__)

LIVENESS_S = 0.5  # how often a process that waits checks that the others are alive
STOP_WAIT_S = 5.0  # how long a helper that is told to stop may finish its batch


class BatchJob(NamedTuple):
    """One batch of a translation: what `TorchEngine.translate_batch` needs of it, plain
    lists (sent to a helper as they are)."""

    rows: list[list[int]]  # each sentence's source ids, without eos
    forced: list[list[int]] | None  # each sentence's target prefix, or None
    seeds: list[int]  # each sentence's sampling seed (sampling only)
    wanted: list | None  # each sentence's constraints' ids, or None
    banned: list[int]  # target ids this batch never outputs (`Engine.output_groups`)


class WorkerError(UserError):
    """A helper process failed (one line)."""


class BatchWorkers:
    """`workers` - 1 helper processes, each with its share of the threads, for `engine`:
    forks of it on one thread each, or spawned processes that load it again with `load`
    (picklable: `pytorch.helper_engine` with the engine's files and choices). Made by
    the engine (`TorchEngine.worker_pool`); `run` spreads a translation's batches over
    them and the engine's own process."""

    def __init__(
        self, engine: Any, load: Callable[[], Any], workers: int, threads: int | None = None
    ):
        self.workers = workers
        self.threads = max((threads or torch.get_num_threads()) // workers, 1)
        self.helped = 0  # batches the helpers have translated
        self.forked = self.threads == 1 and "fork" in multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if self.forked else "spawn")
        # The batch a process takes next, of the translation `call` (a helper still at the
        # end of an earlier one sees another call and takes nothing of this one)
        self.taken = context.Array("q", [0, 0])  # [call, next batch]
        self.results = context.Queue()  # (call, batch, hypotheses or None, error or None)
        self.inboxes = [context.Queue() for _ in range(workers - 1)]  # (call, jobs, opts)
        start = (_adopt_engine, (engine,)) if self.forked else (_start_helper, (load, self.threads))
        self.helpers = [
            context.Process(
                target=_helper,
                args=(*start, inbox, self.taken, self.results),
                daemon=True,  # stopped with the engine's process
                name=f"mtkit-helper-{i + 1}",
            )
            for i, inbox in enumerate(self.inboxes)
        ]
        with held_while_starting_workers():
            for helper in self.helpers:
                helper.start()
        # stopped when the pool is let go, and at the process's end before
        # multiprocessing's own end joins them (they ignore its SIGTERM)
        self._stop = Finalize(self, _stop, (self.inboxes, self.helpers), exitpriority=10)
        self.calls = itertools.count(1)
        log.info(
            "translating %d batches at once, on %d thread(s) each (helpers %s)",
            workers,
            self.threads,
            "forked" if self.forked else "spawned",
        )

    def run(
        self,
        jobs: list[BatchJob],
        opts: SearchOptions,
        here: Callable[[BatchJob, SearchOptions], list[list[Hypothesis]]],
    ) -> Iterator[tuple[int, list[list[Hypothesis]]]]:
        """(index, hypotheses) of each of `jobs` as they are finished, by the helpers or
        by `here` (the engine's own `translate_batch`, in this process): each process
        takes the next batch not yet taken whenever it is free."""
        self._check_alive()
        call = next(self.calls)
        with self.taken.get_lock():
            self.taken[0], self.taken[1] = call, 0
        for inbox in self.inboxes:
            inbox.put((call, jobs, opts))
        finished = 0
        try:
            with torch_threads(self.threads):  # this process's share, beside the helpers
                while (i := _take(self.taken, call, len(jobs))) is not None:
                    yield i, here(jobs[i], opts)
                    finished += 1
                    for i, hyps in self._ready(call, block=False):
                        yield i, hyps
                        finished += 1
                while finished < len(jobs):
                    for i, hyps in self._ready(call, block=True):
                        yield i, hyps
                        finished += 1
        finally:  # stopped early (an error, a signal): the helpers take nothing more of it
            with self.taken.get_lock():
                if self.taken[0] == call:
                    self.taken[1] = len(jobs)

    def _ready(self, call: int, block: bool) -> Iterator[tuple[int, list[list[Hypothesis]]]]:
        """The helpers' results of `call` that have come back (with `block`, at least
        one, waiting for it); a helper that stopped or failed is a `WorkerError`."""
        while True:
            try:
                got, i, hyps, error = self.results.get(block, LIVENESS_S)
            except queue.Empty:
                if not block:
                    return
                self._check_alive()
                continue
            if got != call:  # an interrupted earlier call's
                continue
            if error is not None:
                raise WorkerError(f"a translation helper process failed: {error}")
            self.helped += 1
            yield i, hyps
            block = False

    def _check_alive(self) -> None:
        dead = [h for h in self.helpers if not h.is_alive()]
        if dead:
            raise WorkerError(
                f"a translation helper process stopped (exit code {dead[0].exitcode}: "
                f"killed, or out of memory); translate with --workers 1"
            )

    def close(self) -> None:
        """Stop the helpers (`_stop`)."""
        self._stop()


def _stop(inboxes: list[Any], helpers: list[Any]) -> None:
    """Each helper ends after its batch, or is killed after `STOP_WAIT_S`."""
    for inbox in inboxes:
        inbox.put(None)
    for helper in helpers:
        helper.join(timeout=STOP_WAIT_S)
        if helper.is_alive():
            helper.kill()
            helper.join()


def _take(taken: Any, call: int, total: int) -> int | None:
    """The next batch of `call` not yet taken, taken now; None when all are (or another
    call has begun)."""
    with taken.get_lock():
        if taken[0] != call or taken[1] >= total:
            return None
        taken[1] += 1
        return taken[1] - 1


def _helper(
    start: Callable[..., Any], start_args: tuple, inbox: Any, taken: Any, results: Any
) -> None:
    """A helper's life: its engine from `start`, then for each call in its inbox the
    batches it takes, until None, or until the engine's process is gone (killed: no one
    would send the None)."""
    engine = start(*start_args)
    parent = multiprocessing.parent_process()
    results.cancel_join_thread()  # at its end, results no one will read are let go

    def orphaned() -> bool:
        return parent is not None and not parent.is_alive()

    while True:
        try:
            message = inbox.get(timeout=LIVENESS_S)
        except queue.Empty:
            if orphaned():
                return
            continue
        if message is None:
            return
        call, jobs, opts = message
        while not orphaned() and (i := _take(taken, call, len(jobs))) is not None:
            try:
                results.put((call, i, engine.translate_batch(jobs[i], opts), None))
            except Exception as e:  # told to the engine's process, in one line
                results.put((call, i, None, f"{type(e).__name__}: {first_line(e)}"))


def _quiet_helper(threads: int) -> None:
    """What every helper starts with: stop signals are the engine's process's to answer
    (`ignore_in_worker`), its log is errors only, and its threads are its share."""
    ignore_in_worker()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(threads)


def _adopt_engine(engine: Any) -> Any:
    """A forked helper's engine: the one it was forked with, on one thread."""
    _quiet_helper(1)
    return engine


def _start_helper(load: Callable[[], Any], threads: int) -> Any:
    """A spawned helper's engine: the same one, loaded again (`load`)."""
    _quiet_helper(threads)
    return load()
