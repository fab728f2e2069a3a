"""Threads that share one `mtkit.Translator` (one engine, one model): each call gets
exactly what it gets alone, whatever the interleaving.

The interleavings are forced, not left to luck: a `threading.Barrier` patched into the
point that matters holds every thread there until all have come, so that all are at
once inside an alignment pass (which watches the model's cross-attention, the pass
that documents rest on), inside a trace of `mtkit explain`, or at the door of what
is taken one call at a time (helper processes, captured decoder steps). A barrier that
breaks (a thread never came: it failed, or waits on another) fails the test within
`WAIT_S`, never hangs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest
import torch

import mtkit
from mtkit.engines.pytorch import TorchEngine
from mtkit.model import attention

from faultkit import ROOT

THREADS = 8
WAIT_S = 60  # a barrier that waits longer is broken (a thread failed or waits forever)
PAGES = [
    "<p>A <b>dog</b> runs in the <i>snow</i>.</p>",
    "<p>Two <b>men</b> talk. A <a href='x'>woman</a> sings!</p>",
    "<ul><li>A <em>girl</em> plays.</li><li>A cat <b>sleeps</b></li></ul>",
    "<p><b>People</b> are <i>walking</i> on the street.</p>",
    "<div>A man in a <span class='c'>blue</span> shirt.</div>",
    "<p>A <b>child</b> eats <i>an apple</i>.</p>",
    "<p>The <b>boy</b> jumps <i>into</i> the water.</p>",
    "<p>Three <b>dogs</b> and a <i>ball</i>.</p>",
]


def first_time_each_thread(
    barrier: threading.Barrier, call: Callable, threads: range = range(THREADS)
) -> Callable:
    """`call`, which waits at `barrier` the first time each of `threads` (`in_threads`'
    numbers) calls it."""
    came = threading.local()

    def wrapped(*args, **kwargs):
        if not getattr(came, "yes", False) and int(threading.current_thread().name) in threads:
            came.yes = True
            barrier.wait()
        return call(*args, **kwargs)

    return wrapped


def in_threads(work: Callable[[int], object], count: int = THREADS) -> list:
    """work(k) in `count` threads at once; their results in order (a thread's error
    is raised here)."""
    results: list = [None] * count
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            results[k] = work(k)
        except BaseException as e:  # noqa: BLE001 - told to the test below
            errors.append(e)

    threads = [
        threading.Thread(target=run, args=(k,), name=str(k), daemon=True) for k in range(count)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3 * WAIT_S)
    assert not any(t.is_alive() for t in threads), "a thread never finished"
    if errors:
        raise errors[0]
    return results


def outcome(translations: list[mtkit.Translation]) -> list[tuple]:
    """What a call gave: each text, and each of its parts' pieces and word links (a
    document's tags are put back through them)."""
    return [
        (t.text, [(s.text, s.tokens, s.alignment) for s in t.sentences or (t,)])
        for t in translations
    ]


@pytest.fixture(scope="module")
def shared(trained) -> mtkit.Translator:
    """The tiny trained model's translator: one model on the CPU, one batch at a time
    (workers 1), so that calls run at once."""
    with mtkit.Translator.load(trained / "run" / "checkpoints" / "best.pt", device="cpu") as t:
        yield t


def test_threads_inside_the_alignment_pass_at_once_place_each_documents_tags_as_alone(
    shared, monkeypatch
):
    """Eight threads, each a page's alignment pass held until all eight are inside
    theirs (the barrier in the watched attention: each pass watches the shared model's
    cross-attention), then four calls more each: every page as one-by-one gives it,
    tags on the same words. (Watched through the model's own attribute, a pass saw the
    others' weights: a KeyError, a size mismatch, or tags on other words.)"""
    alone = [outcome(shared.translate([p], format="html")) for p in PAGES]
    assert all(s[2] for r in alone for s in r[0][1]) and len({r[0][0] for r in alone}) == 8
    barrier = threading.Barrier(THREADS, timeout=WAIT_S)
    monkeypatch.setattr(
        attention,
        "observed_attention",
        first_time_each_thread(barrier, attention.observed_attention),
    )

    def pages(k: int) -> list:
        mine = [(k + j) % len(PAGES) for j in range(5)]
        return [(i, outcome(shared.translate([PAGES[i]], format="html"))) for i in mine]

    for got in in_threads(pages):
        assert all(result == alone[i] for i, result in got)
    assert barrier.n_waiting == 0 and not barrier.broken


