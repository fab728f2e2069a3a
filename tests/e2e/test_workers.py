"""Several batches at once on a CPU (`decode.workers`, `translate --workers`): helper
processes translate whole batches beside the engine's process."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import time

import pytest
import torch

from mtkit.core.search_options import SearchOptions
from mtkit.engines.ct2 import ct2_threads
from mtkit.engines.loader import load_engine
from mtkit.engines.pytorch_loading import helper_engine
from mtkit.engines.workers import BatchJob, BatchWorkers, WorkerError
from mtkit.tuning.compile import compiler_missing

from conftest import cli, one_line_error, read_lines

LINES = read_lines("test2016.en.gz", 40)


@pytest.fixture
def one_thread():
    """Every process on one thread (the helpers' share of 1 or 2): the same kernels
    everywhere, so that hypotheses compare exactly."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("beam", [1, 4])
def test_helpers_translate_batches_as_the_engine_does(
    trained, one_thread, beam, monkeypatch, tmp_path
):
    """Both engines translate with the attention kernel measured at the first load, as two
    processes on one machine do through the kept measurements (`mtkit.tuning.measured`).
    The tests keep none, so without a cache folder here each load measured its own: the two
    kernels take close times on a small model, a loaded machine could give SDPA to one
    engine and matmul + softmax to the other, and their scores then differed in the sixth
    decimal. With one kernel and one thread everywhere, a batch gives the same hypotheses
    in a helper as in the engine's process."""
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(tmp_path / "cache"))
    checkpoint = trained / "run" / "checkpoints" / "best.pt"
    alone = load_engine(checkpoint, "cpu", workers=1)
    together = load_engine(checkpoint, "cpu", workers=2)
    try:
        assert together.precision["attention"] == alone.precision["attention"]
        opts = SearchOptions(beam=beam, nbest=min(beam, 2))
        done: list[int] = []
        want = alone.translate(LINES, opts, batch_tokens=60)
        got = together.translate(LINES, opts, done.append, batch_tokens=60)
        for _ in range(5):  # a helper starved of CPU by other processes may take no batch
            if together._pool.helped:  # of one call: they did work
                break
            again = together.translate(LINES, opts, batch_tokens=60)
            assert [[h.tokens for h in n] for n in again] == [[h.tokens for h in n] for n in got]
        assert together._pool is not None and together._pool.helped > 0
        assert alone._pool is None
        assert [[h.tokens for h in n] for n in got] == [[h.tokens for h in n] for n in want]
        assert all(abs(g.score - w.score) < 1e-5 for a, b in zip(got, want) for g, w in zip(a, b))
        assert sum(done) == len(LINES)  # progress counts every line once (of the first call)
        assert torch.get_num_threads() == 1  # this process's threads as they were
        again = together.translate(LINES[:12], opts, batch_tokens=60)  # the same helpers
        assert [n[0].tokens for n in again] == [n[0].tokens for n in want[:12]]
    finally:
        together.close()


@pytest.mark.skipif(compiler_missing() is not None, reason="Inductor needs a C++ compiler")
def test_forked_helpers_step_what_their_engine_compiled(trained, one_thread, monkeypatch, tmp_path):
    """`--compile on --workers 2`: the engine compiles the steps of its first input's
    kind of search (greedy here) before it forks its helpers, which run that code (a
    fork that compiled would hang: Inductor's threads are not in it); a later input of
    the other kind (beam search) steps eagerly in the helpers. Every batch's hypotheses
    are the eager engine's."""
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(tmp_path / "cache"))
    checkpoint = trained / "run" / "checkpoints" / "best.pt"
    alone = load_engine(checkpoint, "cpu", workers=1, compile="off")
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # (of the process)
    together = load_engine(checkpoint, "cpu", workers=2, compile="on")
    try:
        assert together.precision["compile"] == {"compile": "on", "asked": "on"}
        for beam, compiled in ((1, {1}), (4, {1, 2})):
            opts = SearchOptions(beam=beam)
            want = alone.translate(LINES, opts, batch_tokens=60)
            got = together.translate(LINES, opts, batch_tokens=60)
            assert [n[0].tokens for n in got] == [n[0].tokens for n in want]
            # greedy's graph before the fork; beam search's in this process if it took
            # a batch of the second input (the helpers step it eagerly)
            assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs in compiled
        assert together._pool is not None and together._pool.helped > 0
        record = together.steppers[0].record()
        assert record["compiled_steps"] > 0 and "failed" not in record
    finally:
        together.close()


