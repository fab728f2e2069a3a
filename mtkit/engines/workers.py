"""Several batches translated at once on a CPU: helper processes beside the engine's own.

A small model's decoder step is many small operations; two threads share each of them
less well than two processes share the batches (CTranslate2's `inter_threads`, Marian's
`--cpu-threads`). With `workers` N, the engine's process and N - 1 helper processes each
translate whole batches on their share of the threads (`torch.get_num_threads()` / N).
A batch is the same batch wherever it runs, so its hypotheses are the ones the engine
would make with that many threads.

A helper loads the same checkpoint files in the same precision and attention kernel as
the engine (`load_torch_engine` in the helper; spawned, not forked: OpenMP's threads do
not survive a fork). Helpers start while the engine's process translates its first
batches, and are kept for the engine's later inputs. They ignore Ctrl-C, which the
engine's process answers; a helper that dies is one line (`WorkerError`).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from mtkit.core.errors import UserError
from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import SearchOptions

log = logging.getLogger(__name__)

QUEUED_PER_HELPER = 2  # batches handed to each helper ahead, so none waits for the next


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
    """`workers` - 1 helper processes, each with its share of the threads, for an engine
    loaded with `load` (the keyword arguments of `load_torch_engine`, plus the attention
    kernel). Made by the engine (`TorchEngine.worker_pool`); `run` spreads a translation's
    batches over them and the engine's own process."""

    def __init__(self, load: dict[str, Any], workers: int, threads: int | None = None):
        self.workers = workers
        self.threads = max((threads or torch.get_num_threads()) // workers, 1)
        self.helped = 0  # batches the helpers have translated
        self.executor = ProcessPoolExecutor(
            workers - 1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_helper,
            initargs=(load, self.threads),
        )
        log.info("translating %d batches at once, on %d thread(s) each", workers, self.threads)

    def run(
        self,
        jobs: list[BatchJob],
        opts: SearchOptions,
        here: Callable[[BatchJob, SearchOptions], list[list[Hypothesis]]],
    ) -> Iterator[tuple[int, list[list[Hypothesis]]]]:
        """(index, hypotheses) of each of `jobs` as they are finished, by the helpers or
        by `here` (the engine's own `translate_batch`, in this process), in order of
        the jobs taken: helpers get the first ones, this process the next free one."""
        queued: dict[Future, int] = {}
        ahead = QUEUED_PER_HELPER * (self.workers - 1)
        taken = 0
        with self.threads_here():
            while taken < len(jobs) or queued:
                while taken < len(jobs) and len(queued) < ahead:
                    queued[self._submit(jobs[taken], opts)] = taken
                    taken += 1
                for future in [f for f in queued if f.done()]:
                    yield queued.pop(future), self._result(future)
                if taken < len(jobs):
                    taken += 1
                    yield taken - 1, here(jobs[taken - 1], opts)
                elif queued:
                    finished, _ = wait(queued, return_when=FIRST_COMPLETED)
                    for future in finished:
                        yield queued.pop(future), self._result(future)

    def _submit(self, job: BatchJob, opts: SearchOptions) -> Future:
        try:
            return self.executor.submit(_translate_batch, job, opts)
        except (BrokenProcessPool, RuntimeError) as e:
            raise WorkerError(f"a translation helper process stopped ({e})") from None

    def _result(self, future: Future) -> list[list[Hypothesis]]:
        try:
            hyps = future.result()
        except BrokenProcessPool:
            raise WorkerError(
                "a translation helper process stopped (killed, or out of memory); "
                "translate with --workers 1"
            ) from None
        self.helped += 1
        return hyps

    @contextmanager
    def threads_here(self) -> Iterator[None]:
        """This process on its share of the threads while helpers run beside it."""
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


_engine = None  # a helper's engine (`_start_helper`)


def _start_helper(load: dict[str, Any], threads: int) -> None:
    """A helper's start: Ctrl-C is the engine's process's to answer, the threads its
    share, and the same engine loaded."""
    global _engine
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(threads)
    from mtkit.core.device import tune_cpu_runtime
    from mtkit.engines.pytorch import load_torch_engine

    tune_cpu_runtime()
    load = dict(load)
    attention = load.pop("attention", None)
    _engine = load_torch_engine(load.pop("paths"), "cpu", workers=1, **load)
    if attention is not None:
        _engine.use_attention(attention)


def _translate_batch(job: BatchJob, opts: SearchOptions) -> list[list[Hypothesis]]:
    return _engine.translate_batch(job, opts)