def test_an_alignment_pass_beside_searches_of_other_threads_sees_only_its_own(shared, monkeypatch):
    """Four threads held inside their alignment pass while four others are held at the
    start of their search (one barrier): the searches attend unwatched, the passes
    record their own weights; each result as alone."""
    texts = ["A dog runs in the snow.", "Two men talk.", "A girl plays.", "A cat sleeps."]
    alone = [outcome(shared.translate([t], alignments=True)) for t in texts]
    plain = [outcome(shared.translate([t])) for t in texts]
    barrier = threading.Barrier(THREADS, timeout=WAIT_S)
    monkeypatch.setattr(
        attention,
        "observed_attention",
        first_time_each_thread(barrier, attention.observed_attention, range(4, 8)),
    )
    search = TorchEngine.search
    monkeypatch.setattr(TorchEngine, "search", first_time_each_thread(barrier, search, range(4)))

    def work(k: int):
        text = texts[k % len(texts)]
        if k < 4:
            return outcome(shared.translate([text]))
        return outcome(shared.translate([text], alignments=True))

    got = in_threads(work)
    assert got[:4] == plain and got[4:] == alone


def test_a_trace_of_mtkit_explain_beside_a_translating_thread_records_its_own_pass():
    """`trace_shapes` while another thread runs the same model, both held in the same
    decoder layer: the trace holds its own stages only, as alone (the model's hooks
    record the tracing thread's pass, its observers are of that pass alone)."""
    from mtkit.core.config import ModelConfig
    from mtkit.model.transformer import build_model
    from mtkit.stages.explain import make_batch, trace_shapes

    torch.manual_seed(0)
    cfg = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, heads=2, ffn_dim=32)
    model = build_model(cfg, 20, 20).eval()
    batch = make_batch([("A dog runs.", "Ein Hund rennt.")], None, None, 20)
    other = make_batch([("Two men are talking here.", "Zwei Männer.")] * 3, None, None, 20)
    alone = [(s.name, s.shape) for s in trace_shapes(model, batch)]
    barrier = threading.Barrier(2, timeout=WAIT_S)

    def held(module, inputs) -> None:
        barrier.wait()

    model.decoder_layers[0].register_forward_pre_hook(held)

    def work(k: int):
        if k == 0:
            return [(s.name, s.shape) for s in trace_shapes(model, batch)]
        with torch.no_grad():
            return model.decode(other.tgt_in, *model.encode(other.src))

    traced, _ = in_threads(work, 2)
    assert traced == alone


def test_captured_decoder_steps_are_taken_one_call_at_a_time(trained, monkeypatch):
    """Captured steps (the CPU stand-in of a CUDA graph): a slot holds one search's
    cache, so the engine runs one call's batches at a time; eight threads let in at
    once translate as one by one."""
    from mtkit.core.search_options import SearchOptions
    from mtkit.engines.loader import load_engine
    from mtkit.tuning import capture

    monkeypatch.setitem(capture.CAPTURES, "cpu", lambda step: step)
    engine = load_engine(
        trained / "run" / "checkpoints" / "best.pt", "cpu", precision="fp32", cuda_graphs="on"
    )
    assert engine.graphs
    lines = [["A dog runs in the snow.", "Two men talk."], ["A girl plays with a ball."]]
    opts = SearchOptions(beam=4)
    alone = [engine.translate(lines[k % 2], opts) for k in range(THREADS)]
    barrier = threading.Barrier(THREADS, timeout=WAIT_S)
    monkeypatch.setattr(
        TorchEngine, "run_jobs", first_time_each_thread(barrier, TorchEngine.run_jobs)
    )
    got = in_threads(lambda k: engine.translate(lines[k % 2], opts))
    assert [[[h.tokens for h in n] for n in g] for g in got] == [
        [[h.tokens for h in n] for n in a] for a in alone
    ]
    assert engine.graph_record()["replayed_steps"] > 0


# Eight threads share a translator with a helper process (workers 2, each one thread: a
# fork), all let in at once; a process of its own, so that a hang is a timeout
WORKERS = """
import json, sys, threading, torch
torch.set_num_threads(2)
import mtkit
from mtkit.engines.pytorch import TorchEngine
barrier = threading.Barrier(8, timeout=60)
run_jobs, came = TorchEngine.run_jobs, threading.local()
def held(*args):
    if not getattr(came, "yes", False):
        came.yes = True
        barrier.wait()
    return run_jobs(*args)
lines = [f"A dog number {i} runs in the snow." for i in range(6)]
with mtkit.Translator.load(sys.argv[1], device="cpu", workers=2) as shared:
    alone = [[t.text for t in shared.translate(lines[s:], batch_tokens=40)] for s in range(3)]
    TorchEngine.run_jobs = held
    got = [None] * 8
    def work(k):
        got[k] = [t.text for t in shared.translate(lines[k % 3:], batch_tokens=40)]
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    helped = shared.engine._pool.helped
print(json.dumps({"same": [g == alone[k % 3] for k, g in enumerate(got)], "helped": helped}))
"""


def test_threads_share_a_translators_helper_processes_one_call_at_a_time(trained):
    """workers 2: the helpers serve one call's batches at a time (their shared counter
    is of one call), started once; eight calls let in at once each get what they get
    alone, and the helpers took part."""
    model = trained / "run" / "checkpoints" / "best.pt"
    proc = subprocess.run(
        [sys.executable, "-c", WORKERS, str(model)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["same"] == [True] * THREADS and result["helped"] > 0