def test_a_helper_with_several_threads_is_spawned_and_loads_the_same_engine(trained, one_thread):
    """Two threads a helper: a new process (OpenMP's threads do not survive a fork) that
    loads the checkpoint in the engine's precision and attention kernel."""
    engine = load_engine(trained / "run" / "checkpoints" / "best.pt", "cpu", workers=1)
    engine.use_attention("matmul")
    load = functools.partial(helper_engine, engine.sources, "fp32", "matmul")
    pool = BatchWorkers(engine, load, workers=2, threads=4)
    try:
        assert not pool.forked and pool.threads == 2
        opts = SearchOptions(beam=3)
        jobs = [BatchJob([ids], None, [], None, []) for ids in engine.encode(LINES[:12])]

        def here(job, opts):  # the first batch here waits for the helper to take one
            deadline = time.time() + 120  # (its start: Python, torch, the checkpoint)
            while pool.taken[1] < 2 and time.time() < deadline:
                time.sleep(0.05)
            return engine.translate_batch(job, opts)

        got = dict(pool.run(jobs, opts, here))
        assert pool.helped > 0 and sorted(got) == list(range(len(jobs)))
        for i, job in enumerate(jobs):
            assert [h.tokens for h in got[i][0]] == [
                h.tokens for h in engine.translate_batch(job, opts)[0]
            ]
    finally:
        pool.close()
    assert not any(helper.is_alive() for helper in pool.helpers)


def test_a_helper_that_dies_is_one_line(trained, one_thread):
    engine = load_engine(trained / "run" / "checkpoints" / "best.pt", "cpu", workers=2)
    try:
        engine.translate(LINES, SearchOptions(beam=1), batch_tokens=60)
        for helper in engine._pool.helpers:
            os.kill(helper.pid, signal.SIGKILL)
            helper.join(timeout=10)
        stopped = r"helper process 1 of 1 \(pid \d+\) stopped with exit code -9"
        with pytest.raises(WorkerError, match=stopped):
            engine.translate(LINES, SearchOptions(beam=1), batch_tokens=60)
        assert engine._pool.broken and not any(h.is_alive() for h in engine._pool.helpers)
        engine.translate(LINES, SearchOptions(beam=1), batch_tokens=60)  # new helpers
        assert not engine._pool.broken and engine._pool.helped > 0
    finally:
        engine.close()


def test_a_helper_that_fails_is_one_line(trained, one_thread, monkeypatch):
    engine = load_engine(trained / "run" / "checkpoints" / "best.pt", "cpu", workers=2)
    own = engine.translate_batch

    def translate_batch(job, opts):  # forked helpers fail; this process is slow
        if multiprocessing.current_process().name.startswith("mtkit-helper"):
            raise RuntimeError("no memory for the logits")
        time.sleep(0.05)  # so that the helper takes batches too
        return own(job, opts)

    monkeypatch.setattr(engine, "translate_batch", translate_batch)
    try:
        with pytest.raises(WorkerError, match="failed: RuntimeError: no memory for the logits"):
            engine.translate(LINES, SearchOptions(beam=1), batch_tokens=60)
    finally:
        engine.close()


def test_one_batch_needs_no_helpers(trained):
    engine = load_engine(trained / "run" / "checkpoints" / "best.pt", "cpu", workers=2)
    engine.translate(LINES[:3], SearchOptions(beam=2))
    assert engine._pool is None


def test_ctranslate2_runs_batches_on_threads_of_their_own(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert ct2_threads(0, "cpu") == (8, 1)  # auto: one batch per thread
    assert ct2_threads(1, "cpu") == (1, 8)  # one batch on all of them
    assert ct2_threads(2, "cpu") == (2, 4)
    assert ct2_threads(16, "cpu") == (16, 1)
    assert ct2_threads(0, "cuda") == (1, 0)  # a GPU: one batch at a time
    monkeypatch.setattr(torch, "get_num_threads", lambda: 32)
    assert ct2_threads(0, "cpu") == (8, 4)  # auto takes at most 8


def test_auto_is_one_batch_per_thread_on_a_cpu(trained):
    checkpoint = trained / "run" / "checkpoints" / "best.pt"
    before = torch.get_num_threads()
    try:
        for threads, expected in ((1, 1), (2, 2)):
            torch.set_num_threads(threads)
            assert load_engine(checkpoint, "cpu", workers=0).workers == expected
            assert load_engine(checkpoint, "cpu", workers=1).workers == 1  # as asked
            assert load_engine(checkpoint, "cpu").workers == expected  # decode.workers: 0
    finally:
        torch.set_num_threads(before)


def test_a_bad_number_of_workers_is_one_line(trained):
    checkpoint = trained / "run" / "checkpoints" / "best.pt"
    one_line_error(cli("translate", "-m", checkpoint, "--workers", "300"), "--workers")
    one_line_error(cli("translate", "-m", checkpoint, "--workers", "-1"), "--workers")
