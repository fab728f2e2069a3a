"""The model worker of `mtkit serve`: one queue for every request's sentences, and one
thread that runs the model (`Batcher`).

Greedy requests join one running greedy search between any two of its steps and leave
it as each sentence ends (continuous batching, `mtkit.serving.stream`); each request is
answered once its own last sentence ends. Other requests run in rounds: the worker takes
sentences up to `max_batch_tokens` source tokens or until `max_wait_ms` has passed since
the oldest waiting one arrived (or since answers last went out, if later, so that the
clients it answered can join), translates them in one batched search per decoding
setting, and answers each request at the round's end. At shutdown (`Batcher.close`) what
is in flight is finished, one last round takes the waiting requests up to the budget,
and the rest get 503 (`Batcher._finish`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from mtkit.core.errors import plural
from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import SearchOptions, flag
from mtkit.engines.base import Engine
from mtkit.serving.stream import LineStream, open_stream

if TYPE_CHECKING:
    from mtkit.serving.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DocumentLimits:
    """What the document routes take (`mtkit.serving.documents`)."""

    max_jobs: int = 16  # documents queued, translating or awaiting download; beyond: 429
    max_bytes: int = 10 << 20  # a document's file
    max_chars: int = 1_000_000  # characters of one document's text translated
    expiry_s: float = 3_600.0  # how long a result (or an error) waits for its download
    workers: int = 2  # documents translated at once
    chunk_lines: int = 16  # sentences a document has in the batcher at a time


@dataclass(frozen=True)
class Limits:
    max_batch_tokens: int = 4000  # source tokens the worker takes into one search
    max_wait_ms: float = 5.0  # how long the oldest waiting sentence may wait for company
    max_lines: int = 64  # sentences per request
    max_chars: int = 20_000  # characters per request, all sentences together
    max_body_bytes: int = 1 << 20  # request body
    body_timeout_s: float = 30.0  # how long a request's body may take to arrive (then 408)
    max_queued_lines: int = 20_000  # sentences waiting; beyond this requests get 503
    documents: DocumentLimits = DocumentLimits()  # the document routes' own

    def check(self, texts: list[str]) -> None:
        """413 (naming the field "text") for a request over the per-request limits: the
        one size check of every route."""
        if len(texts) > self.max_lines:
            raise ServeError(
                413,
                f"at most {plural(self.max_lines, 'text')} per request, got {len(texts)}",
                "text",
            )
        chars = sum(map(len, texts))
        if chars > self.max_chars:
            raise ServeError(
                413,
                f"at most {plural(self.max_chars, 'character')} per request, got {chars}",
                "text",
            )


# When waiting greedy requests join the running stream (`Batcher._join_stream`): each
# join runs the encoder, which costs nearly as much for a few sentences as for dozens, so
# they wait until they are half as many as those decoding, or for 3 steps: with many
# clients (`benchmarks/serve_load.py`'s requests) this serves more than joining at every
# step; with few the two do not differ beyond noise.
JOIN_SHARE = 0.5
JOIN_AFTER_STEPS = 3


T = TypeVar("T")


class Meter(Protocol):
    """What a metered `QueuedEngine` (`QueuedEngine.metered`) tells as it sends one
    caller's sentences to the batcher: a document's job
    (`mtkit.serving.documents.DocumentJob`), its progress and its limit."""

    chunk_lines: int  # sentences it has in the batcher at a time

    def admit(self, lines: list[str]) -> None:
        """Before `lines` are sent: raise where they may not be (over a limit)."""

    def sent(self, lines: list[str]) -> None:
        """Once the translations of `lines` are back."""


class QueuedEngine:
    """The served engine as every request's session sees it (`mtkit.engines.base.Engine`),
    made once when the server starts: its searches are queued in the server's `Batcher`,
    whose one thread runs the engine it wraps; what describes the model and checks a
    request is the wrapped engine's. A search belongs to the `Ticket` of the request
    whose session asks for it (the one its thread runs under), so that a client who
    leaves drops its searches not yet begun. With a `meter` (`metered`), its sentences
    go to the batcher `meter.chunk_lines` at a time, each chunk once the last is back, so
    that requests arriving meanwhile join the batcher's next round beside them instead
    of waiting behind them all."""

    def __init__(self, engine: Engine, batcher: Batcher, meter: Meter | None = None):
        self.engine, self.batcher, self.meter = engine, batcher, meter
        self.src_vocab, self.tgt_vocab = engine.src_vocab, engine.tgt_vocab
        self.capabilities, self.config = engine.capabilities, engine.config
        self.steps, self.weights = engine.steps, engine.weights
        self.batch_tokens = engine.batch_tokens

    def metered(self, meter: Meter) -> QueuedEngine:
        """The same engine and batcher, its sentences sent in chunks and told to `meter`."""
        return QueuedEngine(self.engine, self.batcher, meter)

    def translate(
        self,
        lines,
        options,
        done=None,
        prefixes=None,
        *,
        batch_tokens=0,
        constraints=None,
        links=None,
    ) -> list[list[Hypothesis]]:
        """The hypotheses of `lines`, searched by the batcher with whatever other
        requests' lines it runs them with (`batch_tokens` is the server's `Limits`); with
        a meter, `meter.chunk_lines` at a time, admitted by it first and each chunk told
        to it once back."""
        if self.meter is None:
            return self._search(lines, options, prefixes, constraints, links)
        self.meter.admit(lines)
        step, found = self.meter.chunk_lines, []
        for i in range(0, len(lines), step):
            chunk = lines[i : i + step]
            found += self._search(
                chunk,
                options,
                prefixes[i : i + step] if prefixes else None,
                constraints[i : i + step] if constraints else None,
                links[i : i + step] if links is not None else None,
            )
            self.meter.sent(chunk)
        return found

    def _search(self, lines, options, prefixes, constraints, links) -> list[list[Hypothesis]]:
        """`lines` in one batcher job, under the running request's `Ticket`."""
        if not lines:
            return []
        ticket = _TICKET.get(None)
        if ticket is not None and ticket.cancelled:
            raise CancelledError
        future = self.batcher.submit(lines, options, constraints, prefixes, links=links)
        if ticket is not None:
            ticket.futures.append(future)
        return future.result()

    def check(self, options: SearchOptions, spell: Callable[[str], str] = flag) -> None:
        self.engine.check(options, spell)

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self.engine.encode(lines)

    def constraint_errors(self, texts, constraints, opts: SearchOptions) -> list[str]:
        return self.engine.constraint_errors(texts, constraints, opts)

    def describe(self) -> dict:
        return self.engine.describe()

    def close(self) -> None:
        """Nothing: the server closes the engine it serves when it stops."""


class Ticket:
    """One request's searches in the batcher. `run` calls its session's work in the
    thread that runs it; `cancel` drops the searches queued under it that have not begun
    (the client left) and fails any it asks for later."""

    def __init__(self) -> None:
        self.futures: list[Future] = []
        self.cancelled = False

    def run(self, work: Callable[..., T], *args) -> T:
        held = _TICKET.set(self)
        try:
            return work(*args)
        finally:
            _TICKET.reset(held)

    def cancel(self) -> None:
        self.cancelled = True
        for future in self.futures:
            future.cancel()


_TICKET: ContextVar[Ticket] = ContextVar("mtkit_serve_ticket")  # the running session's


SHUTTING_DOWN = "the server is shutting down; retry shortly"
SIGNAL_SLICE_S = 0.2  # the longest the model thread waits without running signal handlers


class ServeError(Exception):
    """An error answered as JSON {"error": message, "field"?: name} with `status`."""

    def __init__(self, status: int, message: str, field_name: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field_name


# --- the model worker ------------------------------------------------------------------


@dataclass
class _Job:
    """One request's sentences, from the queue until answered."""

    lines: list[str]
    opts: SearchOptions
    tokens: int  # source tokens, for the batch budget
    longest: int  # tokens of its longest sentence
    constraints: list[list[tuple[str, ...]]] | None = None  # per line (`mtkit.core.terms`)
    prefixes: list[str] | None = None  # per line: the output's forced start
    links: list[bool] | None = None  # per line, with alignments: whether it wants them
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    seen_at_step: int = 0  # the stream's step count when the worker took the request
    results: list[list[Hypothesis] | None] = field(default_factory=list)  # streamed lines
    left: int = 0  # streamed lines not yet ended
    counted: bool = True  # in `received` and `waiting_lines` (the warm-up is not)


class Batcher:
    """The queue and the one worker that runs the model (dynamic batching): `run` in the
    calling thread, or `start` a thread for it.

    With `continuous` (the default) greedy requests, where the engine can stream them
    (`open_stream`), join one running search between any two of its steps and leave it
    as each sentence ends: continuous batching. A request is answered once its last
    sentence ends. Other requests run in rounds: the waiting ones up to the token
    budget, in one search per decoding setting, answered at the round's end.

    `mtkit serve` runs the model on the main thread (and HTTP on another): the same
    search ran slower in a second thread."""

    def __init__(self, translator: Engine, limits: Limits, continuous: bool = True):
        self.translator, self.limits, self.continuous = translator, limits, continuous
        self._queue: queue.Queue[_Job | None] = queue.Queue()  # None: stop
        self._queued_lines = 0
        self.received = 0  # requests accepted since start (never falls: a client can wait on it)
        self._stopping = False  # `close` was called: new requests get 503
        self._lock = threading.Lock()
        self._backlog: list[_Job] = []  # taken from the queue, not yet run or streaming
        self._stream: LineStream | None = None
        self._streaming: list[_Job] = []  # requests with sentences in the stream
        self._closing = False
        self._steps = 0  # steps the stream has run
        self._round_end = 0.0  # time.monotonic() when answers last went out
        self._thread: threading.Thread | None = None
        self.metrics: Metrics | None = None  # told of each batch and answer (`/metrics`)

    def start(self) -> Batcher:
        self._thread = threading.Thread(target=self.run, name="mtkit-model", daemon=True)
        self._thread.start()
        return self

    def submit(
        self,
        lines: list[str],
        opts: SearchOptions,
        constraints: list[list[tuple[str, ...]]] | None = None,
        prefixes: list[str] | None = None,
        counted: bool = True,
        links: list[bool] | None = None,
    ) -> Future:
        """Queue a request's sentences (and each one's constraints, target prefix and
        whether it wants word links, when given); the future gets one hypothesis list per
        line. `counted`: whether it counts in `received` and `waiting_lines` (the
        server's own warm-up does not)."""
        lengths = [len(x) + 1 for x in self.translator.encode(lines)]
        with self._lock:
            if self._stopping:
                raise ServeError(503, SHUTTING_DOWN)
            if self._queued_lines + len(lines) > self.limits.max_queued_lines:
                raise ServeError(
                    503, "the server is busy: too many sentences are waiting; retry shortly"
                )
            self._queued_lines += len(lines) * counted
            self.received += counted
        job = _Job(
            lines,
            opts,
            sum(lengths),
            max(lengths, default=0),
            constraints,
            prefixes,
            links,
            counted=counted,
        )
        self._queue.put(job)
        return job.future

    @property
    def stopping(self) -> bool:
        """Whether `close` was called: the server is shutting down."""
        return self._stopping

    @property
    def waiting_lines(self) -> int:
        """Sentences accepted and not yet taken into a round or the stream."""
        return self._queued_lines

    def close(self) -> None:
        """Stop taking requests (new ones get 503) and let `run` finish what it has (see
        `_finish`), then return. Returns at once; safe to call more than once."""
        with self._lock:
            self._stopping = True
        self._queue.put(None)

    def stop(self) -> None:
        """`close`, and wait until the worker thread (if `start`ed) has returned."""
        self.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def run(self) -> None:
        """Translate queued sentences until `close`."""
        while not self._closing:
            self._take(wait=not (self._backlog or self._streaming))
            self._run_round()
            self._join_stream()
            self._step_stream()
        self._finish()

    def _finish(self) -> None:
        """What shutdown promises: the requests in flight are finished, and the waiting
        ones join one last round or the stream, up to the token budget, without waiting
        for company; the rest are answered 503 at once. So a long backlog costs a round
        at shutdown, not the time to translate all of it."""
        self._run_round()
        self._join_stream(eager=True)
        while self._streaming:
            self._step_stream()
        refused = self._taken(list(self._backlog))
        for job in refused:
            job.future.set_exception(ServeError(503, SHUTTING_DOWN))

    def _next(self) -> _Job | None:
        """The next queued request, however long it takes to come: waited for in slices,
        so that this thread (the main one, under `serve`) runs a stop signal's handler
        within one whichever of the process's threads the kernel delivered it to (a
        thread blocked in one long wait would never run it)."""
        while True:
            try:
                return self._queue.get(timeout=SIGNAL_SLICE_S)
            except queue.Empty:
                continue

    def _take(self, wait: bool) -> None:
        """Move queued requests to the backlog. With `wait`, block for the first, then
        wait for company until the token budget is reached or `max_wait_ms` has passed.

        The wait counts from the first request's arrival, or from when answers last went
        out if later: the clients just answered can then join it with their next
        requests, instead of forming a half-empty round of their own."""
        tokens, deadline = 0, None
        while not self._closing:
            wait = wait and not self._stopping  # closing: take all that is queued, now
            if wait and deadline is None:
                job = self._next()
            else:
                timeout = deadline - time.monotonic() if wait else 0
                try:  # past the deadline, still take what is already queued
                    job = (
                        self._queue.get(timeout=timeout)
                        if timeout > 0
                        else self._queue.get_nowait()
                    )
                except queue.Empty:
                    return
            if job is None:
                self._closing = True
                return
            job.seen_at_step = self._steps
            self._backlog.append(job)
            tokens += job.tokens
            if deadline is None:
                deadline = max(job.arrived, self._round_end) + self.limits.max_wait_ms / 1000
            if wait and tokens >= self.limits.max_batch_tokens:
                return

    def _streams(self, job: _Job) -> bool:
        """Whether the job goes to the stream (made here for the first that can); one
        with constraints never does (they need a beam), nor one with prefixes or with
        word links for some lines only."""
        if not self.continuous or job.constraints or job.prefixes or job.links is not None:
            return False
        if self._stream is not None and self._stream.accepts(job.opts):
            return True
        if self._streaming:  # the running stream decodes with other settings
            return False
        stream = open_stream(self.translator, job.opts)
        if stream is not None:
            self._stream = stream
        return stream is not None

    def _taken(self, jobs: list[_Job]) -> list[_Job]:
        """Take `jobs` out of the backlog; returns those still awaited (a request whose
        future was cancelled, as uvicorn's shutdown timeout cancels waiting handlers, is
        dropped untranslated; the others' futures can no longer be cancelled, so
        answering them never fails with InvalidStateError)."""
        taken = {id(j) for j in jobs}
        self._backlog = [j for j in self._backlog if id(j) not in taken]
        with self._lock:
            self._queued_lines -= sum(len(j.lines) for j in jobs if j.counted)
        return [j for j in jobs if j.future.set_running_or_notify_cancel()]

    def _run_round(self) -> None:
        """The backlog's requests that do not stream, oldest first, up to the budget."""
        jobs, tokens = [], 0
        for job in self._backlog:
            if not self._streams(job) and (
                not jobs or tokens + job.tokens <= self.limits.max_batch_tokens
            ):
                jobs.append(job)
                tokens += job.tokens
        jobs = self._taken(jobs)
        if not jobs:
            return
        groups: dict[SearchOptions, list[_Job]] = {}
        for job in jobs:
            groups.setdefault(job.opts, []).append(job)
        for opts, group in groups.items():
            self._translate(group, opts)
        self._round_end = time.monotonic()

    def _translate(self, jobs: list[_Job], opts: SearchOptions) -> None:
        lines = [line for job in jobs for line in job.lines]
        constraints = [c for job in jobs for c in job.constraints or [[]] * len(job.lines)]
        prefixes = [p for job in jobs for p in job.prefixes or [""] * len(job.lines)]
        links = [w for job in jobs for w in job.links or [True] * len(job.lines)]
        if self.metrics:
            self.metrics.batch_ran(len(lines), sum(job.tokens for job in jobs))
        try:
            hyps = self.translator.translate(
                lines,
                opts,
                None,
                prefixes if any(prefixes) else None,
                batch_tokens=self.limits.max_batch_tokens,
                constraints=constraints if any(constraints) else None,
                links=None if all(links) else links,
            )
        except Exception as e:  # answer every waiting request, keep serving
            log.exception("translation failed")
            for job in jobs:
                job.future.set_exception(e)
            return
        start = 0
        for job in jobs:
            job.future.set_result(hyps[start : start + len(job.lines)])
            start += len(job.lines)
        if self.metrics:
            self.metrics.translated(len(hyps), sum(len(h[0].tokens) for h in hyps if h))

    def _join_stream(self, eager: bool = False) -> None:
        """Waiting greedy requests join the stream when the join policy lets them
        (`joining`; `eager`: at once, as at shutdown)."""
        waiting = [j for j in self._backlog if self._streams(j)]
        decoding = len(self._stream) if self._streaming else 0
        joining = join_policy(
            waiting, self._streaming, decoding, self._steps, self.limits.max_batch_tokens, eager
        )
        joining = self._taken(joining)
        if joining and self.metrics:
            self.metrics.batch_ran(
                sum(len(j.lines) for j in joining), sum(j.tokens for j in joining)
            )
        for job in joining:
            job.results, job.left = [None] * len(job.lines), len(job.lines)
            try:
                self._stream.add(job.lines, [(id(job), i) for i in range(len(job.lines))], job.opts)
            except Exception as e:  # the request at fault is answered with the error
                log.exception("translation failed")
                job.future.set_exception(e)
                continue
            self._streaming.append(job)

    def _step_stream(self) -> None:
        """One step of the stream; requests whose last sentence ended are answered."""
        if not self._streaming:
            return
        try:
            ended = self._stream.step()
        except Exception as e:
            self._fail_stream(e)
            return
        self._steps += 1
        if not ended:
            return
        jobs = {id(j): j for j in self._streaming}
        for (job_id, i), hyps in ended:
            job = jobs[job_id]
            job.results[i] = hyps
            job.left -= 1
            if not job.left:
                job.future.set_result(job.results)
        if self.metrics:
            self.metrics.translated(len(ended), sum(len(h[0].tokens) for _, h in ended if h))
        self._streaming = [j for j in self._streaming if j.left]
        self._round_end = time.monotonic()

    def _fail_stream(self, e: Exception) -> None:
        """Answer every request in the stream with the error; start a new stream."""
        log.exception("translation failed")
        for job in self._streaming:
            job.future.set_exception(e)
        self._streaming, self._stream = [], None


def join_policy(
    waiting: list[_Job],
    streaming: list[_Job],
    decoding: int,
    steps: int,
    budget: int,
    eager: bool = False,
) -> list[_Job]:
    """Which of the `waiting` greedy requests (oldest first) join the stream now, beside
    the `streaming` ones (`decoding` sentences, `steps` run so far): none until a join
    is worth an encoder run (they are at least `JOIN_SHARE` of the sentences decoding, or
    the oldest has waited `JOIN_AFTER_STEPS` steps; `eager`: at once), then as many as
    fit the token budget, counting padding as `translate --batch-tokens` does (the slots'
    caches are as wide as the longest sentence in them). The first always fits an idle
    stream."""
    if not waiting:
        return []
    if streaming and not eager:
        lines = sum(len(j.lines) for j in waiting)
        if lines < JOIN_SHARE * decoding and steps - waiting[0].seen_at_step < JOIN_AFTER_STEPS:
            return []
    rows = sum(len(j.lines) for j in streaming)
    longest = max((j.longest for j in streaming), default=0)
    joining: list[_Job] = []
    for job in waiting:
        rows, longest = rows + len(job.lines), max(longest, job.longest)
        if (streaming or joining) and rows * longest > budget:
            break
        joining.append(job)
    return joining
